#!/usr/bin/env bash
# Device call 1 of 2. Keeps the first half of the target (the packaged SmolLM2-135M-Instruct GGUF, 98 MB; a call
# carries at most 64 MiB) for call 2, notes the machine, and on a SmolLM2-135M-shaped stand-in (random weights, so
# every trajectory runs its full length) times three recordings, which pick call 2's settings (written to $W/choice):
#   a: 128 Spec-Bench prompts at batch 128, a hidden-state forward per trajectory (the default);
#   b: the same with --hidden-batch 65536 (a batch's trajectories in a few right-padded forwards);
#   c: 512 generated prompts at batch 512 with --hidden-batch 65536 (the generated prompts are short).
# Then a few EAGLE-3 training steps on what c recorded and pack.py on the result: every step of call 2 but the
# real target. Environment (the device's defaults): P W DEV MNT HS N1 N2 CAP VOCAB STANDIN.
set -u
START=$(date +%s); at() { echo "[$(( $(date +%s) - START )) s] $*"; }
P=${P:-.gpu}; W=${W:-/root/w}; DEV=${DEV:-cuda}; MNT=${MNT:-192}; HS=${HS:-last,2,15,27}
N1=${N1:-128}; N2=${N2:-512}; CAP=${CAP:-45}
mkdir -p $W && cp $P/part00 $W/
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $P/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=${SPECSIM_HOME:-/tmp/specsim-home}
{ cat $P/commit; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, transformers, h5py, numpy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'h5py', h5py.__version__, 'numpy', numpy.__version__)"
  nproc; free -g | head -2; python3 --version; } 2>&1 | tee $OUT/env.txt
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > $OUT/gpu_call1.csv 2>&1 &
UTIL=$!
TGT=${STANDIN:-$W/standin}
[ -n "${STANDIN:-}" ] || python3 $P/standin.py $P/standin $TGT 2>&1 | grep -v Writing
head -$N1 $P/S.jsonl > $W/s1.jsonl; head -$N2 $P/G.jsonl > $W/g1.jsonl
rec() {  # name prompts batch [flags]: one capped recording at T = 0.7, its last two lines shown
  at "recording $1: $(wc -l < $2) prompts, batch $3 $4"
  /usr/bin/time -f "%e s wall, %M KB peak" timeout -k 10 -s TERM $CAP python3 -m specsim cache --target $TGT \
    --prompts $2 --max-new-tokens $MNT --temperature 0.7 --hidden-states $HS --store stats --batch-size $3 $4 \
    --device $DEV --out $W/$1.h5 --quiet > $OUT/rec_$1.txt 2>&1
  grep -E "^recorded|^time:|wall" $OUT/rec_$1.txt
}
rec a $W/s1.jsonl $N1 ""
rec b $W/s1.jsonl $N1 "--hidden-batch 65536"
rec c $W/g1.jsonl $N2 "--hidden-batch 65536"
rate() { grep -o "([0-9.]* positions/s" $OUT/rec_$1.txt | grep -o "[0-9.]*" | head -1; }
python3 - "$(rate a)" "$(rate b)" "$(rate c)" $N1 $N2 > $W/choice <<'PY'
import sys
a, b, c = (float(x) if x else 0.0 for x in sys.argv[1:4])
print(f"HB={65536 if b > 1.05 * a else 0}")  # the batched hidden states only where they were faster by 5%
print(f"GB={sys.argv[5] if c > 0 else sys.argv[4]}")  # the generated prompts at the larger batch where it ran
print(f"# rates (positions/s): a {a:.0f}, b {b:.0f}, c {c:.0f}")
PY
cat $W/choice | tee $OUT/choice.txt
SMOKE=$W/c.h5; [ -s $SMOKE ] || SMOKE=$W/b.h5
at "smoke: 10 training steps on $SMOKE"
timeout -k 10 60 python3 -m specsim train-draft --kind eagle3 --target $TGT --from $SMOKE --draft-vocab ${VOCAB:-16384} \
  --ttt-steps 4 --steps 10 --batch 64 --lr 1e-3 --lr-schedule cosine --holdout-every 10 --device $DEV --quiet \
  --out $W/smokehead > $OUT/smoke_train.txt 2>&1
tail -3 $OUT/smoke_train.txt | cut -c1-300
mkdir -p $W/packtest && python3 $P/pack.py $W/smokehead smoke $W/packtest && ls $W/packtest
kill $UTIL 2>/dev/null
at "done"

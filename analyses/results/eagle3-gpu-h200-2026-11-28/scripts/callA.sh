#!/usr/bin/env bash
# Device call A of 2. Keeps the first half of the target (the packaged SmolLM2-135M-Instruct GGUF, 98 MB; a call
# carries at most 64 MiB) for call B, notes the machine, writes call B's recording settings (those the last session
# measured: `--hidden-batch 65536`, the generated prompts at batch 512), and runs every step of call B but the real
# target on a SmolLM2-135M-shaped stand-in (random weights): a short recording with --hidden-batch, 10 EAGLE-3
# training steps with `train-draft --hidden-batch 65536` (new since the last session, never run on a GPU), pack.py;
# then profile_train.py: a training step's time with the trajectories in host memory and moved to the device once,
# and where it goes (the 11-28 session found the GPU 60-63% busy while training, the host the bound).
# Environment (the device's defaults): P W DEV MNT HS N VOCAB STANDIN PROFILE_BATCH.
set -u
START=$(date +%s); at() { echo "[$(( $(date +%s) - START )) s] $*"; }
P=${P:-.gpu}; W=${W:-/root/w}; DEV=${DEV:-cuda}; MNT=${MNT:-32}; HS=${HS:-last,2,15,27}; N=${N:-64}
mkdir -p $W && cp $P/part00 $W/
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $P/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=${SPECSIM_HOME:-/tmp/specsim-home}
{ cat $P/commit; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, transformers, h5py, numpy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'h5py', h5py.__version__, 'numpy', numpy.__version__)"
  nproc; free -g | head -2; python3 --version; } 2>&1 | tee $OUT/env.txt
printf 'HB=65536\nGB=512\n# from eagle3-gpu-h200-2026-11-27c call 1: --hidden-batch 1.45x, batch 512 2x the step time for 4x the rows\n' \
  > $W/choice
TGT=${STANDIN:-$W/standin}
[ -n "${STANDIN:-}" ] || python3 $P/standin.py $P/standin $TGT 2>&1 | grep -v Writing
head -$N $P/S.jsonl > $W/s1.jsonl
at "smoke recording: $N prompts, $MNT tokens, --hidden-batch 65536"
timeout -k 10 -s TERM 60 python3 -m specsim cache --target $TGT --prompts $W/s1.jsonl --max-new-tokens $MNT \
  --temperature 0.7 --hidden-states $HS --store stats --batch-size $N --hidden-batch 65536 --device $DEV \
  --out $W/smoke.h5 --quiet > $OUT/smoke_rec.txt 2>&1
grep -E "^recorded|^time:" $OUT/smoke_rec.txt
at "smoke: 10 training steps with --hidden-batch 65536"
timeout -k 10 90 python3 -m specsim train-draft --kind eagle3 --target $TGT --from $W/smoke.h5 \
  --draft-vocab ${VOCAB:-16384} --ttt-steps 4 --steps 10 --batch 64 --lr 1e-3 --lr-schedule cosine --holdout-every 10 \
  --hidden-batch 65536 --device $DEV --quiet --out $W/smokehead > $OUT/smoke_train.txt 2>&1
echo "train-draft exit $?" | tee -a $OUT/smoke_train.txt
tail -3 $OUT/smoke_train.txt | cut -c1-300
mkdir -p $W/packtest && python3 $P/pack.py $W/smokehead smoke $W/packtest && ls $W/packtest
at "a training step profiled: the trajectories in host memory (as train-draft) against moved to the device once"
timeout -k 10 150 python3 $P/profile_train.py $TGT $W/smoke.h5 $OUT ${PROFILE_BATCH:-64} 12 ${VOCAB:-16384} \
  > $OUT/profile_train.log 2>&1
grep -E "^device|^==" $OUT/profile_train.log
at "done"

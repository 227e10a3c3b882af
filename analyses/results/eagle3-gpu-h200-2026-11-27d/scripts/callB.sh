#!/usr/bin/env bash
# Device call B of 2. The target whole again (its second half carried now, checked by sha256); Spec-Bench's 467
# training prompts (S: at 7 temperatures, T = 0 first) and 2,003 generated prompts (G: greedy and T = 0.7) recorded
# side by side with EAGLE-3's states and `--hidden-batch 65536`, both capped at REC_S seconds (SIGTERM keeps every
# committed trajectory); one EAGLE-3 head trained on both (`--from S --from G`, each holding out its every 10th
# prompt: S's are the 46 held-out prompts of the CPU runs), with `--hidden-batch 65536` for the prompts' states, for
# the time left before DEADLINE_S less PACK_S (a training that fails within a minute is run again without
# TRAIN_EXTRA); the head packed for the trip back. Lines of the training's output carry the seconds since the call
# began. Environment (the device's defaults): P W DEV TGT DEADLINE_S REC_S PACK_S MNT HS SB TS TG BATCH VOCAB
# TRAIN_EXTRA.
set -u
START=$(date +%s); el() { echo $(( $(date +%s) - START )); }; at() { echo "[$(el) s] $*"; }
P=${P:-.gpu2}; W=${W:-/root/w}; DEV=${DEV:-cuda}; DEADLINE_S=${DEADLINE_S:-575}; REC_S=${REC_S:-280}
PACK_S=${PACK_S:-25}; MNT=${MNT:-192}; HS=${HS:-last,2,15,27}; SB=${SB:-128}
TS=${TS:-0,0.7,0.5,0.9,0.3,0.6,0.8}; TG=${TG:-0,0.7}; TRAIN_EXTRA=${TRAIN_EXTRA---hidden-batch 65536}
if [ -z "${TGT:-}" ]; then
  [ -f $W/part00 ] || { echo "the first half is gone (a fresh machine): run call A again"; exit 3; }
  cat $W/part00 $P/part01 > $W/smol.gguf
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $W/smol.gguf" | sha256sum -c || exit 1
  TGT=$W/smol.gguf
fi
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $P/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=${SPECSIM_HOME:-/tmp/specsim-home}
. $W/choice; cat $W/choice
HBF=""; [ "$HB" != 0 ] && HBF="--hidden-batch $HB"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 2 > $OUT/gpu_callB.csv 2>&1 &
UTIL=$!
at "recording S (batch $SB, T = $TS) and G (batch $GB, T = $TG) side by side, capped at $REC_S s; $HBF"
RECS=""
for c in S G; do
  [ $c = S ] && set -- $SB $TS || set -- $GB $TG
  /usr/bin/time -v timeout -k 20 -s TERM $REC_S python3 -m specsim cache --target $TGT --prompts $P/$c.jsonl \
    --max-new-tokens $MNT --temperature $2 --hidden-states $HS --store stats --batch-size $1 $HBF --device $DEV \
    --out $W/$c.h5 --quiet > $W/rec_$c.log 2>&1 &
  RECS="$RECS $!"
done
wait $RECS  # the recordings only: a bare `wait` also waits for the monitor, which never ends
FROM=""
for c in S G; do grep -E "^recorded|^time:|^this run|^interrupted|Maximum resident|Elapsed" $W/rec_$c.log; [ -s $W/$c.h5 ] && FROM="$FROM --from $W/$c.h5"; done
train() {  # extra flags: one time-limited training, its output lines stamped
  TL=$(( DEADLINE_S - $(el) - PACK_S ))
  at "training on$FROM for $TL s; $*"
  /usr/bin/time -v timeout -k 15 -s TERM $(( TL + 10 )) python3 -m specsim train-draft --kind eagle3 --target $TGT $FROM \
    --draft-vocab ${VOCAB:-16384} --ttt-steps 4 --time-limit $TL --batch ${BATCH:-64} --lr 1e-3 --lr-schedule cosine \
    --holdout-every 10 --save-every 200 --device $DEV --quiet "$@" --out $W/head 2> $W/train.log \
    | while IFS= read -r line; do echo "[$(el) s] $line"; done >> $W/train.txt
  return ${PIPESTATUS[0]}
}
T0=$(el)
train $TRAIN_EXTRA; RC=$?
at "train-draft exit $RC"
if [ $RC != 0 ] && [ ! -s $W/head/model.safetensors ] && [ $(( $(el) - T0 )) -lt 60 ]; then
  tail -5 $W/train.log; mv $W/train.log $W/train_failed.log; train; at "train-draft exit $?"
fi
cut -c1-400 $W/train.txt
python3 $P/pack.py $W/head E $OUT
kill $UTIL 2>/dev/null
mkdir -p $W/logs; cp $W/train.txt $W/E-sums.json $W/E-config.json $OUT/gpu_callB.csv $W/logs/ 2>/dev/null
for f in $W/rec_S.log $W/rec_G.log $W/train.log $W/train_failed.log; do [ -f $f ] && tr '\r' '\n' < $f | grep -v "it/s\]\|s/it\]\|step/s\]\|s/step\]\|prompt/s\]\|s/prompt\]" > $W/logs/$(basename $f).txt; done
tar -czf $OUT/logs.tgz -C $W logs && rm -f $OUT/gpu_callB.csv  # at most 8 files come back
cp $W/train.txt $OUT/
ls -la $OUT
at "packed"

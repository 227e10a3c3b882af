#!/usr/bin/env bash
# The recording and training job of the device's second call (and of the smoke, on a tiny model):
#   1. SHARDS recording processes side by side (`cache --shard i/N`), each capped at REC_S seconds (SIGTERM keeps
#      every committed trajectory), EAGLE-3's hidden states, stats only;
#   2. `merge` of the shards, and beside it a 20-step probe of both trainings on shard 0 (the step time);
#   3. two EAGLE-3 heads trained side by side on the merged cache for as many cosine steps as fit before DEADLINE_S:
#      A on the CATS_A categories' prompts only (Spec-Bench's), B on all (Spec-Bench's and the generated ones), the
#      same held-out prompts (every 10th);
#   4. the heads packed for the trip back (pack.py).
# Environment: TARGET PROMPTS DEV W SHARDS REC_S MNT TEMPS HS RB BATCH CATS_A DEADLINE_S THREADS, and OUT.
set -u
START=${START_EPOCH:-$(date +%s)}  # the call's start, so DEADLINE_S counts the setup before this script too
el() { echo $(( $(date +%s) - START )); }
S="python3 -m specsim"
mkdir -p $W
at() { echo "[$(el) s] $*"; }
at "recording: $SHARDS shards, capped at $REC_S s"
for i in $(seq 0 $((SHARDS-1))); do
  OMP_NUM_THREADS=$THREADS /usr/bin/time -v timeout -k 30 -s TERM $REC_S $S cache --target $TARGET --prompts $PROMPTS \
    --max-new-tokens $MNT --temperature $TEMPS --hidden-states $HS --store stats --batch-size $RB --device $DEV \
    --shard $i/$SHARDS --out "$W/train-{i}-of-{n}.h5" --quiet > $W/record_$i.log 2>&1 &
done
wait
for i in $(seq 0 $((SHARDS-1))); do tail -2 $W/record_$i.log | head -1; done
at "recorded"
$S merge --allow-partial $W/train.h5 $W/train-*-of-$SHARDS.h5 > $W/merge.log 2>&1 &
MERGE=$!
T="train-draft --kind eagle3 --target $TARGET --draft-vocab ${VOCAB:-16384} --ttt-steps 4 --batch $BATCH --lr 1e-3
   --lr-schedule cosine --holdout-every 10 --device $DEV --quiet"
P0=$(date +%s)
OMP_NUM_THREADS=$THREADS timeout 120 $S $T --from $W/train-1-of-$SHARDS.h5 --train-categories $CATS_A --steps 20 \
  --save-every 1000 --out $W/probeA > $W/probeA.txt 2> $W/probeA.log &
OMP_NUM_THREADS=$THREADS timeout 120 $S $T --from $W/train-1-of-$SHARDS.h5 --steps 20 --save-every 1000 \
  --out $W/probeB > $W/probeB.txt 2> $W/probeB.log &
wait
cat $W/merge.log $W/probeA.txt $W/probeB.txt
PROBE_WALL=$(( $(date +%s) - P0 ))
PER=$(grep -o "held-out after 20 steps ([0-9.]* s" $W/probeB.txt | grep -o "([0-9.]*" | tr -d '(')
LEFT=$(( DEADLINE_S - $(el) - ${PACK_S:-25} ))
if [ -n "$PER" ]; then
  # the probe's time outside its 20 steps (loading, prompt states, held-out evaluation) on one shard of the data;
  # the full cache's is taken as twice that
  OVER=$(python3 -c "print(round(2 * ($PROBE_WALL - $PER)))")
  STEPS=$(python3 -c "print(max(${MIN_STEPS:-100}, min(20000, int(($LEFT - $OVER) / ($PER / 20) * 0.9) // 50 * 50)))")
else
  OVER=60; STEPS=${FALLBACK_STEPS:-1000}
fi
at "probe: ${PER:-?} s for 20 steps (B, beside A), ${PROBE_WALL} s in all; $LEFT s left, $OVER s taken as outside the steps: $STEPS steps"
SAVE=$(( STEPS / 4 > 0 ? STEPS / 4 : 1 ))
for H in A B; do
  [ $H = A ] && EXTRA="--train-categories $CATS_A" || EXTRA=""
  OMP_NUM_THREADS=$THREADS /usr/bin/time -v timeout -k 20 -s TERM $(( LEFT - 5 )) $S $T --from $W/train.h5 $EXTRA \
    --steps $STEPS --save-every $SAVE --out $W/head$H > $W/train$H.txt 2> $W/train$H.log &
done
wait
cat $W/trainA.txt $W/trainB.txt
at "trained"
for H in A B; do python3 ${PACK:-.gpu/pack.py} $W/head$H $H $OUT; done
(cd $W && tar czf $OUT/logs.tgz *.txt *.log *.json 2>/dev/null)
ls -la $OUT
at "packed"

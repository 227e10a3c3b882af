#!/usr/bin/env bash
# On the CPU, after the device run: the two heads (unpack.py) measured as the data curve's heads were:
# training-time-test agreement on the curve's 86 held-out trajectories (heldout86.py), then both heads recorded at
# depth 4 on the 13 evaluation and 46 held-out Spec-Bench prompts (T = 0, 128 new tokens) and replayed exactly, with
# per-prompt rows for paired differences (paired.py). Run from the folder holding headA/ and headB/.
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
E3BIG=${E3BIG:-/work/e3big}
R=${R:-/work/main/analyses/results}
lscpu > lscpu.txt
python $R/eagle3-samples-cpu-2026-11-27/heldout86.py $E3BIG/train.h5 headA headB > heldout86.txt 2> heldout86.log
for set in eval heldout46; do
  /usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts "$E3BIG/${set}_prompts.jsonl" \
      --draft eagle3:headA,eagle3:headB --head-depth 4 --max-new-tokens 128 --temperature 0 --store stats \
      --out "${set}.h5" 2> "record_${set}.log"
  for h in A B; do
    $SPECSIM simulate "${set}.h5" --tree chain:4 --tree chain:2 --draft eagle3:head$h --draft suffix \
        --per-request "pr-$h-${set}.csv" > "simulate_${set}_$h.txt" 2>&1
  done
done
# Run afterwards, the same day: the 46 held-out prompts at T = 0.7 (sampled trajectories), both heads and the data
# curve's full head (HEADFULL, the head of ../eagle3-scale-cpu-2026-11-26/) in one cache, replayed with sampling.
ln -sfn "${HEADFULL:-/work/e3big/head}" headFull
/usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts "$E3BIG/heldout46_prompts.jsonl" \
    --draft eagle3:headA,eagle3:headB,eagle3:headFull --head-depth 4 --max-new-tokens 128 --temperature 0.7 \
    --store stats --out heldout46_t07.h5 --quiet > record_heldout46_t07.log 2>&1
$SPECSIM simulate heldout46_t07.h5 --tree chain:4 --tree chain:2 --policy sample --temperature 0.7 \
    --draft eagle3:headA --draft eagle3:headB --draft eagle3:headFull --draft suffix --per-request pr_t07.csv \
    > simulate_heldout46_t07.txt 2>&1

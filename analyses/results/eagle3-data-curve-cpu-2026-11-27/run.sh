#!/usr/bin/env bash
# EAGLE-3 on SmolLM2-135M: a data-scaling curve with one recipe. Run from the folder of ../eagle3-scale-cpu-2026-11-26/
# (/work/e3big: its train.h5 of 118,551 positions, its eval and heldout46 prompts, its head trained on all 389
# training prompts). Two more heads on a quarter and a half of those prompts (--train-prompts, nested subsets, the
# same 43 held-out prompts), each for the same number of epochs as the full head (1400 steps of 8 on 778
# trajectories: about 14.4), then recorded and replayed on the same 13 + 46 held-out prompts.
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
OUT=${OUT:-/work/curve47}
mkdir -p "$OUT"
lscpu > "$OUT/lscpu.txt"
for spec in 97:350 194:700; do
  n=${spec%:*}; steps=${spec#*:}
  /usr/bin/time -v $SPECSIM train-draft --kind eagle3 --target smollm2-135m --from train.h5 --draft-vocab 16384 \
      --ttt-steps 4 --steps "$steps" --batch 8 --lr 1e-3 --lr-schedule cosine --holdout-every 10 --save-every 100 \
      --train-prompts "$n" --out "$OUT/head$n" > "$OUT/train$n.txt" 2> "$OUT/train$n.log"
done
for n in 97 194; do
  for set in eval heldout46; do
    /usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts ${set}_prompts.jsonl --draft "eagle3:$OUT/head$n" \
        --head-depth 4 --max-new-tokens 128 --temperature 0 --store stats --out "$OUT/${set}$n.h5" \
        2> "$OUT/record_${set}$n.log"
    $SPECSIM simulate "$OUT/${set}$n.h5" --tree chain:4 --tree chain:2 --draft "eagle3:$OUT/head$n" \
        > "$OUT/simulate_${set}$n.txt" 2>&1
  done
done

#!/usr/bin/env bash
# The early-exit draft layers:20 (the target's first 20 of 30 layers) on the same prompts, T = 0, 128 new tokens: the
# greedy trajectories are the heads' token for token, so each prompt pairs with the heads' replays.
set -euo pipefail
SPECSIM=${SPECSIM:-/work/main/.venv/bin/specsim}
PY=${PY:-/work/main/.venv/bin/python}
E3BIG=${E3BIG:-/work/e3big}
R=${R:-/work/main/analyses/results}
for set in eval heldout46; do
  /usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts "$E3BIG/${set}_prompts.jsonl" --draft layers:20 \
      --max-new-tokens 128 --temperature 0 --store stats --out "l20_${set}.h5" 2> "record_l20_${set}.log"
  $SPECSIM simulate "l20_${set}.h5" --tree chain:4 --tree chain:2 --draft layers:20 \
      > "simulate_l20_${set}.txt" 2>&1
  for tree in chain:4 chain:2; do
    $SPECSIM simulate "l20_${set}.h5" --tree $tree --draft layers:20 --quiet \
        --per-request "per_request/L20-$set-${tree/:/}.csv" > /dev/null 2>&1
    $PY $R/eagle3-samples-cpu-2026-11-27/paired.py layers20=per_request/L20-$set-${tree/:/}.csv \
        head=per_request/New-$set-${tree/:/}.csv > "paired_l20_${set}_${tree/:/}.txt" 2>&1
  done
done
echo ALLDONE

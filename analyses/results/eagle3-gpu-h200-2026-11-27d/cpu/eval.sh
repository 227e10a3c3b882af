#!/usr/bin/env bash
# On this CPU, after the device run: the head trained on the H200 (headNew, 702,013 positions) and the best earlier
# head (headOld, 280,130 positions, eagle3-written-prompts-cpu-2026-11-27), recorded in one cache at depth 4 on the 13
# evaluation and the 46 held-out Spec-Bench prompts (T = 0, 128 new tokens) and replayed exactly, with per-prompt rows
# for paired differences (paired.py). Run from the folder holding headNew/ and headOld/.
set -euo pipefail
SPECSIM=${SPECSIM:-/work/main/.venv/bin/specsim}
PY=${PY:-/work/main/.venv/bin/python}
E3BIG=${E3BIG:-/work/e3big}
R=${R:-/work/main/analyses/results}
lscpu > lscpu.txt
mkdir -p per_request
for set in eval heldout46; do
  /usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts "$E3BIG/${set}_prompts.jsonl" \
      --draft eagle3:headNew,eagle3:headOld --head-depth 4 --max-new-tokens 128 --temperature 0 --store stats \
      --out "${set}.h5" 2> "record_${set}.log"
  $SPECSIM simulate "${set}.h5" --tree chain:4 --tree chain:2 --draft eagle3:headNew --draft eagle3:headOld \
      --draft suffix > "simulate_${set}.txt" 2>&1
  for tree in chain:4 chain:2; do
    for h in Old New; do
      $SPECSIM simulate "${set}.h5" --tree $tree --draft eagle3:head$h --quiet \
          --per-request "per_request/$h-$set-${tree/:/}.csv" > /dev/null 2>&1
    done
    $PY $R/eagle3-samples-cpu-2026-11-27/paired.py old=per_request/Old-$set-${tree/:/}.csv \
        new=per_request/New-$set-${tree/:/}.csv > "paired_${set}_${tree/:/}.txt" 2>&1
  done
done
echo ALLDONE

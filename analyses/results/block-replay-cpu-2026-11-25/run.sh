#!/usr/bin/env bash
# Block verification of drafts sampled from q: replayed from the target along the drafts' proposals
# (`cache --expand-target`), against token-wise speculative sampling on the same records, and against
# specsim's live engine running the rule (validate). Run from the repository root:
#   bash analyses/results/block-replay-cpu-2026-11-25/run.sh
set -euo pipefail
OUT=analyses/results/block-replay-cpu-2026-11-25
CACHE=cache/block-replay.h5
SPECSIM=.venv/bin/specsim
lscpu > $OUT/lscpu.txt
uptime > $OUT/load.txt
/usr/bin/time -v $SPECSIM cache --target smollm2-135m --draft int8 --draft layers:20 --prompts spec-bench \
    --per-category 1 --max-new-tokens 48 --temperature 0.7 --temperature 1.0 --seed 3 --store stats \
    --expand-target 4 --proposal-chains 8 --out $CACHE --overwrite --quiet 2> $OUT/cache.txt
$SPECSIM simulate $CACHE --tree chain:2 --tree chain:4 --policy block --policy sample \
    --out $OUT/replay.csv --overwrite > $OUT/replay.txt 2>&1
for T in 0.7 1.0; do
  for D in layers:20 int8; do
    /usr/bin/time -v $SPECSIM validate $CACHE --draft $D --tree chain:4 --policy block --policy sample \
        --temperature $T --repeats 2 --threads 2 --out $OUT/validate-${D/:/}-T$T.csv --overwrite \
        > $OUT/validate-${D/:/}-T$T.txt 2>&1
  done
done
uptime >> $OUT/load.txt

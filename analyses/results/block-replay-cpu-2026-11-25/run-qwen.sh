#!/usr/bin/env bash
# The Qwen pair (Qwen2.5-Coder 1.5B target, 0.5B draft): block verification replayed from the target along the
# draft's proposals, against token-wise speculative sampling on the same records, and a live check at T = 0.7.
#   make qwen && bash analyses/results/block-replay-cpu-2026-11-25/run-qwen.sh
set -euo pipefail
OUT=analyses/results/block-replay-cpu-2026-11-25
CACHE=cache/block-replay-qwen.h5
SPECSIM=.venv/bin/specsim
uptime > $OUT/load-qwen.txt
/usr/bin/time -v $SPECSIM cache --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --prompts spec-bench \
    --per-category 1 --max-new-tokens 32 --temperature 0.7 --temperature 1.0 --seed 3 --store stats \
    --expand-target 4 --proposal-chains 8 --out $CACHE --overwrite --quiet 2> $OUT/cache-qwen.txt
$SPECSIM simulate $CACHE --tree chain:2 --tree chain:4 --policy block --policy sample \
    --out $OUT/replay-qwen.csv --overwrite > $OUT/replay-qwen.txt 2>&1
/usr/bin/time -v $SPECSIM validate $CACHE --draft qwen2.5-coder-0.5b --tree chain:4 --policy block --policy sample \
    --temperature 0.7 --repeats 1 --threads 2 --out $OUT/validate-qwen-T0.7.csv --overwrite \
    > $OUT/validate-qwen-T0.7.txt 2>&1
uptime >> $OUT/load-qwen.txt

#!/usr/bin/env bash
# `cache --batch-size 1` against 8 on this CPU, alternated twice; then the two caches compared.
# Usage: batch_size.sh CHECKOUT PROMPTS
set -euo pipefail
repo=$1 prompts=$2
for round in 1 2; do
  for bs in 1 8; do
    rm -f b$bs.h5 b$bs.h5.lock
    /usr/bin/time -f "batch $bs, round $round: %e s wall, %U s user" "$repo/.venv/bin/specsim" cache \
        --target smollm2-135m --prompts "$prompts" --draft layers:20 --max-new-tokens 96 --temperature 0 \
        --store stats --batch-size $bs --out b$bs.h5 --quiet 2>&1 | grep -E "^time:|round|recorded"
  done
done
env PYTHONPATH="$repo" "$repo/.venv/bin/python" -m benchmarks.compare_caches b1.h5 b8.h5
cut -d' ' -f1-3 /proc/loadavg

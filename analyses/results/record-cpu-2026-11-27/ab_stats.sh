#!/usr/bin/env bash
# A T = 0.7 recording with an EAGLE-3 head at depth 4, by the code before ebcf058 (statistics in 2^24 blocks on every
# device) and after it (a CPU's pieces of 2^20), alternated twice in one run; then the two caches compared.
# Usage: ab_stats.sh CHECKOUT HEAD_DIR PROMPTS (CHECKOUT: this repository; run from a scratch folder)
set -euo pipefail
repo=$1 head=$2 prompts=$3
rm -rf old && git -C "$repo" worktree add -q --detach "$PWD/old" 6e15e7b
for round in 1 2; do
  for which in old new; do
    src=$([ $which = old ] && echo "$PWD/old" || echo "$repo")
    rm -f ab_$which.h5 ab_$which.h5.lock
    /usr/bin/time -f "$which, round $round: %e s wall, %U s user" env PYTHONPATH="$src" "$repo/.venv/bin/python" \
        -m specsim cache --target smollm2-135m --prompts "$prompts" --draft "eagle3:$head" --head-depth 4 \
        --max-new-tokens 96 --temperature 0.7 --store stats --out ab_$which.h5 --quiet 2>&1 | grep -E "^time:|round|recorded"
  done
done
env PYTHONPATH="$repo" "$repo/.venv/bin/python" -m benchmarks.compare_caches ab_old.h5 ab_new.h5
git -C "$repo" worktree remove --force "$PWD/old"
cut -d' ' -f1-3 /proc/loadavg

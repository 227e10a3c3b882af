#!/usr/bin/env bash
# Pricing every replica of a cost profile in one pass (AllReplicas) against one replica at a time (the code at
# 640c052): the same `simulate` on the study's SmolLM2 cache and profile (5 rounds per entry: 64 replicas), run by each version in turn; the row files must
# be byte-identical. Run from the repository root after `make study` (cache/study-smollm2.h5, cache/study-smollm2-profile.json).
set -euo pipefail
before=640c052
work=$(mktemp -d)
git worktree add -q --detach "$work/before" "$before"
trap 'git worktree remove --force "$work/before"; rm -rf "$work"' EXIT
lscpu | grep -E "Model name|^CPU\(s\)"
args=(simulate cache/study-smollm2.h5 --draft int8 --tree chain:2 --tree chain:4 --tree kary:2,2 --policy greedy
      --policy sample --temperature 0 --temperature 0.7 --cost-profile cache/study-smollm2-profile.json
      --quiet)
for version in before after; do
  src=$([ $version = before ] && echo "$work/before" || pwd)
  rm -f cache/study-smollm2.h5.features.h5
  uptime
  /usr/bin/time -f "$version: %e s wall, %U s user" env PYTHONPATH="$src" OMP_NUM_THREADS=1 \
    .venv/bin/python -c "from specsim.cli import main; main()" "${args[@]}" --out "$work/$version.csv" > /dev/null
done
cmp "$work/before.csv" "$work/after.csv" && echo "rows byte-identical ($(($(wc -l < "$work/after.csv") - 1)) rows)"

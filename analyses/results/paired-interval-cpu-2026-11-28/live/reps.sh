#!/usr/bin/env bash
# specsim's live decoding against its replay with the same rule, at T = 1, chain:3, `sample`: each seed records a
# new cache (the replay's trajectories) and decodes its prompts live with that seed. Run from the repository root:
#   bash analyses/results/paired-interval-cpu-2026-11-28/live/reps.sh /tmp/reps
# The target is the tests' tiny Llama (tests/conftest.py build_tiny_model).
set -euo pipefail
here=analyses/results/paired-interval-cpu-2026-11-28/live
out=${1:?a scratch folder}
mkdir -p "$out"
.venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); from pathlib import Path; \
from conftest import build_tiny_model; build_tiny_model(Path('$out/tiny'))"
for s in $(seq 0 9); do  # 24 prompts x 24 tokens, drafts int8 and layers:2, 4 decodes per prompt
  .venv/bin/specsim cache --target "$out/tiny" --draft int8,layers:2 --prompts $here/prompts24.jsonl \
    --max-new-tokens 24 --temperature 1 --device cpu --dtype float32 --seed $s --out "$out/t1_$s.h5" --quiet
  .venv/bin/specsim validate "$out/t1_$s.h5" --tree chain:3 --policy sample --repeats 4 --threads 1 --seed $s \
    --out "$out/t1val_$s.csv" --quiet || true
done
for s in $(seq 0 19); do  # 4 prompts x 12 tokens (the tests' tiny cache at seed 0), draft int8, 8 decodes per prompt
  .venv/bin/specsim cache --target "$out/tiny" --draft int8 --prompts $here/prompts4.jsonl --max-new-tokens 12 \
    --temperature 1 --device cpu --dtype float32 --seed $s --out "$out/t4_$s.h5" --quiet
  .venv/bin/specsim validate "$out/t4_$s.h5" --tree chain:3 --policy sample --repeats 8 --threads 1 --seed $s \
    --out "$out/t4val_$s.csv" --quiet || true
done

#!/usr/bin/env bash
# What SpecInfer's rule leaves on the table at nodes with candidates drawn without replacement, beside i.i.d.
# candidates: `specsim bound` on a full cache recorded at T = 0.7. Run from the repository root after `make demo`
# (its cache/demo.h5: SmolLM2-135M with the int8 draft, 13 prompts x 32 tokens, T = 0 and 0.7, full storage):
#   bash analyses/results/bound-swor-cpu-2026-11-26/run.sh [CACHE] [DRAFT]
set -euo pipefail
OUT=$(cd "$(dirname "$0")" && pwd)
CACHE=${1:-cache/demo.h5}
DRAFT=${2:-int8}
SPECSIM=${SPECSIM:-.venv/bin/specsim}
PY=${PY:-.venv/bin/python}
lscpu > "$OUT/lscpu.txt"
uptime > "$OUT/load.txt"
for m in iid swor; do
  OMP_NUM_THREADS=1 /usr/bin/time -f "%e s wall, %U s user" $SPECSIM bound "$CACHE" --draft "$DRAFT" \
      --temperature 0.7 --candidates 4 --multi-draft $m --quiet > "$OUT/bound-$m.txt" 2> "$OUT/bound-$m.time"
done
# the Monte-Carlo's own error: 16x the tuples, another seed
OMP_NUM_THREADS=1 /usr/bin/time -f "%e s wall, %U s user" $SPECSIM bound "$CACHE" --draft "$DRAFT" --temperature 0.7 \
    --candidates 4 --multi-draft swor --samples 65536 --seed 1 --quiet > "$OUT/bound-swor-65536.txt" \
    2> "$OUT/bound-swor-65536.time"
# and against the exact two-candidate value, position by position
OMP_NUM_THREADS=1 $PY "$OUT/mc_check.py" "$CACHE" "$DRAFT" > "$OUT/mc_check.txt"
uptime >> "$OUT/load.txt"

#!/usr/bin/env bash
# --prompt context against --prompt context (the float32 run of run.sh), same data, seed and settings
set -eu
out=$(realpath "${1:?usage: bash SCRIPT OUTDIR}")
S=.venv/bin/specsim
cd "$(git rev-parse --show-toplevel)"
{ date -u; uptime; } > "$out/train-context300.time"
/usr/bin/time -v $S train-draft --kind eagle3 --target smollm2-135m --from "$out/train.h5" --draft-vocab 16384 \
    --ttt-steps 4 --steps 300 --batch 4 --lr 1e-3 --save-every 100 --holdout-every 5 --precision float32 \
    --prompt context --out "$out/head-context300" --quiet > "$out/train-context300.txt" 2>> "$out/train-context300.time"
{ date -u; uptime; } >> "$out/train-context300.time"

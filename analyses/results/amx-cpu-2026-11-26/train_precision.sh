#!/usr/bin/env bash
# EAGLE-3 training on SmolLM2-135M, float32 against bfloat16 autocast, same data, seed and settings, one after
# the other in one run (nothing else running). Usage: bash train_precision.sh OUTDIR
set -eu
out=$(realpath "${1:?usage: bash SCRIPT OUTDIR}")
S=.venv/bin/specsim
cd "$(git rev-parse --show-toplevel)"
lscpu > "$out/lscpu.txt"
$S cache --target smollm2-135m --prompts spec-bench --per-category 10 --max-new-tokens 64 --temperature 0 \
    --hidden-states last,2,15,27 --store stats --out "$out/train.h5" 2> "$out/record.log"
for p in float32 bfloat16; do
  { date -u; uptime; } > "$out/train-$p.time"
  /usr/bin/time -v $S train-draft --kind eagle3 --target smollm2-135m --from "$out/train.h5" --draft-vocab 16384 \
      --ttt-steps 4 --steps 150 --batch 4 --lr 1e-3 --save-every 50 --holdout-every 5 --precision $p \
      --out "$out/head-$p" --quiet > "$out/train-$p.txt" 2>> "$out/train-$p.time"
  { date -u; uptime; } >> "$out/train-$p.time"
done

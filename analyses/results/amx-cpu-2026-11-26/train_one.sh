#!/usr/bin/env bash
# One EAGLE-3 training of SmolLM2-135M on train_precision.sh's recording, with its settings and seed plus the
# given options; its output in OUTDIR/train-NAME.txt, its time in OUTDIR/train-NAME.time. This session ran
#   bash train_one.sh OUTDIR loss --steps 150 --save-every 50 --prompt loss
#   bash train_one.sh OUTDIR context300 --steps 300 --save-every 100 --prompt context
set -eu
out=$(realpath "${1:?usage: bash train_one.sh OUTDIR NAME OPTIONS...}")
name=${2:?usage: bash train_one.sh OUTDIR NAME OPTIONS...}
shift 2
S=.venv/bin/specsim
cd "$(git rev-parse --show-toplevel)"
{ date -u; uptime; } > "$out/train-$name.time"
/usr/bin/time -v $S train-draft --kind eagle3 --target smollm2-135m --from "$out/train.h5" --draft-vocab 16384 \
    --ttt-steps 4 --batch 4 --lr 1e-3 --holdout-every 5 --precision float32 "$@" \
    --out "$out/head-$name" --quiet > "$out/train-$name.txt" 2>> "$out/train-$name.time"
{ date -u; uptime; } >> "$out/train-$name.time"

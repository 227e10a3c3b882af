#!/usr/bin/env bash
# Where a recording's GPU time goes: one capped `cache` run on a SmolLM2-135M-shaped stand-in (random weights, so
# every trajectory runs to 192 tokens), batch 128, EAGLE-3's hidden states, stats only; the run prints its phases.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=/tmp/sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 .gpu3/standin.py .gpu3 /tmp/standin 2>&1 | grep -v Writing | tee -a $OUT/env.txt
timeout -s TERM ${CAP:-60} python3 -m specsim cache --target /tmp/standin --prompts .gpu3/p128.jsonl \
  --max-new-tokens 192 --temperature 0.7,0.5,0 --hidden-states last,2,15,27 --store stats --batch-size 128 \
  --device cuda --out /tmp/s.h5 --quiet 2>&1 | tee $OUT/rec.txt

#!/usr/bin/env bash
# Device call 3: bench_train on CUDA with a SmolLM2-135M-shaped stand-in (random weights): float32 one trajectory at a
# time (the old step), float32 batched, bfloat16 batched, batch 16, same data, same run.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=/tmp/specsim-home
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/env.txt
git log -1 --format='commit %H' 2>/dev/null | tee -a $OUT/env.txt
python3 .gpu3/standin.py .gpu3 /tmp/standin 2>&1 | grep -v Writing | tee -a $OUT/env.txt
date
timeout ${BT_S:-200} python3 -m benchmarks.bench_train --target /tmp/standin --device ${DEV:-cuda} --steps ${STEPS:-40} \
  --per-category ${PER:-5} --batch 16 2>&1 | grep --line-buffered -v "Loading\|Converting\|Writing" | tee $OUT/bench_train.txt
date

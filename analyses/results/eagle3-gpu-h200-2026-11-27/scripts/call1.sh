#!/usr/bin/env bash
# Device call 1 of 2: keep the first half of the target, check the machine, smoke the record + EAGLE-3 training
# pipeline on a tiny random model on CUDA (the commands the real job runs).
mkdir -p /root/w && cp .gpu/part00 /root/w/ && ls -la /root/w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=/tmp/specsim-home
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, transformers, h5py, gguf; print('torch', torch.__version__, 'transformers', transformers.__version__, 'h5py', h5py.__version__, 'gguf', gguf.__version__)"
  nproc; free -g | head -2; python3 --version; } 2>&1 | tee $OUT/env.txt
date
timeout 150 python3 .gpu/smoke.py cuda 2>&1 | grep --line-buffered -v "Writing model shards\|^\s*$" | tee $OUT/smoke.txt
date

#!/usr/bin/env bash
# Device call 1 of 2: keep the first half of the target (the packaged SmolLM2-135M-Instruct GGUF, 98 MB: a call
# carries at most 64 MiB), note the machine, and run job.sh end to end on a tiny random model on CUDA (smoke.sh).
mkdir -p /root/w && cp .gpu/part00 /root/w/ && ls -la /root/w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=/tmp/specsim-home
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, transformers, h5py, numpy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'h5py', h5py.__version__, 'numpy', numpy.__version__)"
  nproc; free -g | head -2; python3 --version; } 2>&1 | tee $OUT/env.txt
mkdir -p $OUT/smoke
DEV=cuda SMOKE_REC_S=${SMOKE_REC_S:-12} SMOKE_DEADLINE_S=${SMOKE_DEADLINE_S:-50} OUT=$OUT/smoke timeout 80 bash .gpu/smoke.sh 2>&1 \
  | grep --line-buffered -v "it/s\]\|^	\|Writing model" | tee $OUT/smoke.txt

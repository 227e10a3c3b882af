#!/usr/bin/env bash
# GPU job: bench_speedup at B = 1, 4, 16 with the current code, then the plain-step diagnostic
mkdir -p /root/w && cp .p*/part0* /root/w/
cat /root/w/part00 /root/w/part01 > /root/w/smol.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /root/w/smol.gguf" | sha256sum -c || exit 1
[ -d /tmp/site/polars ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD SPECSIM_HOME=/tmp/specsim-home PYTHONUNBUFFERED=1
G=/root/w/smol.gguf
F="grep --line-buffered -v Loading\|Converting\|Writing"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, transformers, polars; print('torch', torch.__version__, 'transformers', transformers.__version__, 'polars', polars.__version__)" | tee -a $OUT/env.txt
git log -1 --format='commit %H' 2>/dev/null | tee -a $OUT/env.txt
date
timeout ${BENCH_S:-420} python3 -m benchmarks.bench_speedup --target $G --device cuda --dtype float32 --batches 1,4,16 \
  --drafts int8,layers:20 --categories writing,roleplay,reasoning,math,coding,extraction,stem,humanities \
  --per-category 2 --max-new-tokens 24 --tree chain:4 --tree kary:2,2 --repeats 5 \
  --workdir /root/w/bench --out $OUT/bench-speedup-gpu.csv 2>&1 | $F | tee $OUT/bench-speedup-gpu.log
cp /root/w/bench/profile.json $OUT/bench-speedup-gpu-profile.json 2>/dev/null
date
timeout ${DIAG_S:-90} python3 .gpu/diag.py $G cuda 2>&1 | $F | tee $OUT/plain-step-diag.txt
date

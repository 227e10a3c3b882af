#!/usr/bin/env bash
# GPU job 5: predicted vs live speedup again (the 2026-11-22 command), now that live runs alternate plain and speculative batches
mkdir -p /root/w && cp .p*/part0* /root/w/
source .gpu/setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 545 python3 -m benchmarks.bench_speedup --target $GGUF --device cuda --dtype float32 --batches 1,4,16 \
  --categories writing,roleplay,reasoning,math,coding,extraction,stem,humanities,translation,summarization,qa,math_reasoning,rag \
  --per-category 2 --max-new-tokens 24 --tree chain:4 --tree kary:2,2 --repeats 5 \
  --workdir /root/w/bench --out $OUT/bench-speedup-h100.csv 2>&1 | grep -v "Loading\|Converting" | tee $OUT/bench-speedup-h100.log
cp /root/w/bench/profile.json $OUT/bench-speedup-h100-profile.json 2>/dev/null

#!/usr/bin/env bash
# GPU job 3: full vs stats recording at batch size 8 and 13 (all 13 prompts at once) (the statistics' overhead where the GPU is busy)
source .gpu/setup.sh || exit 1
F="grep -v Loading\|Converting"
for b in 8 13; do
timeout 250 python3 -m benchmarks.bench_cache --device cuda --target $GGUF --draft int8 --draft layers:20 \
  --prompts 13 --max-new-tokens 128 --batch-size $b 2>&1 | $F | tee $OUT/bench_cache_h100_b$b.txt
done

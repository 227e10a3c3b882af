#!/usr/bin/env bash
# GPU job 1: recording throughput and the statistics' overhead (full vs stats), then sharded recording under torchrun
mkdir -p /root/w && cp .p*/part0* /root/w/
source .gpu/setup.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, transformers, polars; print('torch', torch.__version__, 'transformers', transformers.__version__, 'polars', polars.__version__)" | tee -a $OUT/env.txt
F="grep -v Loading\|Converting"
echo "== A: bench_cache"; date
timeout 260 python3 -m benchmarks.bench_cache --device cuda --target $GGUF --draft int8 --draft layers:20 \
  --prompts 13 --max-new-tokens 64 2>&1 | $F | tee $OUT/bench_cache_h100.txt
COMMON="--target $GGUF --draft int8 --draft layers:20 --per-category 1 --max-new-tokens 64 --temperature 0,0.7 --seed 0 --store stats --quiet"
echo "== B: unsharded"; date
s=$(date +%s%N); timeout 120 python3 -m specsim cache $COMMON --device cuda --out /root/w/whole.h5 2>&1 | $F | tail -5
echo "unsharded wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
echo "== C: torchrun, 2 shards on the one GPU"; date
s=$(date +%s%N); timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m specsim cache $COMMON \
  --shard auto --out "/root/w/part-{i}-of-{n}.h5" 2>&1 | $F | tail -8
echo "torchrun wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
python3 -m specsim merge /root/w/merged.h5 /root/w/part-0-of-2.h5 /root/w/part-1-of-2.h5 --quiet 2>&1 | tail -3
python3 -m benchmarks.compare_caches /root/w/whole.h5 /root/w/merged.h5 2>&1 | tee $OUT/shards_h100.txt
python3 .gpu/h5same.py /root/w/whole.h5 /root/w/merged.h5 2>&1 | tee -a $OUT/shards_h100.txt
cp /root/w/whole.h5 $OUT/gpu-13x64.h5; date

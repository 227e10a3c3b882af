#!/usr/bin/env bash
# GPU job 4: device-independent sampling. The CUDA tests, then the 13-prompt recording again (compared with a CPU one here)
mkdir -p /root/w && cp .p*/part0* /root/w/
source .gpu/setup.sh || exit 1
F="grep -v Loading\|Converting"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_recorder.py tests/test_attention.py -k "cuda or CUDA or sampl" 2>&1 | tail -5 | tee $OUT/pytest_cuda.txt
s=$(date +%s%N)
timeout 200 python3 -m specsim cache --target $GGUF --draft int8 --draft layers:20 --per-category 1 --max-new-tokens 64 \
  --temperature 0,0.7 --seed 0 --store stats --device cuda --out $OUT/gpu-13x64-sampler.h5 --quiet 2>&1 | $F | tail -3 | tee $OUT/record.txt
echo "wall $(( ($(date +%s%N) - s) / 1000000 )) ms" | tee -a $OUT/record.txt

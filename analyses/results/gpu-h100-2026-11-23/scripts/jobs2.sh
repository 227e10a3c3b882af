#!/usr/bin/env bash
# GPU job 2: the committed study's SmolLM2 recording (same command as `make study`) on the GPU, for throughput and CPU agreement
source .gpu/setup.sh || exit 1
F="grep -v Loading\|Converting"
date; s=$(date +%s%N)
timeout 420 python3 -m specsim cache --target $GGUF --draft int8 --draft layers:20 --per-category 10 --max-new-tokens 128 \
  --temperature 0,0.7 --seed 0 --store stats --batch-size 8 --device cuda --out /root/w/study-h100.h5 --quiet 2>&1 | $F | tail -8 | tee $OUT/study_h100.txt
echo "wall $(( ($(date +%s%N) - s) / 1000000 )) ms" | tee -a $OUT/study_h100.txt
python3 -m specsim inspect /root/w/study-h100.h5 --quiet 2>&1 | tail -25 | tee -a $OUT/study_h100.txt
cd /root/w && split -b 15M -d study-h100.h5 $OUT/study-h100.h5.part && sha256sum study-h100.h5 | tee -a $OUT/study_h100.txt; ls -la $OUT

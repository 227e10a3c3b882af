#!/usr/bin/env bash
# What SpecInfer's rule leaves on the table at nodes with i.i.d. candidates, SmolLM2-135M, 2-core CPU.
# Run from an empty folder; SPECSIM is the specsim command (default: specsim on PATH).
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
lscpu > lscpu.txt
OMP_NUM_THREADS=1 /usr/bin/time -v $SPECSIM cache --target smollm2-135m --draft layers:20 --draft int8 \
    --per-category 1 --max-new-tokens 64 --temperature 0.7 --out full.h5 > record.txt 2> record.log
for d in layers:20 int8; do
  f=$(echo $d | tr : -)
  OMP_NUM_THREADS=1 /usr/bin/time -f "%e s wall, %U s user" $SPECSIM bound full.h5 --draft $d --temperature 0.7 \
      --candidates 4 --quiet > bound-$f.txt 2> bound-$f.time
done

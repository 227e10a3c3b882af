#!/bin/bash
# The live checks of the committed study's profiles (Makefile, target study), run one at a time on the idle CPU
# after the study itself (2026-11-26); needs the caches and profiles `make study` writes under cache/
set -u
cd "$(dirname "$0")/../../../.."  # the repository root
S=.venv/bin/specsim
M=${OUT:-/tmp/study-checks}; mkdir -p $M
step() { name=$1; shift; echo "$(date +%T) start $name" >> $M/steps.txt; uptime >> $M/steps.txt
  /usr/bin/time -f "%e s wall %U+%S cpu" -o $M/$name.time "$@" > $M/$name.txt 2> $M/$name.err
  echo "$(date +%T) done $name rc=$? $(cat $M/$name.time)" >> $M/steps.txt; }
lscpu > $M/lscpu.txt
step validate_smollm2 $S validate cache/study-smollm2-validate.h5 --draft int8 --tree chain:4 \
    --tree file:cache/study-int8-optimal8.json --cost-profile cache/study-smollm2-profile.json --threads 2 --quiet \
    --out $M/validate_smollm2.csv
step validate_smollm2_b4 $S validate cache/study-smollm2-validate.h5 --draft int8 --tree chain:4 --batch 4 \
    --cost-profile cache/study-smollm2-profile.json --threads 2 --quiet --out $M/validate_smollm2_b4.csv
step cache_qwen_validate $S cache --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --categories coding,math,writing,extraction \
    --per-category 1 --max-new-tokens 64 --temperature 0 --seed 1 --store stats --batch-size 4 \
    --out cache/study-qwen-validate.h5
step validate_qwen $S validate cache/study-qwen-validate.h5 --draft qwen2.5-coder-0.5b --tree chain:4 \
    --cost-profile cache/study-qwen-profile.json --threads 2 --quiet --out $M/validate_qwen.csv
echo "$(date +%T) all done" >> $M/steps.txt

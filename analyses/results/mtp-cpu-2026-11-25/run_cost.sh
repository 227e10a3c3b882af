#!/bin/bash
# Issue 26: the trained MTP head's step costs measured, its speedup predicted and checked live (idle CPU).
set -u
cd "${1:-.}"  # the folder run.sh made (eval.h5, head/)
S=specsim
step() { name=$1; shift; echo "$(date +%T) start $name" >> steps.txt; uptime >> steps.txt
  /usr/bin/time -f "%e s wall %U+%S cpu" -o $name.time "$@" > $name.txt 2> $name.err
  echo "$(date +%T) done $name rc=$? $(cat $name.time)" >> steps.txt; }
lscpu > lscpu-cost.txt
step profile $S profile --for eval.h5 --tree chain:2 --tree chain:4 --draft mtp:head --draft layers:20 \
    --repeats 3 --warmup 1 --threads 2 --quiet --out mtp-profile.json
step simulate_cost $S simulate eval.h5 --draft mtp:head --draft layers:20 --tree chain:2 --tree chain:4 \
    --cost-profile mtp-profile.json --quiet
step validate_cost $S validate eval.h5 --draft mtp:head --draft layers:20 --tree chain:2 --tree chain:4 \
    --cost-profile mtp-profile.json --threads 2 --quiet --out validate_cost.csv
echo "$(date +%T) all done" >> steps.txt

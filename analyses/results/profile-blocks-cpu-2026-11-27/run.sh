#!/bin/bash
# profile --max-repeats as specsim's checkout /work/main has it ("new") against 54397a9's ("old": further passes over
# the whole grid), one after the other on the same machine; then each profile priced by simulate at batch 1 and 4.
# $1: a checkout at 54397a9 (git worktree add /work/old54 54397a9); $2: a label for the pair. Run from /work/e3big
# (the eval cache and head of ../eagle3-scale-cpu-2026-11-26/).
set -x
OLD=$1; LABEL=$2; NEW=/work/main; PY=/work/main/.venv/bin/python; OUT=/work/prof47
SP=$($PY -c "import site; print(site.getsitepackages()[0])")  # -S below: no editable-install hook, the checkout named
cd /work/e3big
ARGS="profile --for eval.h5 --tree chain:2 --tree chain:4 --draft eagle3:head --batch 1,4 --repeats 3 --max-repeats 20 --warmup 1 --threads 2 --quiet"
for who in new old; do
  src=$NEW; [ $who = old ] && src=$OLD
  git -C $src log --oneline -1 > $OUT/$who$LABEL.txt
  /usr/bin/time -f "%e s wall, %U s user, %S s system" env PYTHONPATH=$src:$SP $PY -S -m specsim $ARGS --out $OUT/$who$LABEL.json >> $OUT/$who$LABEL.txt 2>&1
  uptime >> $OUT/$who$LABEL.txt
done
for name in new$LABEL old$LABEL; do
  $PY -m specsim simulate eval.h5 --draft eagle3:head --tree chain:2 --tree chain:4 --batch 1 --batch 4 --cost-profile $OUT/$name.json --quiet > $OUT/sim_$name.txt 2>&1
done

#!/usr/bin/env bash
# EAGLE-3 on SmolLM2-135M, 2-core CPU, at four times the data of eagle3-context-cpu-2026-11-26: 467 training prompts
# x {greedy, T = 0.7} x up to 192 new tokens, trained with the cosine schedule (d500464). Run from an empty folder;
# SPECSIM is the specsim command, PY the python that has specsim.
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
PY=${PY:-python}
HERE=$(dirname "$0")
STEPS=${STEPS:-2000}
$PY "$HERE/../eagle3-cpu-2026-11-25/split_prompts.py"   # the first prompt of each category held out, as before
$PY "$HERE/heldout_prompts.py"                          # the 46 that --holdout-every 10 holds out
lscpu > lscpu.txt
# 1. training data: greedy and T = 0.7 trajectories with the states EAGLE-3 fuses (SmolLM2's layers 2, 15, 27)
/usr/bin/time -v timeout -s TERM 2400 $SPECSIM cache --target smollm2-135m --prompts train_prompts.jsonl \
    --max-new-tokens 192 --temperature 0,0.7 --hidden-states last,2,15,27 --store stats --batch-size 16 \
    --out train.h5 > record_train.log 2>&1 || true
$SPECSIM inspect train.h5 > train_inspect.txt
# 2. the head
/usr/bin/time -v $SPECSIM train-draft --kind eagle3 --target smollm2-135m --from train.h5 --draft-vocab 16384 \
    --ttt-steps 4 --steps "$STEPS" --batch 8 --lr 1e-3 --lr-schedule cosine --holdout-every 10 --save-every 200 \
    --out head > train.txt 2> train.log
# 3. held out: the head and layers:20 on the 13 evaluation prompts of the earlier runs and on the 46 prompts training
#    held out, replayed with the suffix draft beside them
for set in eval heldout46; do
  /usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts ${set}_prompts.jsonl --draft eagle3:head \
      --draft layers:20 --head-depth 4 --max-new-tokens 128 --temperature 0 --store stats --out $set.h5 \
      2> record_$set.log
  $SPECSIM simulate $set.h5 --tree chain:4 --tree chain:2 --draft eagle3:head --draft layers:20 --draft suffix \
      > simulate_$set.txt 2>&1
done
# 4. the head's steps priced and its speedup predicted, then checked live (greedy calls against the replay, and the
#    speedup over plain decoding of the same requests in the same run); then vLLM's eagle3 method with the head
$SPECSIM profile --for eval.h5 --tree chain:2 --tree chain:4 --draft eagle3:head --repeats 3 --warmup 1 --threads 2 \
    --quiet --out eagle3-profile.json > profile.txt 2>&1
$SPECSIM simulate eval.h5 --draft eagle3:head --tree chain:2 --tree chain:4 --cost-profile eagle3-profile.json \
    --quiet > simulate_cost.txt 2>&1
/usr/bin/time -v $SPECSIM validate eval.h5 --draft eagle3:head --tree chain:2 --tree chain:4 \
    --cost-profile eagle3-profile.json --threads 2 --quiet --out validate_cost.csv > validate_cost.txt 2> validate_cost.log
/usr/bin/time -v $SPECSIM validate eval.h5 --engine vllm --draft eagle3:head --tree chain:4 --tree chain:2 \
    > validate_vllm.txt 2> validate_vllm.log
# 5. the profile again with 9 rounds per entry (the first one's leave-one-out error was 241%: the head's steps are
#    6-15 ms, a few scheduler ticks), and the prediction from it
$SPECSIM profile --for eval.h5 --tree chain:2 --tree chain:4 --draft eagle3:head --repeats 9 --warmup 1 --threads 2 \
    --quiet --out eagle3-profile-r9.json > profile-r9.txt 2>&1
$SPECSIM simulate eval.h5 --draft eagle3:head --tree chain:2 --tree chain:4 --cost-profile eagle3-profile-r9.json \
    --quiet > simulate_cost-r9.txt 2>&1

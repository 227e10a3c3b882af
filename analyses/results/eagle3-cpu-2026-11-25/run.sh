#!/usr/bin/env bash
# EAGLE-3 on SmolLM2-135M, 2-core CPU: train on Spec-Bench prompts 2.. of each category, evaluate on the first.
# Run from an empty folder; SPECSIM is the specsim command (default: specsim on PATH). Steps and their logs as
# committed beside this script.
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
python "$(dirname "$0")/split_prompts.py"   # the prompt split: the first prompt of each category is held out for evaluation
lscpu > lscpu.txt
# 1. training data: the target's greedy outputs with the states EAGLE-3 fuses (SmolLM2 has 30 layers: 2, 15, 27)
/usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts train_prompts.jsonl --max-new-tokens 128 \
    --temperature 0 --hidden-states last,2,15,27 --store stats --batch-size 8 --out train.h5 2> record_train.log
# 2. the head (Ctrl-C keeps the last checkpoint)
/usr/bin/time -v $SPECSIM train-draft --kind eagle3 --target smollm2-135m --from train.h5 --draft-vocab 16384 \
    --ttt-steps 4 --steps "${STEPS:-1200}" --batch 4 --lr 1e-3 --save-every 100 --out head > train.txt 2> train.log
# 3. evaluation on the held-out prompts, beside layers:20 (and the model-free suffix draft, which needs no column)
/usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts eval_prompts.jsonl --draft eagle3:head \
    --draft layers:20 --head-depth 4 --max-new-tokens 128 --temperature 0 --store stats --out eval.h5 2> record_eval.log
$SPECSIM simulate eval.h5 --tree chain:4 --tree chain:2 --draft eagle3:head --draft layers:20 --draft suffix \
    > simulate.txt 2>&1
# 4. live decoding against the replay, and vLLM's eagle3 method against the replay
$SPECSIM validate eval.h5 --draft eagle3:head --tree chain:4 --tree chain:2 > validate_live.txt 2>&1
$SPECSIM validate eval.h5 --engine vllm --draft eagle3:head --tree chain:4 --tree chain:2 > validate_vllm.txt 2>&1

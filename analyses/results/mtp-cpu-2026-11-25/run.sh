#!/usr/bin/env bash
# MTP (DeepSeek-V3 wiring) on SmolLM2-135M, 2-core CPU: the held-out split of eagle3-cpu-2026-11-25 (the first
# Spec-Bench prompt of each category held out), so its simulate.txt rows compare with that run's EAGLE-3 head.
# Run from an empty folder; SPECSIM is the specsim command (default: specsim on PATH). RECORD_S and TRAIN_S cap the
# two long steps (SIGTERM keeps what was recorded and the last checkpoint).
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
python "$(dirname "$0")/../eagle3-cpu-2026-11-25/split_prompts.py"   # the prompt split: as in eagle3-cpu-2026-11-25
lscpu > lscpu.txt
# 1. training data: the target's greedy outputs with its last hidden state (DeepSeek-style MTP reads only that)
/usr/bin/time -v timeout -s TERM "${RECORD_S:-1200}" $SPECSIM cache --target smollm2-135m --prompts train_prompts.jsonl \
    --max-new-tokens 128 --temperature 0 --hidden-states last --store stats --batch-size 8 --out train.h5 \
    2> record_train.log || true
$SPECSIM inspect train.h5 > train_inspect.txt
# 2. the MTP layer, training-time test 4 deep (depth d weighted 0.6^(d-1))
/usr/bin/time -v timeout -s TERM "${TRAIN_S:-1800}" $SPECSIM train-draft --kind mtp --target smollm2-135m \
    --from train.h5 --ttt-steps 4 --steps "${STEPS:-600}" --batch 4 --lr 1e-3 --save-every 50 --out head \
    > train.txt 2> train.log || true
# 3. evaluation on the held-out prompts, beside layers:20 and the model-free suffix draft
/usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts eval_prompts.jsonl --draft mtp:head --draft layers:20 \
    --head-depth 4 --max-new-tokens 128 --temperature 0 --store stats --out eval.h5 2> record_eval.log
$SPECSIM simulate eval.h5 --tree chain:4 --tree chain:2 --draft mtp:head --draft layers:20 --draft suffix \
    > simulate.txt 2>&1
# 4. live decoding with the MTP layer against the replay
$SPECSIM validate eval.h5 --draft mtp:head --tree chain:4 --tree chain:2 > validate_live.txt 2>&1

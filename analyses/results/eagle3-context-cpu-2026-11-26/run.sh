#!/usr/bin/env bash
# EAGLE-3 on SmolLM2-135M, 2-core CPU: the same data trained twice, the head shown the prompt (--prompt context,
# the default since 7dd98de) and blind to it (--prompt none, how heads were trained before), then both recorded
# and replayed on the 13 held-out Spec-Bench prompts. Run from an empty folder; SPECSIM is the specsim command.
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
STEPS=${STEPS:-600}
python "$(dirname "$0")/../eagle3-cpu-2026-11-25/split_prompts.py"   # as that run: the first prompt of each category held out for evaluation
lscpu > lscpu.txt
# 1. training data: the target's greedy outputs with the states EAGLE-3 fuses (SmolLM2 has 30 layers: 2, 15, 27);
#    capped at 40 min (SIGTERM keeps the committed trajectories; `cache $RECORD --resume` would record the rest)
RECORD="--target smollm2-135m --prompts train_prompts.jsonl --max-new-tokens 128 --temperature 0 \
    --hidden-states last,2,15,27 --store stats --batch-size 8 --out train.h5"
/usr/bin/time -v timeout -s TERM 2400 $SPECSIM cache $RECORD > record_train.log 2>&1 || true
$SPECSIM inspect train.h5 > train_inspect.txt
# 2. the two heads, trained side by side with one thread each (same data, seed, steps and settings)
for use in context none; do
  OMP_NUM_THREADS=1 /usr/bin/time -v $SPECSIM train-draft --kind eagle3 --target smollm2-135m --from train.h5 \
      --draft-vocab 16384 --ttt-steps 4 --steps "$STEPS" --batch 4 --lr 1e-3 --save-every 100 --prompt $use \
      --out head-$use > train-$use.txt 2> train-$use.log &
done
wait
# 3. held-out evaluation: both heads and layers:20 recorded on the 13 held-out prompts, replayed (and the suffix draft)
/usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts eval_prompts.jsonl --draft eagle3:head-context \
    --draft eagle3:head-none --draft layers:20 --head-depth 4 --max-new-tokens 128 --temperature 0 --store stats \
    --out eval.h5 2> record_eval.log
$SPECSIM simulate eval.h5 --tree chain:4 --tree chain:2 --draft eagle3:head-context --draft eagle3:head-none \
    --draft layers:20 --draft suffix > simulate.txt 2>&1
# 4. the context-trained head decoded live against the replay
$SPECSIM validate eval.h5 --draft eagle3:head-context --tree chain:4 > validate_live.txt 2>&1

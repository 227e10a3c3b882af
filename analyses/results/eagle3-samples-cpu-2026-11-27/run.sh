#!/usr/bin/env bash
# More samples per prompt or more prompts? The data curve's quarter (97 prompts x T = 0, 0.7) recorded again with four
# trajectories per prompt (T = 0, 0.5, 0.7, 0.9), trained with the half's recipe and steps (700 x 8: the same positions
# and compute as 194 prompts x 2), then recorded and replayed on the same 13 + 46 held-out prompts.
# Run from a folder holding prompts.jsonl (make_prompts.py: the 97 quarter prompts, then one held-out prompt, index 97,
# the one --holdout-every 98 holds out); E3BIG: the folder of ../eagle3-scale-cpu-2026-11-26/ (eval, heldout46 prompts).
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
E3BIG=${E3BIG:-/work/e3big}
lscpu > lscpu.txt
/usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts prompts.jsonl --max-new-tokens 192 \
    --temperature 0,0.5,0.7,0.9 --hidden-states last,2,15,27 --store stats --batch-size 16 --out train4.h5 \
    > record_train.log 2>&1
$SPECSIM inspect train4.h5 > train_inspect.txt
/usr/bin/time -v $SPECSIM train-draft --kind eagle3 --target smollm2-135m --from train4.h5 --draft-vocab 16384 \
    --ttt-steps 4 --steps 700 --batch 8 --lr 1e-3 --lr-schedule cosine --holdout-every 98 --save-every 100 \
    --out head > train.txt 2> train.log
for set in eval heldout46; do
  /usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts "$E3BIG/${set}_prompts.jsonl" --draft eagle3:head \
      --head-depth 4 --max-new-tokens 128 --temperature 0 --store stats --out "${set}.h5" 2> "record_${set}.log"
  $SPECSIM simulate "${set}.h5" --tree chain:4 --tree chain:2 --draft eagle3:head > "simulate_${set}.txt" 2>&1
done

#!/usr/bin/env bash
# EAGLE-3 on SmolLM2-135M with 2.6x the training positions of ../eagle3-scale-cpu-2026-11-26/: its Spec-Bench cache
# (E3BIG/train.h5: 467 prompts x {greedy, T = 0.7} x 192 tokens) and a second cache recorded from 603 prompts SmolLM2
# wrote itself (`write-prompts`), trained on together (`train-draft --from A --from B`, 095ded5), then recorded and
# replayed on the same 13 + 46 held-out prompts and paired against the head trained on E3BIG/train.h5 alone.
# Run from an empty folder; E3BIG: the folder of ../eagle3-scale-cpu-2026-11-26/ (train.h5, head/, eval and heldout46
# prompts and caches). LIMIT: the training's --time-limit in seconds.
set -uo pipefail
SPECSIM=${SPECSIM:-specsim}
PY=${PY:-python}
E3BIG=${E3BIG:-/work/e3big}
LIMIT=${LIMIT:-3600}
HERE=$PWD
PAIRED=$(dirname "$0")/../eagle3-samples-cpu-2026-11-27/paired.py
lscpu > lscpu.txt
# 1. prompts written by SmolLM2 (Magpie), at most 15 minutes; 2. their greedy and T = 0.7 trajectories with the states
#    EAGLE-3 fuses, at most 55 minutes (SIGTERM keeps every committed trajectory)
/usr/bin/time -v timeout -s INT 900 $SPECSIM write-prompts --model smollm2-135m --count 1200 --seed 51 \
    --out generated_prompts.jsonl > write_prompts.log 2>&1
/usr/bin/time -v timeout -s TERM 3300 $SPECSIM cache --target smollm2-135m --prompts generated_prompts.jsonl \
    --max-new-tokens 192 --temperature 0,0.7 --hidden-states last,2,15,27 --store stats --batch-size 16 \
    --out train_generated.h5 > record_train.log 2>&1
$SPECSIM inspect train_generated.h5 > train_inspect.txt 2>&1
# 3. the head on both caches, each holding out its every 10th prompt (the first cache's are the 46 of heldout46)
/usr/bin/time -v $SPECSIM train-draft --kind eagle3 --target smollm2-135m --from $E3BIG/train.h5 \
    --from train_generated.h5 --draft-vocab 16384 --ttt-steps 4 --time-limit $LIMIT --batch 8 --lr 1e-3 \
    --lr-schedule cosine --holdout-every 10 --save-every 200 --out head > train.txt 2> train.log
# 4. held out: recorded and replayed on the 13 evaluation prompts and the 46 Spec-Bench prompts training held out,
#    with the suffix draft beside it; per prompt against the head trained on E3BIG/train.h5 alone (same trajectories)
mkdir -p per_request
for set in eval heldout46; do
  /usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts $E3BIG/${set}_prompts.jsonl --draft eagle3:head \
      --head-depth 4 --max-new-tokens 128 --temperature 0 --store stats --out $set.h5 2> record_$set.log
  $SPECSIM simulate $set.h5 --tree chain:4 --tree chain:2 --draft eagle3:head --draft suffix > simulate_$set.txt 2>&1
  for tree in chain:4 chain:2; do
    $SPECSIM simulate $set.h5 --tree $tree --draft eagle3:head --quiet \
        --per-request per_request/new-$set-${tree/:/}.csv > /dev/null 2>&1
    (cd $E3BIG && $SPECSIM simulate $set.h5 --tree $tree --draft eagle3:head --quiet \
        --per-request $HERE/per_request/old-$set-${tree/:/}.csv > /dev/null 2>&1)
    $PY $PAIRED old=per_request/old-$set-${tree/:/}.csv new=per_request/new-$set-${tree/:/}.csv \
        > paired_${set}_${tree/:/}.txt 2>&1
  done
done
# 5. the new head live (specsim's engine) and in vLLM's eagle3 method, against the replay, call for call
$SPECSIM validate eval.h5 --engine vllm --draft eagle3:head --tree chain:4 --tree chain:2 > validate_vllm.txt 2> validate_vllm.log
$SPECSIM validate eval.h5 --draft eagle3:head --tree chain:4 --tree chain:2 --threads 2 --quiet > validate_live.txt 2> validate_live.log

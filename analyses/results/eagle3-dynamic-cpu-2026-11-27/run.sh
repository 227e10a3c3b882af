#!/usr/bin/env bash
# Dynamic trees over a trained EAGLE-3 head on SmolLM2-135M, 2-core CPU: a head trained here in ~15 min on Spec-Bench
# prompts 2.. of each category, recorded with its EAGLE-2 expansion (--expand topk=4,depth=4) beside layers:20 on the
# 13 held-out first prompts, replayed (chains and dynamic trees), and decoded live against the replay.
# Run from an empty folder; SPECSIM is the specsim command. RECORD_S / TRAIN_S bound the two long steps.
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
PY=${PY:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
lscpu > lscpu.txt
$PY "$HERE/../eagle3-cpu-2026-11-25/split_prompts.py"   # first prompt of each category held out (eval_prompts.jsonl)
# 1. training data, cut by SIGTERM after RECORD_S seconds (every committed trajectory stays)
timeout -s TERM "${RECORD_S:-720}" /usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts train_prompts.jsonl \
    --max-new-tokens 128 --temperature 0 --hidden-states last,2,15,27 --store stats --batch-size 8 --out train.h5 \
    2> record_train.log || true
$SPECSIM inspect train.h5 --quiet > train_inspect.txt 2>&1
# 2. the head, as many steps as TRAIN_S seconds hold
/usr/bin/time -v $SPECSIM train-draft --kind eagle3 --target smollm2-135m --from train.h5 --draft-vocab 16384 \
    --ttt-steps 4 --time-limit "${TRAIN_S:-900}" --batch 4 --lr 1e-3 --out head > train.txt 2> train.log
# 3. the held-out prompts with the head's and layers:20's expansions (K = 4, four levels)
/usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts eval_prompts.jsonl --draft eagle3:head \
    --draft layers:20 --head-depth 4 --expand topk=4,depth=4 --max-new-tokens 128 --temperature 0 --store stats \
    --out eval.h5 2> record_eval.log
$SPECSIM inspect eval.h5 --quiet > eval_inspect.txt 2>&1
TREES="--tree chain:2 --tree chain:4 --tree dynamic:topk=4,depth=4,tokens=4 --tree dynamic:topk=4,depth=4,tokens=8
       --tree dynamic:topk=4,depth=4,tokens=16 --tree dynamic:topk=4,depth=3,tokens=8"
$SPECSIM simulate eval.h5 $TREES --draft eagle3:head --draft layers:20 > simulate.txt 2>&1
# 4. this machine's costs, then live decoding against the replay with the speedups priced by them
$SPECSIM profile --for eval.h5 --draft eagle3:head $TREES --out profile.json > profile.log 2>&1
$SPECSIM validate eval.h5 --draft eagle3:head --tree chain:4 --tree dynamic:topk=4,depth=4,tokens=8 \
    --tree dynamic:topk=4,depth=4,tokens=16 --cost-profile profile.json > validate_live.txt 2>&1
# 5. per prompt: each dynamic tree against chain:4, paired on the same prompts (the same head, the same trajectories)
mkdir -p per_request
for tree in chain:4 dynamic:topk=4,depth=4,tokens=4 dynamic:topk=4,depth=4,tokens=8 dynamic:topk=4,depth=4,tokens=16; do
  for d in eagle3:head layers:20; do
    $SPECSIM simulate eval.h5 --tree $tree --draft $d --quiet --per-request "per_request/${d%%:*}-${tree//[:=,]/_}.csv" \
        > /dev/null 2>&1
  done
done
for d in eagle3 layers; do
  $PY "$HERE/../eagle3-samples-cpu-2026-11-27/paired.py" chain4="per_request/$d-chain_4.csv" \
      dyn4="per_request/$d-dynamic_topk_4_depth_4_tokens_4.csv" dyn8="per_request/$d-dynamic_topk_4_depth_4_tokens_8.csv" \
      dyn16="per_request/$d-dynamic_topk_4_depth_4_tokens_16.csv" > "paired_$d.txt" 2>&1
done
# 6. batch 4, continuous batching: each request grows its own tree in the shared head forwards
$SPECSIM validate eval.h5 --draft eagle3:head --tree dynamic:topk=4,depth=4,tokens=8 --tree dynamic:topk=4,depth=3,tokens=6 \
    --batch 4 --batching continuous > validate_b4.txt 2>&1
# 7. T = 0.7: the trees verified as point masses (EAGLE's rule at any T), live acceptance against the exact replay
/usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts eval_prompts.jsonl --draft eagle3:head --head-depth 4 \
    --expand topk=4,depth=4 --max-new-tokens 128 --temperature 0.7 --store stats --out eval07.h5 2> record_eval07.log
$SPECSIM validate eval07.h5 --draft eagle3:head --policy sample --temperature 0.7 --repeats 3 \
    --tree dynamic:topk=4,depth=4,tokens=8 --tree chain:4 > validate_t07.txt 2>&1
echo ALLDONE

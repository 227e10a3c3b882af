#!/usr/bin/env bash
# On this CPU, after the device run: the head trained on the H200 at batch 128 (head/, rebuilt by
# ../../eagle3-gpu-h200-2026-11-27b/scripts/unpack.py) recorded with its EAGLE-2 expansion (--expand topk=4,depth=4)
# on the 13 evaluation and the 46 held-out Spec-Bench prompts (T = 0, 128 new tokens), replayed exactly as chains and
# dynamic trees, paired per prompt with the heads of ../eagle3-gpu-h200-2026-11-27d (their per-prompt CSVs, the same
# greedy trajectories: the suffix draft's per-prompt rows, which depend on nothing but the trajectory, must equal
# that run's), then this CPU's costs, SGLang's configuration chosen by speed, and live decoding against the replay.
# Run from the folder holding head/. SPECSIM is the specsim command, PY the python that has specsim.
set -euo pipefail
SPECSIM=${SPECSIM:-/work/main/.venv/bin/specsim}
PY=${PY:-/work/main/.venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
R=$HERE/../..
D=$R/eagle3-gpu-h200-2026-11-27d/cpu/per_request
lscpu > "$HERE/lscpu.txt"
$PY "$R/eagle3-cpu-2026-11-25/split_prompts.py" && $PY "$R/eagle3-scale-cpu-2026-11-26/heldout_prompts.py"
TREES="--tree chain:2 --tree chain:4 --tree dynamic:topk=4,depth=4,tokens=4 --tree dynamic:topk=4,depth=4,tokens=8
       --tree dynamic:topk=4,depth=4,tokens=16"
mkdir -p per_request "$HERE/per_request"
for set in eval heldout46; do
  [ -f "${set}.h5" ] || /usr/bin/time -v $SPECSIM cache --target smollm2-135m --prompts "${set}_prompts.jsonl" \
      --draft eagle3:head --head-depth 4 --expand topk=4,depth=4 --max-new-tokens 128 --temperature 0 --store stats \
      --out "${set}.h5" 2> "record_${set}.log"
  $SPECSIM simulate "${set}.h5" $TREES --draft eagle3:head --draft suffix > "$HERE/simulate_${set}.txt" 2>&1
  for tree in chain:4 chain:2 dynamic:topk=4,depth=4,tokens=4 dynamic:topk=4,depth=4,tokens=8 \
      dynamic:topk=4,depth=4,tokens=16; do
    t=${tree//[:=,]/_}
    $SPECSIM simulate "${set}.h5" --tree $tree --draft eagle3:head --quiet --per-request "per_request/B128-$set-$t.csv" \
        > /dev/null 2>&1
  done
  for tree in chain:4 chain:2; do
    $SPECSIM simulate "${set}.h5" --tree $tree --draft suffix --quiet --per-request "per_request/Suffix-$set-${tree/:/}.csv" \
        > /dev/null 2>&1
    # the same trajectories as the earlier run: the model-free draft's rows, compared as numbers
    $PY - "per_request/Suffix-$set-${tree/:/}.csv" "$D/Suffix-$set-${tree/:/}.csv" <<'PY' >> "$HERE/trajectories.txt"
import csv, sys
cols = ["prompt_index", "tokens", "target_calls", "accepted", "drafted"]
rows = [[[float(r[c]) for c in cols] for r in csv.DictReader(open(p))] for p in sys.argv[1:]]
same = rows[0] == rows[1]
print(f"{sys.argv[1]}: {len(rows[0])} prompts, suffix rows {'equal' if same else 'DIFFERENT'} to the earlier run's")
assert same
PY
    $PY "$R/eagle3-samples-cpu-2026-11-27/paired.py" batch64="$D/New-$set-${tree/:/}.csv" \
        batch128="per_request/B128-$set-${tree/:/_}.csv" cpu280k="$D/Old-$set-${tree/:/}.csv" \
        layers20="$D/L20-$set-${tree/:/}.csv" suffix="per_request/Suffix-$set-${tree/:/}.csv" \
        > "$HERE/paired_${set}_${tree/:/}.txt" 2>&1
  done
  $PY "$R/eagle3-samples-cpu-2026-11-27/paired.py" chain4="per_request/B128-$set-chain_4.csv" \
      dyn8="per_request/B128-$set-dynamic_topk_4_depth_4_tokens_8.csv" \
      dyn16="per_request/B128-$set-dynamic_topk_4_depth_4_tokens_16.csv" > "$HERE/paired_${set}_dynamic.txt" 2>&1
  # at equal verified budget: the suffix draft's chain:4 against the head's dynamic tree of 4 (and 16) tokens
  $PY "$R/eagle3-samples-cpu-2026-11-27/paired.py" suffix="per_request/Suffix-$set-chain4.csv" \
      dyn4="per_request/B128-$set-dynamic_topk_4_depth_4_tokens_4.csv" \
      dyn16="per_request/B128-$set-dynamic_topk_4_depth_4_tokens_16.csv" > "$HERE/paired_${set}_suffix.txt" 2>&1
done
cp per_request/*.csv "$HERE/per_request/"
# this machine's costs for the trees replayed, then SGLang's configuration chosen by speed (measured costs)
$SPECSIM profile --for eval.h5 --draft eagle3:head $TREES --out profile.json > profile.log 2>&1
cp profile.json "$HERE/"
$SPECSIM optimize eval.h5 --draft eagle3:head --budget 16 --cost-profile profile.json --emit sglang flags_opt.txt \
    --overwrite > "$HERE/optimize_emit.txt" 2>&1
cat flags_opt.txt >> "$HERE/optimize_emit.txt"
echo ALLDONE

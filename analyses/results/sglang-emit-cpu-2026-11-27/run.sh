#!/usr/bin/env bash
# An EAGLE-3 head handed back to SGLang: the head and cache of ../eagle3-dynamic-cpu-2026-11-27 (its run.sh makes
# them: head/, eval.h5 recorded with --expand topk=4,depth=4 on the 13 held-out prompts, profile.json measured on this
# CPU). Run from that folder; SPECSIM is the specsim command, PY the python that has specsim.
set -euo pipefail
SPECSIM=${SPECSIM:-specsim}
PY=${PY:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
lscpu > "$HERE/lscpu.txt"
# 1. the one configuration replayed, as SGLang's flags (the head written out in the reference layout SGLang loads)
$SPECSIM simulate eval.h5 --draft eagle3:head --tree dynamic:topk=4,depth=4,tokens=8 --emit sglang flags_dyn8.txt \
    --overwrite > "$HERE/simulate_emit.txt" 2>&1
cp flags_dyn8.txt "$HERE/"
# 2. that directory read by SpecForge's class (the one that writes the layout) against specsim's head
(cd "$(mktemp -d)" && $PY "$HERE/check_specforge.py" "$OLDPWD/head" "$(cut -d' ' -f4 "$OLDPWD/flags_dyn8.txt")") \
    > "$HERE/check_specforge.txt" 2>&1
# 3. SGLang's configuration chosen by speed among the chains and dynamic trees the recording replays: with this
#    CPU's measured costs, and with an assumed draft cost (labelled as one)
for cost in "--cost-profile profile.json" "--cost c=0.05"; do
  $SPECSIM optimize eval.h5 --draft eagle3:head --budget 16 $cost --emit sglang flags_opt.txt --overwrite 2>&1 \
      | grep -v "^writing\|it/s" || true
  [ -f flags_opt.txt ] && cat flags_opt.txt && rm flags_opt.txt
done > "$HERE/optimize_emit.txt"
{ echo; echo "# vLLM's choice, chains only, the same measured costs:"
  $SPECSIM optimize eval.h5 --draft eagle3:head --budget 16 --cost-profile profile.json --emit vllm spec.json \
      --overwrite 2>&1 | grep -v "^writing\|it/s" || true; } >> "$HERE/optimize_emit.txt"
# 4. the configuration step 3 chose with this CPU's measured costs, decoded live against its prediction (specsim's live
#    engine: SGLang does not run here)
/usr/bin/time -v $SPECSIM validate eval.h5 --draft eagle3:head --tree dynamic:topk=4,depth=1,tokens=2 \
    --cost-profile profile.json --threads 2 --quiet > "$HERE/validate_chosen.txt" 2> "$HERE/validate_chosen.time.txt"
# 5. in one run: that tree, chain:4 (the EAGLE-3 default of the earlier runs) and chain:1 (the best chain)
/usr/bin/time -v $SPECSIM validate eval.h5 --draft eagle3:head --tree dynamic:topk=4,depth=1,tokens=2 --tree chain:4 \
    --tree chain:1 --cost-profile profile.json --threads 2 --quiet > "$HERE/validate_three.txt" \
    2> "$HERE/validate_three.time.txt"
echo ALLDONE

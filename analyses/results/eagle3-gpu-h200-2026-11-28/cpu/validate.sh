#!/usr/bin/env bash
# After run.sh: the tree `optimize` chose with this CPU's measured costs (dynamic:topk=4,depth=1,tokens=2), chain:4
# (the issue's configuration) and dynamic:topk=4,depth=4,tokens=8, decoded live in one run against their
# predictions (specsim's live engine: SGLang does not run here). Run from run.sh's folder.
set -euo pipefail
SPECSIM=${SPECSIM:-/work/main/.venv/bin/specsim}
HERE=$(cd "$(dirname "$0")" && pwd)
/usr/bin/time -v $SPECSIM validate eval.h5 --draft eagle3:head --tree dynamic:topk=4,depth=1,tokens=2 --tree chain:4 \
    --tree dynamic:topk=4,depth=4,tokens=8 --cost-profile profile.json --threads 2 --quiet \
    > "$HERE/validate_live.txt" 2> "$HERE/validate_live.time.txt"
echo ALLDONE

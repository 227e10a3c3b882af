#!/usr/bin/env bash
# Device call A of 2 for the session after 11-28: 27d's call A (carried as callA-27d.sh: the target's first half
# kept, the machine noted, the smoke on a stand-in), then profile_train.py on the smoke recording: a training step's
# seconds with the trajectories in host memory (as train-draft keeps them) and moved to the device once, and where
# they go (11-28 found the GPU 60-63% busy while training, the host the bound). Environment: 27d's, and
# PROFILE_BATCH (64).
set -u
P=${P:-.gpu}; W=${W:-/root/w}
bash $P/callA-27d.sh || exit $?
START=$(date +%s); at() { echo "[$(( $(date +%s) - START )) s] $*"; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=${SPECSIM_HOME:-/tmp/specsim-home}
at "a training step profiled: the trajectories in host memory (as train-draft) against moved to the device once"
timeout -k 10 150 python3 $P/profile_train.py ${STANDIN:-$W/standin} $W/smoke.h5 $OUT ${PROFILE_BATCH:-64} 12 \
  ${VOCAB:-16384} > $OUT/profile_train.log 2>&1
grep -E "^device|^==" $OUT/profile_train.log
at "done"

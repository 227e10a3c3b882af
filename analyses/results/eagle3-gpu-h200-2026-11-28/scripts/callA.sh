#!/usr/bin/env bash
# Device call A of 2 for the session after 11-28: 27d's call A (carried as callA-27d.sh: the target's first half
# kept, the machine noted, the smoke on a stand-in), then profile_train.py on the smoke recording: a training step's
# seconds, and where they go, three ways: 11-28's step with the trajectories in host memory (as 11-28 trained: the
# GPU 60-63% busy, the host the bound), the same moved to the device once, and train-draft's step now (moved once,
# nothing read back before the loss). Environment: 27d's, and PROFILE_BATCH (64).
set -u
P=${P:-.gpu}; W=${W:-/root/w}
bash $P/callA-27d.sh || exit $?
START=$(date +%s); at() { echo "[$(( $(date +%s) - START )) s] $*"; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=${SPECSIM_HOME:-/tmp/specsim-home}
at "a training step profiled: 11-28's in host memory, 11-28's moved to the device once, train-draft's now"
timeout -k 10 200 python3 $P/profile_train.py ${STANDIN:-$W/standin} $W/smoke.h5 $OUT ${PROFILE_BATCH:-64} 12 \
  ${VOCAB:-16384} > $OUT/profile_train.log 2>&1
grep -E "^device|^==" $OUT/profile_train.log
at "done"

#!/usr/bin/env bash
# The payload folders of ../../eagle3-gpu-h200-2026-11-27d/scripts/payload.sh (run from the repository root, with .venv
# set up), with this folder's call A in .gpu: callA.sh runs 27d's (carried as callA-27d.sh), then profile_train.py
# (with the 11-28 training step beside it, from git, to compare with train-draft's step now).
# Then: bash analyses/results/eagle3-gpu-h200-2026-11-27d/scripts/dryrun.sh DIR on this CPU; on the device,
# `bash .gpu/callA.sh` (carry .gpu), then `DEADLINE_S=585 bash .gpu2/callB.sh` (carry .gpu2, 27d's, batch 64).
set -euo pipefail
R=analyses/results
bash $R/eagle3-gpu-h200-2026-11-27d/scripts/payload.sh
mv .gpu/callA.sh .gpu/callA-27d.sh
cp $R/eagle3-gpu-h200-2026-11-28/scripts/callA.sh $R/eagle3-gpu-h200-2026-11-28/scripts/profile_train.py .gpu/
git show 71cf563:specsim/record/train_loss.py > .gpu/train_loss_1128.py  # the step 11-28 trained with, to compare
du -sh .gpu

#!/usr/bin/env bash
# The two device calls end to end on this CPU before a lease: callA.sh on a tiny random model, callB.sh on the real
# target at 8 new tokens, from the payload folders .gpu and .gpu2 (run from the repository root). As on the device:
# polars cannot be imported, the gguf wheel is installed into /tmp/site, and `nvidia-smi -l` runs until it is
# killed (a stand-in on the PATH: the real one never ends, which a script's waits must allow for).
# Usage: bash dryrun.sh DIR (an empty scratch folder)
set -eu
D=$1; mkdir -p $D/bin $D/out1 $D/out2
printf '#!/bin/sh\ncase "$*" in *" -l "*) exec sleep 100000;; *) echo "dry run, no GPU";; esac\n' > $D/bin/nvidia-smi
chmod +x $D/bin/nvidia-smi
export PATH=$D/bin:$PATH
rm -rf /tmp/site && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/*.whl
mkdir -p /tmp/site/polars && echo 'raise ImportError("no polars on the device")' > /tmp/site/polars/__init__.py
python3 - "$D" <<'PY'
import json, sys
from pathlib import Path
from tests.conftest import build_tiny_model
tiny = build_tiny_model(Path(sys.argv[1]) / "tiny", hidden=64, layers=8)
config = json.loads((tiny / "config.json").read_text())
config["max_position_embeddings"] = 8192  # byte-level prompts are long
(tiny / "config.json").write_text(json.dumps(config))
PY
P=.gpu W=$D/w DEV=cpu MNT=8 HS=last,2,4,5 N=20 VOCAB=256 STANDIN=$D/tiny OUT=$D/out1 \
  SPECSIM_HOME=$D/home timeout 300 bash .gpu/callA.sh
P=.gpu2 W=$D/w DEV=cpu DEADLINE_S=260 REC_S=100 PACK_S=25 MNT=8 TS=0,0.7 TG=0 SB=16 BATCH=8 OUT=$D/out2 \
  SPECSIM_HOME=$D/home timeout 400 bash .gpu2/callB.sh
ls $D/out2

#!/usr/bin/env bash
# The device's smoke (call 1): job.sh end to end on a tiny random model (no weights to carry), on DEV.
set -u
export START_EPOCH=$(date +%s)
python3 - <<'PY'
import json
from pathlib import Path
from tests.conftest import build_tiny_model
tiny = build_tiny_model(Path("/tmp/smoke/tiny"), hidden=64, layers=8)
config = json.loads((tiny / "config.json").read_text())
config["max_position_embeddings"] = 8192  # byte-level prompts are long
(tiny / "config.json").write_text(json.dumps(config))
PY
D=$(dirname "$0")
# 20 Spec-Bench prompts of several categories, then 20 generated ones
{ head -40 $D/train_prompts.jsonl | awk 'NR % 2'; tail -40 $D/train_prompts.jsonl | awk 'NR % 2'; } > /tmp/smoke/p.jsonl
CATS_A=$(python3 -c "import json; print(','.join(dict.fromkeys(c for c in (json.loads(l)['category'] for l in open('/tmp/smoke/p.jsonl')) if c != 'generated')))")
TARGET=/tmp/smoke/tiny PROMPTS=/tmp/smoke/p.jsonl W=/tmp/smoke/w SHARDS=2 REC_S=${SMOKE_REC_S:-25} MNT=12 TEMPS=0,0.7 \
  HS=last,2,4,5 RB=${SMOKE_RB:-16} BATCH=8 CATS_A=$CATS_A DEADLINE_S=${SMOKE_DEADLINE_S:-110} THREADS=2 VOCAB=256 MIN_STEPS=10 \
  PACK=$D/pack.py bash $D/job.sh

"""The pieces of tests/test_vllm.py's fixtures before its vLLM program, timed one by one (run with
OMP_NUM_THREADS=1, as a pytest-xdist worker of `make test` runs them).

    OMP_NUM_THREADS=1 .venv/bin/python analyses/results/test-time-cpu-2026-11-29/fixture_pieces.py [BATCH]
"""

import sys
import tempfile
import time
from pathlib import Path

from specsim.record.models import load_model
from specsim.record.run import RecordRequest, record_cache
from specsim.record.train import TrainConfig, train

CATEGORIES = ("coding", "extraction", "translation", "math")
batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1
folder = Path(tempfile.mkdtemp(prefix="fixture-pieces-"))


def timed(label, fn):
    started = time.perf_counter()
    out = fn()
    print(f"{label:14s} {time.perf_counter() - started:6.1f} s", flush=True)
    return out


timed("record train", lambda: record_cache(folder / "train.h5", RecordRequest(
    target="smollm2-135m", categories=CATEGORIES, per_category=1, max_new_tokens=24, store="stats",
    hidden=("last", "2", "15", "27"), batch_size=batch), progress=False))
target = timed("load target", lambda: load_model("smollm2-135m"))
configs = {"eagle": TrainConfig(kind="eagle", steps=40, lr=3e-3, batch=2, holdout_every=3),
           "eagle3": TrainConfig(kind="eagle3", steps=40, lr=3e-3, batch=2, holdout_every=3, ttt_steps=3,
                                 draft_vocab=8192)}
for kind, config in configs.items():
    timed(f"train {kind}", lambda: train(folder / "train.h5", target, folder / kind, config, progress=False))
timed("record check", lambda: record_cache(folder / "v.h5", RecordRequest(
    target="smollm2-135m", drafts=("layers:20", f"eagle:{folder / 'eagle'}", f"eagle3:{folder / 'eagle3'}"),
    categories=CATEGORIES, per_category=1, max_new_tokens=24, store="stats", overhang=8, batch_size=batch),
    progress=False))

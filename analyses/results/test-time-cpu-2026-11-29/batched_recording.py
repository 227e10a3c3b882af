"""test_vllm's recordings at --batch-size 1 and 4: time, and every dataset compared (tokens, draft top ids and
ranks equal; float statistics' largest difference). Run with OMP_NUM_THREADS=1, as a test worker runs it.

    OMP_NUM_THREADS=1 .venv/bin/python analyses/results/test-time-cpu-2026-11-29/batched_recording.py
"""

import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from specsim.record.run import RecordRequest, record_cache

CATEGORIES = ("coding", "extraction", "translation", "math")
folder = Path(tempfile.mkdtemp(prefix="batched-recording-"))
for batch in (1, 4):
    started = time.perf_counter()
    record_cache(folder / f"b{batch}.h5", RecordRequest(
        target="smollm2-135m", drafts=("layers:20",), categories=CATEGORIES, per_category=1, max_new_tokens=24,
        store="stats", overhang=8, batch_size=batch, hidden=("last", "2", "15", "27")), progress=False)
    print(f"batch {batch}: {time.perf_counter() - started:.1f} s", flush=True)


def datasets(f):
    out = {}
    f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


with h5py.File(folder / "b1.h5", "r") as a, h5py.File(folder / "b4.h5", "r") as b:
    one, four = datasets(a), datasets(b)
assert one.keys() == four.keys()
for name in sorted(one):
    x, y = one[name], four[name]
    if name.startswith(("meta", "run")) or x.dtype.kind not in "biuf" or x.shape != y.shape:
        continue
    if x.dtype.kind == "f":
        finite = np.isfinite(x) & np.isfinite(y)
        same_nan = bool((np.isnan(x) == np.isnan(y)).all())
        print(f"{name:45s} max |difference| {np.abs(x[finite].astype(float) - y[finite]).max(initial=0):.2e}"
              f"{'' if same_nan else ' (NaNs differ)'}")
    else:
        print(f"{name:45s} {'equal' if (x == y).all() else 'DIFFERENT'}")

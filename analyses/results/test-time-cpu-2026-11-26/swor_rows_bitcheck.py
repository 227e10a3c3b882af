"""The row-batched without-replacement sampler (ad7c3af) against the one-row-at-a-time code before it (640c052):
acceptance_swor, node_acceptance_swor and optimal_acceptance_swor, bit for bit, on random laws with ties, zeros,
peaked rows and a 49,152-token vocabulary.

Run from the repository root, in a clone with its history (the code before is read with `git show`):
.venv/bin/python analyses/results/test-time-cpu-2026-11-26/swor_rows_bitcheck.py > swor_rows_bitcheck.txt
"""
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specsim.cache import stats as new

BEFORE = "640c052"
with tempfile.TemporaryDirectory() as tmp:
    source = Path(tmp) / "stats_before.py"
    source.write_text(subprocess.run(["git", "show", f"{BEFORE}:specsim/cache/stats.py"], check=True,
                                     capture_output=True, text=True).stdout)
    spec = importlib.util.spec_from_file_location("stats_before", source)
    old = importlib.util.module_from_spec(spec)
    sys.modules["stats_before"] = old
    spec.loader.exec_module(old)

def case(rng, n, V, kind):
    if kind == "dirichlet":
        p = rng.dirichlet(np.full(V, 0.3), n); q = rng.dirichlet(np.full(V, 0.3), n)
    elif kind == "ties":  # q = p on some rows, equal ratios, zeros
        p = rng.integers(0, 3, (n, V)).astype(float) + 1e-300 * 0; p[:, 0] += 1; p /= p.sum(1, keepdims=True)
        q = np.where(rng.random((n, V)) < 0.5, p, rng.integers(0, 3, (n, V)).astype(float)); q[:, 1] += 1
        q /= q.sum(1, keepdims=True)
    elif kind == "peaked":
        lp = rng.normal(0, 8, (n, V)); lq = lp + rng.normal(0, 1, (n, V))
        p = np.exp(lp - lp.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
        q = np.exp(lq - lq.max(1, keepdims=True)); q /= q.sum(1, keepdims=True)
    elif kind == "zeros":
        p = rng.dirichlet(np.ones(V), n); q = rng.dirichlet(np.ones(V), n)
        p[rng.random((n, V)) < 0.3] = 0; q[rng.random((n, V)) < 0.3] = 0
        p[:, 0] += 1e-3; q[:, 0] += 1e-3; q[:, -1] += 1e-200
        p /= p.sum(1, keepdims=True); q /= q.sum(1, keepdims=True)
    y = np.array([rng.choice(V, p=row) for row in p])
    return p, q, y

rng = np.random.default_rng(0)
checked = 0
for trial in range(300):
    kind = ["dirichlet", "ties", "peaked", "zeros"][trial % 4]
    V = int(rng.choice([2, 3, 5, 8, 12, 40, 300]))
    n = int(rng.integers(1, 30)); k = int(rng.integers(1, 9)); M = int(rng.choice([16, 64, 256]))
    p, q, y = case(rng, n, V, kind)
    a = old.acceptance_swor(p, q, y, k, M, np.random.default_rng(trial))
    b = new.acceptance_swor(p, q, y, k, M, np.random.default_rng(trial))
    assert a.tobytes() == b.tobytes(), (trial, kind, V, n, k, M, np.abs(a - b).max())
    if trial % 3 == 0:
        a = old.node_acceptance_swor(p, q, k, M, np.random.default_rng(trial))
        b = new.node_acceptance_swor(p, q, k, M, np.random.default_rng(trial))
        assert a.tobytes() == b.tobytes(), ("node", trial, kind, V, n, k, M, np.abs(a - b).max())
        a = old.optimal_acceptance_swor(p, q, k, M, np.random.default_rng(trial))
        b = new.optimal_acceptance_swor(p, q, k, M, np.random.default_rng(trial))
        assert a.tobytes() == b.tobytes(), ("optimal", trial, kind, V, n, k, M, np.abs(a - b).max())
    checked += 1
print("identical on", checked, "random cases")
# large vocabulary (the per-row searchsorted path and row chunks)
p, q, y = case(np.random.default_rng(5), 40, 49152, "peaked")
for f in ("acceptance_swor",):
    t = time.perf_counter(); a = getattr(old, f)(p, q, y, 8, 256, np.random.default_rng(1)); t1 = time.perf_counter() - t
    t = time.perf_counter(); b = getattr(new, f)(p, q, y, 8, 256, np.random.default_rng(1)); t2 = time.perf_counter() - t
    assert a.tobytes() == b.tobytes(); print(f, "V=49152 n=40 identical; old %.2f s new %.2f s" % (t1, t2))
# toy sizes: timing
p, q, y = case(np.random.default_rng(6), 16, 8, "dirichlet")
for f in ("acceptance_swor",):
    t = time.perf_counter()
    for _ in range(50): a = old.acceptance_swor(p, q, y, 3, 256, np.random.default_rng(1))
    t1 = time.perf_counter() - t; t = time.perf_counter()
    for _ in range(50): b = new.acceptance_swor(p, q, y, 3, 256, np.random.default_rng(1))
    t2 = time.perf_counter() - t
    print("V=8 n=16 k=3, 50 calls: old %.2f s new %.2f s, ratio %.1f" % (t1, t2, t1 / t2))

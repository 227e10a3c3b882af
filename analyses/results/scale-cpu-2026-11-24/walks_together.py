"""Old markov_walk (one start at a time, from the file OLD) against markov_walks (starts together) on the first
131k-position block of a bench_scale cache: time and the largest relative difference of the totals.

    git show 57c03ef:specsim/sim/adaptive.py > /tmp/adaptive_old.py
    python -m analyses.results.scale-cpu-2026-11-24.walks_together /tmp/adaptive_old.py CACHE   # from the checkout's root
"""
import sys, time, numpy as np, importlib.util
from specsim.sim.features import feature_source
from specsim.sim import adaptive
spec = importlib.util.spec_from_file_location("adaptive_old", sys.argv[1])
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
src = feature_source(sys.argv[2], "draft", 0.7, progress=False)
b = src.block(*src.blocks(1 << 17)[0])
beta = b.acceptance()
for rule in ("adaptive-hf", "adaptive-history"):
    for cap, Gs in ((16, [1, 2, 4, 8]), (32, [16])):
        nxt = adaptive.next_gamma_table(rule, cap)
        cost = np.random.default_rng(0).uniform(1, 2, (b.n_positions, cap + 1))
        for rep in range(2):
            t = time.perf_counter()
            ref = [old.markov_walk(beta, b, G, nxt, cost) for G in Gs]
            t1 = time.perf_counter()
            new = adaptive.markov_walks(beta, b, Gs, nxt, cost)
            t2 = time.perf_counter()
            err = max(float(np.max(np.abs(r[k] - n[k]) / np.maximum(1, np.abs(r[k])))) for r, n in zip(ref, new) for k in r)
            print(rule, cap, Gs, f"old {t1-t:.3f} new {t2-t1:.3f}  max rel diff {err:.2e}")

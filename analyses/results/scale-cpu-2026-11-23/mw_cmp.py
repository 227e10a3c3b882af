"""markov_walk on the first 131k-position block of a bench_scale cache under CHECKOUT: time, and totals to OUT.pkl.

    PYTHONPATH=CHECKOUT python analyses/results/scale-cpu-2026-11-23/mw_cmp.py OUT.pkl [CACHE]
(specsim imported from CHECKOUT: the one under test)
"""
import sys, time, pickle
import numpy as np
from specsim.sim.features import feature_source
from specsim.sim.adaptive import markov_walk, next_gamma_table
src = feature_source(sys.argv[2] if len(sys.argv) > 2 else "/tmp/big/c1m.h5", "draft", 0.7, progress=False)
b = src.block(*src.blocks(1 << 17)[0])
out = {}; t0 = time.perf_counter()
for g in (1, 4, 16):
    for rule in ("adaptive-hf", "adaptive-history"):
        cap = max(16, 2 * g)
        out[(g, rule)] = markov_walk(b.acceptance(), b, g, next_gamma_table(rule, cap), np.ones((b.n_positions, cap + 1)))
print(__import__("specsim").__file__, f"{time.perf_counter() - t0:.2f} s")
pickle.dump(out, open(sys.argv[1], "wb"))

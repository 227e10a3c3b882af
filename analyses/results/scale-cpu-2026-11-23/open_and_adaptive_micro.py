"""Opening a cache and the adaptive rows on one block, under a given checkout (run alternately for two).

    PYTHONPATH=CHECKOUT python analyses/results/scale-cpu-2026-11-23/open_and_adaptive_micro.py CACHE
(specsim imported from CHECKOUT: the one under test)
"""
import sys, time
import numpy as np
from specsim.cache.reader import CacheReader
from specsim.sim.features import feature_source
from specsim.sim.adaptive import adaptive_stats
from specsim.specs import parse_policy
from specsim.trees import chain
p = sys.argv[1]  # a bench_scale cache (1M positions)
t0 = time.perf_counter()
for _ in range(20):
    with CacheReader(p) as r: r.has_stat("draft", "pi_iid")
t_open = (time.perf_counter() - t0) / 20
src = feature_source(p, "draft", 0.7, progress=False)
b = src.block(*src.blocks(1 << 17)[0])
rng = np.random.default_rng(0)
t0 = time.perf_counter()
for g in (1, 4, 16):
    for rule in ("adaptive-hf", "adaptive-history"):
        adaptive_stats(b, chain(str(g)), parse_policy(rule), rng, None)
t_ad = time.perf_counter() - t0
print(f"{__import__('specsim').__file__}: CacheReader open {t_open*1000:.1f} ms; adaptive rows (3 starts x 2 rules) on one 131k-position block {t_ad:.2f} s")

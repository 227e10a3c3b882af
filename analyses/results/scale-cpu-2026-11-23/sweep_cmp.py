"""The bench_scale sweep on one cache, timed in this process, run from each checkout's root in turn:
    python -m analyses.results.scale-cpu-2026-11-23.sweep_cmp CACHE
"""
import sys, time
from pathlib import Path
from benchmarks import bench_scale as b
import specsim
from specsim.sim.features import load_features
p = Path(sys.argv[1])
for T in (0.0, 0.7): load_features(p, "draft", T, progress=False)
t0, c0 = time.perf_counter(), time.process_time()
groups = []
for trees, policies, T, md in b.SWEEP:
    g0 = time.perf_counter()
    specsim.simulate(p, trees=trees, budgets=b.BUDGETS, policies=policies, temperatures=[T], multi_draft=md, n_boot=200, by_category=False)
    groups.append(time.perf_counter() - g0)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(f"{specsim.__file__}: sweep {wall:.1f} s wall, {cpu:.1f} s CPU; groups " + " ".join(f"{g:.1f}" for g in groups))

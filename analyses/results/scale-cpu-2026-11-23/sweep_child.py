"""The bench_scale sweep in this (fresh) process with simulate() keyword arguments: wall, CPU, peak RSS.

    python -m analyses.results.scale-cpu-2026-11-23.sweep_child CACHE "{'fit_positions': 100000}"
"""
import json, sys, time
from pathlib import Path
import specsim
from benchmarks.bench_scale import SWEEP, BUDGETS, _peak_rss_mb
kw = eval(sys.argv[2]); cache = Path(sys.argv[1])
t0, c0 = time.perf_counter(), time.process_time()
n = sum(specsim.simulate(cache, trees=trees, budgets=BUDGETS, policies=pol, temperatures=[T], multi_draft=md, n_boot=200, by_category=False, **kw).height for trees, pol, T, md in SWEEP)
print(json.dumps({"kw": kw, "configs": n, "wall": round(time.perf_counter() - t0, 1), "cpu": round(time.process_time() - c0, 1), "rss": round(_peak_rss_mb())}))

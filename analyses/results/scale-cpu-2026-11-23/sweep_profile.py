"""cProfile of one simulate call per tree family of the bench_scale sweep on CACHE.
    python -m analyses.results.scale-cpu-2026-11-23.sweep_profile CACHE   # from the checkout's root
"""
import sys, time, cProfile, pstats
from pathlib import Path
import specsim
from benchmarks.bench_scale import SWEEP, BUDGETS
p = Path(sys.argv[1])
times = []
pr = cProfile.Profile()
for trees, pol, T, md in SWEEP:
    for tr in trees:
        t0 = time.perf_counter(); pr.enable()
        specsim.simulate(p, trees=[tr], budgets=BUDGETS, policies=pol, temperatures=[T], multi_draft=md, n_boot=200, by_category=False)
        pr.disable(); times.append((f"{tr:8s} {','.join(pol):28s} T={T} {md}", time.perf_counter() - t0))
for k, v in times: print(f"{k}: {v:5.2f} s")
print("total", sum(v for _, v in times))
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)

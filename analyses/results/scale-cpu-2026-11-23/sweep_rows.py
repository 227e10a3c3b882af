"""Each tree family of the bench_scale sweep timed alone on a 200k-position cache (built if missing).
    python -m analyses.results.scale-cpu-2026-11-23.sweep_rows [CACHE]   # from the checkout's root
"""
import sys, time
from pathlib import Path
import specsim
from benchmarks.bench_scale import build, SWEEP, BUDGETS
p = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/c200k.h5")
if not p.exists(): build(p, 200_000)
specsim.simulate(p, trees=["chain"], budgets=[1], policies=["greedy"], temperatures=[0.0], n_boot=10, by_category=False)
for trees, pol, T, md in SWEEP:
    for tr in trees:
        t0 = time.perf_counter(); c0 = time.process_time()
        specsim.simulate(p, trees=[tr], budgets=BUDGETS, policies=pol, temperatures=[T], multi_draft=md, n_boot=200, by_category=False)
        print(f"{tr:8s} {','.join(pol):28s} T={T} {md}: {time.perf_counter()-t0:5.2f} s wall {time.process_time()-c0:5.2f} CPU", flush=True)

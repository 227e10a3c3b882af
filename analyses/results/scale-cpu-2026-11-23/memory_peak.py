"""tracemalloc's largest allocations during the bench_scale sweep on a 100k-position cache (swor included).
    python -m analyses.results.scale-cpu-2026-11-23.memory_peak [CACHE]   # from the checkout's root
"""
import sys, threading, time, tracemalloc
from pathlib import Path
import specsim
from benchmarks.bench_scale import BUDGETS
p = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/c100k.h5")
tracemalloc.start(8)
best = [0, None]
stop = False
def watch():
    while not stop:
        cur = tracemalloc.get_traced_memory()[0]
        if cur > best[0] * 1.02:
            best[0] = cur; best[1] = tracemalloc.take_snapshot()
        time.sleep(0.05)
t = threading.Thread(target=watch, daemon=True); t.start()
trees, pol, T, md = sys.argv[1].split(","), sys.argv[2].split(","), float(sys.argv[3]), sys.argv[4]
specsim.simulate(p, trees=trees, budgets=BUDGETS, policies=pol, temperatures=[T], multi_draft=md, n_boot=200, by_category=False)
stop = True; t.join()
print(f"peak seen {best[0]/1e6:.1f} MB")
for s in best[1].statistics("traceback")[:6]:
    print(f"{s.size/1e6:.1f} MB"); print("\n".join("   " + l for l in s.traceback.format()[-8:]))

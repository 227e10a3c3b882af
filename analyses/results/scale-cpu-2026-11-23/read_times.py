"""Time every read of a recorded statistic during one bench_scale sweep (no profiler): name, temperature, calls, s, MB.

    OMP_NUM_THREADS=1 python -m analyses.results.scale-cpu-2026-11-23.read_times CACHE   # from the checkout's root
"""
import sys, time, collections
import specsim.sim.features as F
from benchmarks.bench_scale import sweep
from pathlib import Path
if __name__ == "__main__":
    stats = collections.defaultdict(lambda: [0, 0.0, 0])
    orig = F.Features._read_recorded
    def timed(self, name):
        t0 = time.perf_counter(); out = orig(self, name); dt = time.perf_counter() - t0
        s = stats[(name, self.temperature, self.parent is None)]; s[0] += 1; s[1] += dt; s[2] += 0 if out is None else out.nbytes
        return out
    F.Features._read_recorded = timed
    n, w, c = sweep(Path(sys.argv[1]), 200)
    print(f"sweep {w:.1f} s")
    for k, (cnt, t, b) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        print(k, cnt, f"{t:.2f} s", f"{b/1e6:.0f} MB")

"""The bench sweep under CHECKOUT (its code, its bench_scale.sweep) on CACHE with W workers, in a fresh process.
    PYTHONPATH=CHECKOUT python analyses/results/scale-cpu-2026-11-24/old_vs_new.py CACHE WORKERS LABEL
"""
import sys, os
from pathlib import Path
from benchmarks.bench_scale import sweep
if __name__ == "__main__":
    w = int(sys.argv[2])
    l = os.getloadavg()[0]
    n, wall, cpu = sweep(Path(sys.argv[1]), 200, w)
    print(f"{sys.argv[3]:>6} workers {w}: {wall:6.2f} s wall {cpu:6.2f} s CPU  load {l:.2f}->{os.getloadavg()[0]:.2f}  {n * 1_000_000 / wall:,.0f} cfg-pos/s", flush=True)

"""The bench_scale sweep by two checkouts in fresh processes, alternating: wall, CPU, peak RSS and the rows.

    python -m analyses.results.scale-cpu-2026-11-23.blocks_old_vs_new OLD_CHECKOUT NEW_CHECKOUT CACHE [--rounds 2]

run from NEW_CHECKOUT's root (it builds CACHE with that checkout); each child runs in its checkout's root.

CACHE: a bench_scale stats cache (`benchmarks.bench_scale.build`; built there if missing, 1M positions).
Each child runs the 100-configuration sweep once with its checkout's specsim (features already derived) and
reports its peak RSS (VmHWM); the rows of the two checkouts are compared column by column, fixed trees and
fitted trees (optimal:N) apart.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, pickle, sys, time  # run with cwd = the checkout: its specsim and benchmarks
from pathlib import Path
import specsim
from benchmarks.bench_scale import SWEEP, BUDGETS, _peak_rss_mb
cache = Path(sys.argv[2])
t0, c0 = time.perf_counter(), time.process_time()
frames = [specsim.simulate(cache, trees=trees, budgets=BUDGETS, policies=pol, temperatures=[T], multi_draft=md,
                           n_boot=200, by_category=False) for trees, pol, T, md in SWEEP]
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
pickle.dump(frames, open(sys.argv[3], "wb"))
print(json.dumps({"wall": wall, "cpu": cpu, "rss": _peak_rss_mb(), "configs": sum(f.height for f in frames)}))
"""


def compare(a, b) -> str:
    import numpy as np
    import polars as pl

    worst, differ = {}, []
    for x, y in zip(a, b):
        if x.height != y.height or x.columns != y.columns:
            return f"different shapes: {x.shape} vs {y.shape}"
        for c, t in x.schema.items():
            if c == "cache":
                continue
            if t in (pl.Float64, pl.Float32, pl.Int64):
                u, v = x[c].to_numpy().astype(float), y[c].to_numpy().astype(float)
                with np.errstate(invalid="ignore", divide="ignore"):
                    d = np.nanmax(np.abs(u - v) / np.maximum(np.abs(u), 1e-300)) if x.height else 0.0
                worst[c] = max(worst.get(c, 0.0), float(d))
            elif x[c].to_list() != y[c].to_list():
                differ.append(c)
    big = {k: f"{v:.1e}" for k, v in worst.items() if v > 0}
    return (f"numeric columns: largest relative difference {big or 'none (equal)'}; "
            f"other columns differing: {sorted(set(differ)) or 'none'}")


def main(argv: list[str]) -> None:
    old, new, cache = (Path(x).resolve() for x in argv[:3])
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 2
    if not cache.exists():
        from benchmarks.bench_scale import build

        build(cache, 1_000_000)
    from specsim.sim.features import load_features

    for T in (0.0, 0.7):
        load_features(cache, "draft", T, progress=False)
    print(f"# cache {cache.name}; load {os.getloadavg()[0]:.2f} at start", flush=True)
    frames = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name, tree in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
                out = Path(tmp) / f"{name}.pkl"
                res = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(cache), str(out)], cwd=tree,
                                     capture_output=True, text=True, check=True)
                rec = json.loads(res.stdout.strip().splitlines()[-1])
                print(f"{name} ({tree.name}): {rec['configs']} configurations, {rec['wall']:.1f} s wall, "
                      f"{rec['cpu']:.1f} s CPU, peak RSS {rec['rss']:.0f} MB, load {os.getloadavg()[0]:.2f}",
                      flush=True)
                frames[name] = pickle.load(open(out, "rb"))
    import polars as pl

    fitted = [pl.col("tree").str.starts_with("optimal")]
    for label, keep in (("fixed trees", [~c for c in fitted]), ("fitted trees (optimal:N)", fitted)):
        print(f"rows, old vs new, {label}:", compare([f.filter(*keep) for f in frames["old"]],
                                                      [f.filter(*keep) for f in frames["new"]]))


if __name__ == "__main__":
    main(sys.argv[1:])

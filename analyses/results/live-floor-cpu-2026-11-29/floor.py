"""How much one live measurement moves by itself, from the committed bench_speedup runs.

Every bench_speedup run decodes the same plain baseline (the same prompts, tokens and batch size) once per
configuration, beside that configuration's speculative decoding (ABBA segments): six live measurements of one
quantity per batch size per run. Their spread is the live side's own error, measured in the run itself. For
every row the script prints the row's plain tokens/s over the median of its run's plain measurements at that
batch size, and marks the rows whose predicted / live ratio missed 1 +- 0.10. Reads the CSVs only.

    .venv/bin/python analyses/results/live-floor-cpu-2026-11-29/floor.py
"""

import glob
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    runs = sorted({p for p in glob.glob(str(ROOT / "bench-*" / "bench-run*.csv"))})
    spreads, misses, outliers = [], [], 0
    total = 0
    print(f"{'run':48s} {'B':>2s} {'plain live max/min':>18s} {'pred/median':>11s}  misses (ratio; the row's plain / run median)")
    for path in runs:
        frame = pl.read_csv(path)
        name = str(Path(path).relative_to(ROOT))
        for (batch,), part in frame.group_by(["batch"], maintain_order=True):
            plain = part["plain_tokens_per_s_live"].to_numpy()
            median = float(np.median(plain))
            spreads.append(plain.max() / plain.min())
            rel = plain / median
            total += len(rel)
            outliers += int(np.sum(np.abs(rel - 1) > 0.05))
            missed = [f"{d} {t} {r:.3f}; {x:.3f}" for d, t, r, x in
                      zip(part["draft"], part["tree"], part["ratio"], rel) if abs(r - 1) > 0.10]
            misses += [(r, x) for r, x in zip(part["ratio"], rel) if abs(r - 1) > 0.10]
            pred = float(part["plain_tokens_per_s_predicted"][0]) / median
            print(f"{name:48s} {batch:2d} {plain.max() / plain.min():18.3f} {pred:11.3f}  {' | '.join(missed)}")
    spreads = np.asarray(spreads)
    print(f"\n{len(runs)} runs, {len(spreads)} (run, batch) groups of 6 plain measurements of the same requests:")
    print(f"  max/min within a group: median {np.median(spreads):.3f}, above 1.10 in {np.sum(spreads > 1.10)}, "
          f"largest {spreads.max():.3f}")
    print(f"  a row's plain measurement more than 5% from its group's median: {outliers} of {total}")
    same = sum(1 for r, x in misses if (r < 1) == (x < 1) and abs(x - 1) > 0.05)
    print(f"  rows whose ratio missed 1 +- 0.10: {len(misses)}; of them, with the row's plain measurement more than "
          f"5% from its group's median, in the direction that moves the ratio the way it missed: {same}")


if __name__ == "__main__":
    main()

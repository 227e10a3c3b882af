"""Would a studentised bootstrap (bootstrap-t) cover better than the expanded percentile interval specsim prints?

coverage.py found the expanded percentile interval of a ratio of sums covering 85-91% over 4-13 skewed synthetic
prompts. The bootstrap-t (Efron & Tibshirani 1993, ch. 12; Hesterberg 2015 recommends it for skewed data)
studentises each resample by the ratio estimator's linearised standard error, which for a ratio of sums costs only
three more columns in the resampling product (sums of a^2, b^2 and ab).

Two populations:
- synthetic: coverage.py's skewed prompts (Beta(1.5, 6) acceptance), truth from 2,000,000 prompts;
- real: the 46 held-out prompts' per-request rows of seven committed replays (EAGLE-3 heads and the suffix draft,
  chain:4, T = 0 and 0.7; analyses/results/eagle3-gpu-h200-2026-11-27b/cpu/per_request/*heldout46*.csv), each
  taken as its own population: n prompts drawn from it with replacement, truth its ratio over all 46.
Ratios: tokens per call (tokens / target_calls) and acceptance (accepted / drafted). 600 experiments a cell,
1,000 resamples each; width is the median width, bootstrap-t over expanded.

    .venv/bin/python analyses/results/paired-interval-cpu-2026-11-28/studentised.py > studentised.txt
"""

import glob
from pathlib import Path

import numpy as np
import polars as pl

from specsim.sim.metrics import bootstrap_counts, expanded_tail

EXPERIMENTS, SIZES = 600, (4, 8, 13, 24)


def intervals(a, b, seed):
    """(expanded percentile, bootstrap-t) 95% intervals of Σa / Σb over the n rows."""
    n = len(a)
    ratio = a.sum() / b.sum()
    sums = bootstrap_counts(n, 1000, seed) @ np.column_stack([a, b, a * a, b * b, a * b])
    with np.errstate(all="ignore"):
        boot = sums[:, 0] / sums[:, 1]
        expanded = np.percentile(boot, [expanded_tail(n), 100 - expanded_tail(n)])
        se = ((a - ratio * b) / b.mean()).std(ddof=1) / np.sqrt(n)
        ss = np.maximum(sums[:, 2] - 2 * boot * sums[:, 4] + boot**2 * sums[:, 3], 0)
        t = (boot - ratio) / np.sqrt(ss / (n - 1) / n) * (sums[:, 1] / n)
    t = t[np.isfinite(t)]
    if not len(t):  # every resample repeats one prompt: no interval
        return expanded, (np.nan, np.nan)
    t_lo, t_hi = np.percentile(t, [2.5, 97.5])
    return expanded, (ratio - t_hi * se, ratio - t_lo * se)


def cell(draw, truth, n):
    rng = np.random.default_rng(n)
    cover, width = np.zeros(2), [[], []]
    for e in range(EXPERIMENTS):
        for k, (lo, hi) in enumerate(intervals(*draw(rng, n), e)):
            cover[k] += lo <= truth <= hi
            width[k].append(hi - lo)
    wider = np.nanmedian(width[1]) / np.median(width[0])
    return f"{cover[0] / EXPERIMENTS:.2f} {cover[1] / EXPERIMENTS:.2f} {wider:4.2f}x"


def synthetic(rng, n, kappa=20.0, depth=3):
    base = rng.beta(1.5, 6, size=n)
    theta, calls = rng.beta(base * kappa, (1 - base) * kappa), rng.integers(60, 120, size=n)
    return calls * sum(theta**k for k in range(1, depth + 1)), calls.astype(float)


print(f"{'population':<44} {'ratio':<18}" + "".join(f" | n={n:<2} exp  b-t  width" for n in SIZES))
a, b = synthetic(np.random.default_rng(99), 2_000_000)
print(f"{'synthetic (coverage.py)':<44} {'accepted/calls':<18}"
      + "".join(f" | {cell(synthetic, a.sum() / b.sum(), n):<20}" for n in SIZES), flush=True)
root = Path(__file__).resolve().parents[1] / "eagle3-gpu-h200-2026-11-27b/cpu/per_request"
for path in sorted(glob.glob(str(root / "*heldout46*.csv"))):
    rows = pl.read_csv(path)
    for num, den in (("tokens", "target_calls"), ("accepted", "drafted")):
        A, B = rows[num].to_numpy().astype(float), rows[den].to_numpy().astype(float)
        draw = lambda rng, n: (lambda i: (A[i], B[i]))(rng.integers(0, len(A), n))  # noqa: E731
        label = f"{Path(path).stem} ({rows['draft'][0]}, T={rows['temperature'][0]})"
        print(f"{label:<44} {num + '/' + den:<18}"
              + "".join(f" | {cell(draw, A.sum() / B.sum(), n):<20}" for n in SIZES), flush=True)

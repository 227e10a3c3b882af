"""From expected totals per trajectory to the numbers users read, with bootstrap CIs over prompts.

Every metric is a ratio of sums over the trajectories of a group (a prompt category,
or "all"): acceptance rate = accepted / drafted, tokens per call = tokens / calls, …
— the per-token averages a long run would measure, not means of per-prompt ratios.

Uncertainty from *which prompts* were cached is a percentile bootstrap (Efron &
Tibshirani 1993): resample the group's trajectories with replacement B times and
recompute each ratio. All B resamples are one matrix product of multinomial counts
(B, n) with the per-trajectory sums (n, K); the counts depend only on the group size
and the seed, so configurations of one sweep share them (their CIs are comparable).
A Monte-Carlo policy's own estimation error is reported separately as a standard error.
numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from specsim.sim.engine import TrajectoryStats

ALL = "all"  # the category label of the row over every prompt
CI_LEVEL = 0.95  # two-sided percentile interval


@dataclass(frozen=True)
class Estimate:
    value: float  # point estimate on the group's trajectories
    lo: float  # lower end of the 95% bootstrap interval (nan with fewer than 2 prompts)
    hi: float  # upper end


@lru_cache(maxsize=64)
def bootstrap_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) float64 multinomial resampling counts (each row sums to n)."""
    rng = np.random.default_rng([seed, n])
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)
    counts.flags.writeable = False
    return counts


def ratio_estimates(num: np.ndarray, den: np.ndarray, *, n_boot: int, seed: int) -> list[Estimate]:
    """Ratio-of-sums estimates Σnum[:, k] / Σden[:, k] with bootstrap CIs over rows (trajectories).

    num, den: (n, K). One matrix product covers every bootstrap resample of every ratio.
    """
    num, den = np.atleast_2d(num.T).T, np.atleast_2d(den.T).T  # (n, K)
    n = num.shape[0]
    point = num.sum(axis=0) / den.sum(axis=0)
    if n < 2 or n_boot < 1:
        return [Estimate(float(v), float("nan"), float("nan")) for v in point]
    W = bootstrap_counts(n, int(n_boot), int(seed))  # (B, n)
    K = num.shape[1]
    sums = W @ np.concatenate([num, den], axis=1)  # (B, 2K): every resample's sums in one product
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = sums[:, :K] / sums[:, K:]  # (B, K)
    tail = (1 - CI_LEVEL) / 2 * 100
    pct = np.nanpercentile if np.isnan(boot).any() else np.percentile  # nan: a resample drafted nothing
    lo, hi = pct(boot, [tail, 100 - tail], axis=0)
    return [Estimate(float(v), float(a), float(b)) for v, a, b in zip(point, lo, hi)]


def groups(categories: np.ndarray, by_category: bool) -> list[tuple[str, np.ndarray]]:
    """(label, trajectory indices): "all" first, then each category in sorted order."""
    out = [(ALL, np.arange(len(categories)))]
    if by_category:
        cats = sorted({str(c) for c in categories})
        if len(cats) > 1 or (cats and cats[0] != ALL):
            out += [(c, np.flatnonzero(categories == c)) for c in cats]
    return out


def summarize(stats: TrajectoryStats, features, *, by_category: bool = True, n_boot: int = 1000,
              seed: int = 0) -> list[dict]:
    """One dict of metrics per group ("all", then categories)."""
    D = stats.reach.shape[1]
    rows = []
    for label, idx in groups(features.traj_category, by_category):
        calls, drafted, accepted = stats.calls[idx], stats.drafted[idx], stats.accepted[idx]
        tokens, cost, reach = stats.tokens[idx], stats.cost[idx], stats.reach[idx]
        num = np.column_stack([accepted, accepted, tokens, 100 * calls, drafted, tokens, reach])  # (n, 6 + D)
        den = np.column_stack([drafted, calls, calls, tokens, calls, cost] + [calls] * D)
        est = ratio_estimates(num, den, n_boot=n_boot, seed=seed)
        row = {"category": label, "n_prompts": int(len(np.unique(features.traj_prompt[idx]))),
               "n_positions": int(tokens.sum())}
        for name, e in zip(("accept_rate", "accepted_per_call", "tokens_per_call", "calls_per_100_tokens",
                            "drafted_per_call", "speedup"), est):
            row[name], row[name + "_lo"], row[name + "_hi"] = e.value, e.lo, e.hi
        row["depth_accept"] = [e.value for e in est[6:]]  # P(A >= d) per call, d = 1..D
        row["call_cost"] = float(cost.sum() / calls.sum())
        if stats.exact or stats.se_accepted is None:
            row["mc_se_accept_rate"] = row["mc_se_tokens_per_call"] = None
        else:
            se = float(np.sqrt((stats.se_accepted[idx] ** 2).sum()))  # SE of Σ accepted
            row["mc_se_accept_rate"] = se / float(drafted.sum())
            row["mc_se_tokens_per_call"] = se * float(tokens.sum()) / float(calls.sum()) ** 2  # via calls = n - accepted
        rows.append(row)
    return rows

"""How often a 95% interval for "engine minus replay, paired by prompt" holds a zero difference, by simulation.

Each experiment is an engine check at T > 0 as `specsim validate` runs it: per prompt, the replay's exact
expected acceptance on one cached trajectory against R fresh decodes of the same prompt by the same rule.
Prompts' acceptance differs widely (Beta(1.5, 6)); a trajectory's varies about its prompt's (Beta with
concentration 20); each call of a chain of 3 accepts while a coin of the trajectory's rate comes up;
60-119 calls a trajectory. Two intervals of the same pairs: the percentile bootstrap (1,000 resamples of
prompts, what `ratio_difference` used before) and the linearised ratio estimator with Student's t
(`specsim.sim.metrics.ratio_difference` now).

    .venv/bin/python analyses/results/paired-interval-cpu-2026-11-28/coverage.py > coverage.txt
"""

import numpy as np

from specsim.sim.metrics import _ratio, bootstrap_counts, ratio_difference

EXPERIMENTS = 400


def experiment(rng, n, repeats, kappa=20.0, depth=3):
    base = rng.beta(1.5, 6, size=n)
    out = np.zeros((n, 4))
    for i in range(n):
        for j in range(repeats + 1):  # j = 0: the cached trajectory, replayed exactly
            theta = rng.beta(base[i] * kappa, (1 - base[i]) * kappa)
            calls = int(rng.integers(60, 120))
            if j == 0:
                out[i, 2:] = calls * sum(theta**k for k in range(1, depth + 1)), calls
            else:
                kept = np.cumprod(rng.random((calls, depth)) < theta, axis=1).sum()
                out[i, :2] += kept, calls
    return out.T


def percentile_bootstrap(na, da, nb, db, seed):
    sums = bootstrap_counts(len(na), 1000, seed) @ np.column_stack([na, da, nb, db])
    return np.percentile(_ratio(sums[:, 0], sums[:, 1]) - _ratio(sums[:, 2], sums[:, 3]), [2.5, 97.5])


print(f"{'prompts':>7} {'decodes/prompt':>14} | {'bootstrap: covers':>17} {'width':>6} | {'linearised t: covers':>20} "
      f"{'width':>6}   ({EXPERIMENTS} experiments each; binomial s.e. of a coverage near 95%: 1.1%)")
for n, repeats in [(3, 4), (4, 4), (6, 2), (8, 4), (13, 2), (13, 6), (24, 2), (46, 2)]:
    rng = np.random.default_rng([n, repeats])
    boot, lin = [], []
    for e in range(EXPERIMENTS):
        data = experiment(rng, n, repeats)
        boot.append(percentile_bootstrap(*data, e))
        est = ratio_difference(*data)
        lin.append((est.lo, est.hi))
    cover = lambda ci: np.mean([lo <= 0 <= hi for lo, hi in ci])  # noqa: E731
    width = lambda ci: np.mean([hi - lo for lo, hi in ci])  # noqa: E731
    print(f"{n:>7} {repeats:>14} | {cover(boot):>17.3f} {width(boot):>6.3f} | {cover(lin):>20.3f} {width(lin):>6.3f}",
          flush=True)


# One side alone: a ratio of sums over n prompts (the replay's interval in every `simulate` row) against the
# population's ratio (2,000,000 prompts), 1,000 experiments per row.
from scipy.stats import norm, t as student_t  # noqa: E402


def one_side(rng, n, kappa=20.0, depth=3):
    base = rng.beta(1.5, 6, size=n)
    theta, calls = rng.beta(base * kappa, (1 - base) * kappa), rng.integers(60, 120, size=n)
    return calls * sum(theta**k for k in range(1, depth + 1)), calls.astype(float)


num, den = one_side(np.random.default_rng(99), 2_000_000)
truth = num.sum() / den.sum()
print(f"\n{'prompts':>7} | {'percentile covers':>17} | {'expanded percentile covers':>26}   (1,000 experiments each: "
      f"a ratio of sums over n prompts against the population's; binomial s.e. near 95%: 0.7%)")
for n in (4, 8, 13, 24, 46):
    rng = np.random.default_rng(n)
    tail = 100 * norm.cdf(-np.sqrt(n / (n - 1)) * student_t.ppf(0.975, n - 1))
    plain = expanded = 0
    for e in range(1000):
        num, den = one_side(rng, n)
        W = bootstrap_counts(n, 1000, e)
        r = _ratio(W @ num, W @ den)
        lo, hi = np.percentile(r, [2.5, 97.5])
        plain += lo <= truth <= hi
        lo, hi = np.percentile(r, [tail, 100 - tail])
        expanded += lo <= truth <= hi
    print(f"{n:>7} | {plain / 1000:>17.3f} | {expanded / 1000:>26.3f}", flush=True)

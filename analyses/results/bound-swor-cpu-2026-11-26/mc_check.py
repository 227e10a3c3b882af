"""The Monte-Carlo prefix minimum of `optimal_acceptance_swor` (used for three or more candidates) run at two
candidates, where the exact value is known: its error per position and on the mean, at 4,096 and 65,536 tuples.
Usage: python mc_check.py CACHE DRAFT  (a full cache recorded at T = 0.7 with the model draft DRAFT)."""

import sys

import numpy as np

from specsim.cache.stats import _SworDraws, optimal_acceptance_swor
from specsim.sim.features import load_features


def mc_two(p, q, samples, rng):
    """The j >= 3 branch of optimal_acceptance_swor, at j = 2."""
    q = q / q.sum(axis=1, keepdims=True)
    out = np.zeros(p.shape[0])
    for row in range(p.shape[0]):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = np.where(q[row] > 0, p[row] / np.where(q[row] > 0, q[row], 1.0), np.inf)
        order = np.argsort(ratio, kind="stable")
        ps, qs = p[row, order], q[row, order]
        p_cum = np.r_[0.0, np.cumsum(ps)]
        draws = _SworDraws(qs, 2, samples, rng)
        last = np.full(samples, -1)
        for _ in range(2):
            x, alive = draws.draw(draws.rest())
            last = np.maximum(last, np.where(alive, x, -1))
        inside = np.cumsum(np.bincount(last + 1, minlength=len(qs) + 1))[: len(qs) + 1] / samples
        out[row] = np.clip(1.0 + (p_cum - inside).min(), 0.0, 1.0)
    return out


features = load_features(sys.argv[1], sys.argv[2], 0.7, progress=False)
rng = np.random.default_rng(0)
exact, mc = [], {4096: [], 65536: []}
for start, stop, p, q in features.iter_distributions():
    exact.append(optimal_acceptance_swor(p, q, 2, 1, rng)[:, 1])
    for samples in mc:
        mc[samples].append(mc_two(p, q, samples, rng))
exact = np.concatenate(exact)
print(f"{sys.argv[2]}, T = 0.7, {exact.size} positions: two candidates without replacement, exact mean {exact.mean():.4f}")
for samples, values in mc.items():
    err = np.concatenate(values) - exact
    print(f"Monte-Carlo prefix minimum, {samples:>6,} tuples: mean error {err.mean():+.5f}, "
          f"per-position sd {err.std():.5f}, max |error| {np.abs(err).max():.5f}")

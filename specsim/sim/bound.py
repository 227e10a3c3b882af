"""What the verification rule leaves on the table at a node with i.i.d. or without-replacement candidates.

At a node with j children drawn i.i.d. from the draft's law q, SpecInfer's recursive rule (the
one specsim replays and runs live for i.i.d. trees, `specsim.verify`) accepts one of them with
probability 1 − Π_{i<j} (1 − Σ_x min(q, r_i)). No valid verifier (one whose output is
distributed as the target's p) can accept more than the optimal transport between the
candidates and the output, which Hu et al. (ICLR 2025, arXiv 2502.18779) compute through its
dual: α* = 1 + min_A [p(A) − q(A)^j] (`specsim.cache.stats.optimal_acceptance_iid`).

Both are computed exactly here at every position of the recorded target-sampled trajectories,
from the recorded distributions (p the target's, q the draft's, at the trajectories'
temperature), and averaged over positions with a standard error over trajectories. This is a
per-node comparison: the node on the target's path at each position. (How the gap compounds
over a tree's depths depends on which optimal coupling a verifier picks: the optimum is not
unique for j ≥ 2, so no single tokens-per-call figure follows from α* alone.)

Candidates drawn without replacement (`sampling="swor"`): the rule is the same recursion with the
proposal renormalised over the undrawn tokens (`node_acceptance_swor`), the bound the same cut with
the law of a tuple drawn without replacement (`optimal_acceptance_swor`); both exact for j ≤ 2 and
Monte-Carlo beyond (the rule over the histories of rejected candidates, the bound over tuples).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.cache.stats import (node_acceptance_iid, node_acceptance_swor, optimal_acceptance_iid,
                                 optimal_acceptance_swor)
from specsim.errors import CacheError, SpecError


@dataclass(frozen=True)
class NodeBound:
    """Per number of candidates j = 1..k: the rule's and the optimal acceptance at a node, and their SEs."""

    draft: str
    temperature: float
    sampling: str  # how a node's candidates are drawn: "iid" or "swor" (specsim.specs.MULTI_DRAFT)
    positions: int
    trajectories: int
    rule: np.ndarray  # (k,) mean over positions of P(one of j candidates accepted) under SpecInfer's rule
    rule_se: np.ndarray  # (k,) standard error over trajectories
    bound: np.ndarray  # (k,) the same for the optimal valid verifier (Hu et al.)
    bound_se: np.ndarray
    gap_se: np.ndarray  # (k,) standard error of bound − rule (paired: the same positions)


def _ratio_mean(sums: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, SE) of a per-position quantity from per-trajectory sums (G, k) and counts (G,): the positions'
    mean, with the cluster (ratio-estimator) standard error over trajectories."""
    total = counts.sum()
    mean = sums.sum(axis=0) / total
    G = counts.shape[0]
    if G < 2:
        return mean, np.full_like(mean, np.nan)
    resid = sums - counts[:, None] * mean[None, :]
    return mean, np.sqrt(G / (G - 1) * (resid ** 2).sum(axis=0)) / total


def node_bound(cache, draft: str, temperature: float, candidates: int, *, sampling: str = "iid",
               samples: int = 4096, seed: int = 0, progress: bool = True) -> NodeBound:
    """The rule's and the optimal acceptance of 1..`candidates` candidates drawn `sampling` ("iid" or "swor") at
    every position of the trajectories `cache` recorded at `temperature` (> 0), for model draft `draft` (module
    docstring). samples, seed: the Monte-Carlo of three or more candidates without replacement."""
    from tqdm.auto import tqdm

    from specsim.sim.features import load_features
    from specsim.specs import MULTI_DRAFT

    if temperature <= 0:
        raise SpecError.naming("{temperature} 0: at T = 0 a verifier accepts exactly the target's argmax; the bound "
                               "is about sampling: give a temperature the cache recorded above 0")
    if candidates < 1:
        raise SpecError.naming("{candidates} {value}: give 1 or more", value=candidates)
    if sampling not in MULTI_DRAFT:
        raise SpecError(f"candidates drawn {sampling!r}: give one of {', '.join(MULTI_DRAFT)}")
    features = load_features(cache, draft, temperature, progress=progress)
    if features.model_free:
        raise SpecError(f"{draft} is model-free: its proposals are point masses, not draws from a law q")
    if features.depth is not None:
        raise SpecError(f"{draft} is a head draft: its laws are recorded as statistics per call start and depth, "
                        "not as distributions; the bound needs q itself (a model draft in a full cache)")
    if not features.has_distributions:
        raise CacheError(f"{features.cache_path}: a stats-only cache holds no distributions; the bound needs p and q "
                         "at every position: record with --store full")
    n = features.token.shape[0]
    rule = np.zeros((n, candidates))
    best = np.zeros((n, candidates))
    rng = np.random.default_rng(seed)
    bar = tqdm(total=n, unit="pos", desc=f"bound {draft} {sampling} T={features.temperature:g}", disable=not progress,
               dynamic_ncols=True, leave=False)
    for start, stop, p, q in features.iter_distributions():
        if sampling == "iid":
            rule[start:stop] = node_acceptance_iid(p, q, candidates)
            best[start:stop] = optimal_acceptance_iid(p, q, candidates)
        else:
            rule[start:stop] = node_acceptance_swor(p, q, candidates, samples, rng)
            best[start:stop] = optimal_acceptance_swor(p, q, candidates, samples, rng)
        bar.update(stop - start)
    bar.close()
    counts = features.traj_len.astype(np.float64)
    some = counts > 0
    cut = np.r_[features.traj_start[some], n]

    def per_trajectory(x):
        return np.stack([x[a:b].sum(axis=0) for a, b in zip(cut[:-1], cut[1:])])

    r_mean, r_se = _ratio_mean(per_trajectory(rule), counts[some])
    b_mean, b_se = _ratio_mean(per_trajectory(best), counts[some])
    _, gap_se = _ratio_mean(per_trajectory(best - rule), counts[some])
    return NodeBound(draft=draft, temperature=float(features.temperature), sampling=sampling, positions=int(n),
                     trajectories=int(some.sum()), rule=r_mean, rule_se=r_se, bound=b_mean, bound_se=b_se,
                     gap_se=gap_se)

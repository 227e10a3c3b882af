"""Lossy acceptance rules (p ≥ q, p ≥ λq, Medusa's typical acceptance) replayed approximately.

A lossy rule (`specsim.verify.LossyRule`; Cai et al. 2024 for 'typical') accepts more drafts
than speculative sampling but no longer emits tokens distributed as p, so the coupling of
docs/design.md §2 breaks: the cached trajectories are not samples of what the rule would emit.
The simulator still evaluates the rule ALONG the target trajectories, and says so:

* at each cached prefix, one candidate x ~ q passes with α_t = Σ_x q_t(x) · 1[rule passes x];
  a node's i-th of k i.i.d. candidates is the first to pass with (1 − α_t)^i · α_t;
* the walk then continues from the target's token y_t, not from the accepted x — this is the
  approximation, so every number is flagged approximate;
* next to it, the distortion the rule causes: TV(output law of the rule, p) at k = 1
  (`verify.output_distribution` closed form), averaged over the positions, in the row as
  ``tv_distortion`` (and its maximum as ``tv_distortion_max``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specsim.errors import SpecError
from specsim.sim.multidraft import length_distribution, reach_by_depth
from specsim.trees import Tree
from specsim.verify import LossyRule

if TYPE_CHECKING:  # pragma: no cover
    from specsim.sim.engine import AcceptanceTable
    from specsim.sim.features import Features

_NO_MASS = 1e-12  # as specsim.verify.residual
_ROW_ELEMENTS = 1 << 19  # floats per row block


def rule_of(spec) -> LossyRule:
    """The LossyRule a PolicySpec names ('p>=q', 'p>=lq:λ', 'typical[:eps,delta]')."""
    params = tuple(getattr(spec, "params", ()))
    if spec.name == "p>=q":
        return LossyRule("p>=q")
    if spec.name == "p>=lq":
        return LossyRule("p>=lq", lam=float(params[0]))
    if spec.name == "typical":
        return LossyRule("typical", eps=float(params[0]), delta=float(params[1])) if params else LossyRule("typical")
    raise SpecError(f"{spec.name!r} is not a lossy rule; use p>=q, p>=lq:0.5 or typical[:eps,delta]")


def passes(rule: LossyRule, p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
    """(n, V) bool: tokens the rule accepts when drafted, row by row (`LossyRule.passes`)."""
    if rule.name == "typical":
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -np.where(p_target > 0, p_target * np.log(p_target), 0.0).sum(axis=1)
        threshold = np.minimum(rule.eps, rule.delta * np.exp(-entropy))  # (n,)
        return p_target > threshold[:, None]
    return p_target >= rule.lam * q_draft


def output_law(rule: LossyRule, p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
    """(n, V) law of the emitted token with one candidate x ~ q (`verify.output_distribution`, k = 1)."""
    q_draft = q_draft / q_draft.sum(axis=1, keepdims=True)  # as verify: a rounding-level excess can flip p >= q
    ok = passes(rule, p_target, q_draft)
    if rule.name == "typical":
        fallback = p_target
    else:  # residual(p, q); p itself where it has no mass (p == q)
        r = np.maximum(p_target - q_draft, 0.0)
        total = r.sum(axis=1, keepdims=True)
        fallback = np.where(total > _NO_MASS, r / np.where(total > 0, total, 1.0), p_target)
    rejected = (q_draft * ~ok).sum(axis=1, keepdims=True)
    return np.where(ok, q_draft, 0.0) + rejected * fallback


def lossy_table(features: "Features", tree: Tree, spec, rng: np.random.Generator) -> "AcceptanceTable":
    """Approximate acceptance of a lossy rule along the cached target trajectories, with TV distortion."""
    from specsim.sim.engine import AcceptanceTable, drafted_per_call

    rule = rule_of(spec)
    k = int(tree.n_children.max()) if tree.budget else 1
    if k > 1 and getattr(spec, "multi_draft", "iid") != "iid":
        raise SpecError(f"lossy rule {spec.label}: trees are simulated with i.i.d. candidates; use --multi-draft iid")
    if features.temperature <= 0:
        raise SpecError(f"lossy rule {spec.label} samples candidates: it needs trajectories at T > 0")
    N = features.n_positions
    alpha = np.zeros(N)
    tv = np.zeros(N)
    for start, stop, p_block, q_block in features.iter_distributions():
        step = max(1, _ROW_ELEMENTS // p_block.shape[1])
        for a in range(0, stop - start, step):  # CPU-cache-sized rows (see multidraft)
            p_target, q_draft = p_block[a : a + step], q_block[a : a + step]
            rows = slice(start + a, start + a + p_target.shape[0])
            alpha[rows] = (q_draft * passes(rule, p_target, q_draft)).sum(axis=1)
            tv[rows] = 0.5 * np.abs(output_law(rule, p_target, q_draft) - p_target).sum(axis=1)
    alpha = np.clip(alpha, 0.0, 1.0)
    pi = alpha[:, None] * (1.0 - alpha[:, None]) ** np.arange(k)[None, :]  # (N, k) first pass at index i
    at_least = reach_by_depth(pi, tree, features.remaining())
    extra = {"tv_distortion": float(tv.mean()), "tv_distortion_max": float(tv.max(initial=0.0)),
             "approximation": "lossy rule evaluated along target trajectories"}
    return AcceptanceTable(p_len=length_distribution(at_least), drafted=drafted_per_call(tree, features.room()),
                           exact=True, extra=extra)

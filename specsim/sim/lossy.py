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

from specsim.cache.stats import lossy_acceptance, lossy_label, lossy_rule
from specsim.errors import SpecError
from specsim.sim.multidraft import length_distribution, reach_by_depth
from specsim.trees import Tree
from specsim.verify import LossyRule

if TYPE_CHECKING:  # pragma: no cover
    from specsim.sim.engine import AcceptanceTable
    from specsim.sim.features import Features

_ROW_ELEMENTS = 1 << 19  # floats per row block


def rule_of(spec) -> LossyRule:
    """The LossyRule a PolicySpec names ('p>=q', 'p>=lq:λ', 'typical[:eps,delta]')."""
    return lossy_rule(spec.label)


def lossy_table(features: "Features", tree: Tree, spec, rng: np.random.Generator) -> "AcceptanceTable":
    """Approximate acceptance of a lossy rule along the cached target trajectories, with TV distortion."""
    from specsim.sim.engine import AcceptanceTable, drafted_per_call

    rule = rule_of(spec)
    k = int(tree.n_children.max()) if tree.budget else 1
    if k > 1 and getattr(spec, "multi_draft", "iid") != "iid":
        raise SpecError(f"lossy rule {spec.label}: trees are simulated with i.i.d. candidates; use --multi-draft iid")
    if features.temperature <= 0:
        raise SpecError(f"lossy rule {spec.label} samples candidates: it needs trajectories at T > 0")
    alpha, tv = _alpha_tv(features, rule, spec)
    pi = alpha[:, None] * (1.0 - alpha[:, None]) ** np.arange(k)[None, :]  # (N, k) first pass at index i
    at_least = reach_by_depth(pi, tree, features.remaining())
    extra = {"tv_distortion": float(tv.mean()), "tv_distortion_max": float(tv.max(initial=0.0)),
             "approximation": "lossy rule evaluated along target trajectories"}
    return AcceptanceTable(p_len=length_distribution(at_least), drafted=drafted_per_call(tree, features.room()),
                           exact=True, extra=extra)


def _alpha_tv(features: "Features", rule: LossyRule, spec) -> tuple[np.ndarray, np.ndarray]:
    """(N,) α_t and TV_t: from the recording's statistics when it computed this rule, else from the logits."""
    recorded = features.recorded_stats
    labels = [lossy_label(lossy_rule(x)) for x in recorded.lossy] if recorded is not None else []
    if lossy_label(rule) in labels:
        j = labels.index(lossy_label(rule))
        alpha, tv = features.recorded("lossy_alpha"), features.recorded("lossy_tv")
        if alpha is not None and tv is not None:
            return alpha[:, j].astype(np.float64), tv[:, j].astype(np.float64)
    if not features.has_distributions:
        raise SpecError(f"lossy rule {spec.label} was not recorded in this stats-only cache (recorded: "
                        f"{', '.join(labels) or 'none'}); re-record with --lossy {spec.label} (or --store full)")
    N = features.n_positions
    alpha = np.zeros(N)
    tv = np.zeros(N)
    for start, stop, p_block, q_block in features.iter_distributions():
        step = max(1, _ROW_ELEMENTS // p_block.shape[1])
        for a in range(0, stop - start, step):  # CPU-cache-sized rows (see multidraft)
            rows = slice(start + a, start + a + min(step, stop - start - a))
            alpha[rows], tv[rows] = lossy_acceptance(rule, p_block[a : a + step], q_block[a : a + step])
    return alpha, tv

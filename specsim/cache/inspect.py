"""Quick draft-quality statistics straight from a cache, no simulation needed.

Two per-position numbers summarise how well a draft q matches the target p:

* top-1 agreement, 1[argmax q_t = argmax p_t]: the greedy acceptance rate of a
  one-token chain when the target's argmax is the trajectory token;
* α_t = 1 − TV(p_t, q_t) = Σ_x min(p_t(x), q_t(x)): the probability that
  speculative sampling accepts one drafted token (Leviathan et al., 2023, §3.5).

Both are averaged over every recorded position. Format-3 caches record them per
position (the target's argmax, the draft's top id and Σ min(p, q), computed in float32
where the models ran), so they are read, not recomputed; older files are streamed
trajectory by trajectory in blocks of positions so memory stays bounded for any file
size. At T=0 there is no sampling distribution, so α is computed from the T=1 softmax
and flagged as such. numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from specsim.cache.layout import TARGET
from specsim.cache.reader import CacheReader
from specsim.errors import CacheError

BLOCK = 64  # positions read at once per column: 64 x V float32 (~39 MB at V = 152k)


@dataclass(frozen=True)
class AgreementStats:
    draft: str  # draft column name
    temperature: float  # recorded temperature of the trajectories
    alpha_temperature: float  # temperature of the softmax α was computed at (1.0 when temperature is 0)
    positions: int  # positions averaged over
    prompts: int  # distinct prompts those positions came from
    top1_agreement: float  # mean of 1[argmax q = argmax p]
    mean_alpha: float  # mean of 1 - TV(p, q)
    tail_approximated: bool  # True for top-K storage: the non-top-K mass is spread evenly


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of logits / temperature, in float64 for stable sums."""
    z = logits.astype(np.float64) / temperature  # (n, V)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def alpha(p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
    """Per-row acceptance probability Σ min(p, q) = 1 - TV(p, q)."""
    return np.minimum(p_target, q_draft).sum(axis=-1)


def agreement_stats(
    reader: CacheReader, *, on_positions: Callable[[int], None] = lambda n: None
) -> list[AgreementStats]:
    """Top-1 agreement and mean α for every draft x temperature, in one streaming pass."""
    drafts, temps = reader.spec.drafts, reader.spec.temperatures
    agree = {(d, t): 0 for d in drafts for t in temps}
    alpha_sum = {(d, t): 0.0 for d in drafts for t in temps}
    count = {t: 0 for t in temps}
    prompts: dict[float, set[int]] = {t: set() for t in temps}
    recorded = reader.has_stat(TARGET, "top_id") and all(reader.has_stat(d, "overlap") for d in drafts)
    try:
        for row in reader.iter_trajectories():
            t = next(x for x in temps if abs(x - row.temperature) < 1e-6)
            t_alpha = t if t > 0 else 1.0
            prompts[t].add(row.prompt_index)
            for s in range(row.start, row.stop, BLOCK if not recorded else row.length):
                e = min(s + (BLOCK if not recorded else row.length), row.stop)
                if recorded:
                    p_top = reader.stats(TARGET, "top_id", s, e)
                    for d in drafts:  # a head draft's depth 1: the law its calls start with
                        top, overlap = reader.stats(d, "top_ids", s, e), reader.stats(d, "overlap", s, e)
                        if reader.depth(d) is not None:
                            top, overlap = top[:, 0], overlap[:, 0]
                        agree[d, t] += int((top[:, 0] == p_top).sum())
                        alpha_sum[d, t] += float(overlap.sum())
                else:
                    p_logits = reader.logits(TARGET, s, e)  # (n, V)
                    p_target = softmax(p_logits, t_alpha)
                    p_top = p_logits.argmax(axis=-1)
                    for d in drafts:
                        q_logits = reader.logits(d, s, e)  # (n, V)
                        agree[d, t] += int((q_logits.argmax(axis=-1) == p_top).sum())
                        alpha_sum[d, t] += float(alpha(p_target, softmax(q_logits, t_alpha)).sum())
                count[t] += e - s
                on_positions(e - s)
    except OSError as exc:
        raise CacheError(f"{reader.path}: corrupt data while reading logits ({exc})") from None
    topk = reader.spec.storage == "topk"
    return [
        AgreementStats(
            draft=d, temperature=t, alpha_temperature=t if t > 0 else 1.0, positions=count[t],
            prompts=len(prompts[t]),
            top1_agreement=agree[d, t] / count[t] if count[t] else float("nan"),
            mean_alpha=alpha_sum[d, t] / count[t] if count[t] else float("nan"),
            tail_approximated=topk and not recorded,
        )
        for d in drafts
        for t in temps
    ]

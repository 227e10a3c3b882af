"""Per-position statistics of the target and draft distributions: everything exact replay reads.

docs/design.md §2: along a target-sampled trajectory the simulator needs, per position t
and draft, only a few numbers derived from p_t and q_t — never the distributions themselves:

* the rank of y_t under q_t (greedy trees) and the draft's top-K ids;
* log p_t(y_t) and log q_t(y_t) at the trajectory's temperature (chains: β_t);
* π_i(y_t), the probability that the i-th of a node's candidates is the one accepted given
  that the output is y_t, for i.i.d. candidates (exact) and candidates drawn without
  replacement (`acceptance_swor`: exact for i ≤ 1, unbiased Monte-Carlo beyond);
* for lossy rules, the probability α_t that one drafted candidate passes and the total
  variation between the rule's output law and p_t.

The recorder computes them where the models run (`specsim.record.statistics`, torch, from
float32 logits before storage rounds them); this module is the numpy reference the
recorder is tested against, and what the simulator falls back on for caches recorded
without them. numpy only.

Without replacement, exactly (the residual's shape). Verifying candidates x_0, x_1, …
drawn from q without replacement keeps, after rejections with drawn mass Q_i, a residual
r_i = max(0, p − c_i q) / Z_i with Z_i = Σ_v max(0, p(v) − c_i q(v)) and
c_0 = 0, c_{i+1} = c_i + Z_i / (1 − Q_i). (Induction: the proposal is q_i = q / (1 − Q_i)
on the undrawn tokens, and max(0, max(0, p − c q) − a q) = max(0, p − (c + a) q) for a ≥ 0;
a rejected x_i had r_i(x_i) < q_i(x_i), i.e. p(x_i) < c_{i+1} q(x_i), so the formula puts
no mass on drawn tokens by itself.) The whole history acts only through (c_i, Q_i), so after
sorting the vocabulary by p/q once per position, Z(c) is one binary search over prefix sums
and a candidate draw is one search over the cumulative q: O(V log V) per position and
O(log V) per candidate and Monte-Carlo sample, instead of O(V) per candidate and sample.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

STATS_TOP_K = 16  # a draft's top-K ids kept per position in its statistics
PI_CANDIDATES = 8  # candidates per tree node whose acceptance π_i is recorded (fan-outs up to 8)
SWOR_SAMPLES = 256  # Monte-Carlo samples per position for without-replacement candidates i >= 2
SWOR_GROUPS = 16  # groups of those samples whose means are kept, for the standard error
MAX_PROPOSAL_DEPTH = 16  # --expand-target: deepest chain recorded
MAX_PROPOSAL_CHAINS = 64  # --expand-target: most chains per position
LOSSY_RULES = ("p>=q", "p>=lq:0.5", "typical:0.09,0.3")  # lossy rules recorded by default
_NO_MASS = 1e-12  # as specsim.verify: a residual lighter than this is rounding noise of r == q


@dataclass(frozen=True)
class StatsSpec:
    """Which statistics a recording computes per draft and position (kept in the cache's header)."""

    candidates: int = PI_CANDIDATES  # π_i recorded for i < candidates (iid and swor)
    swor_samples: int = SWOR_SAMPLES  # Monte-Carlo samples per position (candidates i >= 2)
    swor_groups: int = SWOR_GROUPS  # group means kept per position: replicates for the standard error
    lossy: tuple[str, ...] = field(default=LOSSY_RULES)  # lossy rules whose α and TV are recorded
    top_ids: int = STATS_TOP_K  # the draft's top ids kept per position
    expand: tuple[int, int] | None = None  # (top_k, depth) of the draft's EAGLE-2 expansion recorded per position
    expand_target: tuple[int, int] | None = None  # (depth K, chains R): the target along R chains of K drafts drawn
    #                                               from q at every position (block verification's replay)

    def __post_init__(self) -> None:
        from specsim.errors import SpecError

        if not 1 <= self.candidates <= 64:
            raise SpecError(f"candidates per node must be in 1..64, got {self.candidates}")
        if self.swor_groups < 2 or self.swor_samples % self.swor_groups:
            raise SpecError(f"swor samples ({self.swor_samples}) must be a multiple of at least 2 groups "
                            f"({self.swor_groups})")
        for rule in self.lossy:
            lossy_rule(rule)  # refuses a malformed rule before any recording
        if self.expand is not None:
            from specsim.expansion import Expansion

            object.__setattr__(self, "expand", tuple(int(x) for x in self.expand))
            Expansion(*self.expand)  # refuses K < 1, D < 1, too many candidates
        if self.expand_target is not None:
            depth, chains = (int(x) for x in self.expand_target)
            object.__setattr__(self, "expand_target", (depth, chains))
            if not 1 <= depth <= MAX_PROPOSAL_DEPTH or not 2 <= chains <= MAX_PROPOSAL_CHAINS:
                raise SpecError(f"the target along the draft's proposals: depth {depth} must be in 1..{MAX_PROPOSAL_DEPTH} and chains "
                                f"{chains} in 2..{MAX_PROPOSAL_CHAINS} (two at least: their spread is the standard "
                                "error)")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "StatsSpec":
        data = json.loads(text)
        return cls(**{**data, "lossy": tuple(data.get("lossy", ()))})  # older files: no expand_target

    @property
    def expansion(self):
        """The recorded `specsim.expansion.Expansion`, or None."""
        if self.expand is None:
            return None
        from specsim.expansion import Expansion

        return Expansion(*self.expand)


def lossy_rule(label: str):
    """The `specsim.verify.LossyRule` a policy label names ('p>=q', 'p>=lq:0.5', 'typical:0.09,0.3')."""
    from specsim.errors import SpecError
    from specsim.specs import parse_policy
    from specsim.verify import LossyRule

    spec = parse_policy(label)
    if spec.lossless or spec.kind.adaptive:
        raise SpecError(f"{label!r} is not a lossy rule; use p>=q, p>=lq:0.5 or typical[:eps,delta]")
    if spec.name == "p>=q":
        return LossyRule("p>=q")
    if spec.name == "p>=lq":
        return LossyRule("p>=lq", lam=float(spec.params[0]))
    return LossyRule("typical", eps=float(spec.params[0]), delta=float(spec.params[1])) if spec.params else \
        LossyRule("typical")


def lossy_label(rule) -> str:
    """The canonical label of a LossyRule, as the cache's header lists recorded rules."""
    if rule.name == "p>=q":
        return "p>=q"
    if rule.name == "p>=lq":
        return f"p>=lq:{rule.lam:g}"
    return f"typical:{rule.eps:g},{rule.delta:g}"


# -- on-path statistics -------------------------------------------------------------------------


def token_rank(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(n,) rank of y[i] in row i: entries strictly larger, plus equal ones with a lower id."""
    ly = logits[np.arange(len(y)), y][:, None]  # (n, 1)
    lower_id = np.arange(logits.shape[1])[None, :] < y[:, None]  # (n, V)
    return ((logits > ly) | ((logits == ly) & lower_id)).sum(axis=1).astype(np.int32)


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """(n, k) ids of the k largest entries per row, ties broken by the lower id (as `token_rank`)."""
    n, V = logits.shape
    m = min(V, k + 8)  # slack so ties at the k-th value usually fall inside the partition
    part = np.argpartition(-logits, m - 1, axis=1)[:, :m] if m < V else np.broadcast_to(np.arange(V), (n, V)).copy()
    vals = np.take_along_axis(logits, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)
    ids = np.take_along_axis(part, order, axis=1)
    sorted_vals = np.take_along_axis(vals, order, axis=1)
    if m < V:  # a tie run reaching the partition's edge may hide a lower id outside it: sort those rows fully
        for i in np.flatnonzero(sorted_vals[:, m - 1] == sorted_vals[:, k - 1]):
            ids[i] = np.argsort(-logits[i], kind="stable")[:m]
    return ids[:, :k].astype(np.int32)


def log_prob(logits: np.ndarray, y: np.ndarray, T: float) -> np.ndarray:
    z = logits.astype(np.float64) / T  # (n, V)
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
    return z[np.arange(len(y)), y] - lse


def probabilities(logits: np.ndarray, T: float) -> np.ndarray:
    """(n, V) float64 softmax(logits / T); T = 0 (greedy trajectories) uses T = 1."""
    z = np.asarray(logits, dtype=np.float64) / (T if T > 0 else 1.0)
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


# -- multi-draft acceptance given the output ------------------------------------------------------


def _take(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """x[..., idx[...]] for an index with one entry per leading row."""
    return np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]


def _residual(r: np.ndarray, q_i: np.ndarray) -> np.ndarray:
    """Row-wise norm(max(0, r − q_i)); rows without mass keep r (as `verify.residual`)."""
    out = np.maximum(r - q_i, 0.0)
    total = out.sum(axis=-1, keepdims=True)
    return np.where(total > _NO_MASS, out / np.where(total > 0, total, 1.0), r)


def acceptance_iid(p_target: np.ndarray, q_draft: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """(n, k) exact π_i(y) for i.i.d. candidates (SpecInfer), rows of p_target/q_draft (n, V).

    π_i(y) = Π_{j<i}(1 − Σ_x min(q, r_j)) · min(q(y), r_i(y)) / p(y): the residuals do not
    depend on the candidates, so the expectation factorises.
    """
    p = np.asarray(p_target, dtype=np.float64)
    q = np.asarray(q_draft, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    p_y = _take(p, y)
    inv_p_y = np.where(p_y > 0, 1.0 / np.where(p_y > 0, p_y, 1.0), 0.0)
    out = np.zeros((p.shape[0], k))  # (n, k)
    r, survive = p, np.ones(p.shape[0])
    for i in range(k):
        out[:, i] = survive * np.minimum(_take(q, y), _take(r, y)) * inv_p_y
        if i + 1 < k:
            survive = survive * np.clip(1.0 - np.minimum(q, r).sum(axis=1), 0.0, 1.0)
            r = _residual(r, q)
    return out


def node_acceptance_iid(p_target: np.ndarray, q_draft: np.ndarray, k: int) -> np.ndarray:
    """(n, k) P(one of j i.i.d. candidates from q is accepted), j = 1..k, under the recursive rule above
    (SpecInfer's: candidate i against the residual r_i): 1 − Π_{i<j} (1 − Σ_x min(q, r_i))."""
    p = np.asarray(p_target, dtype=np.float64)
    q = np.asarray(q_draft, dtype=np.float64)
    out = np.zeros((p.shape[0], k))
    r, survive = p, np.ones(p.shape[0])
    for i in range(k):
        survive = survive * np.clip(1.0 - np.minimum(q, r).sum(axis=1), 0.0, 1.0)
        out[:, i] = 1.0 - survive
        if i + 1 < k:
            r = _residual(r, q)
    return out


def _p_over_q(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """p/q per token; inf where q has no mass (and where p/q overflows for a denormal q: both sort with the
    largest ratios, last ascending and first descending)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)


def _ascending_prefixes(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tokens of each row in ascending p/q, where the bounds' cuts are prefixes: (q in that order (n, V),
    p of each prefix (n, V+1), q of each prefix (n, V+1))."""
    order = np.argsort(_p_over_q(p, q), axis=1, kind="stable")
    qs = np.take_along_axis(q, order, axis=1)
    zeros = np.zeros((p.shape[0], 1))
    p_cum = np.concatenate([zeros, np.cumsum(np.take_along_axis(p, order, axis=1), axis=1)], axis=1)
    return qs, p_cum, np.concatenate([zeros, np.cumsum(qs, axis=1)], axis=1)


def _descending(p: np.ndarray, q: np.ndarray):
    """Each row's tokens (positions, (m, V)) in descending p/q, where the residual max(0, p − c q) lives on a prefix
    (ties: any order): (order, p, q and p/q in that order, prefix sums P and Q), all (m, V)."""
    ratio = _p_over_q(p, q)
    order = np.argsort(-ratio, axis=-1)
    ps, qs = np.take_along_axis(p, order, axis=-1), np.take_along_axis(q, order, axis=-1)
    return order, ps, qs, np.take_along_axis(ratio, order, axis=-1), np.cumsum(ps, axis=-1), np.cumsum(qs, axis=-1)


_BROADCAST = 1 << 22  # the largest (rows, histories, vocabulary) comparison done in one broadcast
_ROW_CHUNK = 1 << 20  # rows of the without-replacement sampler held at once: at most this many (row, token) cells


def _rows(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """(m, S) a[r, idx[r, s]]: each row's entries at that row's indices."""
    return np.take_along_axis(a, idx, axis=1)


def _searchsorted_rows(a: np.ndarray, v: np.ndarray, side: str) -> np.ndarray:
    """(m, S) np.searchsorted(a[r], v[r], side=side) for every row r of `a` (m, V, each row ascending): the entries
    below v (at most v for side="right"), counted by one broadcast comparison where it is small."""
    m, V = a.shape
    if m * v.shape[1] * V <= _BROADCAST:
        a, v = a[:, None, :], v[:, :, None]
        return (a <= v if side == "right" else a < v).sum(axis=2)
    return np.stack([np.searchsorted(a[r], v[r], side=side) for r in range(m)])


def optimal_acceptance_iid(p_target: np.ndarray, q_draft: np.ndarray, k: int) -> np.ndarray:
    """(n, k) the most any valid verifier accepts of j i.i.d. candidates from q, j = 1..k (Hu et al., "Towards
    Optimal Multi-draft Speculative Decoding", ICLR 2025, arXiv 2502.18779: the dual of the optimal transport).

    A verifier is valid when its output is distributed as p; it accepts when the output is one of the candidates.
    The most it can accept is a max flow from candidate tuples (mass Q) to tokens (capacity p), whose min cut is
    α* = min over token sets A of p(A) + Q(not every candidate is in A); for i.i.d. candidates that is
    1 + min_A [p(A) − q(A)^j]. On the prefixes of the tokens in ascending p/q, p(A) for a given q(A) is at its
    least (a fractional knapsack: convex, piecewise linear in q(A)) and −q(A)^j is concave, so their sum is
    concave between two prefixes and the minimum over all 2^V sets is at a prefix: O(V log V) per row.
    j = 1 gives Σ_x min(p, q), one draft's maximal coupling."""
    p = np.asarray(p_target, dtype=np.float64)
    q = np.asarray(q_draft, dtype=np.float64)
    _, p_cum, q_cum = _ascending_prefixes(p, q)
    q_cum = np.clip(q_cum, 0.0, 1.0)
    return np.stack([np.clip(1.0 + (p_cum - q_cum ** j).min(axis=1), 0.0, 1.0) for j in range(1, k + 1)], axis=1)


def optimal_acceptance_swor(p_target: np.ndarray, q_draft: np.ndarray, k: int, samples: int,
                             rng: np.random.Generator) -> np.ndarray:
    """(n, k) the most any valid verifier accepts of j candidates drawn from q without replacement, j = 1..k: the
    min cut of `optimal_acceptance_iid`, α* = 1 + min_A [p(A) − Q(every candidate ∈ A)], with Q now the law of a
    tuple drawn without replacement, taken over the prefixes of the tokens in ascending p/q.

    The minimum over all 2^V sets is at a prefix, as for i.i.d. candidates: P(every candidate ∈ A) has growing
    normalised marginals, so a token may enter A only after every token of smaller p/q (docs/design.md §2e gives the
    proof; tests/test_bound.py checks the lemma and the minimum by enumeration). j = 1: Σ min(p, q).
    j = 2, exactly: Q(A) = Σ_{a∈A} q(a) (q(A) − q(a)) / (1 − q(a)) = q(A) − (1 − q(A)) Σ_{a∈A} q(a) / (1 − q(a)),
    with 1 − q(A) and 1 − q(a) summed from the other tokens (no cancellation). j ≥ 3: Q(prefix) from `samples`
    tuples per row (the share whose last token in that order lies inside the prefix); the minimum over noisy
    values sits below the exact one by O(1/√samples) (a Monte-Carlo estimate, biased low)."""
    p = np.asarray(p_target, dtype=np.float64)
    q = np.asarray(q_draft, dtype=np.float64)
    q = q / q.sum(axis=1, keepdims=True)
    n, V = p.shape
    qs, p_cum, q_cum = _ascending_prefixes(p, q)
    zeros = np.zeros((n, 1))
    outside = np.concatenate([np.cumsum(qs[:, ::-1], axis=1)[:, ::-1], zeros], axis=1)  # q beyond each prefix
    out = np.zeros((n, k))
    out[:, 0] = np.minimum(p, q).sum(axis=1)
    if k >= 2:
        others = q_cum[:, :-1] + outside[:, 1:]  # 1 − q(a): the mass of every other token
        share = np.concatenate([zeros, np.cumsum(np.where(others > 0, qs / np.where(others > 0, others, 1.0), 0.0),
                                                 axis=1)], axis=1)
        pair = np.maximum(q_cum - outside * share, 0.0)  # Q(both candidates in the prefix)
        out[:, 1] = np.clip(1.0 + (p_cum - pair).min(axis=1), 0.0, 1.0)
    for row in range(n) if k >= 3 else ():
        draws = _SworDraws(qs[row][None], k, samples)
        last = np.full(samples, -1)  # the tuple's furthest position in the order so far (−1: none)
        for j in range(k):
            x, alive = draws.draw(draws.rest(), rng.random((1, samples)))
            last = np.maximum(last, np.where(alive[0], x[0], -1))
            if j >= 2:  # Q(prefix of m tokens) = share of tuples whose furthest candidate is among them
                inside = np.cumsum(np.bincount(last + 1, minlength=V + 1))[: V + 1] / samples
                out[row, j] = np.clip(1.0 + (p_cum[row] - inside).min(), 0.0, 1.0)
    return out


def acceptance_swor(
    p_target: np.ndarray,
    q_draft: np.ndarray,
    y: np.ndarray,
    k: int,
    samples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """(n, samples, k) unbiased estimates of π_i(y) for candidates drawn without replacement.

    Candidates 0 and 1 are exact closed forms (the same value in every sample):
        π_0 = min(p(y), q(y)) / p(y),
        π_1 = Σ_{x≠y} max(0, q(x) − p(x)) · min(q(y) / (1 − q(x)), max(0, p(y) − q(y)) / Z_1) / p(y).
    For i ≥ 2 each sample draws x_0..x_{i−1} without replacement, integrates the coins
    analytically (weight Π_{j<i}(1 − a_j)) and forces x_i = y (importance weight q_i(y)),
    using the residual's closed shape (module docstring): unbiased, no clipping, and samples
    are i.i.d. so their spread is an honest standard error. Candidates beyond the support of q
    have π = 0.
    """
    p = np.asarray(p_target, dtype=np.float64)
    q = np.asarray(q_draft, dtype=np.float64)
    q = q / q.sum(axis=1, keepdims=True)
    y = np.asarray(y, dtype=np.int64)
    n, _ = p.shape
    out = np.zeros((n, samples, k))  # (n, M, k)
    p_y, q_y = _take(p, y), _take(q, y)
    inv_p_y = np.where(p_y > 0, 1.0 / np.where(p_y > 0, p_y, 1.0), 0.0)
    out[:, :, 0] = (np.minimum(p_y, q_y) * inv_p_y)[:, None]
    if k == 1:
        return out
    out[:, :, 1] = (_second_candidate(p, q, y, p_y, q_y) * inv_p_y)[:, None]
    rows = np.flatnonzero((p_y > 0) & (q_y > 0)) if k > 2 else np.zeros(0, dtype=np.int64)
    step = max(1, _ROW_CHUNK // p.shape[1])  # in order: the generator's draws go to the rows as one row at a time
    for part in (rows[i : i + step] for i in range(0, rows.size, step)):
        out[part, :, 2:] = _later_candidates(p[part], q[part], y[part], k, samples, rng) * inv_p_y[part, None, None]
    return out


def _second_candidate(p, q, y, p_y, q_y) -> np.ndarray:
    """(n,) p(y) · π_1(y), exactly: the first candidate x ≠ y was rejected (weight max(0, q − p))."""
    rejected = np.maximum(q - p, 0.0)  # q(x) (1 − a_0(x))
    rejected[np.arange(len(y)), y] = 0.0  # x_0 = y would have been accepted or consumed y
    z1 = np.maximum(p - q, 0.0).sum(axis=1)
    r1_y = np.where(z1 > _NO_MASS, np.maximum(p_y - q_y, 0.0) / np.where(z1 > 0, z1, 1.0), 0.0)
    rest = _mass_without_each(q)  # Σ_{v≠x} q(v), without the cancellation of 1 − q(x) when q(x) ≈ 1
    q1_y = np.where(rest > 0, q_y[:, None] / np.where(rest > 0, rest, 1.0), 0.0)  # (n, V)
    return (rejected * np.minimum(q1_y, r1_y[:, None])).sum(axis=1)


def _mass_without_each(q: np.ndarray) -> np.ndarray:
    """(n, V) Σ_{v≠x} q(v) per entry x. Only a row's largest entry can exceed 1/2, so only there
    would 1 − q(x) cancel: that entry gets the sum of the others instead."""
    rest = 1.0 - q
    top = np.argmax(q, axis=1)
    rows = np.arange(q.shape[0])
    others = q.copy()
    others[rows, top] = 0.0
    rest[rows, top] = others.sum(axis=1)
    return rest


def node_acceptance_swor(p_target: np.ndarray, q_draft: np.ndarray, k: int, samples: int,
                         rng: np.random.Generator) -> np.ndarray:
    """(n, k) P(one of j candidates drawn without replacement is accepted), j = 1..k, under the recursive rule
    `acceptance_swor` replays. Given the history (c_i, Z_i and the undrawn mass 1 − Q_i), candidate i is accepted
    with Σ_y min(q_i(y), r_i(y)), one lookup in the prefix sums of the descending p/q order (`_step_acceptance`).
    j = 1, 2: exact (the one rejected candidate before the second is summed over); j ≥ 3: the histories are
    Monte-Carlo (`samples` per row, the sampler of `acceptance_swor`), each step's acceptance exact given its
    history."""
    p = np.asarray(p_target, dtype=np.float64)
    q = np.asarray(q_draft, dtype=np.float64)
    q = q / q.sum(axis=1, keepdims=True)
    n = p.shape[0]
    out = np.zeros((n, k))
    out[:, 0] = np.minimum(p, q).sum(axis=1)
    rest_without = _mass_without_each(q) if k >= 2 else None
    for row in range(n) if k >= 2 else ():
        _, ps, qs, rs, P, Q = _descending(p[row][None], q[row][None])  # (1, V)
        # the second candidate, exactly: the first, x, was rejected with weight max(0, q(x) − p(x)); then c_1 = 1
        # and Z_1 = Σ max(0, p − q) whatever x was, and the undrawn mass is 1 − q(x)
        z1 = float(np.maximum(p[row] - q[row], 0.0).sum())
        rejected = np.maximum(q[row] - p[row], 0.0)
        some = rejected > 0
        second = _step_acceptance(P, Q, rs, np.ones((1, int(some.sum()))), np.full((1, int(some.sum())), z1),
                                  rest_without[row, some][None])[0]
        out[row, 1] = out[row, 0] + float((rejected[some] * second).sum())
        if k < 3:
            continue
        draws = _SworDraws(qs, k, samples)
        c, z, weight = np.zeros((1, samples)), np.ones((1, samples)), np.ones((1, samples))
        total = np.zeros(samples)
        for i in range(k):
            rest = draws.rest()
            if i >= 2:
                total = total + (weight * _step_acceptance(P, Q, rs, c, z, rest))[0]
                out[row, i] = out[row, 1] + total.mean()
            if i + 1 == k:
                break
            c, z, weight = _reject_next(draws, rest, rng.random((1, samples)), ps, qs, rs, P, Q, c, z, weight)
    return out


def _step_acceptance(P: np.ndarray, Q: np.ndarray, rs: np.ndarray, c: np.ndarray, z: np.ndarray,
                     rest: np.ndarray) -> np.ndarray:
    """Σ_y min(q(y) / rest, max(0, p(y) − c q(y)) / z) per history (c, z, rest; (m, S), S histories of each of m
    rows): the chance that the next candidate drawn without replacement is accepted. P, Q: prefix sums of p and q
    in descending p/q (rs), (m, V). Tokens with p/q above c' = c + z / rest give q / rest, those in (c, c'] give the
    residual; drawn tokens (rejected, so p/q < c) and the rest give nothing, so nothing needs subtracting."""
    def prefix(sums, m):
        return np.where(m > 0, _rows(sums, np.maximum(m - 1, 0)), 0.0)

    ok = (z > _NO_MASS) & (rest > 0)
    safe_rest, safe_z = np.where(ok, rest, 1.0), np.where(ok, z, 1.0)
    top = _searchsorted_rows(-rs, -(c + safe_z / safe_rest), "left")  # tokens with p/q > c'
    live = _searchsorted_rows(-rs, -c, "left")  # tokens with p/q > c
    head = prefix(Q, top) / safe_rest
    body = (prefix(P, live) - prefix(P, top) - c * (prefix(Q, live) - prefix(Q, top))) / safe_z
    return np.where(ok, np.clip(head + np.maximum(body, 0.0), 0.0, 1.0), 0.0)


class _SworDraws:
    """Candidates drawn without replacement from q, `samples` tuples side by side for each of m rows, over each
    row's tokens in a fixed order (`qs`, (m, V): q in that order); `drawn` holds each tuple's positions so far,
    ascending.

    The undrawn mass 1 − Q_i cancels catastrophically once the drawn candidates hold nearly all of q, so it is
    kept as (Σ of the small tokens − the small ones drawn) + Σ of the big tokens not drawn: the k + 8 largest q
    sum exactly, and only a token outside them, at most as heavy, is ever subtracted."""

    def __init__(self, qs: np.ndarray, k: int, samples: int):
        m, V = qs.shape
        self.qs = qs
        self.cum = np.cumsum(qs, axis=1)
        self.starts = self.cum - qs  # each token's interval [start, start + q) in the cumulative q
        self.big = np.argsort(-qs, axis=1)[:, : min(V, k + 8)]  # positions of the largest q
        self.slot = np.full((m, V), -1)
        np.put_along_axis(self.slot, self.big, np.broadcast_to(np.arange(self.big.shape[1]), self.big.shape), axis=1)
        small = self.slot < 0
        self.small_mass = np.array([float(qs[r][small[r]].sum()) for r in range(m)])  # in order, as summed alone
        self.big_q = np.take_along_axis(qs, self.big, axis=1)
        self.big_left = np.ones((m, samples, self.big.shape[1]), dtype=bool)
        self.small_drawn = np.zeros((m, samples))
        self.drawn = np.zeros((m, samples, 0), dtype=np.int64)

    def rest(self) -> np.ndarray:
        """(m, samples) the undrawn mass of q."""
        return (np.maximum(self.small_mass[:, None] - self.small_drawn, 0.0)
                + (self.big_left * self.big_q[:, None, :]).sum(axis=2))

    def draw(self, rest: np.ndarray, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next candidate of every tuple, (positions, alive), each (m, samples): `uniforms` (m, samples) in
        [0, 1) scaled to the undrawn mass `rest` and mapped past the drawn intervals; alive is False where no mass
        was left beyond rounding (no candidate)."""
        alive = rest > 1e-12 * self.small_drawn
        u = uniforms * rest
        for j in range(self.drawn.shape[2]):
            drawn = self.drawn[:, :, j]
            u = u + np.where(u >= _rows(self.starts, drawn), _rows(self.qs, drawn), 0.0)
        x = np.minimum(_searchsorted_rows(self.cum, u, "right"), self.cum.shape[1] - 1)
        hit = _rows(self.slot, x)
        big = alive & (hit >= 0)
        row, sample = np.nonzero(big)
        self.big_left[row, sample, hit[big]] = False
        self.small_drawn = self.small_drawn + np.where(alive & (hit < 0), _rows(self.qs, x), 0.0)
        self.drawn = np.sort(np.concatenate([self.drawn, x[:, :, None]], axis=2), axis=2)
        return x, alive


def _reject_next(draws, rest, uniforms, ps, qs, rs, P, Q, c, z, weight):
    """Draw every history's next candidate and reject it: (c, Z, weight) after it, weight times the chance
    1 − a that it is rejected (the residual's shape, module docstring; descending p/q order, prefix sums P, Q).
    Histories (m, S) of m rows, the rows' orders (m, V)."""
    x, alive = draws.draw(rest, uniforms)
    q_x, p_x = _rows(qs, x), _rows(ps, x)
    a = np.where(alive & (z > _NO_MASS) & (q_x > 0),
                 np.minimum(1.0, np.maximum(p_x - c * q_x, 0.0) * rest / np.where(z * q_x > 0, z * q_x, 1.0)),
                 1.0)  # no mass left to reject into: later candidates are never reached
    weight = weight * (1.0 - a)
    c = c + np.where(alive, z / np.where(rest > 0, rest, 1.0), 0.0)
    live = _searchsorted_rows(-rs, -c, "left")  # tokens with p/q > c
    last = np.maximum(live - 1, 0)
    z = np.maximum(np.where(live > 0, _rows(P, last) - c * _rows(Q, last), 0.0), 0.0)
    return c, z, weight


def _later_candidates(p: np.ndarray, q: np.ndarray, y: np.ndarray, k: int, samples: int,
                      rng: np.random.Generator) -> np.ndarray:
    """(m, samples, k − 2) p(y) · π̂_i(y) for i = 2..k−1 at m positions (see `acceptance_swor`): the rows side by
    side, the generator's draws taken row after row, as if each row were sampled alone."""
    order, ps, qs, rs, P, Q = _descending(p, q)
    m = p.shape[0]
    y_pos = np.argmax(order == y[:, None], axis=1)
    p_y, q_y = _take(p, y)[:, None], _take(q, y)[:, None]
    draws = _SworDraws(qs, k, samples)
    uniforms = rng.random((m, k - 1, samples))  # row r's draws for its k − 1 rejections, in the order drawn
    out = np.zeros((m, samples, k - 2))
    c = np.zeros((m, samples))  # residual shape parameter c_i
    z = np.ones((m, samples))  # Z_i = Σ max(0, p − c_i q)
    weight = np.ones((m, samples))  # Π_{j<i} (1 − a_j)
    for i in range(k):
        rest = draws.rest()  # 1 − Q_i
        if i >= 2:
            fresh = ~(draws.drawn == y_pos[:, None, None]).any(axis=2)
            with np.errstate(over="ignore"):  # only where y was drawn (rest < q(y)); masked by `fresh`
                q_i_y = np.where(rest > 0, q_y / np.where(rest > 0, rest, 1.0), 0.0)
            r_i_y = np.where(z > _NO_MASS, np.maximum(p_y - c * q_y, 0.0) / np.where(z > 0, z, 1.0), 0.0)
            out[:, :, i - 2] = weight * fresh * np.minimum(q_i_y, r_i_y)
        if i + 1 == k:
            break
        c, z, weight = _reject_next(draws, rest, uniforms[:, i], ps, qs, rs, P, Q, c, z, weight)
    return out


# -- lossy rules ------------------------------------------------------------------------------------


def lossy_passes(rule, p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
    """(n, V) bool: tokens the rule accepts when drafted, row by row (`LossyRule.passes`)."""
    if rule.name == "typical":
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -np.where(p_target > 0, p_target * np.log(p_target), 0.0).sum(axis=1)
        threshold = np.minimum(rule.eps, rule.delta * np.exp(-entropy))  # (n,)
        return p_target > threshold[:, None]
    return p_target >= rule.lam * q_draft


def lossy_output_law(rule, p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
    """(n, V) law of the emitted token with one candidate x ~ q (`verify.output_distribution`, k = 1)."""
    q_draft = q_draft / q_draft.sum(axis=1, keepdims=True)  # as verify: a rounding-level excess can flip p >= q
    ok = lossy_passes(rule, p_target, q_draft)
    if rule.name == "typical":
        fallback = p_target
    else:  # residual(p, q); p itself where it has no mass (p == q)
        r = np.maximum(p_target - q_draft, 0.0)
        total = r.sum(axis=1, keepdims=True)
        fallback = np.where(total > _NO_MASS, r / np.where(total > 0, total, 1.0), p_target)
    rejected = (q_draft * ~ok).sum(axis=1, keepdims=True)
    return np.where(ok, q_draft, 0.0) + rejected * fallback


def lossy_acceptance(rule, p_target: np.ndarray, q_draft: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(α, TV) per row: P(one drafted candidate passes) and TV(the rule's output law, p)."""
    alpha = np.clip((q_draft * lossy_passes(rule, p_target, q_draft)).sum(axis=1), 0.0, 1.0)
    tv = 0.5 * np.abs(lossy_output_law(rule, p_target, q_draft) - p_target).sum(axis=1)
    return alpha, tv


# -- everything for one trajectory --------------------------------------------------------------------


def target_stats(logits: np.ndarray, tokens: np.ndarray, temperature: float) -> dict[str, np.ndarray]:
    """The target column's statistics: log p_t(y_t) at the trajectory's temperature (T = 0: T = 1) and its
    argmax (ties: the lower id)."""
    y = np.asarray(tokens, dtype=np.int64)
    logits = np.asarray(logits, dtype=np.float32)
    return {"logprob": log_prob(logits, y, temperature if temperature > 0 else 1.0),
            "top_id": top_k_ids(logits, 1)[:, 0]}


def draft_stats(p_logits: np.ndarray, q_logits: np.ndarray, tokens: np.ndarray, temperature: float,
                spec: StatsSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A draft column's statistics at every position (the numpy reference of the recorder's).

    rank and top_ids are ties-by-lower-id on the float32 logits; logprob, and overlap
    Σ_x min(p_t(x), q_t(x)) = 1 − TV (one drafted token's acceptance probability before the
    output is known), at the trajectory's temperature (T = 0: T = 1). Sampling statistics (π, lossy α and TV) exist only at T > 0;
    greedy trajectories store NaN there.
    """
    y = np.asarray(tokens, dtype=np.int64)
    q_logits = np.asarray(q_logits, dtype=np.float32)
    n, V = q_logits.shape
    K = spec.candidates
    top = top_k_ids(q_logits, min(spec.top_ids, V))
    if top.shape[1] < spec.top_ids:  # a vocabulary smaller than K: pad with -1
        top = np.pad(top, ((0, 0), (0, spec.top_ids - top.shape[1])), constant_values=-1)
    T = temperature if temperature > 0 else 1.0
    out = {"rank": token_rank(q_logits, y), "logprob": log_prob(q_logits, y, T), "top_ids": top,
           "overlap": np.minimum(probabilities(p_logits, T), probabilities(q_logits, T)).sum(axis=1)}
    out.update(sampling_placeholders(n, K, spec))  # NaN at T = 0; filled below when sampling
    if temperature <= 0:
        return out
    p, q = probabilities(p_logits, temperature), probabilities(q_logits, temperature)
    out["pi_iid"] = acceptance_iid(p, q, y, K).astype(np.float32)
    reps = acceptance_swor(p, q, y, K, spec.swor_samples, rng)  # (n, M, K)
    out["pi_swor"] = reps.mean(axis=1).astype(np.float32)
    out["pi_swor_groups"] = reps.reshape(n, spec.swor_groups, -1, K).mean(axis=2).astype(np.float16)
    for j, label in enumerate(spec.lossy):
        alpha, tv = lossy_acceptance(lossy_rule(label), p, q)
        out["lossy_alpha"][:, j], out["lossy_tv"][:, j] = alpha, tv
    return out


def sampling_placeholders(n: int, candidates: int, spec: StatsSpec) -> dict[str, np.ndarray]:
    """The sampling statistics of n positions, all NaN: what greedy (T = 0) trajectories record."""
    return {"pi_iid": np.full((n, candidates), np.nan, dtype=np.float32),
            "pi_swor": np.full((n, candidates), np.nan, dtype=np.float32),
            "pi_swor_groups": np.full((n, spec.swor_groups, candidates), np.nan, dtype=np.float16),
            "lossy_alpha": np.full((n, len(spec.lossy)), np.nan, dtype=np.float32),
            "lossy_tv": np.full((n, len(spec.lossy)), np.nan, dtype=np.float32)}


# The datasets of a draft column's /stats group: name -> (dtype, trailing shape from the spec).
def draft_stat_shapes(spec: StatsSpec) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    return {
        "rank": (np.dtype(np.int32), ()),
        "logprob": (np.dtype(np.float64), ()),
        "top_ids": (np.dtype(np.int32), (spec.top_ids,)),
        "overlap": (np.dtype(np.float64), ()),
        "pi_iid": (np.dtype(np.float32), (spec.candidates,)),
        "pi_swor": (np.dtype(np.float32), (spec.candidates,)),
        "pi_swor_groups": (np.dtype(np.float16), (spec.swor_groups, spec.candidates)),
        "lossy_alpha": (np.dtype(np.float32), (len(spec.lossy),)),
        "lossy_tv": (np.dtype(np.float32), (len(spec.lossy),)),
        **expansion_shapes(spec),
        **proposal_shapes(spec),
    }


def expansion_shapes(spec: StatsSpec) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The draft's expansion datasets (`specsim.sim.dynamic`), when the recording has one."""
    if spec.expand is None:
        return {}
    m = spec.expansion.candidates
    return {"expand_token": (np.dtype(np.int32), (m,)), "expand_parent": (np.dtype(np.int16), (m,)),
            "expand_score": (np.dtype(np.float32), (m,))}


def proposal_shapes(spec: StatsSpec) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The target along the draft's proposals (`specsim.verify.block_path_factors`, `block_chain_tails`), when the
    recording has it: per position, block verification's factors on the trajectory for the calls starting there,
    and, for the R chains drawn from q there, Π (1 − h_j) of every call that leaves the trajectory there."""
    if spec.expand_target is None:
        return {}
    K, R = spec.expand_target
    return {"block_keep": (np.dtype(np.float64), (K,)), "block_whole": (np.dtype(np.float64), (K + 1,)),
            "block_tails": (np.dtype(np.float32), (R, K, K))}


TARGET_STAT_SHAPES = {"logprob": (np.dtype(np.float64), ()), "top_id": (np.dtype(np.int32), ())}

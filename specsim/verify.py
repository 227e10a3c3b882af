"""Verification rules of speculative decoding: the one implementation of each.

Notation (Leviathan et al. 2023; Chen et al. 2023): p is the target's next-token
distribution, q the draft's. Every rule is a pure function of arrays and an explicit
`numpy.random.Generator` that returns a `StepResult`; live decoding runs these very
functions, and the simulator and the tests use `output_joint`, which computes the
exact distribution of what they return from the same acceptance probabilities.

Lossless rules (the emitted token is distributed exactly as p):

* `verify_greedy`      accept the candidate equal to argmax p.
* `verify_single`      speculative sampling: accept x ~ q w.p. min(1, p(x)/q(x)),
                       else emit a sample of the residual norm(max(0, p - q)).
* `verify_multi_iid`   SpecInfer's multi-round speculative sampling (Miao et al. 2024):
                       k candidates i.i.d. from q, tried in order against the running
                       residual r_0 = p, r_i = norm(max(0, r_{i-1} - q)).
* `verify_multi_swor`  the same with candidates drawn without replacement (SpecTr,
                       Sun et al. 2023; Sequoia, Chen et al. 2024): candidate i is
                       proposed by q_i = q without x_1..x_{i-1}, renormalised, and
                       r_i = norm(max(0, r_{i-1} - q_i)).
* `verify_point_mass`  candidates that are a function of the prefix (n-gram, prompt
                       lookup): sample y ~ p and accept the candidate equal to y.

Lossy rules (`verify_lossy`; faster, not distributed as p): 'p>=q', 'p>=lq' and
Medusa's 'typical' acceptance (Cai et al. 2024). See `LossyRule`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from specsim.errors import SpecError
from specsim.specs import MULTI_DRAFT

_NO_MASS = 1e-12  # a residual with less total mass than this is rounding noise of p == q
_MAX_ENUMERATED = 2_000_000  # candidate tuples output_joint will enumerate


@dataclass(frozen=True)
class StepResult:
    """What one verification step decided at one position."""

    accepted: int  # index into `candidates` of the accepted candidate, -1 if none was
    token: int  # the token emitted here: the accepted candidate, or the correction


@dataclass(frozen=True)
class LossyRule:
    """An acceptance rule from the literature that does NOT preserve p.

    * 'p>=q'    accept candidate x iff p(x) >= q(x);
    * 'p>=lq'   accept candidate x iff p(x) >= lam * q(x) (lam < 1 is more lenient);
    * 'typical' Medusa's typical acceptance: accept x iff p(x) > min(eps, delta * exp(-H(p))),
                H the entropy of p in nats (exact; Medusa's code adds 1e-5 inside the log).

    Candidates are tried in order and the first one that passes is accepted. No coin
    is flipped. When all are rejected the emitted token is sampled from
    residual(p, q) for the 'p>=…' rules (as speculative sampling would) and from p
    for 'typical' (the rule never looks at q).
    """

    name: str  # 'p>=q' | 'p>=lq' | 'typical'
    lam: float = 1.0  # λ of 'p>=lq'; 'p>=q' is λ = 1
    eps: float = 0.09  # 'typical' hard threshold ε (Medusa's posterior_threshold)
    delta: float = 0.3  # 'typical' entropy-scaled threshold δ (Medusa's posterior_alpha ≈ √ε)

    def __post_init__(self) -> None:
        if self.name not in LOSSY_RULES:
            raise SpecError(f"lossy rule {self.name!r} is not one of {', '.join(LOSSY_RULES)}")
        if self.name == "p>=q" and self.lam != 1.0:
            raise SpecError(f"'p>=q' has λ = 1; for λ = {self.lam} use the rule 'p>=lq'")
        if not self.lam > 0:
            raise SpecError(f"lossy rule {self.name!r}: λ must be positive, got {self.lam}")
        if not (self.eps >= 0 and self.delta >= 0):
            raise SpecError(
                f"lossy rule {self.name!r}: eps and delta must be non-negative, "
                f"got {self.eps} and {self.delta}"
            )

    def passes(self, p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
        """(V,) bool: the tokens this rule accepts when they are drafted."""
        p, q = _dist(p_target, "p_target"), _dist(q_draft, "q_draft", like=p_target)
        if self.name == "typical":
            return p > self.threshold(p)
        return p >= self.lam * q

    def threshold(self, p_target: np.ndarray) -> float:
        """'typical' only: min(eps, delta * exp(-H(p)))."""
        p = _dist(p_target, "p_target")
        nz = p[p > 0]
        entropy = float(-(nz * np.log(nz)).sum())
        return min(self.eps, self.delta * float(np.exp(-entropy)))


LOSSY_RULES = ("p>=q", "p>=lq", "typical")


# ---------------------------------------------------------------------------- primitives


def _dist(x: object, name: str, like: object = None) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty 1-D probability vector, got shape {a.shape}")
    if like is not None and a.shape != np.shape(like):
        raise ValueError(f"{name} has shape {a.shape} but p_target has {np.shape(like)}")
    return a


def _tokens(candidates: object, vocab: int) -> np.ndarray:
    c = np.asarray(candidates)
    if c.ndim != 1 or (c.size and c.dtype.kind not in "iu"):
        raise ValueError(f"candidates must be a 1-D array of token ids, got {c!r}")
    c = c.astype(np.int64)
    if c.size and (c.min() < 0 or c.max() >= vocab):
        raise ValueError(f"candidate ids must lie in [0, {vocab}), got {c.tolist()}")
    return c


def residual(p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)): where a rejected draft sends the output.

    If it has no mass, p == q (both are distributions), rejection has probability
    zero and only rounding got us here; p itself is then the correct distribution.
    """
    p = _dist(p_target, "p_target")
    r = np.maximum(p - _dist(q_draft, "q_draft", like=p), 0.0)
    total = r.sum()
    if total <= _NO_MASS:
        return p
    return r / total


def _accept_probability(r: np.ndarray, q_i: np.ndarray, x: int) -> float:
    """min(1, r(x)/q_i(x)); a candidate the proposal cannot produce (q_i(x) = 0) is taken as
    a point mass proposal when r(x) > 0 (accepted w.p. 1) and rejected when r(x) = 0."""
    if r[x] >= q_i[x]:
        return 1.0 if r[x] > 0.0 else 0.0
    return r[x] / q_i[x]


def _accepts(u: float, r: np.ndarray, q_i: np.ndarray, x: int) -> bool:
    # u < min(1, r/q) written without division: exact for q(x) = 1 and q(x) = 0.
    return u * q_i[x] < r[x]


def _sample(dist: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a (possibly unnormalised) non-negative vector by inverse CDF."""
    cdf = np.cumsum(dist)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    if i >= dist.shape[0]:  # u * total rounded up to total
        i = int(np.flatnonzero(dist)[-1])
    return i


def _proposals(q: np.ndarray, candidates: np.ndarray, scheme: str) -> Iterator[np.ndarray]:
    """The proposal distribution q_i each candidate was drawn from, in order."""
    if scheme == "iid":
        for _ in candidates:
            yield q
    elif scheme == "swor":
        remaining = q.copy()
        for x in candidates:
            total = remaining.sum()
            yield remaining / total if total > 0 else remaining
            remaining[x] = 0.0
    else:
        raise ValueError(f"scheme must be 'iid' or 'swor', got {scheme!r}")


def _verify_sequential(p, q, candidates, rng, scheme) -> StepResult:
    p = _dist(p, "p_target")
    q = _dist(q, "q_draft", like=p)
    c = _tokens(candidates, p.shape[0])
    r = p
    for i, (x, q_i) in enumerate(zip(c, _proposals(q, c, scheme))):
        if _accepts(rng.random(), r, q_i, int(x)):
            return StepResult(accepted=i, token=int(x))
        r = residual(r, q_i)
    return StepResult(accepted=-1, token=_sample(r, rng))


# ---------------------------------------------------------------------------- the rules


def verify_greedy(p_target: np.ndarray, candidates: np.ndarray) -> StepResult:
    """Accept the candidate equal to argmax p (ties: the lowest token id)."""
    p = _dist(p_target, "p_target")
    c = _tokens(candidates, p.shape[0])
    token = int(np.argmax(p))
    hits = np.flatnonzero(c == token)
    return StepResult(accepted=int(hits[0]) if hits.size else -1, token=token)


def verify_single(
    p_target: np.ndarray, q_draft: np.ndarray, x: int, rng: np.random.Generator
) -> StepResult:
    """Speculative sampling of one candidate x ~ q (Leviathan et al. 2023, Chen et al. 2023)."""
    return _verify_sequential(p_target, q_draft, np.array([x]), rng, "iid")


def verify_multi_iid(
    p_target: np.ndarray, q_draft: np.ndarray, candidates: np.ndarray, rng: np.random.Generator
) -> StepResult:
    """SpecInfer multi-round speculative sampling of candidates drawn i.i.d. from q.

    Try x_i in order: accept w.p. min(1, r_{i-1}(x_i)/q(x_i)) with r_0 = p, else
    r_i = norm(max(0, r_{i-1} - q)); if all are rejected, emit a sample of r_k.
    """
    return _verify_sequential(p_target, q_draft, candidates, rng, "iid")


def verify_multi_swor(
    p_target: np.ndarray, q_draft: np.ndarray, candidates: np.ndarray, rng: np.random.Generator
) -> StepResult:
    """Multi-draft speculative sampling of candidates drawn WITHOUT replacement from q.

    Candidate i was proposed by q_i = q with x_1..x_{i-1} removed, renormalised; accept
    it w.p. min(1, r_{i-1}(x_i)/q_i(x_i)), else r_i = norm(max(0, r_{i-1} - q_i)); if
    all are rejected, emit a sample of r_k. Lossless: by induction from the last
    candidate, each step is single speculative sampling of r_{i-1} with proposal q_i.
    """
    return _verify_sequential(p_target, q_draft, candidates, rng, "swor")


def verify_point_mass(
    p_target: np.ndarray, candidates: np.ndarray, rng: np.random.Generator
) -> StepResult:
    """Candidates that are a function of the prefix (q = one-hot): accepted iff y ~ p is one.

    Equal in distribution to `verify_multi_iid` with one-hot proposals, in one draw.
    """
    p = _dist(p_target, "p_target")
    c = _tokens(candidates, p.shape[0])
    token = _sample(p, rng)
    hits = np.flatnonzero(c == token)
    return StepResult(accepted=int(hits[0]) if hits.size else -1, token=token)


def sample_candidates(
    q_draft: np.ndarray, k: int, rng: np.random.Generator, *, scheme: str
) -> np.ndarray:
    """k candidate tokens from q: 'iid' (with replacement) or 'swor' (without).

    'swor' uses Gumbel-top-k (Kool et al. 2019), which draws the same ordered sequence
    distribution as k successive renormalised draws. If q has fewer than k tokens with
    mass, 'swor' returns all of them (fewer than k candidates).
    """
    q = _dist(q_draft, "q_draft")
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    if not q.sum() > 0:
        raise ValueError("q_draft has no mass to sample candidates from")
    if scheme == "iid":
        cdf = np.cumsum(q)
        draws = np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right")
        return np.minimum(draws, int(np.flatnonzero(q)[-1])).astype(np.int64)
    if scheme == "swor":
        support = np.flatnonzero(q > 0)
        k = min(k, support.size)
        keys = np.log(q[support]) + rng.gumbel(size=support.size)  # (support,)
        top = np.argpartition(-keys, k - 1)[:k] if k else np.empty(0, dtype=np.int64)
        return support[top[np.argsort(-keys[top], kind="stable")]].astype(np.int64)
    raise ValueError(f"scheme must be 'iid' or 'swor', got {scheme!r}")


def verify_lossy(
    rule: LossyRule,
    p_target: np.ndarray,
    q_draft: np.ndarray,
    candidates: np.ndarray,
    rng: np.random.Generator,
) -> StepResult:
    """Accept the first candidate the rule passes; else emit its fallback sample (see LossyRule)."""
    p = _dist(p_target, "p_target")
    q = _dist(q_draft, "q_draft", like=p)
    c = _tokens(candidates, p.shape[0])
    hits = np.flatnonzero(rule.passes(p, q)[c])
    if hits.size:
        return StepResult(accepted=int(hits[0]), token=int(c[hits[0]]))
    return StepResult(accepted=-1, token=_sample(_lossy_fallback(rule, p, q), rng))


def _lossy_fallback(rule: LossyRule, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return p if rule.name == "typical" else residual(p, q)


# ---------------------------------------------------------------------------- exact laws


def _enumerate(q: np.ndarray, k: int, scheme: str) -> Iterator[tuple[tuple[int, ...], float]]:
    """Every candidate tuple with positive probability, and that probability."""
    support = [int(x) for x in np.flatnonzero(q > 0)]
    if scheme == "iid":
        for tup in itertools.product(support, repeat=k):
            yield tup, float(np.prod(q[list(tup)]))
    elif scheme == "swor":
        for tup in itertools.permutations(support, min(k, len(support))):
            prob, remaining = 1.0, q.copy()
            for x in tup:
                # Sum what is left rather than subtract: 1 - q(x) cancels to 0 when q(x) ≈ 1.
                prob *= remaining[x] / remaining.sum()
                remaining[x] = 0.0
            yield tup, prob
    else:
        raise ValueError(f"scheme must be 'iid' or 'swor', got {scheme!r}")


def output_joint(
    rule: str | LossyRule, p_target: np.ndarray, q_draft: np.ndarray, k: int, scheme: str = "iid"
) -> np.ndarray:
    """EXACT joint law of (emitted token, accepted index) for one verification step.

    Returns J of shape (V, k + 1): J[y, i] = P(emit y and accept candidate i) for
    i < k, and J[y, k] = P(emit y and accept none). `rule` is 'greedy', 'sample' (the
    lossless rule for `scheme`: `verify_multi_iid` or `verify_multi_swor`, which is
    `verify_single` at k = 1) or a `LossyRule`; candidates are k draws from q by
    `scheme`. k = 1 is an O(V) closed form; k > 1 enumerates candidate tuples (small V
    only), integrating each coin analytically. Under 'swor' with fewer than k tokens of
    positive q, the columns of the missing candidates are zero.
    """
    p = _dist(p_target, "p_target")
    q = _dist(q_draft, "q_draft", like=p)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if scheme not in MULTI_DRAFT:
        raise ValueError(f"scheme must be one of {', '.join(MULTI_DRAFT)}, got {scheme!r}")
    if not (rule in ("greedy", "sample") or isinstance(rule, LossyRule)):  # the per-position rules (block: a chain's)
        raise ValueError(f"rule must be 'greedy', 'sample' or a LossyRule, got {rule!r}")
    q = q / q.sum()
    vocab = p.shape[0]
    joint = np.zeros((vocab, k + 1))  # (V, k + 1)
    if k == 1:
        if rule == "greedy":
            top = int(np.argmax(p))
            joint[top] = q[top], 1.0 - q[top]
        elif rule == "sample":
            overlap = np.minimum(p, q)
            joint[:, 0] = overlap
            joint[:, 1] = max(0.0, 1.0 - overlap.sum()) * residual(p, q)
        else:
            passed = rule.passes(p, q)
            joint[:, 0] = np.where(passed, q, 0.0)
            joint[:, 1] = q[~passed].sum() * _lossy_fallback(rule, p, q)
        return joint
    n_support = int((q > 0).sum())
    n_tuples = n_support**k if scheme == "iid" else math.perm(n_support, min(k, n_support))
    if n_tuples > _MAX_ENUMERATED:
        raise ValueError(f"{n_tuples} candidate tuples is too many to enumerate (V={vocab}, k={k})")
    for tup, prob in _enumerate(q, k, scheme):
        joint += prob * _joint_given_candidates(rule, p, q, np.array(tup), scheme, k)
    return joint


def _joint_given_candidates(rule, p, q, c, scheme, k) -> np.ndarray:
    """(V, k + 1) law of (token, accepted index) for fixed candidates; coins integrated out."""
    out = np.zeros((p.shape[0], k + 1))
    if rule == "greedy":
        step = verify_greedy(p, c)
        out[step.token, step.accepted if step.accepted >= 0 else k] = 1.0
        return out
    if isinstance(rule, LossyRule):
        hits = np.flatnonzero(rule.passes(p, q)[c])
        if hits.size:
            out[c[hits[0]], hits[0]] = 1.0
        else:
            out[:, k] = _lossy_fallback(rule, p, q)
        return out
    reach, r = 1.0, p
    for i, (x, q_i) in enumerate(zip(c, _proposals(q, c, scheme))):
        a = _accept_probability(r, q_i, int(x))
        out[x, i] += reach * a
        reach *= 1.0 - a
        r = residual(r, q_i)
    out[:, k] += reach * r
    return out


def output_distribution(
    rule: str | LossyRule, p_target: np.ndarray, q_draft: np.ndarray, k: int, scheme: str = "iid"
) -> np.ndarray:
    """EXACT distribution of the emitted token (see `output_joint`); equals p for lossless rules."""
    return output_joint(rule, p_target, q_draft, k, scheme).sum(axis=1)


def accept_probability_given_output(
    rule: str | LossyRule, p_target: np.ndarray, q_draft: np.ndarray, k: int, scheme: str = "iid"
) -> np.ndarray:
    """(V, k + 1): P(accepted index = i | emitted y); rows of tokens never emitted are 0.

    For lossless rules the emitted y is distributed as p, so this is what the simulator
    needs to replay a cached trajectory (y_t sampled from p) through a tree.
    """
    joint = output_joint(rule, p_target, q_draft, k, scheme)
    emitted = joint.sum(axis=1, keepdims=True)
    return np.divide(joint, emitted, out=np.zeros_like(joint), where=emitted > 0)


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    """TV distance ½ Σ |a - b|: the distortion a lossy rule adds to p."""
    return 0.5 * float(np.abs(np.asarray(a, float) - np.asarray(b, float)).sum())


# ---------------------------------------------------------------------------- block verification


@dataclass(frozen=True)
class BlockResult:
    """What block verification of one drafted chain decided."""

    kept: int  # τ: the drafts kept, 0..γ
    token: int  # the token emitted after them: the correction (τ < γ) or the bonus (τ = γ)


def _block_inputs(p_rows, q_rows, drafts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = np.asarray(p_rows, dtype=np.float64)
    q = np.asarray(q_rows, dtype=np.float64)
    if p.ndim != 2 or q.ndim != 2 or p.shape[0] != q.shape[0] + 1 or p.shape[1] != q.shape[1]:
        raise ValueError(f"p_rows must be (γ+1, V) and q_rows (γ, V); got {p.shape} and {q.shape}")
    x = _tokens(drafts, p.shape[1])
    if x.shape[0] != q.shape[0]:
        raise ValueError(f"{x.shape[0]} drafts for {q.shape[0]} draft rows")
    return p, q, x


def block_thresholds(p_rows, q_rows, drafts) -> tuple[np.ndarray, np.ndarray]:
    """(a, h) of block verification (Sun et al., ICLR 2025, arXiv 2403.10444; vLLM's `block` rejection
    sampler) for a chain x_1..x_γ drafted from q.

    p_rows[i] is the target's law of token i+1 after the first i drafts (γ+1 rows, the last one the
    bonus position's), q_rows[i] the draft's law it drew x_{i+1} from (γ rows). a_0 = 1,
    a_i = min(1, a_{i-1} p_i(x_i) / q_i(x_i)); for i < γ, η_i = Σ_x max(a_i p_{i+1}(x) − q_{i+1}(x), 0)
    and h_i = η_i / (η_i + 1 − a_i) (1 where that is 0/0); h_γ = a_γ. Returns a (γ+1,) and h (γ+1,),
    h_0 unused (0).
    """
    p, q, x = _block_inputs(p_rows, q_rows, drafts)
    g = x.shape[0]
    a = np.ones(g + 1)
    for i in range(g):
        px, qx = p[i, x[i]], q[i, x[i]]
        a[i + 1] = min(1.0, a[i] * px / qx) if qx > 0 else (1.0 if px > 0 and a[i] > 0 else 0.0)
    h = np.zeros(g + 1)
    for i in range(1, g):
        eta = float(np.maximum(a[i] * p[i] - q[i], 0.0).sum())
        denominator = eta + 1.0 - a[i]
        h[i] = eta / denominator if denominator > 0 else 1.0
    if g:
        h[g] = a[g]
    return a, h


def block_kept_law(p_rows, q_rows, drafts) -> np.ndarray:
    """P(τ = i | the drafts), i = 0..γ: τ is the largest i >= 1 with u_i <= h_i (u_i independent uniforms),
    0 if none, so P(τ = i) = h_i Π_{j>i} (1 − h_j)."""
    _, h = block_thresholds(p_rows, q_rows, drafts)
    g = h.shape[0] - 1
    law = np.empty(g + 1)
    tail = 1.0  # Π_{j>i} (1 − h_j)
    for i in range(g, 0, -1):
        law[i] = h[i] * tail
        tail *= 1.0 - h[i]
    law[0] = tail
    return law


def block_correction(p_rows, q_rows, drafts, kept: int) -> np.ndarray:
    """The law of the token emitted after τ = `kept` drafts: norm(max(a_τ p_{τ+1} − q_{τ+1}, 0)) for τ < γ (p_{τ+1}
    itself if that has no mass), the bonus position's p_{γ+1} for τ = γ."""
    p, q, x = _block_inputs(p_rows, q_rows, drafts)
    if kept == x.shape[0]:
        return p[kept]
    a, _ = block_thresholds(p, q, x)
    r = np.maximum(a[kept] * p[kept] - q[kept], 0.0)
    total = r.sum()
    return p[kept] if total <= _NO_MASS else r / total


def verify_block(p_rows, q_rows, drafts, rng: np.random.Generator) -> BlockResult:
    """Block verification of a drafted chain, as vLLM's `rejection_sample_method="block"` runs it: one uniform
    u_i per draft, τ = the largest i with u_i <= h_i (0 if none), then one token from `block_correction`.

    Lossless (the emitted tokens are distributed as the target's; tests/test_block.py enumerates it) and, for
    one drafted chain, optimal in expected tokens kept among valid rules. For drafts that are point masses
    (greedy drafting, vLLM's default `draft_sample_method`), its law of (τ, token) is token-wise verification's
    (docs/design.md, "Block verification").
    """
    _, h = block_thresholds(p_rows, q_rows, drafts)
    kept = 0
    for i in range(1, h.shape[0]):
        if rng.random() <= h[i]:
            kept = i
    return BlockResult(kept=kept, token=_sample(block_correction(p_rows, q_rows, drafts, kept), rng))


def token_wise_kept_law(p_rows, q_rows, drafts) -> np.ndarray:
    """P(τ = i | the drafts) under token-by-token speculative sampling of the same chain: draft i is kept w.p.
    min(1, p_i(x_i) / q_i(x_i)) once all before it were."""
    p, q, x = _block_inputs(p_rows, q_rows, drafts)
    g = x.shape[0]
    law, reach = np.zeros(g + 1), 1.0
    for i in range(g):
        px, qx = p[i, x[i]], q[i, x[i]]
        keep = 1.0 if px >= qx else px / qx
        law[i] = reach * (1.0 - keep)
        reach *= keep
    law[g] = reach
    return law


# ------------------------------------------- block verification given the output (replay, docs/design.md 2f)


def block_path_factors(p_path, q_path, tokens, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The factors of block verification's law given its output that lie on the output itself.

    p_path, q_path (n, V): the target's and the draft's laws along a sequence y (row s: the law y_s
    was drawn from, after y_<s); tokens (n,): y. A call starting at t drafts depth j at position
    t + j − 1. Returns, for every start t and depth i = 0..K−1 (K = `depth`):

    * a (n, K): a_i(t), block verification's a after drafts y_t..y_{t+i−1} (a_0 = 1);
    * keep (n, K): c_i(t) = (Π_{j<=i} q_j(y_j) / Π_{j<=i+1} p_j(y_j)) h_i r_i(y_{t+i}), r_i the correction's law
      norm(max(a_i p_{i+1} − q_{i+1}, 0)) (p_{i+1} itself when that has no mass) and h_0 = 1;
    * whole (n, K+1): Π_{j<=i} (q_j(y_j) / p_j(y_j)) a_i, i = 0..K (column 0 is 1).

    P(τ = i | output) = keep[t, i] · E[Π_{j=i+1..γ} (1 − h_j)] for i < γ (the expectation over the draft's
    continuation from y_<t+i: `block_chain_tails`), and whole[t, γ] for i = γ. Entries past the sequence's end
    are 0.
    """
    p = np.asarray(p_path, dtype=np.float64)
    q = np.asarray(q_path, dtype=np.float64)
    y = np.asarray(tokens, dtype=np.int64)
    n, K = y.shape[0], int(depth)
    rows = np.arange(n)
    py, qy = p[rows, y], q[rows, y]
    a = np.zeros((n, K))
    keep = np.zeros((n, K))
    whole = np.zeros((n, K + 1))
    whole[:, 0] = 1.0
    for t in range(n):
        alpha, ratio = 1.0, 1.0  # a_i(t); Π q/p over the drafts kept so far
        for i in range(min(K, n - t)):
            s = t + i
            a[t, i] = alpha
            eta = float(np.maximum(alpha * p[s] - q[s], 0.0).sum())
            h = 1.0 if i == 0 else (eta / (eta + 1.0 - alpha) if eta + 1.0 - alpha > 0 else 1.0)
            share = max(alpha * py[s] - qy[s], 0.0) / (eta * py[s]) if eta > _NO_MASS else 1.0
            keep[t, i] = ratio * h * share
            alpha = min(1.0, alpha * py[s] / qy[s]) if qy[s] > 0 else (1.0 if py[s] > 0 and alpha > 0 else 0.0)
            ratio *= qy[s] / py[s]
            whole[t, i + 1] = ratio * alpha
    return a, keep, whole


def block_chain_tails(a_branch, p_chain, q_chain, chain_tokens) -> np.ndarray:
    """(R, K, K) Π_{j=i+1..γ} (1 − h_j) along R chains drawn from q at one position s, for every call that left
    the output there: index [r, i, γ − 1], the call at depth i (started at s − i, a_i = a_branch[i]) verifying γ
    drafts, i < γ <= K (h_γ = a_γ); 0 elsewhere.

    p_chain, q_chain (R, K, V): the target's and the draft's laws at each chain node (node 1: the laws at s itself,
    node m: after the chain's first m − 1 tokens); chain_tokens (R, K): the tokens drawn, node m's from q_chain
    [:, m − 1]. The mean over chains drawn from q is an unbiased estimate of the expectation `block_path_factors`
    leaves open.
    """
    p = np.asarray(p_chain, dtype=np.float64)
    q = np.asarray(q_chain, dtype=np.float64)
    x = np.asarray(chain_tokens, dtype=np.int64)
    R, K = x.shape
    take = np.arange(R)
    px = np.stack([p[take, m, x[:, m]] for m in range(K)], axis=1)  # (R, K)
    qx = np.stack([q[take, m, x[:, m]] for m in range(K)], axis=1)
    ratio = np.divide(px, qx, out=np.where(px > 0, np.inf, 0.0), where=qx > 0)
    out = np.zeros((R, K, K))
    for i in range(K):
        alpha = np.full(R, float(a_branch[i]))
        survive = np.ones(R)  # Π (1 − h_j) over the depths already passed
        for m in range(K - i):  # chain node m + 1 is the call's depth i + m + 1
            alpha = np.minimum(1.0, alpha * ratio[:, m])
            out[:, i, i + m] = survive * (1.0 - alpha)  # that depth the last one: h = a
            if m + 1 < K - i:
                eta = np.maximum(alpha[:, None] * p[:, m + 1] - q[:, m + 1], 0.0).sum(axis=1)
                den = eta + 1.0 - alpha
                h = np.divide(eta, den, out=np.ones(R), where=den > 0)
                survive = survive * (1.0 - h)
    return out

"""Sampling trees: multi-draft speculative sampling replayed on target trajectories.

A node with k children draws k candidates from q (i.i.d. as in SpecInfer, Miao et al.
2024, or without replacement as in SpecTr / Sequoia, Chen et al. 2024) and verifies them
one after another against the running residual r_0 = p, r_i = norm(max(0, r_{i-1} - q_i))
(`specsim.verify`). The emitted token is distributed as p, so a cached target trajectory
is a valid sample of what the tree emits (docs/design.md §2). Given the emitted y, which
candidate was accepted decides which subtree is followed:

    π_i(y) = P(accepted as candidate i | y) = E_x[1[x_i = y] · Π_{j<i}(1 − a_j) · a_i] / p(y),
    a_j = min(1, r_{j-1}(x_j) / q_j(x_j)).

Candidate i's fate depends only on candidates 0..i, never on later ones, so π_i does not
depend on the fan-out k > i: one vector π(s) per position serves every node.

* i.i.d.: the residuals do not depend on the candidates, so the expectation factorises
  into a closed form, π_i(y) = Π_{j<i}(1 − Σ_x min(q, r_j)) · min(q(y), r_i(y)) / p(y). Exact.
* without replacement: the residuals depend on the earlier candidates. π_0 and π_1 are
  closed forms; beyond, Monte-Carlo with the coins integrated analytically and x_i forced
  to y (importance weight q_i(y)):
      π̂_i = Π_{j<i}(1 − a_j(x_j)) · min(q_i(y), r_i(y)) / p(y),  x_{<i} ~ q without replacement,
  unbiased, with a standard error from independent replicates. The residual keeps the shape
  max(0, p − c q) (`specsim.cache.stats`), so each sample costs O(log V) per candidate.
* k = 1 everywhere (chains) reduces to β = min(1, q(y)/p(y)), computed without MC.

P(reach node) = P(reach parent) · π_{index}(t + depth − 1) along the tree gives
P(A ≥ d | t) = Σ_{nodes at depth d} P(reach node) (siblings are exclusive), capped at the
end of each trajectory (a call at t accepts at most n − 1 − t drafts).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np

from specsim.cache.stats import acceptance_iid, acceptance_swor
from specsim.errors import ArgumentError, SpecError
from specsim.sim.engine import EndCap, at_depth, leaves_above_full_depth
from specsim.specs import MULTI_DRAFT
from specsim.trees import Tree

if TYPE_CHECKING:  # pragma: no cover
    from specsim.sim.engine import AcceptanceTable
    from specsim.sim.features import Features

_BLOCK_ELEMENTS = 1 << 19  # (positions × vocab) floats per block: CPU-cache sized rows are
#                            5x faster at V = 49k than 256-position blocks (measured)
_MIN_WIDTH = 4  # candidates estimated per position at least, so a sweep's trees share one pass
_MEMO_ELEMENTS = 1 << 25  # Monte-Carlo replicates kept for reuse up to this many floats (256 MB)
_memo: dict[int, tuple] = {}  # id(features) -> (weakref, scheme, samples, pi, reps)


# ---------------------------------------------------------------------------- per-position π
# acceptance_iid and acceptance_swor live in specsim.cache.stats: the recorder computes them too.


# ---------------------------------------------------------------------------- tree DP


def sibling_index(tree: Tree) -> np.ndarray:
    """(n_nodes,) each node's order among its parent's children (its candidate index); root −1."""
    first_child = np.searchsorted(tree.parents, tree.parents, side="left")
    index = np.arange(tree.n_nodes) - first_child
    index[0] = -1
    return index


def reach_by_depth(pi: np.ndarray, tree: Tree, remaining: np.ndarray, *, keyed: bool = False,
                   only: np.ndarray | None = None) -> np.ndarray:
    """P(A ≥ d | t) for d = 1..D from per-position candidate acceptance.

    pi: (N, K, ...) π_i(s) (trailing axes, e.g. Monte-Carlo replicates, are carried along);
    keyed: pi is a head draft's (N, D_rec, K, ...), depth d reading [:, d - 1];
    remaining: (N,) drafts a call at t may accept. Returns (N, D, ...).
    only: (n_nodes,) bool: sum the reach of these nodes alone (leaves: P(the path ends on a leaf at d)).
    """
    by_depth = pi
    pi = at_depth(pi, 1, keyed)  # the shapes of one depth's π
    index = sibling_index(tree)
    if pi.shape[1] < int(index.max(initial=0)) + 1:
        raise ValueError(f"pi has {pi.shape[1]} candidates, the tree needs {int(index.max()) + 1}")
    if by_depth.ndim == 2 and not keyed:
        return _reach_by_node(pi, tree, index, remaining, only)
    n_total = pi.shape[0]
    depths = tree.depths
    depth = int(tree.max_depth)
    out = np.zeros((n_total, depth) + pi.shape[2:])  # (N, D, ...)
    prev_nodes = np.array([0])
    prev_reach = np.ones((n_total, 1) + pi.shape[2:])  # (n, nodes in level, ...), n shrinks with depth
    valid_shape = (n_total,) + (1,) * (pi.ndim - 2)
    valid_all = (remaining >= np.arange(1, depth + 1)[:, None]).T  # (N, D)
    for d in range(1, depth + 1):
        n = n_total - (d - 1)  # calls at t >= n would read π past the array; remaining < d there anyway
        if n <= 0:
            break
        nodes = np.flatnonzero(depths == d)
        valid = valid_all[:n, d - 1].reshape((n,) + valid_shape[1:])
        parent_col = np.searchsorted(prev_nodes, tree.parents[nodes])
        pi_d = at_depth(by_depth, d, keyed)[d - 1 :]  # π at t + d − 1
        reach = prev_reach[:n, parent_col] * pi_d[:, index[nodes]] * valid[:, None]
        out[:n, d - 1] = (reach if only is None else reach[:, only[nodes]]).sum(axis=1)
        prev_nodes, prev_reach = nodes, reach
    return out


def _reach_by_node(pi: np.ndarray, tree: Tree, index: np.ndarray, remaining: np.ndarray,
                   only: np.ndarray | None = None) -> np.ndarray:
    """`reach_by_depth` for one (N, K) π: node by node over contiguous position rows, 3-7x faster than
    gathering a level's (N, nodes) block (measured at 200k positions); pi in Fortran order costs no copy.
    index: each node's candidate index (`sibling_index`)."""
    n_total, depths = pi.shape[0], tree.depths
    cols = np.ascontiguousarray(pi.T, dtype=np.float64)  # (K, N)
    out = np.zeros((int(tree.max_depth), n_total))
    reach: list[np.ndarray | None] = [np.ones(n_total)] + [None] * (tree.n_nodes - 1)
    ends = EndCap(remaining)
    for node in range(1, tree.n_nodes):
        d = int(depths[node])
        n = n_total - (d - 1)  # calls at t >= n would read π past the array; remaining < d there anyway
        if n <= 0:
            continue
        r = reach[tree.parents[node]][:n] * cols[index[node], d - 1 :]  # π at t + d − 1
        r[ends(d)] = 0.0  # remaining < d (see EndCap)
        reach[node] = r
        if only is None or only[node]:
            out[d - 1, :n] += r
    return out.T


REPLICATE_CHUNK = 1 << 13  # positions per block of the replicates' walk: bounds its memory, not its result


def replicate_means(reps: np.ndarray, tree: Tree, remaining: np.ndarray, *, keyed: bool = False) -> np.ndarray:
    """(N, R) E[A | t] under each Monte-Carlo replicate: `reach_by_depth` summed over depths, in blocks of
    positions. A call at t reads π up to t + D − 1, so a block carries D − 1 rows past its end and keeps
    its own rows: the same numbers as one pass, with (block, R) rows per node instead of (N, D, R).

    reps: (N, R, K) (a head draft's: (N, D_rec, R, K)). Node by node over contiguous (R, block) rows,
    as `_reach_by_node`: 3-4x faster than a level's gathers (131k positions, 16 replicates)."""
    n, carry = reps.shape[0], max(tree.max_depth - 1, 0)
    out = np.zeros((n, reps.shape[-2]))
    index, depths, parents = sibling_index(tree), tree.depths, tree.parents
    for a in range(0, n, REPLICATE_CHUNK):
        b = min(n, a + REPLICATE_CHUNK)
        if keyed:
            block = np.swapaxes(reps[a : b + carry], -1, -2).astype(np.float64)
            out[a:b] = reach_by_depth(block, tree, remaining[a : b + carry], keyed=True)[: b - a].sum(axis=1)
            continue
        m = min(n, b + carry) - a
        cols = np.ascontiguousarray(reps[a : a + m].transpose(2, 1, 0), dtype=np.float64)  # (K, R, m)
        ends = EndCap(remaining[a : a + m])
        total = np.zeros(cols.shape[1:])
        reach: list[np.ndarray | None] = [np.ones(cols.shape[1:])] + [None] * (tree.n_nodes - 1)
        for node in range(1, tree.n_nodes):
            d = int(depths[node])
            if m - (d - 1) <= 0:
                continue
            r = reach[parents[node]][:, : m - (d - 1)] * cols[index[node], :, d - 1 :]  # π at t + d − 1
            r[:, ends(d)] = 0.0
            reach[node] = r
            total[:, : r.shape[1]] += r
        out[a:b] = total[:, : b - a].T
    return out


def length_distribution(at_least: np.ndarray, *, valid: bool = True) -> np.ndarray:
    """(N, D+1) P(A = a) from (N, D) P(A ≥ d).

    valid=True makes it a law (clipped to [0, 1], non-increasing): exact inputs already are.
    Monte-Carlo estimates pass valid=False: clipping and monotone repair of noisy estimates
    bias every expectation downward, while the unrepaired differences keep each expectation
    (E[A | t] and the walk's totals, linear in them) unbiased; rows still sum to 1.
    """
    n, depth = at_least.shape
    ge = np.empty((depth + 2, n))  # depth-major: each step below is one contiguous row operation
    ge[0], ge[-1] = 1.0, 0.0
    ge[1:-1] = at_least.T
    if valid:
        np.clip(ge[1:-1], 0.0, 1.0, out=ge[1:-1])
        for d in range(2, depth + 1):
            np.minimum(ge[d], ge[d - 1], out=ge[d])
    return (ge[:-1] - ge[1:]).T


# ---------------------------------------------------------------------------- the policy


def candidate_acceptance(
    features: "Features",
    k: int,
    *,
    scheme: str,
    samples: int,
    rng: np.random.Generator,
    replicates: bool = True,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-position π (N, k) and, for 'swor' with k > 2, Monte-Carlo replicates (N, R, k); a head draft's
    (features.depth set) carry a depth axis after the position: (N, D, k) and (N, D, R, k).

    k = 1 uses the cached log-probabilities (β). Otherwise the statistics the recording
    computed (`Features.recorded`: π_iid exactly; π_swor with its group means as R
    replicates) when they cover k candidates; else the full distributions are streamed
    from the cache once per Features object and scheme (π_i does not depend on the
    fan-out, so one estimate serves every tree of a sweep with no more candidates per node).
    replicates=False: π only, where nothing needs a standard error (tree fitting); recorded
    replicates are then not read.
    """
    if scheme not in MULTI_DRAFT:
        raise SpecError(f"multi-draft scheme {scheme!r} is not one of {', '.join(MULTI_DRAFT)}")
    if k == 1 and features.logp is not None and features.logq is not None:
        return features.acceptance()[..., None], None
    recorded = features.recorded_stats
    if recorded is not None and k <= recorded.candidates:
        name = "pi_iid" if scheme == "iid" else "pi_swor"
        if features.recorded(name) is not None:
            pi = _recorded_pi(features, name, k)
            if scheme == "iid" or k <= 2 or not replicates:  # candidates 0 and 1 are exact without replacement too
                return pi, None
            return pi, _recorded_replicates(features)[..., :k]
    if features.depth is not None:
        raise SpecError(f"head draft {features.draft}: π for {k} candidates per node was not recorded (recorded: "
                        f"{recorded.candidates if recorded else 0}); re-record with --candidates {k}")
    if not features.has_distributions:
        have = f"for up to {recorded.candidates} candidates per node" if recorded is not None else "none"
        raise SpecError(f"a {scheme} tree with {k} candidates per node needs π for {k} candidates; this stats-only "
                        f"cache recorded them {have}: re-record with --candidates {k} (or --store full)")
    hit = _memo.get(id(features))
    if hit is not None and hit[0]() is features and hit[1:3] == (scheme, samples) and hit[3].shape[1] >= k:
        pi, reps = hit[3], hit[4]
        return pi[:, :k], (reps[:, :, :k] if reps is not None and k > 2 else None)
    if features.parent is not None:  # a subset (cross-fitting folds): slice the whole set's estimates
        base, rows = features.parent
        hit = _memo.get(id(base))
        if hit is not None and hit[0]() is base and hit[1:3] == (scheme, samples) and hit[3].shape[1] >= k:
            pi, reps = hit[3][rows], (None if hit[4] is None else hit[4][rows])
            return pi[:, :k], (reps[:, :, :k] if reps is not None and k > 2 else None)
    width = max(k, _MIN_WIDTH)
    pi, reps = _estimate(features, width, scheme, samples, rng)
    if reps is None or reps.size <= _MEMO_ELEMENTS:
        _memo.clear()  # one Features at a time: a sweep walks (draft, temperature) in turn
        _memo[id(features)] = (weakref.ref(features), scheme, samples, pi, reps)
    return pi[:, :k], (reps[:, :, :k] if reps is not None and k > 2 else None)


def _recorded_pi(features: "Features", name: str, k: int) -> np.ndarray:
    """(N, k) float64 recorded π ("pi_iid" or "pi_swor"); candidate 0 is β where the cache has log p and
    log q (the chains' value)."""
    pi = features.recorded(name)[..., :k].astype(np.float64)
    if features.logp is not None and features.logq is not None:
        pi[..., 0] = features.acceptance()
    return pi


def _recorded_replicates(features: "Features") -> np.ndarray:
    """(N, R, K) float32: the recorded swor group means as replicates for the SE, their first two columns
    set to the exact π (no spread between replicates there). Prepared once per Features at the recorded
    width (every tree of a sweep slices it); the float16 recording is then dropped from the memo."""
    key = "swor replicates"
    if key in features._memo:
        return features._memo[key]
    if features.parent is not None:  # a subset (cross-fitting folds): the whole set's rows
        base, rows = features.parent
        features._memo[key] = _recorded_replicates(base)[rows]
    else:
        groups = features.recorded("pi_swor_groups").astype(np.float32)
        groups[..., :2] = _recorded_pi(features, "pi_swor", 2)[..., None, :]
        groups.flags.writeable = False
        features._memo[key] = groups
        features._memo.pop("recorded:pi_swor_groups", None)
    return features._memo[key]


_BAR_ELEMENTS = 1 << 28  # (positions × vocab × candidates [× samples]) above which a progress bar shows


def _estimate(features: "Features", k: int, scheme: str, samples: int, rng: np.random.Generator):
    from tqdm.auto import tqdm

    n_total = int(features.token.shape[0])
    pi = np.zeros((n_total, k))
    reps = np.zeros((n_total, samples, k)) if scheme == "swor" else None
    bar = None
    for start, stop, p_target, q_draft in features.iter_distributions():
        if bar is None:  # a terminal-only bar once the work is known to be long (swor at a large V)
            work = n_total * p_target.shape[1] * k
            bar = tqdm(total=n_total, unit="pos", desc=f"{scheme} candidate acceptance ({features.draft}, "
                       f"T={features.temperature:g})", leave=False,
                       disable=None if work >= _BAR_ELEMENTS else True)
        y = features.token[start:stop].astype(np.int64)
        step = max(1, _BLOCK_ELEMENTS // p_target.shape[1])
        for a in range(0, stop - start, step):
            b = min(a + step, stop - start)
            if reps is None:
                pi[start + a : start + b] = acceptance_iid(p_target[a:b], q_draft[a:b], y[a:b], k)
            else:
                est = acceptance_swor(p_target[a:b], q_draft[a:b], y[a:b], k, samples, rng)
                reps[start + a : start + b] = est
                pi[start + a : start + b] = est.mean(axis=1)
            bar.update(b - a)
    if bar is not None:
        bar.close()
    return pi, reps


def sample_tree_table(features: "Features", tree: Tree, spec, rng: np.random.Generator) -> "AcceptanceTable":
    """AcceptanceTable of a sampling tree under multi-draft verification (`spec.multi_draft`).

    A node's children are its candidates in sibling order: the i-th child (ranks sorted) is
    the i-th candidate drawn, so a node with k children draws and verifies k candidates.
    Exact for 'iid' and for chains; 'swor' trees are Monte-Carlo with `samples` per position
    (`spec.samples`, default 64) and a standard error of E[A | t].
    """
    from specsim.sim.engine import AcceptanceTable, drafted_per_call

    if features.temperature <= 0:
        raise SpecError(
            "sampling trees need trajectories sampled at a temperature > 0; at T=0 use --policy greedy"
        )
    scheme = getattr(spec, "multi_draft", "iid")
    samples = int(getattr(spec, "samples", 0) or 64)
    if samples < 2:
        raise ArgumentError("{samples} {value}: at least 2 (a standard error needs two)", value=samples)
    k = int(tree.n_children.max())
    pi, reps = candidate_acceptance(features, k, scheme=scheme, samples=samples, rng=rng)
    remaining = features.remaining()
    keyed = features.depth is not None
    at_least = reach_by_depth(pi, tree, remaining, keyed=keyed)  # (N, D)
    drafted = drafted_per_call(tree, features.room())
    leaf_law = None
    if leaves_above_full_depth(tree):  # the next call's root feed depends on the node a path ends on
        leaf_law = np.zeros((features.n_positions, tree.max_depth + 1))
        leaf_law[:, 1:] = reach_by_depth(pi, tree, remaining, keyed=keyed, only=tree.n_children == 0)
    if reps is None:
        return AcceptanceTable(p_len=length_distribution(at_least), drafted=drafted, exact=True, leaf_law=leaf_law)
    # Each replicate (one sample, or one group's mean, per position) gives an unbiased E[A | t]
    # since positions are independent; their spread bounds the point estimate's error per position
    # (the product of per-position means varies less than the mean of products). The law is left
    # unrepaired (valid=False): every expectation stays unbiased.
    per_rep = replicate_means(reps, tree, remaining, keyed=keyed)  # (N, R)
    se = per_rep.std(axis=1, ddof=1) / np.sqrt(per_rep.shape[1])
    return AcceptanceTable(p_len=length_distribution(at_least, valid=False), drafted=drafted, exact=False,
                           se_len=se, jackknife=_jackknife_laws(reps, tree, remaining, keyed), leaf_law=leaf_law)


JACKKNIFE_GROUPS = 8  # replicate groups a swor table's walk totals are jackknifed over


def _jackknife_laws(reps: np.ndarray, tree: Tree, remaining: np.ndarray, keyed: bool) -> np.ndarray:
    """(G, N, D+1) the length laws with one group of replicates left out (the walk's delete-a-group jackknife).

    A trajectory's total reads π at overlapping positions from the same draws, and its point estimate
    multiplies per-position means: recomputing the whole estimate without each group carries both (the
    per-position standard errors summed in quadrature carry neither)."""
    axis = reps.ndim - 2  # the replicate axis: (N, R, k) or (N, D, R, k)
    R = reps.shape[axis]
    groups = np.array_split(np.arange(R), min(JACKKNIFE_GROUPS, R))
    total = reps.sum(axis=axis, dtype=np.float64)
    out = []
    for g in groups:
        pi = (total - np.take(reps, g, axis=axis).sum(axis=axis, dtype=np.float64)) / (R - g.size)
        out.append(length_distribution(reach_by_depth(pi, tree, remaining, keyed=keyed), valid=False))
    return np.stack(out)

"""The best static draft tree for a token budget (Sequoia, Chen et al. 2024; docs/design.md §2).

Objective on a cache: the tokens per target call of *decoding the cached trajectories*
with the tree (Σ tokens / Σ expected target calls, what `specsim simulate` reports).

Expected tokens per call of a call started at a uniformly chosen position, 1 + Σ_nodes
P(node accepted), has an exact optimum (below), but the decoding walk does not start
calls uniformly: it starts them right after each correction token, and where the draft
is wrong tends to cluster, so the two objectives can rank trees differently (on a demo
cache, the all-positions optimum of 16 nodes decoded at 4.17 tokens/call, chain:16 at
4.57). The walk's objective has no known exact optimiser, so on a cache we keep the best,
*by walk value*, of: the all-positions optimum; refits of it on the start positions the
walk of the current best visits (weighted by expected visits; EM-like, until a refit
stops improving, at most `REFITS` times); and the chain and k-ary (k = 2, 3, 4) trees of the same
budget. The result never decodes worse than those simple trees; it is not proven optimal.

* Greedy on a cache: P(node accepted) is the empirical frequency, over the start positions
  (optionally weighted), of the node's rank path in the trajectory's rank sequence
  (ρ_t, ρ_{t+1}, …). A child's frequency never exceeds its parent's, so the N most
  frequent rank paths form a prefix-closed tree and maximise the (weighted) mean. Found
  best-first: pop the most frequent path, count its children over the positions it
  matched (ties: shallower first, then smaller ranks, so a parent always precedes its
  children).
* A positional acceptance vector (Sequoia's layout: entry k ≥ 1 is the probability that the
  k-th ranked sibling is the accepted one): P(node) = Π p_{rank+1} along the path, and a
  node's children are the first k candidates. Sequoia's dynamic program over (subtree size,
  depth) finds the optimum for any vector, monotone or not.
* Sampling on a cache: π_i(s) per position from `specsim.sim.multidraft`; the positional
  vector is their mean and Sequoia's DP proposes one tree; a best-first search on the exact
  per-position node values (mean over t of Π π along the path, which treats consecutive
  positions jointly rather than as independent) proposes another; with the refits and
  simple trees above, all are scored by their walk on the cache and the best is kept.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from specsim.errors import ArgumentError, SpecError
from specsim.sim.engine import EndCap, at_depth
from specsim.trees import Tree

if TYPE_CHECKING:  # pragma: no cover
    from specsim.sim.features import Features


REFITS = 4  # most refits on the positions the walk visits, per budget (each must improve the walk)
SIMPLE_WIDTHS = (1, 2, 3, 4)  # chain (1) and k-ary trees every cache fit is compared with


@dataclass(frozen=True)
class OptimalTree:
    tree: Tree  # the chosen tree (canonical order)
    expected_tokens_per_call: float  # 1 + expected accepted drafts per call, on the data it was fitted to
    source: str  # what it was computed from, for the table footer
    walk_tokens_per_call: float | None = None  # Σ tokens / Σ target calls of decoding the trajectories
    #   with this tree (what `specsim simulate` reports, and what a cache fit maximises); the value
    #   above weights every start position equally, the walk weights them by how often a call starts there


# ---------------------------------------------------------------------------- Sequoia's DP


def _check_budget(budget: int, max_depth: int | None) -> int:
    if int(budget) < 1:
        raise SpecError(f"budget {budget} must be at least 1")
    if max_depth is not None and int(max_depth) < 1:
        raise SpecError(f"max depth {max_depth} must be at least 1")
    return int(budget) if max_depth is None else min(int(max_depth), int(budget))


def _acceptance_vector(acceptance: Sequence[float]) -> np.ndarray:
    vec = np.asarray(acceptance, dtype=np.float64)
    if vec.ndim != 1 or vec.shape[0] < 2:
        raise SpecError(
            "the acceptance vector must be a list [unused, p_1, p_2, ...] with at least one probability"
        )
    p = vec[1:]
    if not np.all(np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
        bad = int(np.flatnonzero(~(np.isfinite(p) & (p >= 0) & (p <= 1)))[0]) + 1
        raise SpecError(f"acceptance vector entry {bad} is {vec[bad]!r}; entries 1.. must be probabilities")
    if p.sum() > 1 + 1e-6:
        raise SpecError(
            f"acceptance vector entries 1.. sum to {p.sum():.4f} > 1; entry k is the probability that "
            "the k-th sibling is THE accepted one, so they share one unit of mass"
        )
    return p


def optimal_tree_from_vector(
    acceptance: Sequence[float], budget: int, *, max_depth: int | None = None
) -> OptimalTree:
    """Sequoia's DP: the tree of ≤ budget nodes maximising Σ_nodes Π_{path} p_{rank+1}.

    G_d(m) = best value of m nodes below a node, depth ≤ d:
        G_d(m) = max_k max_{m_1+…+m_k = m} Σ_{i≤k} p_i (1 + G_{d-1}(m_i − 1)),
    the inner max a knapsack over the children in rank order (the first k candidates).
    """
    p = _acceptance_vector(acceptance)
    depth_cap = _check_budget(budget, max_depth)
    n = int(budget)
    width = min(p.shape[0], n)
    neg = -np.inf
    m_idx = np.arange(n + 1)
    s_idx = np.arange(n + 1)
    # conv[m, s] reads H_{i-1}(m − s) for child sizes s = 1..m
    diff = m_idx[:, None] - s_idx[None, :]  # (n+1, n+1)
    feasible = (s_idx[None, :] >= 1) & (diff >= 0)
    diff = np.where(feasible, diff, 0)
    g_prev = np.full(n + 1, neg)
    g_prev[0] = 0.0  # depth 0: no nodes below
    levels: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per depth: G, best k, size choices
    for _ in range(depth_cap):
        child_value = np.full(n + 1, neg)  # c_i(s) / p_i = 1 + G_{d-1}(s − 1), s ≥ 1
        child_value[1:] = 1.0 + g_prev[:-1]
        h = np.full(n + 1, neg)
        h[0] = 0.0
        best = h.copy()
        best_k = np.zeros(n + 1, dtype=np.int32)
        sizes = np.zeros((width, n + 1), dtype=np.int32)  # sizes[i, m]: subtree size of child i
        for i in range(width):
            gain = np.where(np.isfinite(child_value), p[i] * child_value, neg)  # 0·(−inf) is not a gain
            cand = np.where(feasible, h[diff] + gain[None, :], neg)  # (n+1, n+1)
            sizes[i] = np.argmax(cand, axis=1)
            h = cand[m_idx, sizes[i]]
            better = h > best
            best = np.where(better, h, best)
            best_k = np.where(better, i + 1, best_k)
        levels.append((best, best_k, sizes))
        if np.array_equal(best, g_prev):  # deeper trees cannot do better any more
            break
        g_prev = best
    g, _, _ = levels[-1]
    m_best = int(np.argmax(np.where(np.isfinite(g), g, neg)))  # fewest nodes among the best
    paths: list[tuple[int, ...]] = []
    _rebuild(levels, len(levels), m_best, (), paths)
    tree = Tree.from_paths(paths, name=f"sequoia:{n}") if paths else None
    if tree is None:
        raise SpecError("every entry of the acceptance vector is 0: no tree beats plain decoding")
    return OptimalTree(tree=tree, expected_tokens_per_call=1.0 + float(g[m_best]),
                       source=f"Sequoia DP on a {p.shape[0]}-entry positional acceptance vector")


def _rebuild(levels, depth: int, m: int, prefix: tuple[int, ...], paths: list) -> None:
    """Append the rank paths of the optimal m-node subtree under `prefix` (depth ≤ `depth`)."""
    if m == 0 or depth == 0:
        return
    _, best_k, sizes = levels[depth - 1]
    k = int(best_k[m])
    child_sizes = []
    for i in range(k - 1, -1, -1):  # unwind the knapsack from the last child
        s = int(sizes[i, m])
        child_sizes.append(s)
        m -= s
    for i, s in enumerate(reversed(child_sizes)):
        paths.append(prefix + (i,))
        _rebuild(levels, depth - 1, s - 1, prefix + (i,), paths)


def tree_value(tree: Tree, acceptance: Sequence[float]) -> float:
    """Expected tokens per call of `tree` under a positional vector: 1 + Σ_nodes Π p_{index+1}."""
    from specsim.sim.multidraft import sibling_index

    p = np.concatenate([np.asarray(acceptance, dtype=np.float64)[1:], [0.0]])
    index = np.minimum(sibling_index(tree), p.shape[0] - 1)
    value = np.ones(tree.n_nodes)
    for node in range(1, tree.n_nodes):
        value[node] = value[tree.parents[node]] * p[index[node]]
    return float(value.sum())


# ---------------------------------------------------------------------------- greedy on a cache


def best_first_paths(
    symbols: np.ndarray, remaining: np.ndarray, budget: int, max_depth: int, weights: np.ndarray | None = None
) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The `budget` most frequent prefixes of the sequences (symbols[t], symbols[t+1], …).

    remaining[t] caps the prefix length at t (end of trajectory); weights[t] (default 1)
    weights start position t; symbols (N, D) (a head draft's ranks) read column d - 1 at depth d.
    Returns the paths in the order found — non-increasing frequency, so the first n of them are
    the best n — and their (weighted) counts.
    """
    n_total = symbols.shape[0]
    heap: list[tuple[float, int, tuple[int, ...], np.ndarray]] = []
    w = None if weights is None else np.asarray(weights, dtype=np.float64)

    def push_children(path: tuple[int, ...], positions: np.ndarray) -> None:
        d = len(path)
        if d >= max_depth:
            return
        live = positions[remaining[positions] > d]
        if live.size == 0:
            return
        nxt = at_depth(symbols, d + 1, symbols.ndim == 2)[live + d]
        order = np.argsort(nxt, kind="stable")
        live = live[order]
        values, starts, counts = np.unique(nxt[order], return_index=True, return_counts=True)
        mass = counts if w is None else np.add.reduceat(w[live], starts)
        for value, start, count, m in zip(values.tolist(), starts.tolist(), counts.tolist(), mass.tolist()):
            if m > 0:
                heapq.heappush(heap, (-m, d + 1, path + (int(value),), live[start : start + count]))

    push_children((), np.arange(n_total) if w is None else np.flatnonzero(w > 0))
    paths: list[tuple[int, ...]] = []
    counts: list[float] = []
    while heap and len(paths) < budget:
        neg_count, _, path, positions = heapq.heappop(heap)
        paths.append(path)
        counts.append(-neg_count)
        push_children(path, positions)
    return paths, np.array(counts, dtype=np.int64 if w is None else np.float64)


def simple_trees(budget: int, max_depth: int, max_width: int = max(SIMPLE_WIDTHS)) -> dict[str, Tree]:
    """chain:N and kary:W@N of this budget (those within max_depth), distinct shapes only."""
    from specsim.trees import kary_prefix

    out: dict[str, Tree] = {}
    seen = set()
    for width in (w for w in SIMPLE_WIDTHS if w <= max_width):
        tree = kary_prefix(width, budget)
        name = f"chain:{budget}" if width == 1 else f"kary:{width}@{budget}"
        key = tuple(tree.rank_paths())
        if tree.max_depth <= max_depth and key not in seen:
            seen.add(key)
            out[name] = tree
    return out


class _Scores:
    """A fit's scores of candidate trees: (walk tokens/call, all-positions tokens/call) on `features`.

    walk(F, tree) gives, on features F, each position's expected visits by the walk and its
    expected accepted drafts. Both totals are sums over trajectories, so a cross-fitting fold
    (`Features.subset` of whole trajectories) is scored from per-trajectory sums computed once
    on the whole set: the in-sample fit and every fold's fit share each candidate they have in
    common (the chain and k-ary trees always, often the optimum itself), and a candidate costs
    one pass over the cache instead of one per fit. `shared=False` (the fold's statistics are
    not the whole set's, sliced) scores on `features` alone.
    """

    def __init__(self, features: "Features", key: tuple, walk, *, shared: bool = True) -> None:
        self.features, self.walk = features, walk
        base, rows = features, None
        if shared and features.parent is not None and "parent_trajectories" in features._memo:
            base, rows = features.parent[0], features._memo["parent_trajectories"]
        self.base, self.rows = base, rows
        self.memo = base._memo.setdefault(("fit scores",) + key, {})

    def __call__(self, tree: Tree) -> tuple[float, float]:
        key = tuple(tree.rank_paths())
        if key not in self.memo:
            visits, accepted = self.walk(self.base, tree)
            starts = self.base.traj_start
            self.memo[key] = (np.add.reduceat(visits, starts), np.add.reduceat(accepted, starts))
        visits, accepted = self.memo[key]
        if self.rows is not None:
            visits, accepted = visits[self.rows], accepted[self.rows]
        n = self.features.n_positions
        return n / visits.sum(), 1.0 + accepted.sum() / n

    def visits(self, tree: Tree) -> np.ndarray:
        """(N,) expected visits on `features` (the weights of a refit)."""
        return self.walk(self.features, tree)[0]


class _WalkSearch:
    """Best tree by walk value among candidates, for one budget; remembers what it scored."""

    def __init__(self, score: _Scores) -> None:
        self.score = score
        self.best: tuple | None = None  # (walk value, how, tree, all-positions value)
        self.seen: set = set()

    def offer(self, tree: Tree, how: str) -> bool:
        """Score `tree` unless already scored; True when it was new."""
        key = tuple(tree.rank_paths())
        if key in self.seen:
            return False
        self.seen.add(key)
        walk_value, mean_value = self.score(tree)
        if self.best is None or walk_value > self.best[0] + 1e-12:
            self.best = (walk_value, how, tree, mean_value)
        return True


def _search(budget: int, max_depth: int, fit, score, n_pos: int, what: str,
            max_width: int = max(SIMPLE_WIDTHS)) -> OptimalTree:
    """The walk-value search shared by greedy and sampling fits.

    fit(weights | None) → the tree maximising the (weighted) mean over start positions.
    """
    search = _WalkSearch(score)
    search.offer(fit(None), f"the all-positions optimum ({what} over {n_pos} start positions)")
    for name, tree in simple_trees(budget, max_depth, max_width).items():
        search.offer(tree, name)
    for i in range(REFITS):  # stop once a refit no longer improves the walk
        before = search.best[0]
        if not search.offer(fit(score.visits(search.best[2])), f"refit {i + 1} on the positions the walk visits") \
                or search.best[0] <= before:
            break
    walk_value, how, tree, mean_value = search.best
    return OptimalTree(
        tree=Tree.from_paths(tree.rank_paths()[1:], name=f"optimal:{budget}"),
        expected_tokens_per_call=float(mean_value),
        source=(f"best walk tokens/call of {len(search.seen)} candidate trees ({what}; the all-positions "
                f"optimum over {n_pos} start positions, its refits on visited positions, chain and k-ary "
                f"trees of budget {budget}); chosen: {how}"),
        walk_tokens_per_call=float(walk_value),
    )


def _greedy_trees(features: "Features", budgets: Sequence[int], max_depth: int) -> list[OptimalTree]:
    """The greedy fit for each budget (the all-positions optimum's paths are shared by every budget)."""
    from specsim.sim.engine import deterministic_occupancy
    from specsim.sim.policies import greedy_lengths

    if features.rank is None:
        raise SpecError(
            f"draft {features.draft!r} has no ranks (model-free): optimise trees for model drafts"
        )
    rank = features.rank.astype(np.int64)
    remaining = features.remaining()
    paths, counts = best_first_paths(rank, remaining, max(budgets), max_depth)
    if not paths:
        raise SpecError("the cache has no position with a next token to draft: trajectories of length 1")
    n_pos = features.n_positions

    def walk(f: "Features", tree: Tree):
        rank_f, remaining_f = (rank, remaining) if f is features else (f.rank.astype(np.int64), f.remaining())
        length = greedy_lengths(rank_f, remaining_f, tree)
        return deterministic_occupancy(length, f), length.astype(np.float64)

    score = _Scores(features, ("greedy",), walk)

    out = []
    for budget in budgets:
        def fit(weights, budget=budget):
            found = paths[:budget] if weights is None else best_first_paths(rank, remaining, budget, max_depth,
                                                                            weights)[0]
            return Tree.from_paths(found or paths[:1])

        out.append(_search(budget, max_depth, fit, score, n_pos, "greedy, exact"))
    return out


# ---------------------------------------------------------------------------- sampling on a cache


def fit_width(budgets: Sequence[int]) -> int:
    """The most candidates per node a sampling tree fitted for these budgets may have (fan-outs above 8
    candidates are not estimated)."""
    return min(max(max(budgets), max(SIMPLE_WIDTHS)), 8)


def _sample_trees(features: "Features", budgets: Sequence[int], max_depth: int, scheme: str, samples: int,
                  rng: np.random.Generator) -> list[OptimalTree]:
    from specsim.sim.engine import AcceptanceTable, occupancy
    from specsim.sim.multidraft import candidate_acceptance, length_distribution, reach_by_depth

    if features.temperature <= 0:
        raise ArgumentError("sampling trees need trajectories sampled at T > 0; at T=0 use {policy} greedy")
    if features.rank is None:
        raise SpecError(f"draft {features.draft!r} is model-free: its proposals are not sampled from a q")
    width = fit_width(budgets)
    cap = ""
    if not features.has_distributions and features.recorded_stats is not None:  # π only as recorded
        if features.recorded_stats.candidates < width:
            cap = (f"; fan-out capped at the {features.recorded_stats.candidates} candidates per node this cache "
                   f"recorded (re-record with --candidates {width} or --store full for wider)")
        width = min(width, features.recorded_stats.candidates)
    pi, _ = candidate_acceptance(features, width, scheme=scheme, samples=samples, rng=rng, replicates=False)
    if pi.ndim == 2:
        pi = np.asfortranarray(pi)  # every score reads π a candidate column at a time
    remaining = features.remaining()
    keyed = features.depth is not None
    vector = np.concatenate([[0.0], np.clip((pi[:, 0] if keyed else pi).mean(axis=0), 0.0, 1.0)])
    if vector[1:].sum() > 1:
        vector[1:] /= vector[1:].sum()
    n_pos = int(pi.shape[0])
    # folds share the whole set's scores only where their π is the whole set's, sliced: the recorded statistics
    recorded = (features.recorded_stats is not None and width <= features.recorded_stats.candidates
                and features.recorded("pi_iid" if scheme == "iid" else "pi_swor") is not None)
    used = features.recorded_stats.swor_samples if recorded else samples  # the recording's samples, if it has π
    mc = ("exact" if scheme == "iid" else f"Monte-Carlo, {used} samples/position") + cap

    def walk(f: "Features", tree: Tree):
        pi_f, remaining_f = (pi, remaining) if f is features else (_fit_pi(f), f.remaining())
        at_least = reach_by_depth(pi_f, tree, remaining_f, keyed=keyed)  # (N, D)
        table = AcceptanceTable(p_len=length_distribution(at_least), drafted=np.zeros(f.n_positions), exact=True)
        return occupancy(table, f), at_least.sum(axis=1)

    def _fit_pi(f: "Features") -> np.ndarray:
        got, _ = candidate_acceptance(f, width, scheme=scheme, samples=samples, rng=rng, replicates=False)
        return np.asfortranarray(got) if got.ndim == 2 else got

    score = _Scores(features, ("sample", scheme, samples, width), walk, shared=recorded)

    shared = _best_first_exact(pi, remaining, max(budgets), max_depth)  # unweighted: one order for all budgets
    out = []
    for budget in budgets:
        sequoia = optimal_tree_from_vector(vector, budget, max_depth=max_depth).tree

        def fit(weights, budget=budget):
            found = shared[:budget] if weights is None else _best_first_exact(pi, remaining, budget, max_depth,
                                                                              weights)
            return Tree.from_paths(found)

        found = _search(budget, max_depth, fit, score, n_pos, f"{scheme}, {mc}", max_width=width)
        walk_value, mean_value = score(sequoia)
        if walk_value > found.walk_tokens_per_call + 1e-12:  # Sequoia's DP on the positional vector
            found = OptimalTree(tree=Tree.from_paths(sequoia.rank_paths()[1:], name=f"optimal:{budget}"),
                                expected_tokens_per_call=float(mean_value),
                                source=found.source.rsplit("; chosen:", 1)[0]
                                + " and Sequoia's DP on the positional vector); chosen: Sequoia's DP",
                                walk_tokens_per_call=float(walk_value))
        out.append(found)
    return out


def _best_first_exact(pi: np.ndarray, remaining: np.ndarray, budget: int, max_depth: int,
                      weights: np.ndarray | None = None) -> list[tuple[int, ...]]:
    """Grow a tree node by node, always adding the open node of highest exact value.

    A node is open once its parent and its left sibling are in the tree (candidates are
    drawn in order). Value = (weighted) mean over t of Π π along the path at positions t, t+1, ….
    pi (N, width), or a head draft's (N, D, width) read at column d - 1 for depth d.
    """
    keyed = pi.ndim == 3
    n_total, width = pi.shape[0], pi.shape[-1]
    w = np.ones(n_total) if weights is None else np.asarray(weights, dtype=np.float64)
    reach = {(): np.ones(n_total)}  # reach[path][t] for t < n_total - depth + 1 (later t cannot reach it)
    heap: list[tuple[float, int, tuple[int, ...]]] = []
    pi_rows = np.ascontiguousarray(np.moveaxis(pi, 0, -1))  # (width, N) or (D, width, N): candidate i contiguous
    ends = EndCap(remaining)  # the end cap: where a node of depth d stops

    def push(path: tuple[int, ...]) -> None:
        d, i = len(path), path[-1]
        if d > max_depth or i >= width:
            return
        n = n_total - (d - 1)
        if n <= 0:
            return
        row = pi_rows[d - 1, i] if keyed else pi_rows[i]
        value = np.multiply(reach[path[:-1]][:n], row[d - 1 :])  # π at t + d − 1
        value[ends(d)] = 0.0
        reach[path] = value
        heapq.heappush(heap, (-float(value @ w[:n]), d, path))

    push((0,))
    paths: list[tuple[int, ...]] = []
    while heap and len(paths) < budget:
        _, _, path = heapq.heappop(heap)
        paths.append(path)
        push(path + (0,))
        push(path[:-1] + (path[-1] + 1,))
    return paths  # in the order added: the first n form the best-first tree of n nodes


def optimal_trees(
    features: "Features",
    budgets: Sequence[int],
    *,
    policy,
    max_depth: int | None = None,
    samples: int | None = None,
    seed: int = 0,
) -> list[OptimalTree]:
    """`optimal_tree` for several budgets, sharing the expensive part (counts or π estimates)."""
    name = getattr(policy, "name", policy)
    budgets = [int(b) for b in budgets]
    for b in budgets:
        _check_budget(b, max_depth)
    depth_cap = max(budgets) if max_depth is None else int(max_depth)
    if features.depth is not None:  # a head draft drafts no deeper than it was recorded
        depth_cap = min(depth_cap, features.depth)
    if name == "greedy":
        return _greedy_trees(features, budgets, depth_cap)
    if name == "sample":
        scheme = getattr(policy, "multi_draft", "iid")
        samples = int(samples or getattr(policy, "samples", 64))
        return _sample_trees(features, budgets, depth_cap, scheme, samples, np.random.default_rng(seed))
    raise SpecError(f"optimal trees are defined for the policies 'greedy' and 'sample', not {name!r}")


def optimal_tree(
    features: "Features",
    budget: int,
    *,
    policy,
    max_depth: int | None = None,
    samples: int | None = None,
    seed: int = 0,
) -> OptimalTree:
    """The static tree of ≤ budget drafts that maximises expected tokens per call on a cache.

    `policy` is a PolicySpec (or its name): 'greedy' → the most frequent rank paths;
    'sample' → sampling trees under the policy's multi_draft scheme ('iid' | 'swor').
    """
    return optimal_trees(features, [budget], policy=policy, max_depth=max_depth, samples=samples, seed=seed)[0]

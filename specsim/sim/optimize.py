"""The best static draft tree for a token budget (Sequoia, Chen et al. 2024; DESIGN.md §2).

Two data sources, one objective: expected tokens per target call = 1 + Σ_nodes P(node accepted).

* Greedy on a cache: P(node accepted) is the empirical frequency, over all start positions,
  of the node's rank path in the trajectory's rank sequence (ρ_t, ρ_{t+1}, …). A child's
  frequency never exceeds its parent's, so the N most frequent rank paths form a
  prefix-closed tree and are optimal. Found best-first: pop the most frequent path,
  count its children over the positions it matched (ties: shallower first, then smaller
  ranks, so a parent always precedes its children).
* A positional acceptance vector (Sequoia's layout: entry k ≥ 1 is the probability that the
  k-th ranked sibling is the accepted one): P(node) = Π p_{rank+1} along the path, and a
  node's children are the first k candidates. Sequoia's dynamic program over (subtree size,
  depth) finds the optimum for any vector, monotone or not.
* Sampling on a cache: π_i(s) per position from `specsim.sim.multidraft`; the positional
  vector is their mean and Sequoia's DP proposes one tree; a best-first search on the exact
  per-position node values (mean over t of Π π along the path, which treats consecutive
  positions jointly rather than as independent) proposes another; both are scored exactly
  on the cache and the better is kept. Neither search alone is guaranteed optimal for the
  exact objective (it is not a product of positional factors), so keeping the better of two
  exactly-scored candidates is the honest choice.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from specsim.errors import SpecError
from specsim.trees import Tree

if TYPE_CHECKING:  # pragma: no cover
    from specsim.sim.features import Features


@dataclass(frozen=True)
class OptimalTree:
    tree: Tree  # the chosen tree (canonical order)
    expected_tokens_per_call: float  # 1 + expected accepted drafts per call, on the data it was fitted to
    source: str  # what it was computed from, for the table footer
    walk_tokens_per_call: float | None = None  # Σ tokens / Σ target calls of decoding the trajectories
    #   with this tree (what `specsim simulate` reports); the objective above weights every start
    #   position equally, the walk weights them by how often a call starts there


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
    symbols: np.ndarray, remaining: np.ndarray, budget: int, max_depth: int
) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The `budget` most frequent prefixes of the sequences (symbols[t], symbols[t+1], …).

    remaining[t] caps the prefix length at t (end of trajectory). Returns the paths in the
    order found — non-increasing frequency, so the first n of them are the best n — and
    how many start positions each matched.
    """
    n_total = symbols.shape[0]
    heap: list[tuple[int, int, tuple[int, ...], np.ndarray]] = []

    def push_children(path: tuple[int, ...], positions: np.ndarray) -> None:
        d = len(path)
        if d >= max_depth:
            return
        live = positions[remaining[positions] > d]
        if live.size == 0:
            return
        nxt = symbols[live + d]
        order = np.argsort(nxt, kind="stable")
        values, starts, counts = np.unique(nxt[order], return_index=True, return_counts=True)
        for value, start, count in zip(values.tolist(), starts.tolist(), counts.tolist()):
            child = path + (int(value),)
            heapq.heappush(heap, (-count, d + 1, child, live[order[start : start + count]]))

    push_children((), np.arange(n_total))
    paths: list[tuple[int, ...]] = []
    counts: list[int] = []
    while heap and len(paths) < budget:
        neg_count, _, path, positions = heapq.heappop(heap)
        paths.append(path)
        counts.append(-neg_count)
        push_children(path, positions)
    return paths, np.array(counts, dtype=np.int64)


def _greedy_trees(features: "Features", budget: int, max_depth: int) -> list[OptimalTree]:
    """The optimal greedy tree for every budget 1..budget (prefixes of one best-first order)."""
    if features.rank is None:
        raise SpecError(
            f"draft {features.draft!r} has no ranks (model-free): optimise trees for model drafts"
        )
    paths, counts = best_first_paths(features.rank.astype(np.int64), features.remaining(), budget, max_depth)
    if not paths:
        raise SpecError("the cache has no position with a next token to draft: trajectories of length 1")
    from specsim.sim.policies import greedy_table

    n_pos = features.n_positions
    value = 1.0 + np.cumsum(counts) / n_pos
    out = []
    for n in range(1, len(paths) + 1):
        tree = Tree.from_paths(paths[:n], name=f"optimal:{n}")
        out.append(OptimalTree(
            tree=tree,
            expected_tokens_per_call=float(value[n - 1]),
            source=f"the {n} most frequent rank paths over {n_pos} start positions (greedy, exact)",
            walk_tokens_per_call=_walk_value(features, greedy_table(features, tree, None, None)),
        ))
    return out


def _walk_value(features: "Features", table) -> float:
    from specsim.sim.engine import walk

    stats = walk(table, features, 1.0)
    return float(stats.tokens.sum() / stats.calls.sum())


# ---------------------------------------------------------------------------- sampling on a cache


def _sample_trees(features: "Features", budgets: Sequence[int], max_depth: int, scheme: str, samples: int,
                  rng: np.random.Generator) -> list[OptimalTree]:
    from specsim.sim.engine import AcceptanceTable
    from specsim.sim.multidraft import candidate_acceptance, length_distribution, reach_by_depth

    if features.temperature <= 0:
        raise SpecError("sampling trees need trajectories sampled at T > 0; at T=0 use --policy greedy")
    if features.rank is None:
        raise SpecError(f"draft {features.draft!r} is model-free: its proposals are not sampled from a q")
    width = min(max(budgets), 8)  # fan-outs above 8 candidates per node are not estimated
    pi, _ = candidate_acceptance(features, width, scheme=scheme, samples=samples, rng=rng)
    remaining = features.remaining()
    vector = np.concatenate([[0.0], np.clip(pi.mean(axis=0), 0.0, 1.0)])
    if vector[1:].sum() > 1:
        vector[1:] /= vector[1:].sum()
    n_pos = int(pi.shape[0])
    mc = "exact" if scheme == "iid" else f"Monte-Carlo, {samples} samples/position"
    out = []
    for budget in budgets:
        candidates = [optimal_tree_from_vector(vector, budget, max_depth=max_depth).tree,
                      _best_first_exact(pi, remaining, budget, max_depth)]
        at_least = [reach_by_depth(pi, t, remaining) for t in candidates]  # (N, D) each
        scores = [1.0 + a.sum(axis=1).mean() for a in at_least]
        best = int(np.argmax(scores))
        how = ("Sequoia DP on the cache's positional acceptance vector", "best-first on exact node values")[best]
        tree = Tree.from_paths(candidates[best].rank_paths()[1:], name=f"optimal:{budget}")
        table = AcceptanceTable(p_len=length_distribution(at_least[best]),
                                drafted=np.full(n_pos, float(tree.budget)), exact=scheme == "iid")
        out.append(OptimalTree(
            tree=tree,
            expected_tokens_per_call=float(scores[best]),
            source=f"{how} ({scheme}, {mc}), scored over {n_pos} start positions",
            walk_tokens_per_call=_walk_value(features, table),
        ))
    return out


def _best_first_exact(pi: np.ndarray, remaining: np.ndarray, budget: int, max_depth: int) -> Tree:
    """Grow a tree node by node, always adding the open node of highest exact value.

    A node is open once its parent and its left sibling are in the tree (candidates are
    drawn in order). Value = mean over t of Π π along the path at positions t, t+1, ….
    """
    n_total, width = pi.shape
    reach = {(): np.ones(n_total)}
    heap: list[tuple[float, int, tuple[int, ...]]] = []

    def push(path: tuple[int, ...]) -> None:
        d, i = len(path), path[-1]
        if d > max_depth or i >= width:
            return
        shifted = np.zeros(n_total)
        shifted[: n_total - (d - 1)] = pi[d - 1 :, i]
        value = reach[path[:-1]] * shifted * (remaining >= d)
        reach[path] = value
        heapq.heappush(heap, (-float(value.mean()), d, path))

    push((0,))
    paths: list[tuple[int, ...]] = []
    while heap and len(paths) < budget:
        _, _, path = heapq.heappop(heap)
        paths.append(path)
        push(path + (0,))
        push(path[:-1] + (path[-1] + 1,))
    return Tree.from_paths(paths)


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
    if name == "greedy":
        every = _greedy_trees(features, max(budgets), depth_cap)
        return [every[min(b, len(every)) - 1] for b in budgets]
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

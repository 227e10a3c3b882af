"""Reusable hypothesis strategies for specsim tests (the one place they live).

    from tests.strategies import probability_vectors, distribution_pairs, trees, tree_specs

Probability vectors deliberately include zeros, exact ties, near-ties (relative
gaps of 1e-12) and one-hot vectors: the cases where acceptance rules and residuals
go wrong. Vocabularies are small so that exact enumeration stays cheap.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from specsim.trees import Tree

_WEIGHTS = st.one_of(
    st.just(0.0),
    st.floats(min_value=1e-6, max_value=1.0, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.1, 0.25, 0.5, 1.0]),  # exact ties across entries
)


@st.composite
def probability_vectors(
    draw: st.DrawFn, min_size: int = 2, max_size: int = 6, *, size: int | None = None
) -> np.ndarray:
    """A float64 probability vector; zeros, ties, near-ties and one-hots are common draws."""
    n = size if size is not None else draw(st.integers(min_size, max_size))
    kind = draw(st.sampled_from(["weights", "weights", "weights", "one_hot", "uniform"]))
    if kind == "one_hot":
        v = np.zeros(n)
        v[draw(st.integers(0, n - 1))] = 1.0
        return v
    if kind == "uniform":
        return np.full(n, 1.0 / n)
    w = np.array(draw(st.lists(_WEIGHTS, min_size=n, max_size=n)))
    if n > 1 and draw(st.booleans()):  # a near-tie between two entries
        i, j = draw(st.permutations(range(n)))[:2]
        w[j] = w[i] * (1.0 + 1e-12)
    if w.sum() <= 0:
        w[draw(st.integers(0, n - 1))] = 1.0
    return w / w.sum()


@st.composite
def distribution_pairs(
    draw: st.DrawFn, min_size: int = 2, max_size: int = 6
) -> tuple[np.ndarray, np.ndarray]:
    """(p_target, q_draft) over one vocabulary; sometimes q == p, q close to p, or one-hot."""
    n = draw(st.integers(min_size, max_size))
    p_target = draw(probability_vectors(size=n))
    relation = draw(st.sampled_from(["independent", "independent", "equal", "mixture"]))
    if relation == "equal":
        return p_target, p_target.copy()
    q_draft = draw(probability_vectors(size=n))
    if relation == "mixture":  # a draft close to the target
        mix = draw(st.floats(0.0, 1.0))
        q_draft = mix * p_target + (1 - mix) * q_draft
        q_draft = q_draft / q_draft.sum()
    return p_target, q_draft


@st.composite
def rank_path_sets(
    draw: st.DrawFn, max_nodes: int = 24, max_rank: int = 3, max_depth: int = 5
) -> list[tuple[int, ...]]:
    """A prefix-closed list of distinct rank paths in random order (the root is implicit)."""
    n = draw(st.integers(0, max_nodes - 1))
    paths: list[tuple[int, ...]] = []
    for _ in range(n):
        parent = draw(st.sampled_from([()] + paths))
        if len(parent) >= max_depth:
            continue
        taken = {p[-1] for p in paths if p[:-1] == parent}
        free = [r for r in range(max_rank + 1) if r not in taken]
        if free:
            paths.append(parent + (draw(st.sampled_from(free)),))
    return list(draw(st.permutations(paths)))


@st.composite
def trees(draw: st.DrawFn, max_nodes: int = 24, max_rank: int = 3, max_depth: int = 5) -> Tree:
    """A random valid `Tree` (possibly the root alone)."""
    return Tree.from_paths(draw(rank_path_sets(max_nodes, max_rank, max_depth)))


def tree_specs() -> st.SearchStrategy[str]:
    """Valid spec strings of the families that need neither a file nor a cache."""
    small = st.integers(1, 4)
    return st.one_of(
        st.builds("chain:{}".format, st.integers(1, 12)),
        st.builds("kary:{},{}".format, small, st.integers(1, 3)),
        st.builds(
            lambda ws: "widths:" + ",".join(map(str, ws)), st.lists(small, min_size=1, max_size=5)
        ),
        trees(max_nodes=12).filter(lambda t: t.budget > 0).map(Tree.to_spec),
    )

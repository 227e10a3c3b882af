"""Dynamic draft trees (EAGLE-2 / EAGLE-3, SGLang's EAGLE worker), replayed exactly.

A dynamic tree is grown per target call from the draft's own confidence. EAGLE-2's rule
(`topK_genrate` in SafeAILab/EAGLE eagle/model/cnets.py; `organize_draft_results` in
SGLang's python/sglang/srt/speculative/eagle_utils.py), with K = top_k, D = depth in tree
levels (SGLang's `num_steps`, EAGLE's `depth` + 1) and N = draft tokens verified (EAGLE's
`total_tokens`, SGLang's `num_draft_tokens` − 1):

1. the root's K most likely draft tokens are the depth-1 candidates and the first beam;
   a node's score is its cumulative draft log-probability (log-softmax of the draft's
   logits, no temperature: EAGLE ranks by the raw distribution at any sampling T);
2. for depths 2..D: each of the K beam nodes is fed to the draft (one forward of K tokens
   with a tree mask) and proposes its K most likely children, scored parent score + log q;
   all K² are candidates, and the K best of them are the next beam;
3. the N best of all K + (D−1)·K² candidates by score form the tree (ties: the earlier
   candidate, so a parent, never scoring below its child, always precedes it: the tree is
   prefix-closed).

`specsim cache --expand topk=K,depth=D` records steps 1–2 at every on-path position
(`expand_token`, `expand_parent`, `expand_score`, K + (D−1)K² candidates in the order
above), for draft models and head drafts alike (a head feeds a beam node its parent's
predicted feature with its token, `HeadDraft.expand_starts`); step 3 is applied here, so one
recording replays every N ≤ K + (D−1)K² and every depth D' ≤ D (the first D' levels of an
expansion are the expansion to depth D'). A different K changes the beam and needs its own
recording.

Why replay is exact (docs/design.md §2, the point-mass case): candidates are a function of
the prefix. Greedy verification accepts the child equal to the target's argmax = y_t. At
T > 0 EAGLE verifies a node's children in order as point masses against the running
target residual (utils.py `evaluate_posterior`: accept x with probability r(x), else zero
r(x) and renormalise; `specsim.verify.verify_point_mass`); the emitted token is then
distributed as p and a child is accepted exactly when it equals that token. So given the
target's trajectory, the accepted path is the longest path of the tree that follows
y_t, y_{t+1}, …, at every temperature: deterministic, no Monte-Carlo.
numpy only.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecError
from specsim.expansion import (EXPAND_NAMES, DynamicShape, DynamicTree, Expansion, candidates,  # noqa: F401
                               parse_dynamic, parse_expansion)  # the spec types; here for the replay's readers


def node_depths(topk: int, depth: int) -> np.ndarray:
    """(K + (D−1)K²,) the depth of each recorded candidate, in recording order."""
    return np.concatenate([np.ones(topk, dtype=np.int64)]
                          + [np.full(topk * topk, d, dtype=np.int64) for d in range(2, depth + 1)])


# ---------------------------------------------------------------------------- expansion (reference)


def expand_reference(logq, topk: int, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EAGLE-2's expansion at one position, written plainly: (tokens, parents, scores), (M,) each.

    logq(path) -> (V,) the draft's log-probabilities after the root context + path (a tuple of
    token ids). Top-k ties go to the lower token id; beam ties to the earlier candidate.
    The recorder's batched torch version (`specsim.record.expand`) must equal this.
    """
    def top(values: np.ndarray, k: int) -> np.ndarray:
        return np.lexsort((np.arange(values.shape[0]), -values))[:k]

    lp = np.asarray(logq(()), dtype=np.float64)
    first = top(lp, topk)
    tokens, parents, scores = list(first), [-1] * topk, list(lp[first])
    paths = [(int(x),) for x in first]
    beam = list(range(topk))  # indices into the candidate list
    for _ in range(2, depth + 1):
        offset = len(tokens)
        block_scores = []
        for b in beam:
            lq = np.asarray(logq(paths[b]), dtype=np.float64)
            kids = top(lq, topk)
            for x in kids:
                tokens.append(int(x))
                parents.append(b)
                scores.append(scores[b] + lq[x])
                paths.append(paths[b] + (int(x),))
                block_scores.append(scores[-1])
        beam = [offset + int(i) for i in top(np.array(block_scores), topk)]
    return np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64), np.array(scores)


# ---------------------------------------------------------------------------- selection


def select(scores: np.ndarray, shape: DynamicShape) -> np.ndarray:
    """(n, N) the candidates each position's tree keeps, ascending: the N best of the first D levels.

    scores (n, M ≥ K + (D−1)K²): recorded cumulative log-probabilities. A stable sort keeps
    the earlier candidate on ties, so parents precede their children and the set is prefix-closed.
    """
    m = shape.candidates
    order = np.argsort(-np.asarray(scores)[:, :m], axis=1, kind="stable")[:, : shape.tokens]
    return np.sort(order, axis=1)


def select_reference(scores: np.ndarray, shape: DynamicShape) -> list[int]:
    """`select` for one position, as a plain loop (the property tests compare the two)."""
    m = shape.candidates
    ranked = sorted(range(m), key=lambda i: (-float(scores[i]), i))
    return sorted(ranked[: shape.tokens])


# ---------------------------------------------------------------------------- replay


def accepted_lengths(token: np.ndarray, parent: np.ndarray, chosen: np.ndarray, future: np.ndarray,
                     remaining: np.ndarray, depth: int) -> np.ndarray:
    """(n,) accepted depth per position: the longest path of the chosen nodes that follows the future tokens.

    token, parent (n, M): the recording; chosen (n, N) candidate indices; future (n, depth):
    y_t, y_{t+1}, …; remaining (n,): drafts a call at t may accept (the end cap).
    """
    n = chosen.shape[0]
    rows = np.arange(n)[:, None]
    tok = token[rows, chosen]  # (n, N)
    par = parent[rows, chosen]
    cur = np.full(n, -1, dtype=np.int64)  # the node reached (−1: the root)
    length = np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    for d in range(1, depth + 1):
        match = (par == cur[:, None]) & (tok == future[:, d - 1 : d]) & alive[:, None]
        hit = match.any(axis=1) & (remaining >= d)  # siblings are distinct tokens: at most one match
        cur = np.where(hit, chosen[np.arange(n), match.argmax(axis=1)], cur)
        length += hit
        alive = hit
        if not alive.any():
            break
    return length


def dynamic_table(features, tree: DynamicTree, spec, rng: np.random.Generator):
    """Exact, deterministic acceptance table of a dynamic `tree` on the recorded expansion."""
    from specsim.sim.engine import AcceptanceTable

    shape = tree.shape
    if not spec.lossless:
        raise SpecError(f"policy {spec.label} compares p with q; a dynamic tree verifies point masses (greedy or sample)")
    recorded = features.expansion()
    shape.check_recorded(recorded, f"{features.cache_path} draft {features.draft!r}")
    N = features.n_positions
    token = features.recorded("expand_token")
    parent = features.recorded("expand_parent")
    scores = features.recorded("expand_score")
    remaining, room = features.remaining(), features.room()
    depth = tree.max_depth
    length = np.zeros(N, dtype=np.int64)
    drafted = np.zeros(N)
    depths = node_depths(shape.topk, shape.depth)
    idx = np.arange(N)
    future_idx = np.minimum(idx[:, None] + np.arange(depth)[None, :], max(N - 1, 0))
    for lo in range(0, N, 65_536):  # bounded temporaries: (block, N nodes) per level
        hi = min(N, lo + 65_536)
        chosen = select(scores[lo:hi], shape)
        length[lo:hi] = accepted_lengths(token[lo:hi], parent[lo:hi].astype(np.int64), chosen,
                                         features.token[future_idx[lo:hi]], remaining[lo:hi], depth)
        drafted[lo:hi] = (depths[chosen] <= room[lo:hi, None]).sum(axis=1)
    p_len = np.zeros((N, depth + 1))
    p_len[idx, length] = 1.0
    return AcceptanceTable(p_len=p_len, drafted=drafted, exact=True, length=length,
                           engine_drafted=float(min(shape.tokens, candidates(shape.topk, shape.depth))))

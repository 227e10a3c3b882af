"""Per-position statistics of next-token logits: what exact replay reads at every position.

docs/design.md §2: along a target-sampled trajectory the simulator needs, per position t, the
rank of y_t under the draft (greedy trees), log p_t(y_t) and log q_t(y_t) at the
trajectory's temperature (speculative sampling), and the draft's top-K ids. The recorder
computes them from float32 logits before storage rounds them (`position_stats`); the
features derive them from stored logits for caches recorded without them.
numpy only.
"""

from __future__ import annotations

import numpy as np

STATS_TOP_K = 16  # a draft's top-K ids kept per position in its statistics


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


def position_stats(logits: np.ndarray, tokens: np.ndarray, temperature: float, *, draft: bool) -> dict:
    """Per-position statistics replay needs, from the float32 logits before float16 storage rounds them.

    logprob: log softmax(logits / T)[y_t] (T = 0 trajectories: T = 1, as the features use);
    drafts also: rank of y_t (0 = top; ties broken by the lower token id, as live drafting
    ranks) and the top-STATS_TOP_K ids in that order. float16 storage can tie two logits
    that differ in float32, which would move a rank by one.
    """
    y = np.asarray(tokens, dtype=np.int64)
    out = {"logprob": log_prob(logits, y, temperature if temperature > 0 else 1.0)}  # float64
    if draft:
        out["rank"] = token_rank(logits, y)
        out["top_ids"] = top_k_ids(logits, min(STATS_TOP_K, logits.shape[1]))
        if out["top_ids"].shape[1] < STATS_TOP_K:  # a vocabulary smaller than K: pad with -1
            out["top_ids"] = np.pad(out["top_ids"], ((0, 0), (0, STATS_TOP_K - out["top_ids"].shape[1])),
                                    constant_values=-1)
    return out

"""Small synthetic caches with known acceptance, written with the real `CacheWriter`.

    from tests.synthetic import iid_greedy_cache, iid_sample_cache, rank_cache, random_cache

* `rank_cache`: greedy (T=0) trajectories whose tokens have prescribed ranks under the draft;
* `iid_greedy_cache`: ranks along a de Bruijn sequence, so the windows of the first m^γ start
  positions enumerate every accept/reject pattern exactly once: greedy acceptance is i.i.d.
  with α = k/m *exactly* over those positions (no sampling noise);
* `iid_sample_cache`: T=1 trajectories where q_t(y_t)/p_t(y_t) = α at every position;
* `random_cache`: random target logits and a noisy-copy draft, trajectories sampled from the
  target, several categories and uneven lengths (CLI tests, benchmarks).

Logits are chosen float16-exact so the stored values are the intended ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from specsim.cache.stats import StatsSpec
from specsim.cache.layout import CacheSpec, PromptRecord
from specsim.cache.writer import CacheWriter

TARGET_NAME = "synthetic-target"


def write_cache(path, trajectories: Sequence[dict], *, vocab: int, drafts: Sequence[str],
                temperatures: Sequence[float], categories: Sequence[str], storage: str = "full",
                top_k: int = 0, max_new_tokens: int | None = None, stats: StatsSpec | None = None) -> Path:
    """Write a cache; each trajectory is a dict(prompt_index, temperature, tokens, target_logits, draft_logits),
    and `overhang` K when its last K positions lie past its end (docs/cache-format.md). `stats`: the statistics
    recorded per position (default: a recording's)."""
    path = Path(path)
    prompts = [
        PromptRecord(question_id=i, category=c, text=f"synthetic prompt {i}",
                     token_ids=np.arange(3 + i % 5, dtype=np.int32) % vocab)
        for i, c in enumerate(categories)
    ]
    meta = {"settings": {"target": TARGET_NAME, "drafts": list(drafts)}, "target": {"spec": TARGET_NAME}}
    if max_new_tokens is not None:
        meta["settings"]["max_new_tokens"] = max_new_tokens
    spec = CacheSpec(vocab_size=vocab, drafts=tuple(drafts), temperatures=tuple(temperatures), storage=storage,
                     top_k=top_k, meta=meta, stats=stats or StatsSpec())
    with CacheWriter.create(path, spec, prompts, overwrite=True) as writer:
        for i, tr in enumerate(trajectories):
            writer.append_trajectory(prompt_index=tr["prompt_index"], temperature=tr["temperature"], seed=i,
                                     tokens=tr["tokens"], target_logits=tr["target_logits"],
                                     draft_logits=tr["draft_logits"], stop_reason="max_new_tokens",
                                     overhang=int(tr.get("overhang", 0)))
    return path


def _logits_with_ranks(tokens: np.ndarray, ranks: np.ndarray, vocab: int) -> np.ndarray:
    """(n, V) distinct integer logits under which tokens[i] has rank ranks[i]."""
    n = len(tokens)
    out = np.empty((n, vocab), dtype=np.float32)
    for i, (y, r) in enumerate(zip(tokens, ranks)):
        others = [v for v in range(vocab) if v != y]
        order = others[:r] + [int(y)] + others[r:]  # order[j] gets the j-th largest logit
        out[i, order] = np.arange(vocab, 0, -1, dtype=np.float32)
    return out


def rank_cache(path, rank_seqs: Sequence[Sequence[int]], *, vocab: int = 8, categories: Sequence[str] | None = None,
               draft: str = "d", seed: int = 0) -> Path:
    """Greedy trajectories (one per prompt) whose token at t has rank rank_seqs[i][t] under the draft."""
    rng = np.random.default_rng(seed)
    categories = list(categories) if categories is not None else ["c"] * len(rank_seqs)
    trajectories = []
    for i, ranks in enumerate(rank_seqs):
        ranks = np.asarray(ranks, dtype=np.int64)
        if ranks.max(initial=0) >= vocab:
            raise ValueError(f"rank {ranks.max()} needs a vocabulary larger than {vocab}")
        tokens = rng.integers(0, vocab, len(ranks)).astype(np.int32)
        p_logits = np.zeros((len(ranks), vocab), dtype=np.float32)
        p_logits[np.arange(len(ranks)), tokens] = 4.0  # the target's argmax is the trajectory token
        trajectories.append(dict(prompt_index=i, temperature=0.0, tokens=tokens, target_logits=p_logits,
                                 draft_logits={draft: _logits_with_ranks(tokens, ranks, vocab)}))
    return write_cache(path, trajectories, vocab=vocab, drafts=[draft], temperatures=[0.0], categories=categories)


def de_bruijn(m: int, n: int) -> list[int]:
    """The cyclic de Bruijn sequence B(m, n): every length-n word over m symbols occurs once as a window."""
    a = [0] * (m * n)
    out: list[int] = []

    def db(t: int, p: int) -> None:
        if t > n:
            if n % p == 0:
                out.extend(a[1 : p + 1])
            return
        a[t] = a[t - p]
        db(t + 1, p)
        for j in range(a[t - p] + 1, m):
            a[t] = j
            db(t + 1, t)

    db(1, 1)
    return out


def iid_greedy_ranks(k: int, m: int, gamma: int) -> tuple[np.ndarray, int]:
    """Ranks whose first m^γ start positions see every accept/reject window once (α = k/m).

    Symbol s < k means rank 0 (accepted by a greedy chain); s >= k means rank 1 + s - k.
    Returns (ranks, number of start positions with a full window).
    """
    seq = de_bruijn(m, gamma)
    n_windows = len(seq)
    cyclic = seq + seq[: gamma - 1] + [m - 1] * 2  # close the cycle; trailing rejections keep the end cap away
    ranks = np.array([0 if s < k else 1 + s - k for s in cyclic], dtype=np.int64)
    return ranks, n_windows


def iid_greedy_cache(path, *, k: int, m: int, gamma: int, vocab: int = 8) -> tuple[Path, int]:
    ranks, n_windows = iid_greedy_ranks(k, m, gamma)
    return rank_cache(path, [ranks], vocab=vocab), n_windows


def iid_sample_cache(path, *, alpha: float, n_traj: int = 4, length: int = 40, vocab: int = 8,
                     seed: int = 0, categories: Sequence[str] | None = None,
                     stats: StatsSpec | None = None) -> tuple[Path, float]:
    """T=1 trajectories with q_t(y_t)/p_t(y_t) = α everywhere; returns (path, α exactly as stored).

    p_t is uniform; q_t gives y_t logit 0 and every other token logit L, so
    q_t(y_t)/p_t(y_t) = V / (1 + (V-1) e^L). L is rounded to float16 first and α
    recomputed from the stored L, so the returned α is the one the cache holds.
    """
    if not 0 < alpha <= 1:
        raise ValueError("alpha must be in (0, 1]")
    L = float(np.float16(np.log((vocab / alpha - 1) / (vocab - 1))))
    alpha_exact = vocab / (1 + (vocab - 1) * np.exp(L))
    rng = np.random.default_rng(seed)
    categories = list(categories) if categories is not None else ["c"] * n_traj
    trajectories = []
    for i in range(n_traj):
        tokens = rng.integers(0, vocab, length).astype(np.int32)
        q_logits = np.full((length, vocab), L, dtype=np.float32)
        q_logits[np.arange(length), tokens] = 0.0
        trajectories.append(dict(prompt_index=i, temperature=1.0, tokens=tokens,
                                 target_logits=np.zeros((length, vocab), dtype=np.float32),
                                 draft_logits={"d": q_logits}))
    path = write_cache(path, trajectories, vocab=vocab, drafts=["d"], temperatures=[1.0], categories=categories,
                       stats=stats)
    return path, float(alpha_exact)


def _half(x: np.ndarray) -> np.ndarray:
    """float32 values that float16 storage keeps exactly (so stored logits and recorded statistics agree)."""
    return np.asarray(x).astype(np.float16).astype(np.float32)


def random_cache(path, *, n_prompts: int = 6, length: int = 24, vocab: int = 16, drafts: Sequence[str] = ("small",),
                 temperatures: Sequence[float] = (0.0, 1.0), categories: Sequence[str] = ("code", "chat"),
                 noise: float = 1.0, seed: int = 0, storage: str = "full", top_k: int = 0, overhang: int = 0,
                 max_new_tokens: int | None = None) -> Path:
    """Random target logits; each draft is the target plus Gaussian noise (more noise, worse draft).

    Trajectory lengths vary between length//2 and length; tokens are sampled from the
    target at each temperature (argmax at T=0). overhang: positions recorded past each end.
    """
    rng = np.random.default_rng(seed)
    cats = [categories[i % len(categories)] for i in range(n_prompts)]
    trajectories = []
    for i in range(n_prompts):
        for T in temperatures:
            n = int(rng.integers(max(1, length // 2), length + 1)) + overhang
            p_logits = _half(np.round(rng.normal(0, 2.0, (n, vocab)), 2))
            if T == 0:
                tokens = p_logits.argmax(axis=1)
            else:
                z = p_logits / T
                probs = np.exp(z - z.max(axis=1, keepdims=True))
                probs /= probs.sum(axis=1, keepdims=True)
                tokens = (probs.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
            q = {d: _half(p_logits + rng.normal(0, noise * (1 + j), (n, vocab))) for j, d in enumerate(drafts)}
            trajectories.append(dict(prompt_index=i, temperature=T, tokens=tokens.astype(np.int32),
                                     target_logits=p_logits, draft_logits=q, overhang=overhang))
    return write_cache(path, trajectories, vocab=vocab, drafts=drafts, temperatures=temperatures, categories=cats,
                       storage=storage, top_k=top_k, max_new_tokens=max_new_tokens)


def write_gguf(path, architecture: str):
    """A GGUF file of one small tensor whose header names `architecture` (readable; no model in it)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("w", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

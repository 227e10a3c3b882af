"""Toy head drafts on the toy Markov target: the ground truth for depth-keyed replay.

    from tests.toy_heads import ToyHeads, toy_heads, heads_decode, record_heads_cache

A head draft's law depends on where the call started and how deep the node is, not on the
position alone: here q_{s,d}(· | parent) = laws[d - 1, a, b], with a the token before the
call's root (the target's hidden state at the root is a function of it, as Medusa's and
EAGLE's heads read the state at the root's predecessor) and b the parent node's token
(EAGLE's heads condition on the drafted path; a Medusa head would ignore it). Quality
falls with depth and depends on a, so replay that reads the depth-1 law of each position
(q_{t+d-1,1}, what a teacher-forced draft has) instead of q_{t,d} is visibly wrong.

`heads_decode` is real speculative decoding with such a draft (the toy Markov loop, with
the heads' law at each node, verified by `specsim.verify`); `record_heads_cache` writes target-sampled
trajectories with the heads' statistics keyed by depth, as `specsim cache --draft medusa:…`
does (`specsim.record.recorder.head_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from specsim.cache.stats import StatsSpec, draft_stats
from specsim.cache.layout import CacheSpec, PromptRecord
from specsim.cache.writer import CacheWriter
from specsim.trees import Tree
from tests.toy_markov import DecodeResult, MarkovLM, sample_tokens, speculative_decode


@dataclass(frozen=True)
class ToyHeads:
    """laws (D, V, V, V): q at depth d given (token before the root, parent's token)."""

    logits: np.ndarray  # (D, V, V, V) float64 holding float16 values

    def __post_init__(self) -> None:
        z = self.logits - self.logits.max(axis=-1, keepdims=True)
        object.__setattr__(self, "laws", np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True))

    @property
    def depth(self) -> int:
        return int(self.logits.shape[0])

    def law(self, committed: Sequence[int], parent: int, depth: int) -> np.ndarray:
        return self.laws[depth - 1, int(committed[-2]), int(parent)]


def toy_heads(target: MarkovLM, depth: int = 3, seed: int = 0) -> ToyHeads:
    """Heads whose agreement with the target falls with depth and depends on the token before the root."""
    rng = np.random.default_rng(seed)
    V = target.vocab
    laws = np.empty((depth, V, V, V))
    for d in range(depth):
        for a in range(V):
            weight = (0.9 if a % 2 == 0 else 0.55) * 0.5**d  # how much of the target's law a head keeps
            for b in range(V):
                noise = rng.dirichlet(np.full(V, 0.5))
                laws[d, a, b] = weight * target.trans[b] + (1 - weight) * noise
    return ToyHeads(np.log(laws).astype(np.float16).astype(np.float64))


def heads_decode(target: MarkovLM, heads: ToyHeads, prompt: Sequence[int], n: int, tree: Tree,
                 rng: np.random.Generator, *, greedy: bool, scheme: str = "iid") -> DecodeResult:
    """Generate n tokens by speculative decoding with head drafts and a static tree: the toy Markov loop
    (`tests.toy_markov.speculative_decode`) with the heads' law at each node."""
    def law(committed, path):
        return heads.law(committed, (list(committed) + list(path))[-1], len(path) + 1)

    return speculative_decode(target, None, prompt, n, tree, rng, greedy=greedy, scheme=scheme, law=law)


def depth_keyed_logits(heads: ToyHeads, prompt: Sequence[int], tokens: Sequence[int], *,
                       wrong: bool = False) -> np.ndarray:
    """(n, D, V): row t, column d - 1 = log q_{t-d+1, d} on the target's path (uniform where no call starts).

    wrong=True: every column holds the depth-1 law at t (what a teacher-forced draft records).
    """
    x = list(prompt) + list(tokens)
    plen, n, V = len(prompt), len(tokens), heads.logits.shape[-1]
    out = np.zeros((n, heads.depth, V))
    for t in range(n):
        for d in range(1, heads.depth + 1):
            s = t if wrong else t - d + 1
            if s < 0:
                continue
            out[t, d - 1] = heads.logits[0 if wrong else d - 1, x[plen + s - 2], x[plen + t - 1]]
    return out


def record_heads_cache(path, target: MarkovLM, heads: ToyHeads, prompts: Sequence[np.ndarray], n: int, *,
                       temperatures: Sequence[float] = (0.0, 1.0), seed: int = 0, name: str = "medusa:toy",
                       wrong: bool = False) -> Path:
    """One target-sampled trajectory per prompt and temperature, the heads' statistics keyed by depth."""
    rng = np.random.default_rng(seed)
    stats_spec = StatsSpec(candidates=3, lossy=("p>=q",))  # trees of up to 3 children: a quick recording
    records = [PromptRecord(question_id=i, category=("a", "b")[i % 2], text=f"toy prompt {i}",
                            token_ids=np.asarray(pr, dtype=np.int32)) for i, pr in enumerate(prompts)]
    meta = {"settings": {"target": "toy-markov-target", "drafts": [name]}, "target": {"spec": "toy-markov-target"}}
    spec = CacheSpec(vocab_size=target.vocab, drafts=(name,), temperatures=tuple(temperatures), meta=meta,
                     stats=stats_spec, depths={name: heads.depth})
    with CacheWriter.create(Path(path), spec, records, overwrite=True) as writer:
        for T in temperatures:
            for i, pr in enumerate(prompts):
                tokens = sample_tokens(target, pr, n, rng, greedy=T == 0)
                p_logits = target.logits_along(pr, tokens)
                q = depth_keyed_logits(heads, pr, tokens, wrong=wrong)
                per_depth = [draft_stats(p_logits, q[:, d], tokens, T, stats_spec, np.random.default_rng([i, d]))
                             for d in range(heads.depth)]
                stats = {name: {k: np.stack([s[k] for s in per_depth], axis=1) for k in per_depth[0]}}
                writer.append_trajectory(prompt_index=i, temperature=T, seed=i, tokens=tokens,
                                         target_logits=p_logits, draft_logits={}, stop_reason="max_new_tokens",
                                         stats=stats)
    return Path(path)

"""Draft proposers: fill a static tree's nodes with draft tokens, one draft forward per level.

A static tree (specsim.trees) names each node by its rank path. A model draft fills
it level by level (SpecInfer, Miao et al. 2024; Sequoia, Chen et al. 2024): one
forward over the tokens the draft has not seen yet gives q at the root; then one
forward over the nodes of depth d that have children gives q at each of them, and
their children are

* greedy:   the parent's r-th most likely draft token for the child of rank r
            (ties broken by the lower token id, as the simulator ranks them);
* sampling: k candidates drawn from q at the parent (`specsim.verify.sample_candidates`,
            'iid' or 'swor'), in draw order, for a parent with k children.

After verification the draft keeps the KV entries of the accepted nodes it was fed
and forgets the rest; tokens it has not seen (the correction, an accepted leaf) are
fed at the start of the next step. Model-free drafts (n-gram, prompt lookup) put a
point mass on a candidate trie built from the token prefix (`specsim.sim.modelfree`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from specsim.live.tree_forward import KVModel
from specsim.trees import Tree
from specsim.verify import sample_candidates


@dataclass(frozen=True)
class Proposal:
    """A tree filled with draft tokens for one speculative step."""

    tokens: np.ndarray  # (n_nodes,) int64 token of each node; node 0 is the root (last committed token)
    valid: np.ndarray  # (n_nodes,) bool, prefix-closed; False: no token (swor out of support, no n-gram match)
    q_draft: np.ndarray | None  # (n_nodes, V) float64 draft probabilities at each node with children; None: point masses


class Drafter(Protocol):
    name: str

    def reset(self, prompt_ids: np.ndarray) -> None: ...

    def propose(self, committed: np.ndarray, tree: Tree, *, policy: str, temperature: float, multi_draft: str,
                rng: np.random.Generator) -> Proposal: ...

    def accept(self, path: np.ndarray) -> None: ...


def probabilities(logits: torch.Tensor, temperature: float) -> np.ndarray:
    """softmax(logits / T) in float64 ((..., V)); T = 0 gives T = 1 probabilities (greedy needs only ranks)."""
    x = logits.double() / (temperature if temperature > 0 else 1.0)
    return torch.softmax(x, dim=-1).cpu().numpy()


def top_ranked(logits: torch.Tensor, k: int) -> np.ndarray:
    """(rows, k) ids of the k most likely tokens per row, ties broken by the lower token id."""
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]
    return order.cpu().numpy().astype(np.int64)


class ModelDrafter:
    """A draft language model (a separate model, `layers:K` or `int8`) with its own KV cache."""

    def __init__(self, model, name: str):
        self.kv = KVModel(model)
        self.name = name
        self._cached = 0  # committed tokens whose KV entries the draft holds
        self._base = 0  # committed tokens when the last proposal was made
        self._slots = np.empty(0, np.int64)  # cache row (after `_base`) of each node fed last step; -1 unfed

    def reset(self, prompt_ids: np.ndarray) -> None:
        self.kv.start(np.asarray(prompt_ids[:-1]))
        self._cached = self.kv.length

    def propose(self, committed, tree, *, policy, temperature, multi_draft, rng) -> Proposal:
        if self._cached != self.kv.length:
            raise RuntimeError("draft cache out of step with the committed tokens")
        n = tree.n_nodes
        tokens = np.zeros(n, dtype=np.int64)
        tokens[0] = committed[-1]
        valid = np.ones(n, dtype=bool)
        sampling = policy != "greedy"
        q_draft = None
        slots = np.full(n, -1, dtype=np.int64)
        base = len(committed)  # the root sits at row base - 1 once pending tokens are fed
        root_logits = self.kv.feed_chain(np.asarray(committed[self._cached:]))[-1:]  # (1, V)
        anc = tree.ancestor_mask()
        fed = 0
        level_nodes = np.array([0])
        level_logits = root_logits
        while True:
            parents = level_nodes[tree.n_children[level_nodes] > 0]
            if parents.size == 0:
                break
            rows = np.searchsorted(level_nodes, parents)
            logits = level_logits[torch.as_tensor(rows)]  # (n_parents, V)
            if sampling:
                probs = probabilities(logits, temperature)  # (n_parents, V)
                if q_draft is None:
                    q_draft = np.zeros((n, probs.shape[1]))
                q_draft[parents] = probs
            else:
                ranked = top_ranked(logits, int(tree.ranks[1:].max()) + 1)  # (n_parents, max_rank + 1)
            children_all = []
            for row, parent in enumerate(parents):
                children = tree.children(int(parent))
                children_all.append(children)
                if not sampling:
                    tokens[children] = ranked[row, tree.ranks[children]]
                    continue
                scheme = multi_draft if len(children) > 1 else "iid"
                drawn = sample_candidates(q_draft[parent], len(children), rng, scheme=scheme)
                tokens[children[: len(drawn)]] = drawn
                valid[children[len(drawn):]] = False  # swor ran out of tokens with mass
                valid[children] &= valid[parent]
            level_nodes = np.concatenate(children_all)
            # Feed this level's nodes that have children of their own: one draft forward.
            to_feed = level_nodes[tree.n_children[level_nodes] > 0]
            if to_feed.size == 0:
                break
            context = self.kv.length
            fed_nodes = np.flatnonzero(slots >= 0)
            attend = np.zeros((to_feed.size, context + to_feed.size), dtype=bool)
            attend[:, :base] = True
            attend[:, base + slots[fed_nodes]] = anc[np.ix_(to_feed, fed_nodes)]
            attend[:, context:] = np.eye(to_feed.size, dtype=bool)
            slots[to_feed] = fed + np.arange(to_feed.size)
            fed += to_feed.size
            level_logits = self.kv.forward(tokens[to_feed], base - 1 + tree.depths[to_feed], attend)
            level_nodes = to_feed
        self._slots = slots
        self._base = base
        return Proposal(tokens=tokens, valid=valid, q_draft=q_draft)

    def accept(self, path: np.ndarray) -> None:
        """`path`: accepted node ids after the root (only those whose tokens were committed)."""
        kept = []
        for node in path:
            if self._slots[node] < 0:
                break
            kept.append(self._slots[node])
        self.kv.keep(self._base, np.asarray(kept, dtype=np.int64))
        self._cached = self._base + len(kept)


class ModelFreeDrafter:
    """ngram:N / prompt-lookup:N: the simulator's candidate trie over the committed tokens (no model)."""

    def __init__(self, spec: str):
        from specsim.sim.modelfree import parse_modelfree

        self.draft = parse_modelfree(spec)
        self.name = self.draft.name

    def reset(self, prompt_ids: np.ndarray) -> None:
        pass

    def propose(self, committed, tree, *, policy, temperature, multi_draft, rng) -> Proposal:
        from specsim.sim.modelfree import tree_tokens

        tokens = tree_tokens(np.asarray(committed, dtype=np.int64), self.draft, tree)  # -1: no candidate
        valid = tokens >= 0
        valid[0] = True
        tokens[0] = committed[-1]
        return Proposal(tokens=np.where(valid, tokens, 0), valid=valid, q_draft=None)

    def accept(self, path: np.ndarray) -> None:
        pass


def is_model_free(spec: str) -> bool:
    return spec.split(":", 1)[0].strip().lower() in ("ngram", "prompt-lookup")

"""Live drafting with heads on the target: Medusa and EAGLE (`specsim.record.heads`).

Both read the target's final hidden state at the root's predecessor, which the engine hands
over after every verification (`needs_hidden`: the engine keeps the target's hidden states
of the last forward and passes those of the accepted path). A static tree is filled level by
level as a draft model fills it (`specsim.live.drafting`): greedy takes the r-th most likely
token of the law at the parent, sampling draws the parent's children from it.

* Medusa: the law at any node of depth d - 1 is head d's at the root's state (Medusa's
  top-k-per-head trees), so one head pass serves the whole tree.
* EAGLE: the layer keeps its own KV cache over committed entries (h_i, y_{i+1}); each call
  feeds the entries the last verification produced, then one forward per tree level on
  (parent's predicted feature, node token), each node seeing the committed entries and its
  ancestors. Tree entries are dropped after the call. One request at a time.
"""

from __future__ import annotations

import numpy as np
import torch

from specsim.errors import SpecError
from specsim.live.drafting import Proposal, allowed, cut_below_eos, fill_children
from specsim.record.heads import concat_kv, load_heads

ONE_AT_A_TIME = "EAGLE heads decode one request at a time (--batch 1)"


class MedusaDrafter:
    """Medusa heads: head d at the root's predecessor state drafts every node of depth d."""

    needs_hidden = True

    def __init__(self, head):
        self.head = head
        self.name = head.name
        self.levels: list[int] = []
        self._state: torch.Tensor | None = None  # (B, H) target state before each request's root

    def start(self, prompts, hidden) -> None:
        self._state = torch.stack([h[-1] for h in hidden])

    def join(self, prompts, hidden) -> None:
        self._state = torch.cat([self._state, torch.stack([h[-1] for h in hidden])])

    def drop(self, keep) -> None:
        self._state = self._state[torch.as_tensor(np.asarray(keep), device=self._state.device)]

    @torch.inference_mode()
    def propose(self, committed, tree, rooms, *, policy, temperature, multi_draft, rngs, eos) -> Proposal:
        if tree.max_depth > self.head.config.heads:
            raise SpecError(f"tree {tree.name} is {tree.max_depth} deep; {self.name} has {self.head.config.heads} heads")
        B, n = len(committed), tree.n_nodes
        laws = self.head.module(self._state, self.head.lm_head).float()  # (B, K, V)
        self.levels = [1]
        tokens = np.zeros((B, n), dtype=np.int64)
        tokens[:, 0] = [c[-1] for c in committed]
        valid = allowed(tree, rooms)
        sampling = policy != "greedy"
        q_draft: dict | None = {} if sampling else None
        level = np.array([0])
        while True:
            parents = level[tree.n_children[level] > 0]
            if parents.size == 0:
                break
            logits = laws[:, tree.depths[parents]]  # (B, P, V): the head of the children's depth
            level = fill_children(tree, parents, logits, tokens, valid, q_draft, sampling=sampling,
                                  temperature=temperature, multi_draft=multi_draft, rngs=rngs)
            valid = cut_below_eos(tree, tokens, valid, eos)
        return Proposal(tokens=tokens, valid=valid, q_draft=q_draft)

    def accept(self, paths, hidden) -> None:
        self._state = torch.stack([h[-1] for h in hidden])


class EagleDrafter:
    """An EAGLE-1/2 layer with its own KV cache over committed entries; one request at a time."""

    needs_hidden = True

    def __init__(self, head):
        self.head = head
        self.name = head.name
        self.levels: list[int] = []
        self._past = None  # per layer (k, v) (1, Hkv, m, d) of the committed entries
        self._m = 0  # committed entries: input indices 0..m-1
        self._pending: torch.Tensor | None = None  # (k, H) target states whose entries are not fed yet

    def start(self, prompts, hidden) -> None:
        if len(prompts) != 1:
            raise SpecError(ONE_AT_A_TIME)
        self._past, self._m, self._pending = None, 0, hidden[0]

    def join(self, prompts, hidden) -> None:
        raise SpecError(ONE_AT_A_TIME)

    def drop(self, keep) -> None:
        if len(keep):
            raise SpecError(ONE_AT_A_TIME)
        self._past, self._m, self._pending = None, 0, None

    def _forward(self, feats, ids, positions, mask, past):
        return self.head.module(feats[None], ids[None], positions[None], mask[None], past, self.head.embed)

    @torch.inference_mode()
    def propose(self, committed, tree, rooms, *, policy, temperature, multi_draft, rngs, eos) -> Proposal:
        if len(committed) != 1:
            raise SpecError(ONE_AT_A_TIME)
        dev = self._pending.device
        k = self._pending.shape[0]
        ids = torch.as_tensor(np.asarray(committed[0][-k:], dtype=np.int64), device=dev)
        pos = torch.arange(self._m, self._m + k, device=dev)
        mask = torch.ones((k, self._m + k), dtype=torch.bool, device=dev)
        mask[:, self._m :] = torch.ones(k, k, dtype=torch.bool, device=dev).tril()
        feats, new = self._forward(self._pending, ids, pos, mask, self._past)
        self._past = concat_kv(self._past, new)
        self._m += k
        self.levels = [k]
        n = tree.n_nodes
        tokens = np.zeros((1, n), dtype=np.int64)
        tokens[0, 0] = committed[0][-1]
        valid = allowed(tree, rooms)
        sampling = policy != "greedy"
        q_draft: dict | None = {} if sampling else None
        feature = {0: feats[0, -1]}  # node -> the predicted feature after it
        level_logits = {0: self.head.lm_head(feats[0, -1]).float()}
        anc = tree.ancestor_mask()
        slot = np.full(n, -1, dtype=np.int64)  # node -> index among the tree entries fed this call
        tree_past = None
        fed = 0
        level = np.array([0])
        while True:
            parents = level[tree.n_children[level] > 0]
            if parents.size == 0:
                break
            logits = torch.stack([level_logits[int(p)] for p in parents])[None]  # (1, P, V)
            level = fill_children(tree, parents, logits, tokens, valid, q_draft, sampling=sampling,
                                  temperature=temperature, multi_draft=multi_draft, rngs=rngs)
            valid = cut_below_eos(tree, tokens, valid, eos)
            to_feed = np.array([v for v in level if tree.n_children[v] > 0 and valid[0, tree.children(int(v))].any()],
                               dtype=np.int64)
            if to_feed.size == 0:
                break
            w = to_feed.size
            fed_nodes = np.flatnonzero(slot >= 0)
            attend = np.zeros((w, fed + w), dtype=bool)
            attend[:, slot[fed_nodes]] = anc[np.ix_(to_feed, fed_nodes)]
            attend[:, fed:] = np.eye(w, dtype=bool)
            mask = torch.cat([torch.ones((w, self._m), dtype=torch.bool, device=dev),
                              torch.as_tensor(attend, device=dev)], dim=1)
            past = concat_kv(self._past, tree_past)
            parent_feats = torch.stack([feature[int(tree.parents[v])] for v in to_feed])  # (w, H)
            ids = torch.as_tensor(tokens[0, to_feed], device=dev)
            positions = torch.as_tensor(self._m - 1 + tree.depths[to_feed], device=dev)
            out, new = self._forward(parent_feats, ids, positions, mask, past)
            tree_past = concat_kv(tree_past, new)
            for i, v in enumerate(to_feed):
                feature[int(v)] = out[0, i]
                level_logits[int(v)] = self.head.lm_head(out[0, i]).float()
            slot[to_feed] = fed + np.arange(w)
            fed += w
            self.levels.append(w)
            level = to_feed
        return Proposal(tokens=tokens, valid=valid, q_draft=q_draft)

    def accept(self, paths, hidden) -> None:
        self._pending = hidden[0]  # states of the root and the accepted nodes: entries paired with what follows


def head_drafter(spec: str, target) -> MedusaDrafter | EagleDrafter:
    head = load_heads(spec, target)
    return MedusaDrafter(head) if head.kind == "medusa" else EagleDrafter(head)


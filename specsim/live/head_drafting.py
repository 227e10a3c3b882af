"""Live drafting with heads on the target: Medusa, EAGLE and EAGLE-3 (`specsim.record.heads`).

All read the target's hidden states at the root's predecessor, which the engine hands over
after every verification (`needs_hidden`: the engine keeps the states `hidden_layers` names
from the last forward — the final state, or EAGLE-3's low, middle and high layers side by
side — and passes those of the accepted path). A static tree is filled level by
level as a draft model fills it (`specsim.live.drafting`): greedy takes the r-th most likely
token of the law at the parent, sampling draws the parent's children from it.

* Medusa: the law at any node of depth d - 1 is head d's at the root's state (Medusa's
  top-k-per-head trees), so one head pass serves the whole tree.
* EAGLE and EAGLE-3: the layer keeps its own KV cache over committed entries (h_i, y_{i+1});
  each call feeds the entries the last verification produced (EAGLE-3 fuses the target's
  layers first), then one forward per tree level on (parent's predicted feature, node token),
  each node seeing the committed entries and its ancestors. Tree entries are dropped after
  the call. A batch shares one padded cache.

A dynamic tree (`dynamic:topk=K,depth=D,tokens=N`) is grown per request with EAGLE-2's rule
(`specsim.record.expand.beam_expand`), the beam's K nodes of a level fed as the recorder feeds
them (`HeadDraft.expand_starts`), so the trees live decoding verifies are the ones the replay reads.
"""

from __future__ import annotations

import numpy as np
import torch

from specsim.errors import SpecError
from specsim.expansion import DynamicTree
from specsim.live.drafting import Proposal, allowed, dynamic_proposal, fill_children
from specsim.record.head_checkpoints import load_heads
from specsim.record.head_unroll import concat_kv

class _HeadDrafter:
    """What every head drafter is: a loaded head (`specsim.record.head_unroll.HeadDraft`) that reads the target's states
    `hidden_layers`, which the engine keeps for it (`needs_hidden`); `levels` the draft forwards of the last call."""

    needs_hidden = True

    def __init__(self, head):
        self.head = head
        self.name = head.name
        self.hidden_layers = head.hidden_layers
        self.levels: list[int] = []


class MedusaDrafter(_HeadDrafter):
    """Medusa heads: head d at the root's predecessor state drafts every node of depth d."""

    def __init__(self, head):
        super().__init__(head)
        self._state: torch.Tensor | None = None  # (B, H) target state before each request's root

    def start(self, prompts, hidden) -> None:
        self._state = torch.stack([h[-1] for h in hidden])

    def join(self, prompts, hidden) -> None:
        self._state = torch.cat([self._state, torch.stack([h[-1] for h in hidden])])

    def drop(self, keep) -> None:
        self._state = self._state[torch.as_tensor(np.asarray(keep), device=self._state.device)]

    @torch.inference_mode()
    def propose(self, committed, tree, rooms, *, policy, temperature, multi_draft, rngs) -> Proposal:
        heads = self.head.config.heads
        if isinstance(tree, DynamicTree) and tree.shape.depth > heads:
            raise SpecError(f"tree {tree.name} expands {tree.shape.depth} levels; {self.name} has {heads} heads")
        if tree.max_depth > heads:
            raise SpecError(f"tree {tree.name} is {tree.max_depth} deep; {self.name} has {heads} heads")
        laws = self.head.module(self._state, self.head.lm_head).float()  # (B, heads, V)
        self.levels = [1]
        if isinstance(tree, DynamicTree):  # every node of depth d - 1 has head d's top K as its children
            from specsim.record.expand import expand_by_depth

            out = expand_by_depth(laws, topk=tree.shape.topk, depth=tree.shape.depth, per_row=True)
            return dynamic_proposal(out, tree.shape, committed, rooms)
        B, n = len(committed), tree.n_nodes
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
        return Proposal(tokens=tokens, valid=valid, q_draft=q_draft)

    def accept(self, paths, hidden) -> None:
        self._state = torch.stack([h[-1] for h in hidden])


class EagleDrafter(_HeadDrafter):
    """An EAGLE-1/2 or EAGLE-3 layer with its own KV cache over each request's committed entries, for a batch.

    The cache is one (B, Hkv, M, d) tensor per layer whose entries are appended for every row
    at once; `_real` (B, M) marks each row's committed entries (a row that fed fewer entries in
    a call has padding there, which no query sees), `_count` (B,) their number, which is also
    the position id of the next entry.
    """

    def __init__(self, head):
        super().__init__(head)
        self._past = None  # per layer (k, v) (B, Hkv, M, d)
        self._real = np.zeros((0, 0), dtype=bool)  # (B, M) committed entries of each row
        self._count = np.zeros(0, dtype=np.int64)  # (B,) committed entries per row
        self._pending: list[torch.Tensor] = []  # per row (k, H) target states whose entries are not fed yet

    def start(self, prompts, hidden) -> None:
        self._past, self._real = None, np.zeros((len(prompts), 0), dtype=bool)
        self._count = np.zeros(len(prompts), dtype=np.int64)
        self._root: list[torch.Tensor | None] = [None] * len(prompts)
        self._pending = list(hidden)
        self._feed([np.asarray(p) for p in prompts])  # the prompt pass, at admission like the target's

    def join(self, prompts, hidden) -> None:
        old = len(self._pending)
        if self._past is not None:
            self._past = [tuple(torch.cat([t, t.new_zeros((len(prompts),) + t.shape[1:])]) for t in layer)
                          for layer in self._past]
        self._real = np.concatenate([self._real, np.zeros((len(prompts), self._real.shape[1]), dtype=bool)])
        self._count = np.concatenate([self._count, np.zeros(len(prompts), dtype=np.int64)])
        self._root += [None] * len(prompts)
        self._pending += list(hidden)
        # the new rows' prompt pass; the others keep their pending entries for their next call
        self._feed([np.zeros(0, dtype=np.int64)] * old + [np.asarray(p) for p in prompts],
                   rows=range(old, old + len(prompts)))

    def drop(self, keep) -> None:
        keep = np.asarray(keep, dtype=np.int64)
        if self._past is not None:
            idx = torch.as_tensor(keep, device=self._past[0][0].device)
            self._past = [tuple(t[idx] for t in layer) for layer in self._past]
        self._real, self._count = self._real[keep], self._count[keep]
        self._pending = [self._pending[i] for i in keep]
        self._root = [self._root[i] for i in keep]
        if not keep.size:
            self._past = None

    def _forward(self, feats, ids, positions, mask, past, *, from_target: bool):
        return self.head.forward(feats, ids, positions, mask, past, from_target=from_target)

    @torch.inference_mode()
    def _feed(self, committed, rows=None) -> int:
        """Feed the pending entries of `rows` (all by default; state i with the token after it, padded to the
        longest) in one forward, keep each fed row's last output as its root feature; the entries fed per row
        at most (0: no forward)."""
        B = len(committed)
        dev = self._pending[0].device
        H = self._pending[0].shape[-1]
        chosen = np.zeros(B, dtype=bool)
        chosen[list(range(B)) if rows is None else list(rows)] = True
        ks = np.array([p.shape[0] if c else 0 for p, c in zip(self._pending, chosen)], dtype=np.int64)
        K, M = int(ks.max(initial=0)), self._real.shape[1]
        if K == 0:
            return 0
        feats = torch.zeros((B, K, H), dtype=self._pending[0].dtype, device=dev)
        ids = np.zeros((B, K), dtype=np.int64)
        new_real = np.arange(K)[None, :] < ks[:, None]  # (B, K)
        for r, (p, c) in enumerate(zip(self._pending, committed)):
            if ks[r]:
                feats[r, : ks[r]] = p
                ids[r, : ks[r]] = np.asarray(c[-ks[r]:], dtype=np.int64)
        causal = np.tril(np.ones((K, K), dtype=bool))[None] & new_real[:, None, :]
        causal |= np.eye(K, dtype=bool)[None]  # padding sees itself only
        mask = np.concatenate([np.broadcast_to(self._real[:, None, :], (B, K, M)), causal], axis=2)
        positions = self._count[:, None] + np.arange(K)[None, :]
        out, new = self._forward(feats, torch.as_tensor(ids, device=dev), torch.as_tensor(positions, device=dev),
                                 torch.as_tensor(mask, device=dev), self._past, from_target=True)
        self._past = concat_kv(self._past, new)
        self._real = np.concatenate([self._real, new_real], axis=1)
        self._count = self._count + ks
        for r in np.flatnonzero(ks):
            self._root[r] = out[r, ks[r] - 1]  # the predicted feature after the row's root
            self._pending[r] = self._pending[r][:0]
        return K

    @torch.inference_mode()
    def propose(self, committed, tree, rooms, *, policy, temperature, multi_draft, rngs) -> Proposal:
        B = len(committed)
        dev = self._pending[0].device
        # 1. Feed each row's pending entries: the root and what the last call accepted (none right after the
        #    prompt pass, which fed the prompt at admission and left the root's feature).
        K = self._feed(committed)
        self.levels = [K] if K else []
        root_feat = torch.stack(self._root)  # (B, H) after each root
        if isinstance(tree, DynamicTree):
            return self._propose_dynamic(committed, tree.shape, rooms, root_feat)
        # 2. The tree, level by level: (parent's predicted feature, node token) for every row at once.
        n = tree.n_nodes
        tokens = np.zeros((B, n), dtype=np.int64)
        tokens[:, 0] = [c[-1] for c in committed]
        valid = allowed(tree, rooms)
        sampling = policy != "greedy"
        q_draft: dict | None = {} if sampling else None
        feature = {0: root_feat}  # node -> (B, H) the predicted feature after it
        level_logits = {0: self.head.logits(root_feat).float()}  # node -> (B, V)
        anc = tree.ancestor_mask()
        slot = np.full(n, -1, dtype=np.int64)  # node -> index among the tree entries fed this call
        tree_past = None
        fed = 0
        level = np.array([0])
        committed_mask = self._real  # (B, M + K)
        while True:
            parents = level[tree.n_children[level] > 0]
            if parents.size == 0:
                break
            logits = torch.stack([level_logits[int(p)] for p in parents], dim=1)  # (B, P, V)
            level = fill_children(tree, parents, logits, tokens, valid, q_draft, sampling=sampling,
                                  temperature=temperature, multi_draft=multi_draft, rngs=rngs)
            to_feed = np.array([v for v in level if tree.n_children[v] > 0 and valid[:, tree.children(int(v))].any()],
                               dtype=np.int64)
            if to_feed.size == 0:
                break
            w = to_feed.size
            fed_nodes = np.flatnonzero(slot >= 0)
            attend = np.zeros((w, fed + w), dtype=bool)
            attend[:, slot[fed_nodes]] = anc[np.ix_(to_feed, fed_nodes)]
            attend[:, fed:] = np.eye(w, dtype=bool)
            mask = np.concatenate([np.broadcast_to(committed_mask[:, None, :], (B, w, committed_mask.shape[1])),
                                   np.broadcast_to(attend[None], (B, w, fed + w))], axis=2)
            past = concat_kv(self._past, tree_past)
            parent_feats = torch.stack([feature[int(tree.parents[v])] for v in to_feed], dim=1)  # (B, w, H)
            positions = self._count[:, None] - 1 + tree.depths[to_feed][None, :]
            out, new = self._forward(parent_feats, torch.as_tensor(tokens[:, to_feed], device=dev),
                                     torch.as_tensor(positions, device=dev), torch.as_tensor(mask, device=dev), past,
                                     from_target=False)
            tree_past = concat_kv(tree_past, new)
            for i, v in enumerate(to_feed):
                feature[int(v)] = out[:, i]
                level_logits[int(v)] = self.head.logits(out[:, i]).float()
            slot[to_feed] = fed + np.arange(w)
            fed += w
            self.levels.append(w)
            level = to_feed
        return Proposal(tokens=tokens, valid=valid, q_draft=q_draft)

    def _propose_dynamic(self, committed, shape, rooms, root_feat: torch.Tensor) -> Proposal:
        """EAGLE-2's tree for this call, one per request, grown by the forwards the recorder runs
        (`HeadDraft.beam_children`): each row's K beam nodes of a level in its own row of one forward, seeing the
        row's committed entries; the N best candidates kept (`dynamic_proposal`). The tree's entries are dropped
        after the call."""
        from specsim.record.expand import beam_expand

        B, K = root_feat.shape[0], shape.topk
        dev = root_feat.device
        context = torch.as_tensor(self._real, device=dev)[:, None, :].expand(B, K, -1)  # (B, K, M)
        children = self.head.beam_children(root_feat, self._past, context, torch.as_tensor(self._count, device=dev),
                                           topk=K, per_row=True)
        out = beam_expand(self.head.logits(root_feat), children, topk=K, depth=shape.depth, per_row=True)
        self.levels += [K] * (shape.depth - 1)
        return dynamic_proposal(out, shape, committed, rooms)

    def accept(self, paths, hidden) -> None:
        self._pending = list(hidden)  # per row: states of the root and the accepted nodes, paired with what follows


def head_drafter(spec: str, target) -> MedusaDrafter | EagleDrafter:
    head = load_heads(spec, target)
    return EagleDrafter(head) if head.autoregressive else MedusaDrafter(head)


"""Draft proposers: fill a static tree's nodes with draft tokens for a batch of requests.

A static tree (specsim.trees) names each node by its rank path. A model draft fills
it level by level (SpecInfer, Miao et al. 2024; Sequoia, Chen et al. 2024): one
forward over the tokens the draft has not seen yet gives q at the root; then one
forward over the nodes of depth d that have children gives q at each of them, and
their children are

* greedy:   the parent's r-th most likely draft token for the child of rank r
            (ties broken by the lower token id, as the simulator ranks them);
* sampling: k candidates drawn from q at the parent (`specsim.verify.sample_candidates`,
            'iid' or 'swor'), in draw order, for a parent with k children.

Every request of the batch drafts the same tree in the same forwards (one row each), as
serving engines batch their draft steps. A request drafts only what it can use, as
Hugging Face's assisted generation and serving engines do: no node deeper than the
drafts it can still accept before its output limit (`rooms`), and nothing below a node
whose token ends the sequence. A level no request needs is not run.

After verification the draft keeps the KV entries of the accepted nodes it was fed and
forgets the rest; tokens it has not seen (the correction, an accepted leaf) are fed at
the start of the next step. Model-free drafts (n-gram, prompt lookup) put a point mass
on a candidate trie built from the token prefix (`specsim.sim.modelfree`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

from specsim.record.kv import SlotKV
from specsim.expansion import DynamicTree
from specsim.trees import Tree
from specsim.verify import sample_candidates


@dataclass(frozen=True)
class Proposal:
    """A tree filled with draft tokens, one row per request of the batch."""

    tokens: np.ndarray  # (B, n_nodes) int64 token of each node; node 0 is the root (last committed token)
    valid: np.ndarray  # (B, n_nodes) bool, prefix-closed per row; False: not drafted (output cap, swor out of
    #                    support, no n-gram match). A drafted end-of-sequence token does not stop the drafting
    #                    below it, as vLLM's proposers do not stop (v1/spec_decode): the target's verification
    #                    ends the output there, and the replay prices the same whole tree
    q_draft: dict[int, np.ndarray] | None  # node -> (B, V) float64 draft probabilities at that node (sampling
    #                                        drafts, nodes with children); None for point masses (greedy, model-free)
    trees: list[Tree] | None = None  # each request's own tree when the drafter grew them (dynamic trees; tokens
    #                                  and valid are then padded to the largest); None: the config's tree


class Drafter(Protocol):
    name: str

    def start(self, prompts: Sequence[np.ndarray]) -> None: ...

    def join(self, prompts: Sequence[np.ndarray]) -> None: ...

    def drop(self, keep: np.ndarray) -> None: ...

    def propose(self, committed: Sequence[Sequence[int]], tree: Tree, rooms: np.ndarray, *, policy: str,
                temperature: float, multi_draft: str, rngs: Sequence[np.random.Generator]) -> Proposal: ...

    def accept(self, paths: Sequence[Sequence[int]]) -> None: ...

    # Optional: `begin()` before a decoding run, `finish(committed)` when a request ends (prompt + output),
    # for drafters that learn from earlier requests (suffix); `needs_hidden` for head drafts.


def probabilities(logits: torch.Tensor, temperature: float) -> np.ndarray:
    """softmax(logits / T) in float64 ((..., V)); T = 0 gives T = 1 probabilities (greedy needs only ranks)."""
    x = logits.double() / (temperature if temperature > 0 else 1.0)
    return torch.softmax(x, dim=-1).cpu().numpy()


def top_ranked(logits: torch.Tensor, k: int) -> np.ndarray:
    """(rows, k) ids of the k most likely tokens per row, ties broken by the lower token id.

    torch.argmax returns the first maximum, which is the rule for k = 1. For k > 1 a top-k
    with slack is sorted by (logit desc, id asc); a row whose tie run reaches the slack's
    edge is sorted in full.
    """
    if k == 1:
        return logits.argmax(dim=-1, keepdim=True).cpu().numpy().astype(np.int64)
    V = logits.shape[-1]
    m = min(V, k + 8)
    values, ids = torch.topk(logits, m, dim=-1)  # (rows, m), unordered among equal values
    order = torch.sort(ids, dim=-1).indices  # by id, then stably by value: (value desc, id asc)
    ids, values = ids.gather(-1, order), values.gather(-1, order)
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices
    ids, values = ids.gather(-1, order), values.gather(-1, order)
    out = ids[:, :k].cpu().numpy().astype(np.int64)
    if m < V:
        edge = (values[:, m - 1] == values[:, k - 1]).cpu().numpy()
        for row in np.flatnonzero(edge):
            full = torch.sort(logits[row], descending=True, stable=True).indices[:k]
            out[row] = full.cpu().numpy()
    return out


def allowed(tree: Tree, rooms: np.ndarray) -> np.ndarray:
    """(B, n_nodes) bool: nodes no deeper than each request's room (drafts it can still accept)."""
    return tree.depths[None, :] <= np.asarray(rooms)[:, None]


def fill_children(tree: Tree, parents: np.ndarray, logits, tokens: np.ndarray, valid: np.ndarray,
                  q_draft: dict | None, *, sampling: bool, temperature: float, multi_draft: str, rngs) -> np.ndarray:
    """Draft the children of `parents` (P,) from the laws at them, logits (B, P, V), in place in `tokens`
    (and `valid`, where swor runs out of tokens with mass; `q_draft` gets each parent's law when sampling).
    Returns the children, in order: the next level."""
    B = tokens.shape[0]
    children = [tree.children(int(p)) for p in parents]
    if sampling:
        probs = probabilities(logits, temperature)  # (B, P, V)
        for i, (parent, kids) in enumerate(zip(parents, children)):
            q_draft[int(parent)] = probs[:, i]
            scheme = multi_draft if len(kids) > 1 else "iid"
            for r in range(B):
                if not valid[r, kids].any():
                    continue  # nothing this request can use: draw nothing
                drawn = sample_candidates(probs[r, i], len(kids), rngs[r], scheme=scheme)
                tokens[r, kids[: len(drawn)]] = drawn
                valid[r, kids[len(drawn):]] = False  # swor ran out of tokens with mass
    else:
        ranked = top_ranked(logits.reshape(B * len(parents), -1), int(tree.ranks[1:].max()) + 1)
        ranked = ranked.reshape(B, len(parents), -1)  # (B, P, max_rank + 1)
        for i, kids in enumerate(children):
            tokens[:, kids] = ranked[:, i, tree.ranks[kids]]
    return np.concatenate(children)


def dynamic_proposal(out: dict, shape, committed, rooms) -> Proposal:
    """Each request's dynamic tree from its expansion (`specsim.record.expand.beam_expand`, one row per request):
    the N best candidates (`specsim.sim.dynamic.select`) as a static tree of rank paths, nodes deeper than the
    request's room not drafted; point masses (EAGLE verifies them so at any T), padded to the largest tree."""
    from specsim.sim.dynamic import select

    token = out["expand_token"].cpu().numpy()
    parent = out["expand_parent"].cpu().numpy()
    chosen = select(out["expand_score"].float().cpu().numpy(), shape)  # (B, N)
    # rank of a candidate among its parent's children: its column in the parent's top-K
    rank = np.concatenate([np.arange(shape.topk)] + [np.tile(np.arange(shape.topk), shape.topk)] * (shape.depth - 1))
    trees, rows = [], []
    for r in range(len(committed)):
        paths: dict[int, tuple[int, ...]] = {}
        for i in chosen[r]:  # ascending: parents first
            paths[int(i)] = (paths[int(parent[r, i])] if parent[r, i] >= 0 else ()) + (int(rank[i]),)
        tree = Tree.from_paths(list(paths.values()))
        of_path = {p: i for i, p in paths.items()}
        nodes = [of_path[p] for p in tree.rank_paths()[1:]]
        row = np.zeros(tree.n_nodes, dtype=np.int64)
        row[0] = committed[r][-1]
        row[1:] = token[r, nodes]
        trees.append(tree)
        rows.append((row, tree.depths <= rooms[r]))
    n = max(t.n_nodes for t in trees)
    tokens = np.zeros((len(trees), n), dtype=np.int64)
    valid = np.zeros((len(trees), n), dtype=bool)
    for r, (row, ok) in enumerate(rows):
        tokens[r, : row.size], valid[r, : ok.size] = row, ok
    return Proposal(tokens=tokens, valid=valid, q_draft=None, trees=trees)


class ModelDrafter:
    """A draft language model (a separate model, `layers:K` or `int8`) with its own slot KV cache."""

    def __init__(self, model, name: str):
        self.kv = SlotKV(model)
        self.name = name
        self._seen = np.zeros(0, dtype=np.int64)  # committed tokens whose KV entries the draft holds, per row
        self._slot = np.zeros(0, dtype=np.int64)  # (n_nodes,) pending-region index of each node fed; -1 unfed
        self.levels: list[int] = []  # widths of the draft forwards of the last proposal (root feed first)

    def start(self, prompts: Sequence[np.ndarray]) -> None:
        self.kv.start([np.asarray(p[:-1]) for p in prompts])
        self._seen = np.array([len(p) - 1 for p in prompts], dtype=np.int64)

    def join(self, prompts: Sequence[np.ndarray]) -> None:
        fresh = ModelDrafter(self.kv.model, self.name)
        fresh.start(prompts)
        self.kv.append(fresh.kv)
        self._seen = np.concatenate([self._seen, fresh._seen])

    def drop(self, keep: np.ndarray) -> None:
        self.kv.drop(keep)
        self._seen = self._seen[keep]

    def propose(self, committed, tree, rooms, *, policy, temperature, multi_draft, rngs) -> Proposal:
        if isinstance(tree, DynamicTree):
            return self._propose_dynamic(committed, tree.shape, rooms)
        B, n = len(committed), tree.n_nodes
        if not np.array_equal(self._seen, self.kv.lengths):
            raise RuntimeError("draft cache out of step with the committed tokens")
        pending = [np.asarray(c[s:], dtype=np.int64) for c, s in zip(committed, self._seen)]
        root_logits = self.kv.feed_chains(pending)  # (B, V); the root is now in the cache
        self._seen = self.kv.lengths.copy()
        self.levels = [max(len(p) for p in pending)]
        tokens = np.zeros((B, n), dtype=np.int64)
        tokens[:, 0] = [c[-1] for c in committed]
        valid = allowed(tree, rooms)
        sampling = policy != "greedy"
        q_draft: dict[int, np.ndarray] | None = {} if sampling else None
        slot = np.full(n, -1, dtype=np.int64)
        anc = tree.ancestor_mask()
        level_nodes, level_logits = np.array([0]), root_logits[:, None, :]  # (B, 1, V)
        fed = 0
        while True:
            parents = level_nodes[tree.n_children[level_nodes] > 0]
            if parents.size == 0:
                break
            logits = level_logits[:, np.searchsorted(level_nodes, parents)]  # (B, P, V)
            level_nodes = fill_children(tree, parents, logits, tokens, valid, q_draft, sampling=sampling,
                                        temperature=temperature, multi_draft=multi_draft, rngs=rngs)
            # Feed this level's nodes whose children some request can still use: one draft forward.
            needs = np.array([tree.n_children[v] > 0 and valid[:, tree.children(int(v))].any() for v in level_nodes],
                             dtype=bool)
            to_feed = level_nodes[needs]
            if to_feed.size == 0:
                break
            w = to_feed.size
            fed_nodes = np.flatnonzero(slot >= 0)
            attend = np.zeros((B, w, fed + w), dtype=bool)
            attend[:, :, slot[fed_nodes]] = anc[np.ix_(to_feed, fed_nodes)][None]
            attend[:, :, fed:] = np.eye(w, dtype=bool)[None]
            level_logits = self.kv.forward(tokens[:, to_feed], tree.depths[to_feed] - 1, attend)  # (B, w, V)
            slot[to_feed] = fed + np.arange(w)
            fed += w
            self.levels.append(w)
            level_nodes = to_feed
        self._slot = slot
        return Proposal(tokens=tokens, valid=valid, q_draft=q_draft)

    def _propose_dynamic(self, committed, shape, rooms) -> Proposal:
        """EAGLE-2's tree for this call, one per request (`specsim.sim.dynamic`): the recorder's expansion
        at each request's context (`specsim.record.expand.expand`, every request's beam in its own row of
        the same D − 1 forwards), the N best candidates kept, nodes deeper than the request's room not
        drafted. Candidates are point masses (verified as EAGLE does at any T). The trees' KV entries
        are dropped after the expansion; accepted tokens are fed next call."""
        from specsim.record.expand import expand

        if not np.array_equal(self._seen, self.kv.lengths):
            raise RuntimeError("draft cache out of step with the committed tokens")
        pending = [np.asarray(c[s:], dtype=np.int64) for c, s in zip(committed, self._seen)]
        root_logits = self.kv.feed_chains(pending)  # (B, V)
        self._seen = self.kv.lengths.copy()
        out = expand(self.kv, root_logits, self.kv.lengths.copy(), topk=shape.topk, depth=shape.depth, per_row=True)
        self.levels = [max(len(p) for p in pending)] + [shape.topk] * (shape.depth - 1)
        proposal = dynamic_proposal(out, shape, committed, rooms)
        self._slot = np.full(proposal.tokens.shape[1], -1, dtype=np.int64)  # nothing of the trees stays in the cache
        return proposal

    def accept(self, paths: Sequence[Sequence[int]]) -> None:
        """paths[r]: accepted node ids after the root whose tokens were committed, root to leaf."""
        kept = []
        for path in paths:
            rows = []
            for node in path:
                if self._slot[node] < 0:
                    break
                rows.append(self._slot[node])
            kept.append(np.asarray(rows, dtype=np.int64))
        self.kv.commit(kept)
        self._seen = self.kv.lengths.copy()


class ModelFreeDrafter:
    """ngram:N / prompt-lookup:N: the simulator's candidate trie over the committed tokens (no model)."""

    levels: list[int] = []  # no draft forwards

    def __init__(self, spec: str):
        from specsim.sim.modelfree import parse_modelfree

        self.draft = parse_modelfree(spec)
        self.name = self.draft.name

    def start(self, prompts) -> None:
        pass

    def join(self, prompts) -> None:
        pass

    def drop(self, keep) -> None:
        pass

    def propose(self, committed, tree, rooms, *, policy, temperature, multi_draft, rngs) -> Proposal:
        from specsim.sim.modelfree import tree_tokens

        tokens = np.stack([tree_tokens(np.asarray(c, dtype=np.int64), self.draft, tree) for c in committed])
        return self._proposal(tokens, committed, tree, rooms)

    @staticmethod
    def _proposal(tokens, committed, tree, rooms) -> Proposal:
        """Point masses on the nodes with a candidate (−1: none), within each request's room."""
        valid = (tokens >= 0) & allowed(tree, rooms)  # -1: no candidate
        valid[:, 0] = True
        tokens[:, 0] = [c[-1] for c in committed]
        tokens = np.where(valid, tokens, 0)
        return Proposal(tokens=tokens, valid=valid, q_draft=None)

    def accept(self, paths) -> None:
        pass


class SuffixDrafter(ModelFreeDrafter):
    """suffix[:...]: SuffixDecoding's prompt and global suffix trees (`specsim.sim.suffix`), one request at a time.

    The global tree holds the outputs decoded earlier in the same run, in request order,
    as the replay holds the cache's earlier trajectories; a new run starts it empty.
    """

    def __init__(self, spec: str):
        from specsim.sim.suffix import parse_suffix

        self.draft = parse_suffix(spec)
        self.name = self.draft.name
        self.begin()

    def begin(self) -> None:
        """A new decoding run: no earlier outputs."""
        from specsim.sim.suffix import SuffixSpeculator

        self.speculator = SuffixSpeculator(self.draft)

    def _alone(self, requests: int) -> None:
        """The engine's guard (the CLIs check first): the registry's reason, for more than one request."""
        from specsim.specs import check_batch

        check_batch(self.name, requests)

    def start(self, prompts) -> None:
        self._alone(len(prompts))
        self.speculator.start(np.asarray(prompts[0], dtype=np.int64))

    def join(self, prompts) -> None:
        self._alone(2)  # a request joining one in flight

    def finish(self, committed) -> None:
        """A request ended with prompt + output = `committed`."""
        self.speculator.finish(np.asarray(committed, dtype=np.int64))

    def drop(self, keep) -> None:
        self._alone(1 + len(keep))

    def propose(self, committed, tree, rooms, *, policy, temperature, multi_draft, rngs) -> Proposal:
        self._alone(len(committed))
        tokens = np.array(self.speculator.propose(np.asarray(committed[0], dtype=np.int64), tree))[None, :]
        return self._proposal(tokens, committed, tree, rooms)

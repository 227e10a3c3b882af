"""The draft's EAGLE-2 expansion, batched on the models' device (`specsim cache --expand`).

`specsim.sim.dynamic` states the rule and holds its plain reference (`expand_reference`);
this is the same rule for many start positions at once. At every position t of a
trajectory (root context = prompt + y_<t) the depth-1 candidates are the top-K of the
draft's teacher-forced logits there; each deeper level feeds the K beam nodes of every
position in ONE draft forward over the whole sequence's KV cache, with a mask that shows
each beam node the committed prefix of its own position (`SlotKV.forward(visible=...)`)
and its ancestors in its own tree, at position id P + t + depth − 1. So a trajectory
costs D − 1 draft forwards per chunk of positions, not D per position.

Live decoding (`specsim.live.drafting.ModelDrafter`) calls the same function for its one
position per call, so the tree it verifies is the tree the recording replays. The beam rule
itself is `beam_expand`, which head drafts share (`HeadDraft.expand_starts` records them,
`specsim.live.head_drafting` grows their trees live): only the forwards differ.
"""

from __future__ import annotations

import numpy as np
import torch

from specsim.record.kv import SlotKV

QUERIES_PER_FORWARD = 512  # beam tokens fed per draft forward while recording (bounds the mask and logits)


def beam_expand(root_logits: torch.Tensor, children, *, topk: int, depth: int,
                per_row: bool = False) -> dict[str, torch.Tensor]:
    """EAGLE-2's expansion (`specsim.sim.dynamic`, steps 1–2) of c roots from the draft's logits at them, (c, V):
    expand_token/parent/score, (c, K + (D−1)K²). The one rule every draft expands with; what a draft runs to get
    the laws at the beam nodes is `children`:

    children(d, beam_tok, parent, attend) -> logits at the K beam nodes of depth d − 1 of every root, (c, K, V)
    or (c·K, V), where beam_tok (c, K) holds their tokens; parent (c, K) each one's parent among the previous
    call's beam (None at d = 2: the root); attend (groups, w, fed + w) bool, the tree part of their attention
    mask: which of the beam nodes fed earlier in the same group (in feeding order) each new one sees, its
    ancestors and itself. per_row=False: one group of w = c·K nodes (every root of a recorded trajectory in one
    forward); True: c groups of w = K (one request per row of a live batch).
    """
    c = root_logits.shape[0]
    K = topk
    dev = root_logits.device
    score, token = torch.topk(torch.log_softmax(root_logits.float(), dim=-1), K, dim=-1)  # (c, K)
    tokens, parents, scores = [token], [torch.full((c, K), -1, dtype=torch.long, device=dev)], [score]
    beam_tok, beam_score = token, score
    beam_idx = torch.arange(K, device=dev).expand(c, K)
    groups, per_group = (c, K) if per_row else (1, c * K)  # forward rows, beam nodes per row
    ancestors = np.zeros((groups, per_group, 0), dtype=bool)  # each beam node's ancestors among its row's fed nodes
    parent = None
    fed = 0
    for d in range(2, depth + 1):
        w = per_group
        attend = np.zeros((groups, w, fed + w), dtype=bool)
        attend[:, :, :fed] = ancestors
        attend[:, :, fed:] = np.eye(w, dtype=bool)
        logits = children(d, beam_tok, parent, attend)
        value, child = torch.topk(torch.log_softmax(logits.reshape(c * K, -1).float(), dim=-1), K, dim=-1)
        cu = (beam_score[:, :, None] + value.view(c, K, K)).reshape(c, K * K)
        child = child.view(c, K * K)
        tokens.append(child)
        parents.append(beam_idx[:, :, None].expand(c, K, K).reshape(c, K * K))
        scores.append(cu)
        offset = K + (d - 2) * K * K
        beam_score, pick = torch.topk(cu, K, dim=-1)  # (c, K) the next beam
        beam_tok = child.gather(1, pick)
        beam_idx = offset + pick
        parent = (pick // K).cpu().numpy()  # (c, K) each new node's parent in the old beam
        if per_row:
            ancestors = attend[np.arange(c)[:, None], parent]
        else:
            ancestors = attend[0, (np.arange(c)[:, None] * K + parent).reshape(-1)][None]
        fed += w
    return {"expand_token": torch.cat(tokens, dim=1), "expand_parent": torch.cat(parents, dim=1),
            "expand_score": torch.cat(scores, dim=1)}


def expand_by_depth(laws: torch.Tensor, *, topk: int, depth: int, per_row: bool = False) -> dict[str, torch.Tensor]:
    """`beam_expand` of a draft whose law is the same at every node of a depth (Medusa: head d at the root's state
    drafts every child of depth d): laws (c, >= D, V), each root's logits per depth."""
    return beam_expand(laws[:, 0], lambda d, tok, parent, attend: laws[:, d - 1, None].expand(-1, topk, -1),
                       topk=topk, depth=depth, per_row=per_row)


@torch.inference_mode()
def expand(kv: SlotKV, root_logits: torch.Tensor, first_position: np.ndarray, *, topk: int, depth: int,
           visible: np.ndarray | None = None, per_row: bool = False) -> dict[str, torch.Tensor]:
    """The expansion of c positions held in row 0 of `kv`: expand_token/parent/score, (c, K + (D−1)K²).

    root_logits (c, V): the draft's logits at each root; first_position (c,): the position id of
    each position's depth-1 nodes; visible (c,): committed entries each position's tree sees
    (None: all). per_row=True: position i is row i's next position (c = kv.rows; live decoding
    of a batch, one tree per request), each row's beam fed in its own row of the same forwards.
    Leaves nothing pending in `kv`.
    """
    c = root_logits.shape[0]
    K = topk
    base = int(kv.pending)
    first = np.asarray(first_position, dtype=np.int64)

    def children(d, beam_tok, parent, attend):
        if base:  # entries pending before the expansion: no beam node sees them
            attend = np.concatenate([np.zeros((attend.shape[0], attend.shape[1], base), dtype=bool), attend], axis=2)
        if per_row:
            return kv.forward(beam_tok.cpu().numpy(), np.full((c, K), d - 2), attend)  # (c, K, V)
        position = np.repeat(first + d - 2, K)  # (c·K,) depth d−1 nodes
        return kv.forward(beam_tok.reshape(1, c * K).cpu().numpy(), (position - kv.lengths[0])[None], attend,
                          visible=None if visible is None else np.repeat(np.asarray(visible), K)[None])

    out = beam_expand(root_logits, children, topk=topk, depth=depth, per_row=per_row)
    if kv.pending:
        kv.commit([np.zeros(0, dtype=np.int64)] * kv.rows)  # forget the tree entries
    return out


def expand_trajectory(model, prompt_ids, tokens, root_logits: torch.Tensor, *, topk: int,
                      depth: int) -> dict[str, np.ndarray]:
    """The expansion at every position of one trajectory (numpy arrays for the cache).

    model: the draft (a Hugging Face causal LM); root_logits (n, V): its teacher-forced logits.
    One prefill of prompt + y_<n−1, then chunks of positions of QUERIES_PER_FORWARD / K each.
    """
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    y = np.asarray(tokens, dtype=np.int64)
    n, P = y.shape[0], prompt.shape[0]
    kv = SlotKV(model)
    kv.start([np.concatenate([prompt, y[:-1]])])
    chunk = max(1, QUERIES_PER_FORWARD // topk)
    parts = []
    for lo in range(0, n, chunk):
        t = np.arange(lo, min(n, lo + chunk))
        if depth == 1:  # no forward: the root's top-K
            out = expand(kv, root_logits[t[0] : t[-1] + 1], P + t, topk=topk, depth=1)
        else:
            out = expand(kv, root_logits[t[0] : t[-1] + 1], P + t, topk=topk, depth=depth, visible=P + t)
        parts.append(out)
    return stored({name: torch.cat([p[name] for p in parts]) for name in parts[0]})


def stored(out: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """An expansion as the cache stores it (`specsim.cache.stats.expansion_shapes`): int32 tokens, int16 parents,
    float32 scores, numpy."""
    return {"expand_token": out["expand_token"].cpu().numpy().astype(np.int32),
            "expand_parent": out["expand_parent"].cpu().numpy().astype(np.int16),
            "expand_score": out["expand_score"].float().cpu().numpy()}

"""A head bound to its target, and the unrolling that gives its draft law at every call start and depth.

A head's draft law for the token d places after a call's start depends on (start, depth), not
on the position alone: q_{s,d}. `start_logits` computes it for every start of a recorded
trajectory — one teacher-forced pass for depth 1, then one batched pass per further depth in
which every start sees the target's features up to itself and its own predicted chain — so
the cache can store it keyed by depth (docs/cache-format.md). The same unrolling trains
EAGLE-3 and MTP heads with training-time test (`specsim.record.train`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from specsim.errors import ModelError
from specsim.record.heads import HeadConfig


def concat_kv(*parts):
    """Per layer (k, v) of several runs of entries, joined along the entries' axis (None parts skipped)."""
    parts = [p for p in parts if p is not None]
    if len(parts) == 1:
        return parts[0]
    return [(torch.cat([p[i][0] for p in parts], dim=2), torch.cat([p[i][1] for p in parts], dim=2))
            for i in range(len(parts[0]))]


@dataclass
class HeadDraft:
    """A head draft bound to its target: the module plus the target's LM head and embeddings."""

    name: str  # the spec as given: "medusa:DIR"
    kind: str  # "medusa" | "eagle" | "eagle3" | "mtp"
    config: HeadConfig
    module: nn.Module
    target: object  # the target's LoadedModel
    info: dict = field(default_factory=dict)

    @property
    def lm_head(self):
        return self.target.model.get_output_embeddings()

    @property
    def embed(self):
        return self.target.model.get_input_embeddings()

    @property
    def hidden_layers(self) -> tuple[str, ...]:
        """The target states the head reads (`target_hidden`'s keys), concatenated in this order."""
        return self.config.hidden_layers

    @property
    def autoregressive(self) -> bool:
        """EAGLE-1/2, EAGLE-3 and MTP draft one level at a time over their own features; Medusa reads one state."""
        return self.kind in ("eagle", "eagle3", "mtp")

    def features(self, states: dict) -> torch.Tensor:
        """The head's input from `target_hidden`'s states: "last", or EAGLE-3's layers side by side."""
        return torch.cat([states[k] for k in self.hidden_layers], dim=-1)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary of predicted features (EAGLE: the target's LM head; EAGLE-3: its own,
        over its draft vocabulary)."""
        if self.kind == "eagle3":
            return self.module.logits(features, int(self.target.vocab_size))
        if self.kind == "mtp":
            return self.module.logits(features, self.lm_head)
        return self.lm_head(features)

    def forward(self, feats, ids, positions, mask, past, *, from_target: bool):
        """The autoregressive heads' forward (`EagleHead.forward`), with the target's embeddings."""
        return self.module(feats, ids, positions, mask, past, self.embed, from_target=from_target)

    @torch.inference_mode()
    def start_logits(self, hidden: torch.Tensor, x: torch.Tensor, plen: int, depth: int) -> torch.Tensor:
        """(n, depth, V) float32 logits of q_{s,d}: the draft at call start s (generated index 0..n-1) for the
        token d - 1 places after s, with the target's tokens y_s, y_{s+1}, … accepted before it.

        hidden (L - 1, F): the head's input (`features`) at input indices 0..L-2 of x = prompt + y (L tokens),
        the state at index i giving p for x_{i+1}; a call at s has root x_{plen+s-1} and the state at plen+s-2.
        """
        if plen < 2:
            raise ModelError("head drafts need prompts of at least two tokens (the root's state precedes it)")
        L = x.shape[0]
        n = L - plen
        if self.kind == "medusa":
            if depth > self.config.heads:
                raise ModelError(f"{self.name} has {self.config.heads} heads; cannot draft depth {depth}")
            rows = hidden[plen - 2 : plen - 2 + n]  # (n, H): the state before each call's root
            return self.module(rows, self.lm_head)[:, :depth].float()  # (n, depth, V)
        starts = torch.arange(n, device=hidden.device) + plen - 2  # the entry each start's chain continues from
        feats = unroll(self.forward, hidden, x[1:], starts, depth)
        return torch.stack([self.logits(f) for f in feats], dim=1).float()  # (n, depth, V)

    @torch.inference_mode()
    def expand_starts(self, hidden: torch.Tensor, x: torch.Tensor, plen: int, *, topk: int,
                      depth: int) -> dict[str, torch.Tensor]:
        """EAGLE-2's expansion (`specsim.sim.dynamic`) at every call start s = 0..n-1 of a recorded trajectory:
        expand_token/parent/score, (n, K + (D−1)K²), row s the tree a call at s would grow (hidden, x, plen as in
        `start_logits`; its depth-1 law is `start_logits`' depth 1).

        Medusa: a node's children are head d's top K at the root's state whatever its path
        (`specsim.record.expand.expand_by_depth`). EAGLE, EAGLE-3, MTP: the teacher pass gives each start's root
        feature, then `beam_children` feeds every start's K beam nodes in one forward per level, each seeing the
        target's entries up to its start's root.
        """
        from specsim.record.expand import QUERIES_PER_FORWARD, beam_expand, expand_by_depth

        if plen < 2:
            raise ModelError("head drafts need prompts of at least two tokens (the root's state precedes it)")
        n = x.shape[0] - plen
        dev = hidden.device
        if self.kind == "medusa":
            if depth > self.config.heads:
                raise ModelError(f"{self.name} has {self.config.heads} heads; cannot expand to depth {depth}")
            return expand_by_depth(self.module(hidden[plen - 2 : plen - 2 + n], self.lm_head), topk=topk, depth=depth)
        ids = x[1:]
        M = ids.shape[0]
        pos = torch.arange(M, device=dev)
        feats, kv = self.forward(hidden[None], ids[None], pos[None], causal_masks(1, M, dev), None, from_target=True)
        chunk = max(1, QUERIES_PER_FORWARD // topk)
        parts = []
        for lo in range(0, n, chunk):
            starts = torch.arange(lo, min(n, lo + chunk), device=dev) + plen - 2  # each start's root entry
            seen = (pos[None, :] <= starts[:, None]).repeat_interleave(topk, dim=0)[None]  # (1, c·K, M)
            root = feats[0, starts]
            children = self.beam_children(root, kv, seen, starts + 1, topk=topk, per_row=False)
            parts.append(beam_expand(self.logits(root), children, topk=topk, depth=depth))
        return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}

    def beam_children(self, root: torch.Tensor, past, context: torch.Tensor, first_position: torch.Tensor, *,
                      topk: int, per_row: bool):
        """`beam_expand`'s forwards for an autoregressive head (EAGLE's `topK_genrate`), the same for the recording
        (`expand_starts`) and live decoding (`specsim.live.head_drafting`): a beam node of depth d − 1 is fed (its
        parent's predicted feature, its token) at position id first_position + d − 2, seeing the committed entries
        `context` shows it, its ancestors' entries and its own.

        root (c, H): each root's predicted feature; past: the committed entries' kv; context (rows, w, M) bool: which
        of them each beam node sees, in `beam_expand`'s layout (rows, w = c, K per_row, else 1, c·K); first_position
        (c,): each root's depth-1 position id."""
        c, H = root.shape
        K = topk
        rows, w = (c, K) if per_row else (1, c * K)
        dev = root.device
        state = {"out": None, "tree": None}  # the last level's predicted features (c, K, H) and the tree's kv

        def children(d, beam_tok, parent, attend):
            if parent is None:
                feed = root[:, None].expand(c, K, H)
            else:  # each beam node's parent's predicted feature
                feed = state["out"].gather(1, torch.as_tensor(parent, device=dev)[..., None].expand(c, K, H))
            mask = torch.cat([context, torch.as_tensor(attend, device=dev)], dim=2)
            positions = (first_position[:, None] + d - 2).expand(c, K).reshape(rows, w)
            out, new = self.forward(feed.reshape(rows, w, H), beam_tok.reshape(rows, w), positions, mask,
                                    concat_kv(past, state["tree"]), from_target=False)
            state["out"], state["tree"] = out.reshape(c, K, -1), concat_kv(state["tree"], new)
            return self.logits(state["out"])  # (c, K, V)

        return children


def unroll(forward, hidden: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor, depth: int,
           first: int = 0) -> list[torch.Tensor]:
    """An autoregressive head's predicted features at `depth` levels from every start: [(n, H)] per depth.

    hidden (m, F): the target's states of m entries (teacher-forced, causal), entry e paired with ids[e], the
    token after it. A chain from entry j predicts at depth 1 from the teacher pass, then at depth d >= 2 feeds
    its own depth d - 1 feature with ids[j + d - 1] (the token the target took: on a recorded trajectory that is
    the path a call accepts), seeing the teacher entries up to j and its own earlier entries — one batched
    forward per depth for every start. The same unrolling records the heads (`HeadDraft.start_logits`) and
    trains EAGLE-3 and MTP (training-time test, `specsim.record.train`); with grad enabled it is differentiable.
    `first`: the position id of entry 0 (a training window starts inside a sequence).
    """
    dev = hidden.device
    feats = unroll_batch(forward, hidden[None], ids[None], torch.tensor([hidden.shape[0]], device=dev),
                         starts[None], depth, torch.tensor([first], device=dev))
    return [f[0] for f in feats]


def causal_masks(batch: int, m: int, device) -> torch.Tensor:
    """(batch, m, m) causal masks: entry i sees entries 0..i. Padding placed after a sequence's entries is then never
    seen by them."""
    pos = torch.arange(m, device=device)
    return (pos[None, :] <= pos[:, None])[None].expand(batch, m, m)


def unroll_batch(forward, hidden: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor,
                 depth: int, first: torch.Tensor) -> list[torch.Tensor]:
    """`unroll` of B sequences at once, padded: [(B, N, H)] per depth.

    hidden (B, M, F), ids (B, M): sequence b's first lengths[b] entries are real, the rest padding after them,
    where causal attention from a real entry or start never looks; starts (B, N): each sequence's starts (padding
    lanes repeat a real start: computed, to be ignored); first (B,): each sequence's position id of entry 0. One
    sequence alone (B = 1, nothing padded) is `unroll` exactly: the same forwards on the same tensors."""
    dev = hidden.device
    B, M = ids.shape
    N = starts.shape[1]
    pos = torch.arange(M, device=dev)
    feats, kv = forward(hidden, ids, pos[None] + first[:, None], causal_masks(B, M, dev), None, from_target=True)
    prev = torch.gather(feats, 1, starts[..., None].expand(-1, -1, feats.shape[-1]))  # (B, N, H) depth 1
    out = [prev]
    lanes = torch.arange(N, device=dev)
    chain = []  # per depth >= 2: per layer (k, v) (B, Hkv, N, d)
    for d in range(2, depth + 1):
        step_ids = torch.gather(ids, 1, torch.minimum(starts + d - 1, lengths[:, None] - 1))  # past the end: unread
        positions = starts + d - 1 + first[:, None]
        mask = torch.zeros((B, N, M + N * (d - 1)), dtype=torch.bool, device=dev)
        mask[:, :, :M] = pos[None, None, :] <= starts[:, :, None]  # the target's entries up to the start's root
        for e in range(d - 1):  # its own entries at depths 2..d (the last block: this forward's)
            mask[:, lanes, M + e * N + lanes] = True
        feats, new = forward(prev, step_ids, positions, mask, concat_kv(kv, *chain), from_target=False)
        prev = feats
        chain.append(new)
        out.append(prev)
    return out


def target_hidden(target, x: torch.Tensor, layers: tuple[str, ...] = ("last",)) -> dict[str, torch.Tensor]:
    """The target's hidden states at input indices 0..L-2 of x (L,), one teacher-forced pass:
    "last" is the final (normed) state the LM head reads; "prenorm" the last decoder layer's output before the
    final norm (what MiMo's MTP reads); an integer k is the input of decoder layer k, the state after k layers
    (HF's hidden_states[k]; 0: the embeddings; vLLM's EAGLE-3 aux layer k).
    (L - 1, H) float32 tensors on the target's device."""
    model = target.model
    with torch.inference_mode():
        _, states = base_states(getattr(model, model.base_model_prefix), layers, input_ids=x[None, :-1],
                                use_cache=False)
    return {k: v[0].float() for k, v in zip(layers, states)}


def target_hidden_batched(target, xs: list[torch.Tensor], layers: tuple[str, ...],
                          max_tokens: int) -> list[dict[str, torch.Tensor]]:
    """`target_hidden(target, x, layers)` for every x of `xs`, from few forwards instead of one per sequence: sorted
    by length, right-padded, at most `max_tokens` padded tokens a forward. Padding follows a sequence's last token
    and causal attention never shows it to the positions before, so each result is the unbatched one up to the
    rounding of larger matrix products (`tests/test_recorder.py` bounds it)."""
    device = target.info["device"]
    base = getattr(target.model, target.model.base_model_prefix)
    inputs = [x[:-1] for x in xs]  # target_hidden's input: x without its last token
    out: list[dict[str, torch.Tensor]] = [{} for _ in xs]

    def run(group: list[int]) -> None:
        width = max(len(inputs[j]) for j in group)
        ids = torch.zeros((len(group), width), dtype=torch.long, device=device)
        mask = torch.zeros((len(group), width), dtype=torch.long, device=device)
        for r, j in enumerate(group):
            ids[r, : len(inputs[j])] = inputs[j]
            mask[r, : len(inputs[j])] = 1
        with torch.inference_mode():
            _, states = base_states(base, layers, input_ids=ids, attention_mask=mask, use_cache=False)
        for r, j in enumerate(group):
            out[j] = {k: v[r, : len(inputs[j])].float() for k, v in zip(layers, states)}

    group: list[int] = []
    for j in sorted(range(len(xs)), key=lambda j: len(inputs[j])):
        if group and (len(group) + 1) * len(inputs[j]) > max_tokens:
            run(group)
            group = []
        group.append(j)
    if group:
        run(group)
    return out


def base_states(base, layers: tuple[str, ...], **inputs) -> tuple[object, list[torch.Tensor]]:
    """Run a target's base model on `inputs`; (its output, the states `layers` names: "last", "prenorm" or layer
    numbers, as `target_hidden` defines them)."""
    ints = [k for k in layers if k not in ("last", "prenorm")]
    prenorm: list[torch.Tensor] = []
    hook = base.norm.register_forward_hook(lambda _m, args, _o: prenorm.append(args[0])) \
        if "prenorm" in layers else None
    try:
        out = base(**inputs, output_hidden_states=bool(ints))
    finally:
        if hook is not None:
            hook.remove()
    got = {"last": out.last_hidden_state, **({"prenorm": prenorm[-1]} if prenorm else {})}
    for k in ints:
        got[k] = out.hidden_states[int(k)]
    return out, [got[k] for k in layers]

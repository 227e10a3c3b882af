"""The losses heads train on (`specsim.record.train` says which, per kind), batched steps, and the
held-out evaluation.

A step's EAGLE, EAGLE-3 and MTP trajectories run together (`batch_loss`): sorted by length, padded in groups whose
padding stays under PAD_SHARE, one forward per depth per group (`unroll_batch`), each trajectory's loss still
averaged over its own rows. It is the per-trajectory loss up to float32 rounding; one trajectory at a time a step
is hundreds of small kernels, launch-bound on a GPU (16 trajectories: 0.28-0.37 s per step on an H200 against 0.055
batched). MTP layers with experts still run one at a time (their routers would count the padding), and so do Medusa's
heads.

A step reads nothing back from the device before its loss: the group's lengths and each depth's rows are worked out
on the host from the trajectories' shapes, and their index tensors are copied over once per group, without waiting
(`_on`). A read-back (a tensor's value as a Python number, `nonzero`, a boolean mask, `bincount` on a GPU) or a
blocking copy makes the host wait for the device to finish everything queued, so the device then waits for the host
to queue the next work: the GPU trainer of analyses/results/eagle3-gpu-h200-2026-11-28 read back about twice per
trajectory and depth and was 60-63% busy. tests/test_train_sync.py counts the read-backs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from specsim.record.train_data import TrainSequence

if TYPE_CHECKING:
    from specsim.record.train import TrainConfig

PAD_SHARE = 1.5  # batched steps: a group's padded entries are at most this times its trajectories' own
GROUP_CELLS = 1 << 25  # batched steps: a group's trajectories x (its longest's entries)^2 at most this, which bounds
#                        the teacher-forced pass's attention scores (SmolLM2's 9 heads: 1.2 GB in float32)


def _soft_ce(logits: torch.Tensor, p_logits: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over rows of -Σ p log q (p, q softmaxes of the given logits; over the ids `vocab` only, when given)."""
    if vocab is not None:
        logits, p_logits = logits[..., vocab], p_logits[..., vocab]
    return _ce_rows(logits, p_logits).mean()


def _ce_rows(logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """Per row -Σ p log q, in float32 (inside a bfloat16 step too)."""
    p = torch.softmax(p_logits.float(), dim=-1)
    return -(p * torch.log_softmax(logits.float(), dim=-1)).sum(-1)


@dataclass(frozen=True)
class Terms:
    """What one trajectory's loss and held-out numbers are computed from."""

    depths: list  # per depth d = 1, 2, ...: (q logits (m, V), the target's logits there (m, V), tokens y (m,))
    regression: tuple | None = None  # EAGLE: (predicted features ĥ_{t+1}, the target's h_{t+1})
    vocab: torch.Tensor | None = None  # EAGLE-3 with a draft vocabulary: its target ids (the loss is over them)


def terms(kind: str, module, target, seq: TrainSequence, depth: int = 1, *, full: bool = True,
          loss_from: int | None = None) -> Terms:
    """Medusa: head k at h_t against p_{t+1+k}. EAGLE: the layer on (h_t, embed(y_t)), teacher-forced and causal,
    its feature against h_{t+1} and its law against p_{t+1}. EAGLE-3: unrolled `depth` deep on its own features
    from every start t, depth d's law against p_{t+d}; full=False (training) computes both laws' logits on the
    draft vocabulary only, all the loss reads. The head runs over every row (the prompt's are its context); the
    terms are those of starts t >= `loss_from` (default: the first generated row, `seq.context`)."""
    lm_head = target.model.get_output_embeddings()
    h = seq.hidden.to(next(module.parameters()).device)
    y = seq.tokens.to(h.device)
    n = h.shape[0]
    a = seq.context if loss_from is None else loss_from
    if kind == "medusa":  # no attention: the prompt's rows are only more starts
        q_all = module(h[a:], lm_head)  # (n - a, K, V)
        with _teacher(h):  # the target's laws at rows a+1..n-1, once: head k reads rows a+1+k..
            p_all = lm_head(h[a + 1 :])
        return Terms([(q_all[: n - a - 1 - k, k], p_all[k:], y[a + 1 + k :])
                      for k in range(min(q_all.shape[1], n - a - 1))])
    if kind in ("eagle3", "mtp"):
        from specsim.record.head_unroll import unroll

        embed = target.model.get_input_embeddings()
        m = n - 1  # entries (f_t, y_t), t = 0..n-2: the last row has no next token to predict
        feats = unroll(lambda *args, from_target: module(*args, embed, from_target=from_target),
                       seq.features.to(h.device)[:m], y[:m], torch.arange(a, m, device=h.device), min(depth, m - a),
                       first=seq.start)
        # the target's laws at rows a+1..n-1, once: depth d reads rows a+d.. (p_{t+d} for starts t = a..n-1-d)
        if kind == "mtp":  # the target's whole vocabulary, through its LM head
            p_all = _no_grad(lm_head, h[a + 1 : n])
            return Terms([(module.logits(f[: n - a - d], lm_head), p_all[d - 1 :], y[a + d : n])
                          for d, f in enumerate(feats, start=1)])
        V = int(target.vocab_size)
        vocab = None if module.d2t is None else torch.arange(len(module.d2t), device=h.device) + module.d2t
        restrict = vocab is not None and not full
        with _teacher(h):  # (n - a - 1, V), or (n - a - 1, V_draft) restricted
            p_all = torch.nn.functional.linear(h[a + 1 : n], _draft_rows(module, lm_head, vocab)) if restrict \
                else lm_head(h[a + 1 : n])
        depths = []
        for d, f in enumerate(feats, start=1):
            q_logits = module.draft_logits(f[: n - a - d]) if restrict else module.logits(f[: n - a - d], V)
            depths.append((q_logits, p_all[d - 1 :], y[a + d : n]))
        return Terms(depths, vocab=None if restrict else vocab)
    from specsim.record.head_unroll import causal_masks

    pos = torch.arange(n - 1, device=h.device) + seq.start
    feats, _ = module(h[None, :-1], y[None, :-1], pos[None], causal_masks(1, n - 1, h.device), None,
                      target.model.get_input_embeddings())
    pred = feats[0, a:]  # (n - 1 - a, H): ĥ_{t+1}
    with _teacher(h):
        p_logits = lm_head(h[a + 1 :])
    return Terms([(lm_head(pred), p_logits, y[a + 1 :])], regression=(pred, h[a + 1 :]))


def batches_together(config: TrainConfig, module) -> bool:
    """Whether a step runs its trajectories together (`batch_loss`): EAGLE, EAGLE-3 and MTP with a plain block. A
    DeepSeek block's routers count the tokens they route (`RouterBalance`), padding included, so those run one at a
    time; Medusa's heads hold K x V logits per row and gain nothing from a shared forward, so they do too."""
    return config.batched and (config.kind in ("eagle", "eagle3")
                               or (config.kind == "mtp" and not module.config.block))


def batch_loss(module, target, seqs: list[TrainSequence], config: TrainConfig) -> torch.Tensor:
    """The mean over `seqs` of `loss(terms(...))` for EAGLE, EAGLE-3 and MTP, the trajectories run together: sorted by
    length, cut into groups whose padding stays under PAD_SHARE and attention under GROUP_CELLS, each group one
    padded forward per depth (`unroll_batch`). The same loss up to float32 rounding (tests/test_train_batch.py): one
    trajectory at a time a step is launch-bound on a GPU (16 trajectories: 0.37 s on an H200,
    analyses/results/eagle3-gpu-h200-2026-11-27)."""
    groups = _groups(seqs)
    group_loss = _eagle_group_loss if config.kind == "eagle" else _group_loss
    return sum(group_loss(module, target, g, config) for g in groups) / len(seqs)


def _groups(seqs: list[TrainSequence], most: int | None = None) -> list[list[TrainSequence]]:
    """`seqs` sorted by length and cut into groups whose padding stays under PAD_SHARE and attention under
    GROUP_CELLS (and of at most `most` trajectories, when given)."""
    order = sorted(seqs, key=lambda s: s.hidden.shape[0])
    groups, group = [], []
    for seq in order:
        n = seq.hidden.shape[0]  # the longest yet: the group's padded length if it joins
        if group and ((len(group) + 1) * n > PAD_SHARE * sum(s.hidden.shape[0] for s in group + [seq])
                      or (len(group) + 1) * n * n > GROUP_CELLS or len(group) == most):
            groups.append(group)
            group = []
        group.append(seq)
    groups.append(group)
    return groups


def _pad(rows: list[torch.Tensor], length: int) -> torch.Tensor:
    out = rows[0].new_zeros((len(rows), length) + tuple(rows[0].shape[1:]))
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r
    return out


def _on(dev, array: np.ndarray) -> torch.Tensor:
    """A host array on `dev` without waiting for the device: from pinned memory on a GPU (a copy from pageable
    memory waits for the device's queue)."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    kind = torch.device(dev).type
    if kind == "cpu":
        return t
    return (t.pin_memory() if kind == "cuda" else t).to(dev, non_blocking=True)


@dataclass(frozen=True)
class _Group:
    """A group's trajectories on the head's device, laid out for one padded forward; their lengths also on the
    host (`lengths`), so that laying out their rows reads nothing back from the device."""

    hidden: list  # each trajectory's states (n_b, H)
    m: torch.Tensor  # (B,) entries: the rows that predict (the last row predicts nothing)
    a: torch.Tensor  # (B,) the first row the loss covers
    lanes: torch.Tensor  # (B,) predictions (starts) per trajectory: rows a..m-1
    ids: torch.Tensor  # (B, M) each trajectory's tokens at its entries, padded after them
    first: torch.Tensor  # (B,) position id of entry 0
    lengths: np.ndarray  # (3, B) m, a and lanes on the host

    @property
    def n(self) -> int:
        """N, the most lanes of any trajectory."""
        return int(self.lengths[2].max())

    @property
    def j(self) -> torch.Tensor:
        """(N,) lane indices."""
        return torch.arange(self.n, device=self.m.device)

    def depth_rows(self, depths: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per depth d = 1..depths, (trajectory b, lane k) of the rows with a depth-d term, k < lanes_b - d + 1,
        in order of b then k (as `nonzero` lists them), worked out on the host and copied over at once."""
        lanes = self.lengths[2]
        counts = [np.maximum(lanes - d + 1, 0) for d in range(1, depths + 1)]
        b = [np.repeat(np.arange(len(lanes)), c) for c in counts]
        k = [np.arange(c.sum()) - np.repeat(np.cumsum(c) - c, c) for c in counts]
        both = _on(self.m.device, np.stack([np.concatenate(b), np.concatenate(k)]))
        return [(x[0], x[1]) for x in torch.split(both, [int(c.sum()) for c in counts], dim=1)]

    @staticmethod
    def of(seqs: list[TrainSequence], config: TrainConfig, dev, *, generated: bool = False) -> "_Group":
        """generated: the starts are the generated rows (held-out evaluation), not the loss's (`loss_from`)."""
        m = np.array([s.hidden.shape[0] - 1 for s in seqs])
        a = np.array([s.context if generated else s.loss_from(config) for s in seqs])
        lengths = np.stack([m, a, m - a])
        mt, at, lanes, first = _on(dev, np.concatenate([lengths, [[s.start for s in seqs]]]))
        return _Group(hidden=[s.hidden.to(dev) for s in seqs], m=mt, a=at, lanes=lanes,
                      ids=_pad([s.tokens[:n].to(dev) for s, n in zip(seqs, m.tolist())], int(m.max())),
                      first=first, lengths=lengths)

    def states(self, rows: torch.Tensor) -> torch.Tensor:
        """(B, N, H): trajectory b's states at rows[b]."""
        return torch.stack([h[r] for h, r in zip(self.hidden, rows)])


def _group_loss(module, target, seqs: list[TrainSequence], config: TrainConfig) -> torch.Tensor:
    """Σ over `seqs` of each one's `loss(terms(...))`, computed together: `terms`'s unrolling on padded tensors, its
    laws on the rows that have a term (`_group_laws`), each trajectory's cross-entropies averaged over its own rows,
    its depths weighted over its own."""
    _, laws, _ = _group_laws(module, target, seqs, config, full=False)
    return _group_losses(laws, config, None, len(seqs)).sum()


def _group_laws(module, target, seqs: list[TrainSequence], config: TrainConfig, *, full: bool):
    """(the group's layout, per depth d (q logits (R_d, V), the target's there (R_d, V), the trajectory (R_d,) and
    lane (R_d,) of each row), the draft vocabulary's target ids when `full` and there is one): `terms`'s unrolling
    for a group, padded, and its laws on the rows that have a depth-d term only (lane k of trajectory b at depth d
    predicts row a_b + d + k), so no vocabulary-wide work is spent on padding. full=False (training) computes both
    laws on the draft vocabulary only, all the loss reads, from the loss's first row; full=True (evaluation) on the
    whole vocabulary, from the first generated row."""
    from specsim.record.head_unroll import unroll_batch

    dev = next(module.parameters()).device
    lm_head, embed = target.model.get_output_embeddings(), target.model.get_input_embeddings()
    g = _Group.of(seqs, config, dev, generated=full)
    j, N = g.j, g.n
    starts = g.a[:, None] + torch.minimum(j[None], g.lanes[:, None] - 1)  # padding lanes repeat the last start
    m_host, a_host = g.lengths[0].tolist(), g.lengths[1].tolist()
    feats = unroll_batch(lambda *args, from_target: module(*args, embed, from_target=from_target),
                         _pad([s.features[:n].to(dev) for s, n in zip(seqs, m_host)], g.ids.shape[1]), g.ids,
                         g.m, starts, min(config.ttt_steps, N), g.first)
    # the target's laws at rows a+1..m of each trajectory (lane k: row a+1+k), once, on its lanes only, as `terms`
    h = torch.cat([x[a + 1 : m + 1] for x, a, m in zip(g.hidden, a_host, m_host)])  # (R_1, H)
    offset = torch.cumsum(g.lanes, 0) - g.lanes  # trajectory b's first row in h
    vocab = None if config.kind == "mtp" or module.d2t is None else \
        torch.arange(len(module.d2t), device=dev) + module.d2t
    restrict = vocab is not None and not full
    with _teacher(h):
        p_all = torch.nn.functional.linear(h, _draft_rows(module, lm_head, vocab)) if restrict else lm_head(h)
    laws = []
    for d, (f, (b, k)) in enumerate(zip(feats, g.depth_rows(len(feats))), start=1):
        f = f[b, k]  # (R_d, H): depth d's rows
        q = (module.logits(f, lm_head) if config.kind == "mtp" else module.draft_logits(f) if restrict
             else module.logits(f, int(target.vocab_size)))
        laws.append((q, p_all[offset[b] + k + d - 1], b, k))
    return g, laws, vocab if full else None


def _group_losses(laws: list, config: TrainConfig, vocab: torch.Tensor | None, trajectories: int) -> torch.Tensor:
    """(B,) each trajectory's `loss` from `_group_laws`'s laws: its cross-entropies (over the ids `vocab` only, when
    given) averaged over its own rows, its depths weighted over its own (one shorter than d has no depth d)."""
    total = weights = 0.0
    for d, (q, p, b, _) in enumerate(laws, start=1):
        if vocab is not None:
            q, p = q[..., vocab], p[..., vocab]
        ce = _ce_rows(q, p)  # (R_d,)
        count = torch.zeros(trajectories, dtype=b.dtype, device=b.device).index_add_(0, b, torch.ones_like(b))
        has = count > 0
        w = config.ttt_decay ** (d - 1)
        total = total + torch.where(has, w * ce.new_zeros(trajectories).index_add(0, b, ce) / count.clamp(min=1),
                                    0.0)
        weights = weights + has * w
    return total / weights


def _eagle_group_loss(module, target, seqs: list[TrainSequence], config: TrainConfig) -> torch.Tensor:
    """Σ over `seqs` of each one's EAGLE loss (`terms`, `loss`), computed together: the layer teacher-forced over
    the padded trajectories at once, each one's feature regression and token loss averaged over its own rows."""
    from specsim.record.head_unroll import causal_masks

    dev = next(module.parameters()).device
    lm_head, embed = target.model.get_output_embeddings(), target.model.get_input_embeddings()
    g = _Group.of(seqs, config, dev)
    j = g.j
    B, M = g.ids.shape
    feats, _ = module(_pad([h[:n] for h, n in zip(g.hidden, g.lengths[0].tolist())], M), g.ids,
                      torch.arange(M, device=dev)[None] + g.first[:, None], causal_masks(B, M, dev), None, embed)
    rows = torch.minimum(g.a[:, None] + j[None], g.m[:, None] - 1)  # lane k: the prediction from row a+k
    pred = torch.gather(feats, 1, rows[..., None].expand(-1, -1, feats.shape[-1]))  # (B, N, H): ĥ_{t+1}
    h = g.states(rows + 1)  # (B, N, H): h_{t+1}
    with _teacher(h):
        p_logits = lm_head(h)
    live = j[None] < g.lanes[:, None]
    count = live.sum(1)
    regression = (torch.nn.functional.smooth_l1_loss(pred, h, reduction="none").sum(-1) * live).sum(1)
    ce = (_ce_rows(lm_head(pred), p_logits) * live).sum(1)
    return (regression / (count * h.shape[-1]) + config.eagle_token_weight * ce / count).sum()


def _draft_rows(module, lm_head, vocab: torch.Tensor) -> torch.Tensor:
    """The target's LM head rows for the draft vocabulary `vocab`, gathered once and kept on `module` as a plain
    attribute (not a parameter or buffer: never saved). Gathering 16,384 of SmolLM2's 49,152 rows at every depth of
    every trajectory took a quarter of a float32 EAGLE-3 training step (analyses/results/amx-cpu-2026-11-26). `vocab`
    is the one `module.d2t` gives; the rows are kept while neither that mapping nor the LM head changes (the same
    tensors, not modified in place since: their `_version`), which is known without reading either back."""
    key = (lm_head.weight, lm_head.weight._version, module.d2t, module.d2t._version)
    cached = getattr(module, "_draft_rows_cache", None)
    if cached is None or any(x is not y if isinstance(x, torch.Tensor) else x != y for x, y in zip(cached[0], key)):
        with torch.no_grad():
            cached = (key, lm_head.weight[vocab])
        module.__dict__["_draft_rows_cache"] = cached
    return cached[1]


@contextlib.contextmanager
def _teacher(x: torch.Tensor):
    """Where the target's own laws are computed: no gradient, and float32 even inside a bfloat16 training step
    (`TrainConfig.precision`): the head's arithmetic may be approximate, what it is fitted to is not."""
    with torch.no_grad(), torch.autocast(device_type=x.device.type, enabled=False):
        yield


def _no_grad(f, x):
    with _teacher(x):
        return f(x)


def loss(t: Terms, config: "TrainConfig") -> torch.Tensor:
    """Medusa: the mean over heads of CE(p, q). EAGLE: SmoothL1 on the features + the token loss's weight × CE.
    EAGLE-3: Σ_d decay^(d-1) CE(p, q_d) / Σ_d decay^(d-1), over the draft vocabulary; MTP the same over all."""
    if config.kind in ("eagle3", "mtp"):
        weights = [config.ttt_decay ** d for d in range(len(t.depths))]
        return sum(w * _soft_ce(q, p, t.vocab) for w, (q, p, _) in zip(weights, t.depths)) / sum(weights)
    if t.regression is None:
        return sum(_soft_ce(q, p) for q, p, _ in t.depths) / max(1, len(t.depths))
    q, p_logits, _ = t.depths[0]
    return torch.nn.functional.smooth_l1_loss(*t.regression) + config.eagle_token_weight * _soft_ce(q, p_logits)


@torch.no_grad()
def evaluate(kind, module, target, seqs, config: TrainConfig, *, together: bool | None = None) -> dict:
    """Held-out loss, top-1 agreement with the target's token and overlap Σ min(p, q) (a one-token draft's
    acceptance at T = 1) per depth (Medusa: head k; EAGLE: depth 1, teacher-forced; EAGLE-3: depths 1..ttt_steps
    on its own features, the target's tokens fed), on the generated tokens: what a head drafts.

    together: EAGLE-3 and MTP heads whose steps run together (`batches_together`) evaluated `config.batch`
    trajectories at a time too (the same numbers up to float32 rounding; tests/test_train_batch.py). By default
    (None) on a GPU only, where one trajectory at a time is launch-bound as the training steps were; on a CPU one at
    a time is faster (86 held-out trajectories: 27-30 s against 35-36 s,
    analyses/results/eagle3-data-curve-cpu-2026-11-27/eval_timing.txt)."""
    if together is None:
        together = next(module.parameters()).device.type != "cpu"
    losses, hits, counts, overlap = [], {}, {}, {}

    def tally(d, q, p_logits, y):
        hits[d] = hits.get(d, 0) + int((q.argmax(-1) == y).sum())
        counts[d] = counts.get(d, 0) + int(y.numel())
        both = torch.minimum(torch.softmax(q.float(), -1), torch.softmax(p_logits.float(), -1))
        overlap[d] = overlap.get(d, 0.0) + float(both.sum())

    if together and kind in ("eagle3", "mtp") and batches_together(config, module):
        for group in _groups(list(seqs), max(1, config.batch)):
            g, laws, vocab = _group_laws(module, target, group, config, full=True)
            losses += _group_losses(laws, config, vocab, len(group)).tolist()
            tokens = _pad([s.tokens.to(g.m.device) for s in group], int(g.lengths[0].max()) + 1)
            for d, (q, p_logits, b, k) in enumerate(laws, start=1):  # lane k at depth d predicts row a + d + k
                tally(d, q, p_logits, tokens[b, g.a[b] + d + k])
    else:
        for seq in seqs:
            t = terms(kind, module, target, seq, config.ttt_steps)
            losses.append(float(loss(t, config)))
            for d, (q, p_logits, y) in enumerate(t.depths, start=1):
                tally(d, q, p_logits, y)
    return {"loss": float(np.mean(losses)), "top1": {d: hits[d] / counts[d] for d in sorted(counts)},
            "overlap": {d: overlap[d] / counts[d] for d in sorted(counts)}}

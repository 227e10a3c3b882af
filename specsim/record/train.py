"""Training head drafts from a cache: self-distillation on the target's own trajectories.

A cache recorded with `--hidden-states last` holds, along every target-sampled trajectory,
the target's final hidden state h_t (the LM head's input that gave p_t). That is all a head
needs: the target's distribution anywhere on the path is softmax(lm_head(h)), so the loss
is against the target's whole next-token law (self-distillation, as Medusa-2 and EAGLE
recommend for matching the deployed distribution), not only its sampled token.

* Medusa (Cai et al. 2024): head k at h_t predicts y_{t+1+k}; loss Σ_k CE(p_{t+1+k}, q_k), with
  the heads' ResBlocks trained and the LM head the target's (frozen, shared).
* EAGLE (Li et al. 2024): the layer reads (h_t, embed(y_t)) and predicts h_{t+1}; loss =
  SmoothL1(ĥ_{t+1}, h_{t+1}) + 0.1 · CE(p_{t+1}, softmax(lm_head(ĥ_{t+1}))) — EAGLE's
  feature-regression and token losses with its weights (v_w = 1, p_w = 0.1). Teacher-forced,
  causal.
* EAGLE-3 (Li et al. 2025; speculators' `Eagle3DraftModel.forward`, SpecForge's online
  trainer): the layer reads the target's fused low/middle/high states (the cache must hold
  them: `--hidden-states last,K1,K2,K3`) and is trained with training-time test: unrolled
  `ttt_steps` deep on its own features (`specsim.record.head_unroll.unroll`, the same unrolling
  the recorder replays), the target's tokens fed at each step; loss = Σ_d decay^(d-1) ·
  CE(p_{t+d}, q_d), no feature regression. Its LM head is the target's rows for the draft
  vocabulary (frozen, as speculators freezes it); with `draft_vocab` > 0 the draft vocabulary
  is the most frequent tokens of the training trajectories (speculators' `vocab_mapping`)
  and p is renormalised over it in the loss.
* MTP (DeepSeek-V3 §2.2; speculators' `MTPDraftModel`, FastMTP's step weights): the module
  reads the target's state ("last", or "prenorm" for MiMo's wiring: the cache must hold it)
  and is trained unrolled like EAGLE-3 — `ttt_steps` deep, the same layer at every depth fed
  its own previous state and the target's token, as vLLM chains it — with loss Σ_d
  decay^(d-1) · CE(p_{t+d}, q_d) (speculators' default decay 0.6); the LM head is the target's
  (frozen), the final norm starts from the target's. On a DeepSeek-V3 target the layer's block
  is the target's kind, experts included, and each router's correction bias is moved by
  DeepSeek-V3's load-balancing rule after every step, not by gradient (`RouterBalance`).

The prompt is the heads' context, as it is when they draft: a head drafting a call attends over
the target's states at every earlier position, the prompt's included (`HeadDraft.start_logits`),
and EAGLE-3's and SpecForge's trainers run the whole conversation through the head with the loss
masked to the assistant's response (SpecForge 0.2's `specforge/data/preprocessing.py`,
`preprocess_conversations`, copied from EAGLE's `traineagle3/cnets.py`: loss_mask 1 on the
assistant spans only). A cache stores states at generated positions only, so the prompt's are
computed here by the target (one forward per prompt), rounded to float16 as the cache rounds the
rest. `prompt` (PROMPT_USES) chooses: "context" (the default; the loss on generated tokens only),
"loss" (the prompt's tokens are predicted too: the target's laws on text it did not write, more
positions per recording), "none" (the generated part alone, the head blind to the prompt: how
heads were trained before, kept to measure the difference).

`precision` (TRAIN_PRECISIONS) "bfloat16" runs the training steps under torch.autocast: the head's
matrix products in bfloat16, as EAGLE-3 heads are trained on GPUs (SpecForge, speculators), with
the weights, AdamW's state and the loss's softmaxes in float32 and the target's laws (the
teacher) computed in float32 (`_teacher`). Held-out numbers are float32 either way.

`lr_schedule` (LR_SCHEDULES) "cosine", the default, is the optimiser SpecForge trains EAGLE-3 with (its
`BF16Optimizer`: CosineAnnealingWarmupLR with warmup_ratio 0.015, max_grad_norm 0.5, "defaults copied from EAGLE
traineagle3"): the rate ramps up over the first 1.5% of the steps, decays along half a cosine to zero by the last, and
the gradient's norm is clipped at 0.5. "constant" keeps `lr` throughout, unclipped, as heads were trained before.

A step's EAGLE, EAGLE-3 and MTP trajectories run together (`batch_loss`): sorted by length, padded in groups whose
padding stays under PAD_SHARE, one forward per depth per group (`unroll_batch`), each trajectory's loss still
averaged over its own rows. It is the per-trajectory loss up to float32 rounding; one trajectory at a time a step
is hundreds of small kernels, launch-bound on a GPU (16 trajectories: 0.28-0.37 s per step on an H200 against 0.055
batched). MTP layers with experts still run one at a time (their routers would count the padding), and so do Medusa's
heads.

Prompts are split into training and held-out sets by index (every k-th prompt held out), so
the held-out numbers are on prompts the heads never saw. Checkpoints go to `--out` every
`save_every` steps and at the end; a Ctrl-C saves the last one and stops.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection

import numpy as np
import torch

from specsim.errors import CacheError, ModelError
from specsim.specs import HEAD_KINDS, LR_SCHEDULES, PROMPT_USES, TRAIN_PRECISIONS


CURVE_HELDOUT = 24  # held-out trajectories the training curve evaluates at each checkpoint (all of them at the end)
WARMUP_SHARE = 0.015  # "cosine": the share of the steps spent warming up (SpecForge's warmup_ratio)
CLIP_NORM = 0.5  # "cosine": the gradient's norm is clipped to this (SpecForge's max_grad_norm)
PAD_SHARE = 1.5  # batched steps: a group's padded entries are at most this times its trajectories' own
GROUP_CELLS = 1 << 25  # batched steps: a group's trajectories x (its longest's entries)^2 at most this, which bounds
#                        the teacher-forced pass's attention scores (SmolLM2's 9 heads: 1.2 GB in float32)


@dataclass(frozen=True)
class TrainConfig:
    kind: str  # "medusa" | "eagle" | "eagle3" | "mtp"
    heads: int = 4  # Medusa: heads (the deepest depth drafted); EAGLE drafts autoregressively: unused
    steps: int = 300  # optimiser steps (one trajectory batch each)
    lr: float = 1e-3  # AdamW learning rate (the peak rate under the "cosine" schedule)
    lr_schedule: str = "cosine"  # the rate over the steps, and whether gradients are clipped (LR_SCHEDULES)
    batch: int = 4  # trajectories per step
    holdout_every: int = 5  # every k-th prompt is held out (k >= 2)
    train_prompts: int = 0  # train on this many of the training prompts, a random subset by the seed (0: all); the
    #                         held-out prompts stay the same, and a smaller subset is part of a larger (`subset`)
    save_every: int = 100  # checkpoint every this many steps
    seed: int = 0  # initialisation and batch order
    eagle_token_weight: float = 0.1  # EAGLE's p_w: the token loss's weight beside feature regression
    ttt_steps: int = 4  # EAGLE-3: training-time test depth (the deepest draft trained on its own features)
    ttt_decay: float = 1.0  # EAGLE-3, MTP: step d's loss weight is decay^(d - 1) (speculators' ttt_step_loss_decay;
    #                         its MTP step weights use 0.6)
    aux_layers: tuple = ()  # EAGLE-3: the target layers fused (default: the target's low, middle and high)
    draft_vocab: int = 0  # EAGLE-3: draft vocabulary size (0: the target's whole vocabulary)
    mtp_style: str = "deepseek"  # MTP: one of `specs.MTP_STYLES`
    prompt: str = "context"  # what the prompt is to the training (PROMPT_USES)
    precision: str = "float32"  # the training steps' arithmetic (specs.TRAIN_PRECISIONS); evaluation is float32
    router_bias_speed: float = 0.001  # DeepSeek-V3 MTP blocks: the routers' correction-bias step γ (RouterBalance)
    batched: bool = True  # EAGLE, EAGLE-3, MTP without experts: a step's trajectories run together (`batch_loss`);
    #                       False: one at a time, as before (the benchmark's baseline; the same loss)


@dataclass
class TrainOutcome:
    steps: int  # steps taken
    seconds: float  # wall time of the training loop
    positions: int  # training positions
    heldout_positions: int
    before: dict = field(default_factory=dict)  # held-out loss and per-depth top-1 agreement, untrained
    after: dict = field(default_factory=dict)  # the same, trained
    curve: list = field(default_factory=list)  # per checkpoint: step, mean training loss since, the learning rate of
    #                                            its last step, held-out numbers on the first CURVE_HELDOUT held-out
    #                                            trajectories
    interrupted: bool = False


class RouterBalance:
    """DeepSeek-V3's auxiliary-loss-free load balancing (DeepSeek-V3 Technical Report, arXiv 2412.19437, §2.1.2).

    A router's correction bias b_i is added to expert i's score only to choose the top-k experts (not to weight
    them), and it is not trained by gradient: at the end of each training step every bias moves by γ toward
    balance, b_i <- b_i + γ sign(mean load - load_i), the loads being how many of the step's tokens chose each
    expert. DeepSeek-V3 trained with γ = 0.001 (0 for its last 500B tokens). Counts only in training mode (the
    held-out evaluation routes tokens too). Works on any module holding transformers' DeepSeek-V3 routers
    (`e_score_correction_bias`, forward -> (logits, weights, indices)); no router: nothing to do."""

    def __init__(self, module: torch.nn.Module, speed: float):
        self.speed = float(speed)
        self.routers = [m for m in module.modules()
                        if isinstance(getattr(m, "e_score_correction_bias", None), torch.Tensor)]
        self.loads = [torch.zeros_like(r.e_score_correction_bias) for r in self.routers]
        self.hooks = [r.register_forward_hook(self._count(i)) for i, r in enumerate(self.routers)]

    def _count(self, i: int):
        def hook(router, inputs, output):
            if router.training:
                indices = output[2].reshape(-1)
                self.loads[i] += torch.bincount(indices, minlength=self.loads[i].numel()).to(self.loads[i])
        return hook

    def step(self) -> None:
        """Move every bias by γ toward balance on the loads counted since the last step, and reset them."""
        with torch.no_grad():
            for router, load in zip(self.routers, self.loads):
                if self.speed and load.sum() > 0:
                    router.e_score_correction_bias += self.speed * torch.sign(load.mean() - load)
                load.zero_()

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()


@dataclass(frozen=True)
class TrainSequence:
    """One trajectory's training data."""

    hidden: torch.Tensor  # (n, H) float32: row r is the state at input position start + r, which gave p for tokens[r]
    tokens: torch.Tensor  # (n,) int64: the token after row r's position
    start: int  # input position of row 0: 0 with the prompt's rows, else the prompt length - 1
    features: torch.Tensor | None = None  # (n, F) EAGLE-3, MTP: the states the head reads, side by side
    context: int = 0  # leading rows that are the prompt's (prompt length - 1, or 0): not the target's own output

    def loss_from(self, config: "TrainConfig") -> int:
        """The first row a training step's loss covers: the generated part's, or row 0 with `prompt` "loss"."""
        return 0 if config.prompt == "loss" else self.context


def load_sequences(cache, target, layers: tuple[str, ...] = (), prompt: str = "context", *,
                   prompts: Collection[int] | None = None, progress: bool = False) -> list[tuple[int, TrainSequence]]:
    """(prompt index, trajectory) of every trajectory of 2+ tokens in a cache with hidden states (of the prompts
    `prompts` only, when given), checked against `target`; `layers` (the head's: EAGLE-3's fused layers, MTP's
    state) are read side by side into `features`. Unless `prompt` is "none", each trajectory is preceded by its
    prompt's states, computed by `target` (`context` rows)."""
    from tqdm.auto import tqdm

    from specsim.cache.reader import CacheReader
    from specsim.record.head_unroll import target_hidden

    if prompt not in PROMPT_USES:
        raise ModelError(f"--prompt {prompt!r}: one of {', '.join(PROMPT_USES)}")
    with CacheReader(cache) as reader:
        want = tuple(dict.fromkeys(("last", *layers)))
        missing = [k for k in want if k not in reader.spec.hidden]
        if missing:
            raise CacheError(f"{reader.path} has no hidden states {','.join(missing)} to train on (it holds "
                             f"{','.join(reader.spec.hidden) or 'none'}); record it with `specsim cache ... "
                             f"--hidden-states {','.join(want)}`")
        sha = reader.run.tokenizer_sha256
        if sha and sha != target.info.get("tokenizer_sha256"):
            raise ModelError(f"{reader.path} was recorded with target {reader.run.setting('target')!r} "
                             f"(another tokenizer); --target {target.name} is not that model")
        H = int(target.model.config.hidden_size)
        if reader.spec.hidden_size != H:
            raise ModelError(f"{reader.path} stores hidden states of width {reader.spec.hidden_size}; --target "
                             f"{target.name} has hidden size {H}")
        rows = [row for row in reader.iter_trajectories()
                if row.length >= 2 and (prompts is None or row.prompt_index in prompts)]
        ids = {i: reader.prompt_token_ids(i).astype(np.int64) for i in sorted({row.prompt_index for row in rows})}
        context = {}  # prompt index -> {layer: (prompt length - 1, H) float32}, rounded as the cache rounds states
        if prompt != "none":
            device = target.info.get("device", "cpu")
            for i in tqdm(ids, desc="prompt states", unit="prompt", disable=not progress, dynamic_ncols=True):
                if len(ids[i]) >= 2:
                    states = target_hidden(target, torch.as_tensor(ids[i], device=device), want)
                    context[i] = {k: v.half().float().cpu() for k, v in states.items()}

        def sequence(row) -> TrainSequence:
            prompt_ids, before = ids[row.prompt_index], context.get(row.prompt_index)
            states = {k: torch.as_tensor(reader.hidden(k, row.start, row.stop).astype(np.float32)) for k in want}
            tokens = torch.as_tensor(reader.tokens(row.start, row.stop).astype(np.int64))
            if before is not None:
                states = {k: torch.cat([before[k], v]) for k, v in states.items()}
                tokens = torch.cat([torch.as_tensor(prompt_ids[1:]), tokens])
            rows_before = 0 if before is None else len(prompt_ids) - 1  # the prompt's rows, when given
            return TrainSequence(hidden=states["last"], tokens=tokens, start=len(prompt_ids) - 1 - rows_before,
                                 features=torch.cat([states[k] for k in layers], dim=1) if layers else None,
                                 context=rows_before)

        return [(row.prompt_index, sequence(row)) for row in rows]


def recorded_prompts(cache) -> list[int]:
    """The prompt indices of a cache's trajectories of 2+ tokens (what `load_sequences` loads), ascending."""
    from specsim.cache.reader import CacheReader

    with CacheReader(cache) as reader:
        return sorted({row.prompt_index for row in reader.iter_trajectories() if row.length >= 2})


def held_out(prompt: int, every: int) -> bool:
    """Whether prompt index `prompt` is held out from training: every `every`-th is."""
    return prompt % every == every - 1


def split(seqs, every: int, keep: Collection[int]) -> tuple[list[TrainSequence], list[TrainSequence]]:
    """(training, held-out): every `every`-th prompt is held out; the training trajectories are those of the prompts
    `keep` (`subset`)."""
    train = [s for i, s in seqs if i in keep]
    held = [s for i, s in seqs if held_out(i, every)]
    if not train or not held:
        raise CacheError(f"{len(seqs)} trajectories cannot be split 1 in {every} into training and held-out prompts; "
                         "record more prompts")
    return train, held


def subset(recorded: Collection[int], every: int, prompts: int = 0, seed: int = 0) -> set[int]:
    """The training prompts of the prompt indices `recorded` (those not held out, every `every`-th): all of them, or
    `prompts` of them drawn by `seed`, the first of one permutation, so a smaller subset is part of a larger one and
    a data-scaling curve's points add data to one another (the held-out prompts are the same whatever `prompts`)."""
    pool = sorted(i for i in set(recorded) if not held_out(i, every))
    if not prompts:
        return set(pool)
    if prompts > len(pool):
        raise CacheError(f"--train-prompts {prompts}: the cache has {len(pool)} training prompts (1 in {every} held "
                         "out)")
    order = np.random.default_rng([seed, 1]).permutation(len(pool))
    return {pool[k] for k in order[:prompts]}


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


@dataclass(frozen=True)
class _Group:
    """A group's trajectories on the head's device, laid out for one padded forward."""

    hidden: list  # each trajectory's states (n_b, H)
    m: torch.Tensor  # (B,) entries: the rows that predict (the last row predicts nothing)
    a: torch.Tensor  # (B,) the first row the loss covers
    lanes: torch.Tensor  # (B,) predictions (starts) per trajectory: rows a..m-1
    ids: torch.Tensor  # (B, M) each trajectory's tokens at its entries, padded after them
    first: torch.Tensor  # (B,) position id of entry 0

    @property
    def j(self) -> torch.Tensor:
        """(N,) lane indices, N the most lanes of any trajectory."""
        return torch.arange(int(self.lanes.max()), device=self.m.device)

    @staticmethod
    def of(seqs: list[TrainSequence], config: TrainConfig, dev, *, generated: bool = False) -> "_Group":
        """generated: the starts are the generated rows (held-out evaluation), not the loss's (`loss_from`)."""
        m = torch.tensor([s.hidden.shape[0] - 1 for s in seqs], device=dev)
        a = torch.tensor([s.context if generated else s.loss_from(config) for s in seqs], device=dev)
        return _Group(hidden=[s.hidden.to(dev) for s in seqs], m=m, a=a, lanes=m - a,
                      ids=_pad([s.tokens[: int(n)].to(dev) for s, n in zip(seqs, m)], int(m.max())),
                      first=torch.tensor([s.start for s in seqs], device=dev))

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
    j = g.j
    N = len(j)
    starts = g.a[:, None] + torch.minimum(j[None], g.lanes[:, None] - 1)  # padding lanes repeat the last start
    feats = unroll_batch(lambda *args, from_target: module(*args, embed, from_target=from_target),
                         _pad([s.features[: int(n)].to(dev) for s, n in zip(seqs, g.m)], g.ids.shape[1]), g.ids,
                         g.m, starts, min(config.ttt_steps, N), g.first)
    # the target's laws at rows a+1..m of each trajectory (lane k: row a+1+k), once, on its lanes only, as `terms`
    live = j[None] < g.lanes[:, None]
    h = g.states(torch.minimum(g.a[:, None] + 1 + j[None], g.m[:, None]))[live]  # (R_1, H)
    offset = torch.cumsum(g.lanes, 0) - g.lanes  # trajectory b's first row in h
    vocab = None if config.kind == "mtp" or module.d2t is None else \
        torch.arange(len(module.d2t), device=dev) + module.d2t
    restrict = vocab is not None and not full
    with _teacher(h):
        p_all = torch.nn.functional.linear(h, _draft_rows(module, lm_head, vocab)) if restrict else lm_head(h)
    laws = []
    for d, f in enumerate(feats, start=1):
        b, k = (j[None, : N - d + 1] < (g.lanes - d + 1)[:, None]).nonzero(as_tuple=True)  # depth d's rows
        f = f[b, k]  # (R_d, H)
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
        count = torch.bincount(b, minlength=trajectories)
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
    feats, _ = module(_pad([h[: int(n)] for h, n in zip(g.hidden, g.m)], M), g.ids,
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
    every trajectory took a quarter of a float32 EAGLE-3 training step (analyses/results/amx-cpu-2026-11-26)."""
    cached = getattr(module, "_draft_rows_cache", None)
    if cached is None or cached[0] is not lm_head.weight or not torch.equal(cached[1], vocab):
        with torch.no_grad():
            cached = (lm_head.weight, vocab.clone(), lm_head.weight[vocab])
        module.__dict__["_draft_rows_cache"] = cached
    return cached[2]


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
            tokens = _pad([s.tokens.to(g.m.device) for s in group], int(g.m.max()) + 1)
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


def draft_vocabulary(seqs: list[TrainSequence], size: int, vocab: int, config: "TrainConfig") -> np.ndarray:
    """The `size` most frequent tokens the loss covers in the training trajectories, ascending (ties: the lower
    id), as speculators' `build_vocab_mappings_from_distribution` picks an EAGLE-3 draft vocabulary."""
    if not 0 < size <= vocab:
        raise ModelError(f"--draft-vocab {size}: give 1..{vocab:,} (the target's vocabulary), or 0 for all of it")
    counts = np.bincount(np.concatenate([s.tokens[s.loss_from(config):].numpy() for s in seqs]), minlength=vocab)
    order = np.lexsort((np.arange(vocab), -counts))  # by count, descending; then by id
    return np.sort(order[:size])


def schedule(optimiser: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LRScheduler:
    """The learning rate over `config.steps` (`config.lr_schedule`). "cosine" is SpecForge's CosineAnnealingWarmupLR:
    step i of the first w = WARMUP_SHARE · steps runs at lr · (i + 1) / w, then lr · (1 + cos(π (i - w) / (steps -
    w))) / 2."""
    from torch.optim.lr_scheduler import ConstantLR, CosineAnnealingLR, LinearLR, SequentialLR

    if config.lr_schedule == "constant":
        return ConstantLR(optimiser, factor=1.0, total_iters=0)
    warmup = int(WARMUP_SHARE * config.steps)
    cosine = CosineAnnealingLR(optimiser, T_max=max(1, config.steps - warmup))
    if not warmup:
        return cosine
    # ramp step i at (i + 1) / w of the rate; one step of warm-up (w = 1) is one step at the full rate
    ramp = LinearLR(optimiser, start_factor=1 / warmup, end_factor=1.0, total_iters=max(1, warmup - 1))
    return SequentialLR(optimiser, [ramp, cosine], milestones=[warmup])


def train(cache, target, out: Path, config: TrainConfig, *, progress: bool = True,
          echo: Callable[[str], None] = lambda line: None) -> TrainOutcome:
    """Train `config.kind` heads for `target` on `cache`'s hidden states and save them in `out`."""
    from tqdm.auto import tqdm

    from specsim.cache.provenance import trained_on
    from specsim.cache.reader import CacheReader
    from specsim.record.head_checkpoints import build, default_aux_layers, head_config_for, save_heads

    if config.kind not in HEAD_KINDS:
        raise ModelError(f"--kind {config.kind!r}: one of {', '.join(HEAD_KINDS)}")
    if config.precision not in TRAIN_PRECISIONS:
        raise ModelError(f"--precision {config.precision!r}: one of {', '.join(TRAIN_PRECISIONS)}")
    if config.lr_schedule not in LR_SCHEDULES:
        raise ModelError(f"--lr-schedule {config.lr_schedule!r}: one of {', '.join(LR_SCHEDULES)}")
    torch.manual_seed(config.seed)
    aux = (tuple(config.aux_layers) or default_aux_layers(int(target.model.config.num_hidden_layers))
           if config.kind == "eagle3" else ())
    head_config = head_config_for(config.kind, target, heads=config.heads, aux_layers=aux, mtp_style=config.mtp_style)
    blind = config.kind == "medusa" and config.prompt == "context"  # Medusa attends to nothing: no context to give
    recorded, every = recorded_prompts(cache), config.holdout_every
    keep = subset(recorded, every, config.train_prompts, config.seed)
    seqs = load_sequences(cache, target, head_config.hidden_layers if config.kind in ("eagle3", "mtp") else (),
                          "none" if blind else config.prompt, progress=progress,
                          prompts=keep | {i for i in recorded if held_out(i, every)})
    train_seqs, held = split(seqs, every, keep)
    with CacheReader(cache) as reader:  # which prompts it saw: simulate, validate and report say when it meets them
        seen = trained_on(reader, keep)
    draft_ids = (draft_vocabulary(train_seqs, config.draft_vocab, int(target.vocab_size), config)
                 if config.draft_vocab else None)
    if draft_ids is not None:
        head_config = head_config_for(config.kind, target, heads=config.heads, aux_layers=aux,
                                      draft_vocab_size=len(draft_ids))
    module = build(head_config).to(target.info["device"])
    if config.kind in ("eagle", "eagle3", "mtp"):  # EAGLE's init: small weights, the layer starts near its residual path
        for name, param in module.named_parameters():
            if param.dim() >= 2:  # matrices, and a mixture's stacked experts
                torch.nn.init.normal_(param, std=0.02)
    if config.kind == "mtp":  # its final norm feeds the target's LM head: start from the target's
        with torch.no_grad():
            module.norm.weight.copy_(getattr(target.model, target.model.base_model_prefix).norm.weight)
    if config.kind == "eagle3":  # the target's LM head rows for the draft vocabulary, frozen (as speculators')
        lm = target.model.get_output_embeddings().weight.detach()
        with torch.no_grad():
            if draft_ids is None:
                module.lm_head.weight.copy_(lm)
            else:
                ids = torch.as_tensor(draft_ids, device=lm.device)
                module.lm_head.weight.copy_(lm[ids])
                module.d2t.copy_(ids - torch.arange(len(ids), device=lm.device))
        module.lm_head.weight.requires_grad_(False)
    for p in target.model.parameters():
        p.requires_grad_(False)
    n_train = sum(int(s.tokens.shape[0]) - s.loss_from(config) for s in train_seqs)
    n_held = sum(int(s.tokens.shape[0]) - s.context for s in held)
    echo(f"training {config.kind} heads for {target.name} on {len(train_seqs)} trajectories ({n_train} positions"
         + (f"; {config.train_prompts} of the training prompts, drawn by the seed" if config.train_prompts else "")
         + f"{', prompts included' if config.prompt == 'loss' else ''}); held out: {len(held)} ({n_held} generated "
         f"positions, every {config.holdout_every}th prompt); the prompt: {config.prompt} "
         f"({PROMPT_USES[config.prompt]}); arithmetic: {config.precision}; learning rate: {config.lr_schedule}, "
         f"peak {config.lr:g}")
    outcome = TrainOutcome(steps=0, seconds=0.0, positions=n_train, heldout_positions=n_held)
    module.eval()
    outcome.before = evaluate(config.kind, module, target, held, config)
    trained = [p for p in module.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trained, lr=config.lr)
    rates = schedule(optimiser, config)
    rng = np.random.default_rng(config.seed)
    probe = held[:CURVE_HELDOUT]  # the held-out trajectories the training curve is measured on

    def extra() -> dict:
        """The checkpoint's training record; its `heldout` is this checkpoint's own evaluation: all held-out
        trajectories after the last step, the curve's probe at a checkpoint, the untrained head's before step 1."""
        heldout = outcome.after if outcome.after else next(
            (c["heldout"] for c in outcome.curve[-1:] if c["step"] == outcome.steps),
            outcome.before if outcome.steps == 0 else None)
        return {"training": {"cache": str(cache), "steps": outcome.steps, "config": config.__dict__,
                             "positions": n_train, "heldout": heldout,
                             "heldout_trajectories": len(held) if outcome.after else len(probe),
                             "curve": outcome.curve, "trained_on": seen}}

    losses: list[float] = []
    # bfloat16: autocast's matrix products; the loss's softmaxes are taken in float32 (_soft_ce) and the weights
    # and AdamW's state stay float32 (no loss scaling: bfloat16 has float32's exponent range)
    autocast = torch.autocast(device_type=torch.device(target.info["device"]).type, dtype=torch.bfloat16,
                              enabled=config.precision == "bfloat16")
    balance = RouterBalance(module, config.router_bias_speed)
    together = batches_together(config, module)
    rate = config.lr  # the learning rate of the last step taken
    started = time.perf_counter()
    bar = tqdm(total=config.steps, unit="step", desc=f"train {config.kind}", disable=not progress, dynamic_ncols=True)
    try:
        module.train()
        for step in range(config.steps):
            batch = rng.choice(len(train_seqs), size=min(config.batch, len(train_seqs)), replace=False)
            optimiser.zero_grad()
            with autocast:
                if together:
                    total = batch_loss(module, target, [train_seqs[i] for i in batch], config)
                else:
                    total = sum(loss(terms(config.kind, module, target, train_seqs[i], config.ttt_steps, full=False,
                                           loss_from=train_seqs[i].loss_from(config)), config)
                                for i in batch) / len(batch)
            total.backward()
            if config.lr_schedule == "cosine":
                torch.nn.utils.clip_grad_norm_(trained, CLIP_NORM)
            rate = optimiser.param_groups[0]["lr"]
            optimiser.step()
            rates.step()
            balance.step()
            outcome.steps = step + 1
            losses.append(total.item())
            bar.update()
            bar.set_postfix(loss=f"{total.item():.3f}")
            if (step + 1) % config.save_every == 0 and step + 1 < config.steps:
                module.eval()
                outcome.curve.append({"step": step + 1, "train_loss": float(np.mean(losses[-config.save_every:])),
                                      "lr": rate, "heldout": evaluate(config.kind, module, target, probe, config)})
                module.train()
                save_heads(out, head_config, module, extra())
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        bar.close()
        balance.close()
        outcome.seconds = time.perf_counter() - started
    module.eval()
    if not outcome.interrupted:
        outcome.after = evaluate(config.kind, module, target, held, config)
    elif outcome.steps and not (outcome.curve and outcome.curve[-1]["step"] == outcome.steps):
        # stopped between checkpoints: save the weights first (a second interrupt loses nothing), then measure them
        # on the curve's probe, as a checkpoint is
        save_heads(out, head_config, module, extra())
        since = outcome.steps - (outcome.curve[-1]["step"] if outcome.curve else 0)
        outcome.curve.append({"step": outcome.steps, "train_loss": float(np.mean(losses[-since:])), "lr": rate,
                              "heldout": evaluate(config.kind, module, target, probe, config)})
    save_heads(out, head_config, module, extra())
    return outcome

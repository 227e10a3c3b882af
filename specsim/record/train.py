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

`precision` (TRAIN_PRECISIONS) "bfloat16" runs the training steps under torch.autocast: the head's
matrix products in bfloat16, as EAGLE-3 heads are trained on GPUs (SpecForge, speculators), with
the weights, AdamW's state and the loss's softmaxes in float32 and the target's laws (the
teacher) computed in float32 (`train_loss._teacher`). Held-out numbers are float32 either way.

`lr_schedule` (LR_SCHEDULES) "cosine", the default, is the optimiser SpecForge trains EAGLE-3 with (its
`BF16Optimizer`: CosineAnnealingWarmupLR with warmup_ratio 0.015, max_grad_norm 0.5, "defaults copied from EAGLE
traineagle3"): the rate ramps up over the first 1.5% of the steps, decays along half a cosine to zero by the last, and
the gradient's norm is clipped at 0.5. "constant" keeps `lr` throughout, unclipped, as heads were trained before.

Prompts are split into training and held-out sets by index (every k-th prompt held out), so
the held-out numbers are on prompts the heads never saw. Checkpoints go to `--out` every
`save_every` steps and at the end; a Ctrl-C saves the last one and stops.

The data a run trains on (trajectories, the prompt's states, the held-out split) is
`specsim.record.train_data`; the losses, the batched steps and the held-out evaluation are
`specsim.record.train_loss`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specsim.errors import CacheError, ModelError
from specsim.record.train_data import draft_vocabulary, load_sequences, plan_prompts, to_device
from specsim.record.train_loss import batch_loss, batches_together, evaluate, loss, terms
from specsim.specs import HEAD_KINDS, LR_SCHEDULES, PROMPT_USES, TRAIN_PRECISIONS

CURVE_HELDOUT = 24  # held-out trajectories the training curve evaluates at each checkpoint (all of them at the end)
WARMUP_SHARE = 0.015  # "cosine": the share of the steps spent warming up (SpecForge's warmup_ratio)
CLIP_NORM = 0.5  # "cosine": the gradient's norm is clipped to this (SpecForge's max_grad_norm)
WARMUP_FLOOR = 0.1  # a time-limited warm-up starts at this share of the rate (no step is timed before the first)
EVAL_RESERVE = 1.25  # a time limit keeps this many times the untrained head's held-out evaluation for the final one
SAVE_RESERVE = 2.0  # ... and these seconds to save the head
NO_STEP_CAP = 10**9  # `steps` of a time-limited run given no cap
STATE_FILE = "training_state.pt"  # beside each checkpoint: what `train(resume=True)` continues from


@dataclass(frozen=True)
class TrainConfig:
    kind: str  # "medusa" | "eagle" | "eagle3" | "mtp"
    heads: int = 4  # Medusa: heads (the deepest depth drafted); EAGLE drafts autoregressively: unused
    steps: int = 300  # optimiser steps (one trajectory batch each)
    lr: float = 1e-3  # AdamW learning rate (the peak rate under the "cosine" schedule)
    weight_decay: float = 0.01  # AdamW's decoupled decay (torch's default; EAGLE-3's reference trainer: 0)
    lr_schedule: str = "cosine"  # the rate over the steps, and whether gradients are clipped (LR_SCHEDULES)
    batch: int = 4  # trajectories per step
    holdout_every: int = 5  # every k-th prompt is held out (k >= 2)
    train_prompts: int = 0  # train on this many of the training prompts, a random subset by the seed (0: all); the
    #                         held-out prompts stay the same, and a smaller subset is part of a larger (`subset`)
    train_categories: tuple = ()  # train on the prompts of these categories only (empty: all); held-out unchanged
    save_every: int = 100  # checkpoint every this many steps
    time_limit: float = 0.0  # seconds for the whole run (0: none): the schedule runs over the time left after loading,
    #                          less the final evaluation's (`steps` then caps the steps); see `TimedSchedule`
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


def _clock() -> float:
    return time.perf_counter()


class TimedSchedule:
    """`schedule` over time instead of steps, for a run that must end by a deadline (a lent GPU's minutes): a step
    starting a fraction p of the way from `start` to `end` runs at the rate "cosine" gives that fraction of the steps
    (the warm-up ramps from WARMUP_FLOOR of the rate, the first step being untimed), or the full rate ("constant").
    A LambdaLR reads the clock when it sets the next step's rate."""

    def __init__(self, config: TrainConfig, start: float, end: float, clock: Callable[[], float],
                 reached: float = 0.0) -> None:
        """reached: the fraction an interrupted run had reached; this one runs the rest, from there to the end."""
        self.config, self.start, self.end, self.clock, self.first = config, start, end, clock, reached
        self.last = reached  # the fraction run when the clock was last read (where a resumed run goes on)

    def reached(self) -> float:
        """The fraction of the schedule run by now."""
        done = min(1.0, max(0.0, (self.clock() - self.start) / (self.end - self.start)))
        self.last = self.first + (1 - self.first) * done
        return self.last

    def factor(self, _step: int = 0) -> float:
        p = self.reached()
        if self.config.lr_schedule == "constant":
            return 1.0
        if p < WARMUP_SHARE:
            return max(p / WARMUP_SHARE, WARMUP_FLOOR)
        return 0.5 * (1 + math.cos(math.pi * (p - WARMUP_SHARE) / (1 - WARMUP_SHARE)))

    def over(self) -> bool:
        return self.clock() >= self.end


RESUME_FREE = ("time_limit",)  # the settings a resumed run may change: how long it may take


def _save_state(out: Path, state: dict) -> None:
    """Write a run's state (`STATE_FILE`) beside its checkpoint, atomically (tmp, then rename)."""
    tmp = out / (STATE_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, out / STATE_FILE)


def interrupted_state(out: Path) -> Path:
    """The state file of the run interrupted in `out`; ModelError in one line when `out` holds none (callers check
    it before loading the target, which takes minutes for a large one)."""
    path = Path(out) / STATE_FILE
    if not path.exists():
        raise ModelError.naming("{resume}: {path} holds no interrupted run (no " + STATE_FILE + "; a run that "
                                "finished removes it); drop {resume}", path=str(out))
    return path


def _resumed_state(out: Path, config: TrainConfig, prompts: str, positions: int) -> dict:
    """The state an interrupted run left in `out`, checked against this run's settings, training prompts (their
    fingerprint) and training positions."""
    path = interrupted_state(out)
    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # a damaged file: say so in one line
        raise ModelError.naming("{resume}: {path} is damaged ({why}); drop {resume} to start again",
                                path=str(path), why=f"{type(exc).__name__}: {exc}") from None
    was = state["config"]
    for key, value in config.__dict__.items():
        if key not in RESUME_FREE and was.get(key) != value:
            raise ModelError.naming("{resume}: setting {key} differs: the run in {path} had {was!r}, now {value!r}; "
                                    "rerun with its settings", key=key, path=str(out), was=was.get(key), value=value)
    if bool(was["time_limit"]) != bool(config.time_limit):
        raise ModelError.naming("{resume}: the run in {path} was " + ("" if was["time_limit"] else "not ")
                                + "time-limited; resume it " + ("with" if was["time_limit"] else "without")
                                + " {time_limit}", path=str(out))
    if state["prompts"] != prompts or state["positions"] != positions:
        raise ModelError.naming("{resume}: the caches hold other training data than the run in {path} trained on "
                                "({positions:,} positions then, {now:,} now); give the same caches",
                                path=str(out), positions=state["positions"], now=positions)
    return state


def train(caches, target, out: Path, config: TrainConfig, *, progress: bool = True,
          echo: Callable[[str], None] = lambda line: None, begun: float | None = None,
          resume: bool = False, hidden_batch: int = 0,
          report: Callable[[str, dict], None] = lambda what, result: None) -> TrainOutcome:
    """Train `config.kind` heads for `target` on the hidden states of `caches` (a cache file, or a sequence of them
    trained on together: `plan_prompts` says which prompts of each are held out) and save them in `out`. begun:
    when the run began by `_clock` (`config.time_limit` counts from it; default: now), so a caller's loading
    counts too. Every checkpoint of a run not yet finished leaves its state beside it (`STATE_FILE`: weights,
    optimiser, schedule, random streams); resume=True continues the run interrupted in `out` from there, with the
    same settings and data (a time-limited one runs the rest of its schedule in the new `config.time_limit`): a
    run of `steps` resumed ends with the weights it would have had uninterrupted. hidden_batch > 0: the prompts'
    states from right-padded forwards of up to that many tokens (`load_sequences`). report(what, result): each
    held-out evaluation as it is made ("before": the untrained heads' on every held-out trajectory, "step": a
    curve point), so a long run's curve is seen while it runs; a resumed run reports its earlier ones first."""
    from tqdm.auto import tqdm

    from specsim.cache.provenance import trained_on
    from specsim.record.head_checkpoints import build, default_aux_layers, head_config_for, save_heads

    if config.kind not in HEAD_KINDS:
        raise ModelError(f"--kind {config.kind!r}: one of {', '.join(HEAD_KINDS)}")
    if config.precision not in TRAIN_PRECISIONS:
        raise ModelError(f"--precision {config.precision!r}: one of {', '.join(TRAIN_PRECISIONS)}")
    if config.lr_schedule not in LR_SCHEDULES:
        raise ModelError(f"--lr-schedule {config.lr_schedule!r}: one of {', '.join(LR_SCHEDULES)}")
    begun = _clock() if begun is None else begun
    caches = [caches] if isinstance(caches, (str, os.PathLike)) else list(caches)
    torch.manual_seed(config.seed)
    n_layers = int(target.model.config.num_hidden_layers)
    aux = (tuple(config.aux_layers) or default_aux_layers(n_layers) if config.kind == "eagle3" else ())
    if any(not 0 <= k <= n_layers for k in aux):
        raise ModelError.naming("{aux_layers} {value}: {target} has {n} decoder layers, so a layer number is 0..{n}",
                                value=",".join(map(str, aux)), target=target.name, n=n_layers)
    head_config = head_config_for(config.kind, target, heads=config.heads, aux_layers=aux, mtp_style=config.mtp_style)
    blind = config.kind == "medusa" and config.prompt == "context"  # Medusa attends to nothing: no context to give
    plan = plan_prompts(caches, config.holdout_every, config.train_prompts, config.seed, config.train_categories)
    layers = head_config.hidden_layers if config.kind in ("eagle3", "mtp") else ()
    train_seqs, held = [], []
    for c, path in enumerate(caches):
        keep, hold = plan.of(c)
        for i, seq in load_sequences(path, target, layers, "none" if blind else config.prompt, progress=progress,
                                     prompts=keep | hold, hidden_batch=hidden_batch):
            (held if i in hold else train_seqs).append(seq)
    if not train_seqs or not held:
        raise CacheError(f"{len(train_seqs) + len(held)} trajectories cannot be split 1 in {config.holdout_every} "
                         "into training and held-out prompts; record more prompts")
    seen = trained_on(caches, plan.trained_on())  # which prompts it saw: simulate, validate and report say so
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
    train_seqs, where = to_device(train_seqs, target.info["device"])
    held, _ = to_device(held, target.info["device"])
    n_train = sum(int(s.tokens.shape[0]) - s.loss_from(config) for s in train_seqs)
    n_held = sum(int(s.tokens.shape[0]) - s.context for s in held)
    resumed = _resumed_state(out, config, seen["fingerprint"], n_train) if resume else None
    if resumed is not None:
        module.load_state_dict(resumed["module"])
    echo(f"training {config.kind} heads for {target.name} on {len(train_seqs)} trajectories ({n_train} positions"
         + (f"; {config.train_prompts} of the training prompts, drawn by the seed" if config.train_prompts else "")
         + (f"; categories {', '.join(config.train_categories)} only" if config.train_categories else "")
         + f"{', prompts included' if config.prompt == 'loss' else ''}"
         + (f"; {len(caches)} caches" if len(caches) > 1 else "")
         + f"); held out: {len(held)} ({n_held} generated positions, every {config.holdout_every}th prompt"
         + (" of each cache" if len(caches) > 1 else "")
         + (f", and {plan.moved} training prompts another cache holds out" if plan.moved else "")
         + f"); the prompt: {config.prompt} "
         f"({PROMPT_USES[config.prompt]}); arithmetic: {config.precision}; learning rate: {config.lr_schedule}, "
         f"peak {config.lr:g}" + (f"; {where}" if where else ""))
    outcome = TrainOutcome(steps=0, seconds=0.0, positions=n_train, heldout_positions=n_held)
    module.eval()
    if resumed is None:
        evaluating = _clock()
        outcome.before = evaluate(config.kind, module, target, held, config)
        evaluation = _clock() - evaluating
    else:
        outcome.before, outcome.curve, outcome.steps = resumed["before"], resumed["curve"], resumed["step"]
        evaluation = resumed["evaluation_seconds"]
        echo(f"resuming the run in {out} at step {outcome.steps}"
             + (f", {resumed['reached']:.1%} of its time-limited schedule run" if config.time_limit else ""))
    report("before", dict(outcome.before, positions=n_held))
    for point in outcome.curve:  # a resumed run's earlier points
        report("step", point)
    now = _clock()
    trained = [p for p in module.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trained, lr=config.lr, weight_decay=config.weight_decay)
    timed = None
    if config.time_limit:  # the rest of the time, less the final evaluation's (as long as the one just run)
        final = EVAL_RESERVE * evaluation
        end = begun + config.time_limit - final - SAVE_RESERVE
        if end <= now:
            raise ModelError.naming("{time_limit} {value:g} s: loading and evaluating took {used:.0f} s and the "
                                    "final evaluation needs about {need:.0f} s more; nothing is left to train",
                                    value=config.time_limit, used=now - begun, need=final + SAVE_RESERVE)
        timed = TimedSchedule(config, now, end, _clock, resumed["reached"] if resumed is not None else 0.0)
        echo(f"time limit {config.time_limit:g} s: training until {end - begun:.0f} s (loading and evaluating took "
             f"{now - begun:.0f} s; the final evaluation is kept {final:.0f} s)"
             + (f", at most {config.steps} steps" if config.steps < NO_STEP_CAP else ""))
        rates = torch.optim.lr_scheduler.LambdaLR(optimiser, timed.factor)
    else:
        rates = schedule(optimiser, config)
    rng = np.random.default_rng(config.seed)
    losses: list[float] = []
    rate = config.lr  # the learning rate of the last step taken
    if resumed is not None:  # after the schedule is built: building it sets the optimiser's rate, loading resets it
        optimiser.load_state_dict(resumed["optimiser"])
        if timed is None:
            rates.load_state_dict(resumed["rates"])
        else:  # the rate where the rest of the schedule starts, not the interrupted step's
            for group in optimiser.param_groups:
                group["lr"] = group["initial_lr"] * timed.factor()
        rng.bit_generator.state = resumed["rng"]
        torch.set_rng_state(resumed["torch_rng"])
        losses, rate = list(resumed["losses"]), resumed["rate"]
    streams = (rng.bit_generator.state, torch.get_rng_state())  # as the next step starts: its batch is drawn from them
    probe = held[:CURVE_HELDOUT]  # the held-out trajectories the training curve is measured on
    earlier = resumed["seconds"] if resumed is not None else 0.0  # the training loop's seconds before this run

    def extra() -> dict:
        """The checkpoint's training record; its `heldout` is this checkpoint's own evaluation: all held-out
        trajectories after the last step, the curve's probe at a checkpoint, the untrained head's before step 1."""
        heldout = outcome.after if outcome.after else next(
            (c["heldout"] for c in outcome.curve[-1:] if c["step"] == outcome.steps),
            outcome.before if outcome.steps == 0 else None)
        return {"training": {"caches": [str(c) for c in caches], "steps": outcome.steps, "config": config.__dict__,
                             "positions": n_train, "heldout": heldout,
                             "heldout_trajectories": len(held) if outcome.after else len(probe),
                             "curve": outcome.curve, "trained_on": seen}}

    def checkpoint(finished: bool = False) -> None:
        """Save the heads; then the run's state beside them, or, once it has finished, remove that."""
        save_heads(out, head_config, module, extra())
        if finished:
            (out / STATE_FILE).unlink(missing_ok=True)
            return
        _save_state(out, {"config": dict(config.__dict__), "prompts": seen["fingerprint"], "positions": n_train,
                          "step": outcome.steps, "seconds": earlier + time.perf_counter() - started,
                          "module": module.state_dict(), "optimiser": optimiser.state_dict(),
                          "rates": rates.state_dict() if timed is None else None, "rng": streams[0],
                          "torch_rng": streams[1], "reached": timed.last if timed else 0.0,
                          "before": outcome.before, "curve": outcome.curve, "losses": losses[-config.save_every:],
                          "rate": rate, "evaluation_seconds": evaluation})

    # bfloat16: autocast's matrix products; the loss's softmaxes are taken in float32 (_soft_ce) and the weights
    # and AdamW's state stay float32 (no loss scaling: bfloat16 has float32's exponent range)
    autocast = torch.autocast(device_type=torch.device(target.info["device"]).type, dtype=torch.bfloat16,
                              enabled=config.precision == "bfloat16")
    balance = RouterBalance(module, config.router_bias_speed)
    together = batches_together(config, module)
    started = time.perf_counter()
    bar = tqdm(total=None if timed else config.steps, initial=outcome.steps, unit="step", desc=f"train {config.kind}",
               disable=not progress, dynamic_ncols=True)
    try:
        module.train()
        for step in range(outcome.steps, config.steps):
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
            streams = (rng.bit_generator.state, torch.get_rng_state())
            losses.append(total.item())  # the step's one read-back: the host waits for it here
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if timed is not None and timed.over():
                break
            if (step + 1) % config.save_every == 0 and step + 1 < config.steps:
                module.eval()
                outcome.curve.append({"step": step + 1, "train_loss": float(np.mean(losses[-config.save_every:])),
                                      "lr": rate, "heldout": evaluate(config.kind, module, target, probe, config)})
                module.train()
                checkpoint()
                with tqdm.external_write_mode():  # the line above the bar, not through it
                    report("step", outcome.curve[-1])
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        bar.close()
        balance.close()
        outcome.seconds = earlier + time.perf_counter() - started
    module.eval()
    if not outcome.interrupted:
        checkpoint(finished=True)  # first: an interrupt in the evaluation below loses no steps
        try:
            outcome.after = evaluate(config.kind, module, target, held, config)
        except KeyboardInterrupt:  # the trained head is saved, without its held-out numbers
            outcome.interrupted = True
            return outcome
        save_heads(out, head_config, module, extra())
        return outcome
    if outcome.steps and not (outcome.curve and outcome.curve[-1]["step"] == outcome.steps):
        # stopped between checkpoints: save the weights and state first (a second interrupt loses nothing), then
        # measure them on the curve's probe, as a checkpoint is
        checkpoint()
        since = outcome.steps - (outcome.curve[-1]["step"] if outcome.curve else 0)
        outcome.curve.append({"step": outcome.steps, "train_loss": float(np.mean(losses[-since:])), "lr": rate,
                              "heldout": evaluate(config.kind, module, target, probe, config)})
        report("step", outcome.curve[-1])
    checkpoint()
    return outcome

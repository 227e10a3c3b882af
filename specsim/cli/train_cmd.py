"""`specsim train-draft`: train Medusa, EAGLE, EAGLE-3 or MTP heads from a cache's hidden states."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from specsim import specs as registry
from specsim.cli import _common as c


@c.command("train-draft")
@click.option("--kind", type=c.choice(registry.HEAD_KINDS), required=True,
              help=registry.vocab_help(registry.HEAD_KINDS) + ".")
@click.option("--target", required=True,
              help="The target model the caches were recorded with (its LM head gives the training targets).")
@click.option("--from", "caches", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True,
              multiple=True,
              help="A cache recorded with --hidden-states last (MiMo-style MTP: last,prenorm; EAGLE-3: last and the "
                   "layers it fuses, e.g. last,2,15,27 for SmolLM2's 30 layers). Repeat it to train on several caches "
                   "together (recorded from other prompts or at other times): every --holdout-every-th prompt of each "
                   "is held out, and a prompt one cache holds out is trained on in none.")
@click.option("--heads", type=click.IntRange(1, 16), default=4, show_default=True,
              help="Medusa: heads (the deepest depth drafted). EAGLE drafts autoregressively: `specsim cache "
                   "--head-depth` sets how deep it is recorded.")
@click.option("--aux-layers", default=None, metavar="K1,K2,K3",
              help="EAGLE-3: the target layers fused (the inputs of those decoder layers, vLLM's "
                   "eagle_aux_hidden_state_layer_ids). Default: 2, L/2 and L-3 of the target's L layers.")
@click.option("--ttt-steps", type=click.IntRange(1, 16), default=4, show_default=True,
              help="EAGLE-3, MTP: training-time test depth: the head is unrolled this many steps on its own features.")
@click.option("--ttt-decay", type=click.FloatRange(min=0, min_open=True), default=None,
              help="EAGLE-3, MTP: depth d's loss weight is this to the power d - 1  [default: EAGLE-3 1, MTP 0.6 "
                   "(speculators' MTP step weights)].")
@click.option("--mtp-style", type=c.choice(registry.MTP_STYLES), default="deepseek", show_default=True,
              help="MTP: how the layer is wired: " + registry.vocab_help(registry.MTP_STYLES) + ". Both feed back "
                   "their normed output, as vLLM runs them.")
@click.option("--router-bias-speed", type=click.FloatRange(min=0), default=None,
              help="MTP on a DeepSeek-V3 target (its layer's experts): the step γ of DeepSeek-V3's load balancing, "
                   "which moves each router's correction bias by γ toward balance after every training step, not by "
                   "gradient; 0 keeps the biases at zero  [default: 0.001, DeepSeek-V3's].")
@click.option("--draft-vocab", type=click.IntRange(min=0), default=0, show_default=True,
              help="EAGLE-3: draft over the N most frequent tokens of the training trajectories (d2t maps them to the "
                   "target's ids); 0: the target's whole vocabulary.")
@click.option("--prompt", "prompt_use", type=c.choice(registry.PROMPT_USES), default="context", show_default=True,
              help="What the prompt is to the training (its states are computed by the target; a cache stores "
                   "the generated positions'): " + registry.vocab_help(registry.PROMPT_USES) + ".")
@click.option("--precision", type=c.choice(registry.TRAIN_PRECISIONS), default="float32", show_default=True,
              help="The training steps' arithmetic (held-out numbers are float32 either way): "
                   + registry.vocab_help(registry.TRAIN_PRECISIONS) + ".")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="Optimiser steps (with --time-limit: at most this many).  [default: 300; with --time-limit: no "
                   "cap]")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Train for as long as the time allows instead of a step count: the whole run (loading included) "
                   "aims to end within SECONDS (a step at most later); the learning-rate schedule runs over the "
                   "time left after loading, less the final held-out evaluation's (taken as 1.25x the untrained "
                   "head's, measured first). For a lent or scheduled machine's minutes.")
@click.option("--batch", type=click.IntRange(min=1), default=4, show_default=True, help="Trajectories per step.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-3, show_default=True,
              help="AdamW learning rate (the peak rate under --lr-schedule cosine).")
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.01, show_default=True,
              help="AdamW's decoupled weight decay: every step multiplies the weights by 1 - lr x this (torch's "
                   "default; EAGLE-3's reference trainer uses 0).")
@click.option("--lr-schedule", type=c.choice(registry.LR_SCHEDULES), default="cosine", show_default=True,
              help="The learning rate over the steps: " + registry.vocab_help(registry.LR_SCHEDULES) + ".")
@click.option("--holdout-every", type=click.IntRange(min=2), default=5, show_default=True,
              help="Hold out every k-th prompt: the reported loss and agreement are on prompts never trained on.")
@click.option("--train-prompts", type=click.IntRange(min=1), default=None,
              help="Train on this many of the training prompts only, drawn by --seed (a smaller number's prompts are "
                   "part of a larger one's; the held-out prompts stay the same): a data-scaling curve, what more "
                   "data buys.  [default: all]")
@click.option("--train-categories", default=None, metavar="C1,C2,...",
              help="Train on the prompts of these categories only (the prompt file's category field; e.g. a coding "
                   "head, or one without added prompts to measure what they buy); the held-out prompts stay every "
                   "k-th of all categories, so heads trained on different categories are compared on one set.  "
                   "[default: all]")
@click.option("--save-every", type=click.IntRange(min=1), default=100, show_default=True,
              help="Write a checkpoint every this many steps.")
@c.hidden_batch_option(
    "Compute the prompts' states (--prompt context) in right-padded forwards of up to TOKENS tokens "
    "instead of one forward per prompt, as `cache --hidden-batch` does for recording: for a GPU (an H200 "
    "run loading 685k positions of 2,470 prompts, one forward each, had not finished after 75 s; a later "
    "one with 65536 loaded 778k positions of 2,470 prompts and evaluated in 46 s: two sessions, an estimate). "
    "Slower on a CPU (2 cores: 60 Spec-Bench prompts 39 s against 7.9 s). Equal to one forward per prompt up to "
    "rounding.")
@c.device_option
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Directory to write the heads to.")
@click.option("--overwrite", is_flag=True, help="Replace heads already in --out.")
@click.option("--resume", is_flag=True,
              help="Continue the run interrupted in --out (Ctrl-C, SIGTERM, a crash: from its last checkpoint) with "
                   "the same command: the same settings and caches. A --steps run resumed ends with the weights it "
                   "would have had uninterrupted; a --time-limit run runs the rest of its schedule in the new limit.")
@c.seed_option
@c.quiet_option
@c.friendly_errors
def train_draft(kind, target, caches, heads, aux_layers, ttt_steps, ttt_decay, mtp_style, router_bias_speed,
                draft_vocab, prompt_use, precision, steps, time_limit, batch, lr, weight_decay, lr_schedule,
                holdout_every, train_prompts, train_categories, save_every, hidden_batch, device, out, overwrite,
                resume, seed, quiet):
    """Train head drafts for TARGET by self-distillation on the trajectories of one or more caches.

    The loss is against the target's whole next-token law (softmax of its LM head on the
    recorded hidden states), not only its sampled token. The heads are saved as
    config.json + safetensors in the published layouts (Medusa's medusa_lm_head.safetensors,
    EAGLE's model.safetensors, EAGLE-3 in speculators' layout, which vLLM's eagle3 method
    loads, MTP with its style's published keys), ready for --draft medusa:DIR / eagle:DIR /
    eagle3:DIR / mtp:DIR. EAGLE-3 and MTP are trained with training-time test (--ttt-steps
    deep on their own features). Ctrl-C saves the last checkpoint and stops; --resume continues it.

    \b
    Examples:
      specsim cache --target smollm2-135m --hidden-states last --temperature 0,0.7 \\
          --max-new-tokens 128 --out cache/train.h5
      specsim train-draft --kind medusa --target smollm2-135m --from cache/train.h5 --out heads/medusa
      specsim train-draft --kind eagle --target smollm2-135m --from cache/train.h5 --out heads/eagle
      specsim cache --target smollm2-135m --draft medusa:heads/medusa,eagle:heads/eagle --out cache/heads.h5
      specsim cache --target smollm2-135m --hidden-states last,2,15,27 --store stats --out cache/train3.h5
      specsim train-draft --kind eagle3 --target smollm2-135m --from cache/train3.h5 --draft-vocab 16384 \\
          --out heads/eagle3
      specsim train-draft --kind mtp --target smollm2-135m --from cache/train.h5 --out heads/mtp
      specsim train-draft --kind eagle3 --target smollm2-135m --from cache/train3.h5 \\
          --from cache/train-generated.h5 --draft-vocab 16384 --out heads/eagle3-both   # two caches together
      specsim train-draft --kind eagle3 --target smollm2-135m --from cache/train3.h5 --time-limit 600 \\
          --out heads/eagle3-10min            # as many steps as ten minutes hold, the schedule fitted to them
    """
    import time

    begun = time.perf_counter()  # --time-limit counts from here: importing and loading count too
    import transformers

    from specsim.errors import CacheError
    from specsim.files import check_writable
    from specsim.interrupts import sigterm_as_interrupt
    from specsim.record.models import load_model
    from specsim.record.train import CURVE_HELDOUT, NO_STEP_CAP, TrainConfig, interrupted_state, train
    from specsim.record.train_data import plan_prompts

    if resume and overwrite:
        raise CacheError("--resume and --overwrite exclude each other")
    if out.exists() and not out.is_dir():
        raise CacheError(f"--out {out} is a file; give a folder for the heads")
    check_writable("--out", out)  # before the target loads: checkpoints are written while training
    if out.exists() and any(out.iterdir()) and not (overwrite or resume):
        raise CacheError(f"--out {out} is not empty; pass --overwrite to replace the heads in it, or --resume to "
                         "continue the run interrupted there")
    if resume:  # before the target loads
        interrupted_state(out)
    if kind != "eagle3" and (aux_layers or draft_vocab):
        raise CacheError.naming("{aux_layers} and {draft_vocab} are EAGLE-3's: use {kind} eagle3")
    if kind != "mtp" and router_bias_speed is not None:
        raise CacheError.naming("{router_bias_speed} is DeepSeek-V3 MTP's: use {kind} mtp")
    if kind not in ("eagle3", "mtp") and ttt_decay is not None:
        raise CacheError.naming("{ttt_decay} is EAGLE-3's and MTP's: use {kind} eagle3 or mtp")
    try:
        aux = tuple(int(k) for k in aux_layers.split(",")) if aux_layers else ()
    except ValueError:
        raise CacheError.naming("{aux_layers} {value!r}: give layer numbers, e.g. 2,15,27", value=aux_layers) from None
    categories = tuple(dict.fromkeys(c.strip() for c in train_categories.split(",") if c.strip())) \
        if train_categories is not None else ()
    if train_categories is not None and not categories:
        raise CacheError.naming("{train_categories}: give category names, e.g. writing,coding")
    plan_prompts(caches, holdout_every, train_prompts or 0, seed, categories)  # refused before the target loads
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    click.echo(f"loading target {target} ...", err=True)
    loaded = load_model(target, device=device)
    config = TrainConfig(kind=kind, heads=heads, steps=steps or (NO_STEP_CAP if time_limit else 300),
                         time_limit=time_limit or 0.0, lr=lr, weight_decay=weight_decay, lr_schedule=lr_schedule,
                         batch=batch, holdout_every=holdout_every, train_prompts=train_prompts or 0,
                         train_categories=categories, save_every=save_every,
                         seed=seed, ttt_steps=ttt_steps,
                         aux_layers=aux, draft_vocab=draft_vocab,
                         ttt_decay=ttt_decay if ttt_decay is not None else 0.6 if kind == "mtp" else 1.0,
                         mtp_style=mtp_style, prompt=prompt_use, precision=precision,
                         **({} if router_bias_speed is None else {"router_bias_speed": router_bias_speed}))
    def agreement(result):
        return ", ".join(f"depth {d} {v:.3f} (overlap {result['overlap'][d]:.3f})" for d, v in result["top1"].items())

    def report(what: str, result: dict) -> None:
        """Each held-out evaluation on stdout as the run makes it (flushed: a log shows a long run's curve)."""
        if what == "before":
            click.echo(f"held-out ({result['positions']} positions) before training: loss {result['loss']:.3f}, "
                       f"top-1 agreement with the target's token {agreement(result)}; overlap = Σ min(p, q), a "
                       "one-token draft's acceptance at T=1")
        else:
            click.echo(f"step {result['step']}: training loss {result['train_loss']:.3f} (learning rate "
                       f"{result['lr']:.3g}); held-out (first {CURVE_HELDOUT} trajectories) loss "
                       f"{result['heldout']['loss']:.3f}, top-1 "
                       + ", ".join(f"depth {d} {v:.3f}" for d, v in result["heldout"]["top1"].items()))
        sys.stdout.flush()

    with sigterm_as_interrupt():  # SIGTERM (a scheduler's stop) saves the last checkpoint as Ctrl-C does
        outcome = train(caches, loaded, out, config, progress=not quiet, echo=lambda line: click.echo(line, err=True),
                        begun=begun, resume=resume, hidden_batch=hidden_batch or 0, report=report)
    if outcome.interrupted:
        click.echo(f"interrupted after {outcome.steps} steps ({outcome.seconds:.1f} s); saved that checkpoint to {out}; "
                   "the same command with --resume continues it", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    click.echo(f"held-out after {outcome.steps} steps ({outcome.seconds:.1f} s on {outcome.positions} training "
               f"positions): loss {outcome.after['loss']:.3f}, top-1 agreement {agreement(outcome.after)}")
    click.echo(f"wrote {out}; next: specsim cache --target {target} --draft {kind}:{out} --out CACHE")

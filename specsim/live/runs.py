"""Running live speculative decoding over a prompt set, and the tables it produces.

The requests are the prompts, each decoded `repeats` times with its own seed. The same
requests are decoded plainly (the baseline: same engine, same batch size and batching,
same run) and speculatively. Rows use the simulator's metric code
(`specsim.sim.metrics.summarize`: ratio-of-sums metrics with bootstrap CIs over
prompts, a prompt's repeats summed) and its configuration columns, so live and
simulated rows join on (tree, draft, policy, temperature, multi_draft, batch, category).
Times are decode times (engine steps); prompt passes are reported apart.

* ``speedup``: output tokens per second of the speculative run over the plain run's
  (throughput, decode steps only). Its CI is a bootstrap over prompts of the same ratio
  computed from each request's time in the engine (at batch 1 and T = 0 identical to
  the throughput ratio).
* ``latency_per_token_ms``: mean over requests of (time in the engine / output tokens).

A Ctrl-C stops the run after the step in progress; what finished is kept.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import polars as pl

from specsim.expansion import DynamicTree
from specsim.live.decoder import DecodeRun, Decoded, LiveConfig, Target, decode


@dataclass(frozen=True)
class LivePrompt:
    prompt_index: int  # row in the prompt set (or the cache's /prompts)
    category: str  # prompt category ("" when none)
    token_ids: np.ndarray  # (n,) chat-templated prompt ids


@dataclass(frozen=True)
class LiveTrajectory:
    prompt: LivePrompt  # what was decoded
    repeat: int  # 0 .. repeats-1
    seed: int  # seed of this decode's numpy Generator
    live: Decoded  # the speculative decode
    plain: Decoded | None  # the plain decode of the same request; None when not run


@dataclass
class LiveRun:
    config: LiveConfig  # what was run
    target: str  # target model name
    draft: str  # draft name (model spec, layers:K, int8, ngram:N, ...)
    trajectories: list[LiveTrajectory] = field(default_factory=list)  # in request order
    interrupted: bool = False  # True when a Ctrl-C cut the run short
    device: str = ""  # where it ran, e.g. "cpu (2 threads)"
    spec_run: DecodeRun | None = None  # the engine's record of the speculative decodes (steps, times)
    plain_run: DecodeRun | None = None  # the same for the plain baseline


def decode_seed(seed: int, prompt_index: int, repeat: int) -> int:
    """A stable seed per (prompt, repeat); repeat -1 is the plain decode."""
    return int(np.random.SeedSequence([seed % 2**63, prompt_index, repeat + 1]).generate_state(1)[0])


SEGMENTS = 4  # ABBA: equal segments cancel a linear drift of the machine's speed


def run_live(target: Target, drafter, prompts: Sequence[LivePrompt], config: LiveConfig, *, target_name: str,
             repeats: int = 1, seed: int = 0, device: str = "", plain: bool = True, progress: bool = True,
             baseline: DecodeRun | None = None) -> LiveRun:
    """Decode every (prompt, repeat) plainly (unless `plain` is False) and speculatively, `config.batch` at a time.

    With lockstep batching the two runs alternate in `SEGMENTS` segments of whole batches (plain
    then speculative, speculative then plain, plain then speculative, speculative then plain): a
    batch never shares the engine with another, so this changes nothing but the order, and a
    machine whose speed drifts linearly during the run (a shared CPU, a GPU's clocks) shifts both
    sides of the speedup alike instead of one. Few segments, not one per batch, keep the switches
    between the two runs rare. Continuous batching, and drafters that learn from earlier
    requests, run all plain requests first.

    baseline: a plain run of the same requests and batching made earlier in the same session,
    reused instead of decoding them plainly again.
    """
    from tqdm.auto import tqdm

    requests = [(p, r) for p in prompts for r in range(repeats)]
    run = LiveRun(config=config, target=target_name, draft=drafter.name, device=device)
    passes = [("plain", config.plain(), None)] if plain and baseline is None else []
    passes.append(("speculative", config, drafter))
    alternate = len(passes) == 2 and config.batching == "lockstep" and not hasattr(drafter, "begin")
    n_batches = -(-len(requests) // config.batch)
    chunks = [[k for b in part for k in range(b * config.batch, min((b + 1) * config.batch, len(requests)))]
              for part in np.array_split(np.arange(n_batches), max(1, min(SEGMENTS, n_batches)) if alternate else 1)]
    bar = tqdm(total=len(requests) * config.max_new_tokens * len(passes), unit="tok", desc="live decoding",
               disable=not progress, dynamic_ncols=True)
    results: dict[str, DecodeRun] = {"plain": baseline} if plain and baseline is not None else {}
    try:
        for c, chunk in enumerate(chunks):
            for name, cfg, d in (passes if c % 2 == 0 else passes[::-1]):
                seeds = [decode_seed(seed, requests[k][0].prompt_index, -1 if d is None else requests[k][1])
                         for k in chunk]
                part = decode(target, d, [requests[k][0].token_ids for k in chunk],
                              [np.random.default_rng(s) for s in seeds], cfg,
                              on_step=lambda step: bar.update(step.emitted))
                results[name] = _joined(results.get(name), part)
                if part.interrupted:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        run.interrupted = True
    finally:
        bar.close()
    for name in ("speculative", "plain"):  # requests an interruption left undecoded: None, in request order
        if name in results and results[name] is not baseline and len(results[name].decoded) < len(requests):
            results[name].decoded += [None] * (len(requests) - len(results[name].decoded))
    run.spec_run, run.plain_run = results.get("speculative"), results.get("plain")
    if run.spec_run is None:
        return run
    for k, ((p, r), live) in enumerate(zip(requests, run.spec_run.decoded)):
        if live is None:
            continue
        base = run.plain_run.decoded[k] if run.plain_run is not None else None
        run.trajectories.append(LiveTrajectory(prompt=p, repeat=r, seed=decode_seed(seed, p.prompt_index, r),
                                               live=live, plain=base))
    return run


def _joined(before: DecodeRun | None, part: DecodeRun) -> DecodeRun:
    """Two decode runs of consecutive request groups as one (requests and engine steps in order)."""
    if before is None:
        return part
    return DecodeRun(decoded=before.decoded + part.decoded, steps=before.steps + part.steps,
                     prefill_s=before.prefill_s + part.prefill_s, interrupted=before.interrupted or part.interrupted)


def trajectory_stats(run: LiveRun, *, by_prompt: bool = False):
    """The simulator's `TrajectoryStats` (observed totals) and the grouping it needs, for `summarize`: one row per
    decode, or with `by_prompt` one per prompt, its repeats summed (what a bootstrap over prompts resamples: a
    prompt's repeats share its text, so they are not independent draws).

    A trajectory's cost is its time in the engine in units of the plain run's mean time per output token; its
    plain time, what the plain decode of the same request spent per token times the tokens this decode emitted (at
    T = 0 the plain decode's own time). Summarize's speedup is then a ratio of sums of engine times, resampled by
    prompt: the CI of the speedup (its point, in the "all" row, is the run's throughput ratio).
    """
    from specsim.sim.engine import TrajectoryStats
    from specsim.sim.metrics import sums_by_prompt

    D = max(run.config.tree.max_depth, 1)
    accepted = [np.array([s.accepted for s in t.live.steps]) for t in run.trajectories]
    plains = [t.plain for t in run.trajectories if t.plain is not None]
    unit = (sum(p.seconds for p in plains) / sum(len(p.tokens) for p in plains)) if plains else np.nan
    stats = TrajectoryStats(
        calls=np.array([len(a) for a in accepted], dtype=np.float64),
        drafted=np.array([sum(s.drafted for s in t.live.steps) for t in run.trajectories], dtype=np.float64),
        accepted=np.array([a.sum() for a in accepted], dtype=np.float64),
        tokens=np.array([len(t.live.tokens) for t in run.trajectories], dtype=np.float64),
        reach=np.array([[(a >= d).sum() for d in range(1, D + 1)] for a in accepted], dtype=np.float64).reshape(-1, D),
        cost=np.array([t.live.seconds / unit for t in run.trajectories], dtype=np.float64),
        plain=np.array([t.plain.seconds / len(t.plain.tokens) * len(t.live.tokens) / unit if t.plain else np.nan
                        for t in run.trajectories], dtype=np.float64),
        exact=True,
    )
    groups = SimpleNamespace(
        traj_category=np.array([t.prompt.category for t in run.trajectories], dtype=object),
        traj_prompt=np.array([t.prompt.prompt_index for t in run.trajectories], dtype=np.int64),
    )
    if not by_prompt:
        return stats, groups
    names = ("calls", "drafted", "accepted", "tokens", "reach", "cost", "plain")
    prompts, first, sums = sums_by_prompt(groups.traj_prompt, *(getattr(stats, name) for name in names))
    return (TrajectoryStats(**dict(zip(names, sums)), exact=True),
            SimpleNamespace(traj_category=groups.traj_category[first], traj_prompt=prompts))


def summary_rows(run: LiveRun, *, by_category: bool = True, n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """One row per group ("all", then categories): the simulator's columns plus wall-clock ones."""
    from specsim.sim.metrics import summarize

    if not run.trajectories:
        return []
    stats, groups = trajectory_stats(run, by_prompt=True)
    cfg = run.config
    # a static tree whose nodes draw several candidates (a dynamic tree's are point masses: no multi-draft scheme)
    sampling_tree = (cfg.policy != "greedy" and not isinstance(cfg.tree, DynamicTree)
                     and int(cfg.tree.n_children.max()) > 1)
    head = {
        "tree": cfg.tree.name, "budget": cfg.tree.budget, "depth": cfg.tree.max_depth, "draft": run.draft,
        "target": run.target, "policy": cfg.label, "temperature": float(cfg.temperature),
        "multi_draft": cfg.multi_draft if sampling_tree else None, "batch": cfg.batch, "batching": cfg.batching,
        "estimate": "live",
    }
    rows = []
    with warnings.catch_warnings():  # without a plain baseline, cost and speedup are NaN by design
        warnings.simplefilter("ignore", RuntimeWarning)
        summaries = summarize(stats, groups, by_category=by_category, n_boot=n_boot, seed=seed)
    for row in summaries:
        picked = [t for t in run.trajectories if row["category"] in ("all", t.prompt.category)]
        steps = [s for t in picked for s in t.live.steps]
        plain = [t.plain for t in picked if t.plain is not None]
        extra = _throughput(run, picked, plain, row["category"] == "all")
        if extra["speedup"] is not None:
            row["speedup"] = extra.pop("speedup")
        else:
            extra.pop("speedup")
        rows.append({
            **head, **row, **extra,
            "n_decodes": len(picked),
            "target_calls": len(steps),
            "draft_ms_per_call": 1000 * float(np.mean([s.draft_s for s in steps])),
            "verify_ms_per_call": 1000 * float(np.mean([s.verify_s for s in steps])),
            "identical_to_plain": (sum(np.array_equal(t.live.tokens, t.plain.tokens) for t in picked) / len(picked)
                                   if cfg.policy == "greedy" and plain else None),
            "max_new_tokens": cfg.max_new_tokens,
            "device": run.device,
            "interrupted": run.interrupted,
        })
    return rows


def _throughput(run: LiveRun, picked: list[LiveTrajectory], plain: list[Decoded], whole: bool) -> dict:
    """Tokens/s and latency columns; throughput is a whole-run figure (one engine timeline)."""
    tokens = sum(len(t.live.tokens) for t in picked)
    latency = 1000 * float(np.mean([t.live.seconds / len(t.live.tokens) for t in picked]))
    out = {"live_tokens_per_s": None, "plain_tokens_per_s": None, "speedup": None,
           "latency_per_token_ms": latency,
           "plain_latency_per_token_ms": (1000 * float(np.mean([p.seconds / len(p.tokens) for p in plain]))
                                          if plain else None),
           "prefill_s": float(sum(t.live.prefill_s for t in picked))}
    if whole and run.spec_run is not None:
        out["live_tokens_per_s"] = tokens / run.spec_run.decode_s
        if run.plain_run is not None and plain:
            out["plain_tokens_per_s"] = sum(len(p.tokens) for p in plain) / run.plain_run.decode_s
            out["speedup"] = out["live_tokens_per_s"] / out["plain_tokens_per_s"]
    elif run.config.batch == 1:  # a category's own decodes are a contiguous share of a batch-1 timeline
        out["live_tokens_per_s"] = tokens / sum(t.live.seconds for t in picked)
        if plain:
            out["plain_tokens_per_s"] = sum(len(p.tokens) for p in plain) / sum(p.seconds for p in plain)
            out["speedup"] = out["live_tokens_per_s"] / out["plain_tokens_per_s"]
    return out


def steps_frame(run: LiveRun) -> pl.DataFrame:
    """One row per target call: where it started, what it accepted (node ids), the batch and how long it took."""
    rows = [
        {"prompt_index": t.prompt.prompt_index, "category": t.prompt.category, "repeat": t.repeat, "step": i,
         "start": s.start, "accepted": s.accepted, "path": list(s.path[: s.accepted]), "drafted": s.drafted,
         "batch": s.batch, "draft_ms": 1000 * s.draft_s, "verify_ms": 1000 * s.verify_s}
        for t in run.trajectories for i, s in enumerate(t.live.steps)
    ]
    schema = {"prompt_index": pl.Int64, "category": pl.String, "repeat": pl.Int64, "step": pl.Int64,
              "start": pl.Int64, "accepted": pl.Int64, "path": pl.List(pl.Int64), "drafted": pl.Int64,
              "batch": pl.Int64, "draft_ms": pl.Float64, "verify_ms": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def build_drafter(spec: str, target, *, device: str, dtype: str):
    """A drafter from a draft spec: a model-free one (the registry names its drafter), medusa:DIR / eagle:DIR
    (heads on the target), or a model (`load_draft`: layers:K, int8, ...)."""
    from specsim.live.drafting import ModelDrafter
    from specsim.specs import is_head_draft, is_model_free, model_free_drafter
    from specsim.record.models import load_draft

    if is_model_free(spec):
        return model_free_drafter(spec)
    if is_head_draft(spec):
        from specsim.live.head_drafting import head_drafter

        return head_drafter(spec, target)
    return ModelDrafter(load_draft(spec, target, device=device, dtype=dtype).model, spec)


def load_target(spec: str, *, device: str = "auto", dtype: str = "float32", threads: int | None = None,
                echo=lambda message: None):
    """(the target LoadedModel, the resolved device), quietly; `echo` hears one line before the load."""
    import torch
    import transformers

    from specsim.record.models import load_model, resolve_device

    if threads:
        torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    device = resolve_device(device)
    echo(f"loading target {spec} ({dtype}, {device}) ...")
    return load_model(spec, device=device, dtype=dtype), device


def device_label(device: str) -> str:
    """'cpu (2 threads)' or 'cuda (<GPU name>)': where a run happened."""
    import torch

    if device.startswith("cuda"):
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"{device} ({torch.get_num_threads()} threads)"


def live_prompts(loaded, prompts, indices=None) -> list[LivePrompt]:
    """Chat-templated token ids of `specsim.prompts` prompts for the target's tokenizer."""
    from specsim.prompts import encode

    indices = indices if indices is not None else range(len(prompts))
    return [LivePrompt(prompt_index=int(i), category=p.category,
                       token_ids=np.asarray(encode(loaded.tokenizer, p.text), dtype=np.int64))
            for i, p in zip(indices, prompts)]

"""Running live speculative decoding over a prompt set, and the tables it produces.

Every prompt is decoded plainly once (the speedup baseline, same KV-cache code, same
run) and speculatively `repeats` times with different seeds. Rows use the
simulator's metric code (`specsim.sim.metrics.summarize`: ratio-of-sums metrics
with bootstrap CIs over trajectories) and its configuration columns, so live and
simulated rows join on (tree, draft, policy, temperature, multi_draft, category).
Live rows add wall-clock columns; the cost of a trajectory is its live seconds in
units of the plain decode step measured on the same prompt, so `speedup` is the
measured wall-clock speedup.

A Ctrl-C stops the run after the decode in progress; what finished is kept.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import polars as pl

from specsim.live.engine import Decoded, LiveConfig, Target, plain_decode, speculative_decode


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
    plain: Decoded | None  # the plain decode of the same prompt (shared by its repeats); None when not run


@dataclass
class LiveRun:
    config: LiveConfig  # what was run
    target: str  # target model name
    draft: str  # draft name (model spec, layers:K, int8, ngram:N, ...)
    trajectories: list[LiveTrajectory] = field(default_factory=list)  # in decode order
    interrupted: bool = False  # True when a Ctrl-C cut the run short
    device: str = ""  # where it ran, e.g. "cpu (2 threads)"


def decode_seed(seed: int, prompt_index: int, repeat: int) -> int:
    """A stable seed per (prompt, repeat); repeat -1 is the plain decode."""
    return int(np.random.SeedSequence([seed % 2**63, prompt_index, repeat + 1]).generate_state(1)[0])


def run_live(target: Target, drafter, prompts: Sequence[LivePrompt], config: LiveConfig, *, target_name: str,
             repeats: int = 1, seed: int = 0, device: str = "", plain: bool = True, progress: bool = True) -> LiveRun:
    """Decode every prompt plainly once (unless `plain` is False) and speculatively `repeats` times."""
    from tqdm.auto import tqdm

    run = LiveRun(config=config, target=target_name, draft=drafter.name, device=device)
    bar = tqdm(total=len(prompts) * (repeats + plain) * config.max_new_tokens, unit="tok", desc="live decoding",
               disable=not progress, dynamic_ncols=True)
    try:
        for prompt in prompts:
            baseline = None
            if plain:
                baseline = plain_decode(target, prompt.token_ids, temperature=config.temperature,
                                        max_new_tokens=config.max_new_tokens,
                                        rng=np.random.default_rng(decode_seed(seed, prompt.prompt_index, -1)))
                bar.update(config.max_new_tokens)
            for r in range(repeats):
                s = decode_seed(seed, prompt.prompt_index, r)
                live = speculative_decode(target, drafter, prompt.token_ids, config, np.random.default_rng(s))
                run.trajectories.append(LiveTrajectory(prompt=prompt, repeat=r, seed=s, live=live, plain=baseline))
                bar.update(config.max_new_tokens)
                bar.set_postfix(tok_per_call=f"{_tokens_per_call(run):.2f}", refresh=False)
    except KeyboardInterrupt:
        run.interrupted = True
    finally:
        bar.close()
    return run


def _tokens_per_call(run: LiveRun) -> float:
    calls = sum(t.live.target_calls for t in run.trajectories)
    return sum(len(t.live.tokens) for t in run.trajectories) / max(calls, 1)


def trajectory_stats(run: LiveRun):
    """The simulator's `TrajectoryStats` (observed totals) and the grouping it needs, for `summarize`."""
    from specsim.sim.engine import TrajectoryStats

    D = run.config.tree.max_depth
    accepted = [np.array([s.accepted for s in t.live.steps]) for t in run.trajectories]
    plain_step = [t.plain.seconds / len(t.plain.tokens) if t.plain else np.nan for t in run.trajectories]
    stats = TrajectoryStats(
        calls=np.array([len(a) for a in accepted], dtype=np.float64),
        drafted=np.array([sum(s.drafted for s in t.live.steps) for t in run.trajectories], dtype=np.float64),
        accepted=np.array([a.sum() for a in accepted], dtype=np.float64),
        tokens=np.array([len(t.live.tokens) for t in run.trajectories], dtype=np.float64),
        reach=np.array([[(a >= d).sum() for d in range(1, D + 1)] for a in accepted], dtype=np.float64).reshape(-1, D),
        cost=np.array([t.live.seconds / u for t, u in zip(run.trajectories, plain_step)], dtype=np.float64),
        exact=True,
    )
    groups = SimpleNamespace(
        traj_category=np.array([t.prompt.category for t in run.trajectories], dtype=object),
        traj_prompt=np.array([t.prompt.prompt_index for t in run.trajectories], dtype=np.int64),
    )
    return stats, groups


def summary_rows(run: LiveRun, *, by_category: bool = True, n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """One row per group ("all", then categories): the simulator's columns plus wall-clock ones."""
    from specsim.sim.metrics import summarize

    if not run.trajectories:
        return []
    stats, groups = trajectory_stats(run)
    cfg = run.config
    sampling_tree = cfg.policy != "greedy" and int(cfg.tree.n_children.max()) > 1
    head = {
        "tree": cfg.tree.name, "budget": cfg.tree.budget, "depth": cfg.tree.max_depth, "draft": run.draft,
        "target": run.target, "policy": cfg.policy, "temperature": float(cfg.temperature),
        "multi_draft": cfg.multi_draft if sampling_tree else None, "estimate": "live",
    }
    rows = []
    with warnings.catch_warnings():  # without a plain baseline, cost and speedup are NaN by design
        warnings.simplefilter("ignore", RuntimeWarning)
        summaries = summarize(stats, groups, by_category=by_category, n_boot=n_boot, seed=seed)
    for row in summaries:
        picked = [t for t in run.trajectories if row["category"] in ("all", t.prompt.category)]
        steps = [s for t in picked for s in t.live.steps]
        live_s = sum(t.live.seconds for t in picked)
        plain = [p for p in {id(t.plain): t.plain for t in picked}.values() if p is not None]
        rows.append({
            **head, **row,
            "n_decodes": len(picked),
            "target_calls": len(steps),
            "live_tokens_per_s": sum(len(t.live.tokens) for t in picked) / live_s,
            "plain_tokens_per_s": sum(len(p.tokens) for p in plain) / sum(p.seconds for p in plain) if plain else None,
            "draft_ms_per_call": 1000 * sum(s.draft_s for s in steps) / len(steps),
            "verify_ms_per_call": 1000 * sum(s.verify_s for s in steps) / len(steps),
            "identical_to_plain": (sum(np.array_equal(t.live.tokens, t.plain.tokens) for t in picked) / len(picked)
                                   if cfg.policy == "greedy" and plain else None),
            "max_new_tokens": cfg.max_new_tokens,
            "device": run.device,
            "interrupted": run.interrupted,
        })
    return rows


def steps_frame(run: LiveRun) -> pl.DataFrame:
    """One row per target call: where it started, what it accepted (node ids) and how long it took."""
    rows = [
        {"prompt_index": t.prompt.prompt_index, "category": t.prompt.category, "repeat": t.repeat, "step": i,
         "start": s.start, "accepted": s.accepted, "path": list(s.path[: s.accepted]), "drafted": s.drafted,
         "draft_ms": 1000 * s.draft_s, "verify_ms": 1000 * s.verify_s}
        for t in run.trajectories for i, s in enumerate(t.live.steps)
    ]
    schema = {"prompt_index": pl.Int64, "category": pl.String, "repeat": pl.Int64, "step": pl.Int64,
              "start": pl.Int64, "accepted": pl.Int64, "path": pl.List(pl.Int64), "drafted": pl.Int64,
              "draft_ms": pl.Float64, "verify_ms": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def build_drafter(spec: str, target, *, device: str, dtype: str):
    """A drafter from a draft spec: ngram:N / prompt-lookup:N, or a model (`load_draft`: layers:K, int8, ...)."""
    from specsim.live.drafting import ModelDrafter, ModelFreeDrafter, is_model_free
    from specsim.record.models import load_draft

    if is_model_free(spec):
        return ModelFreeDrafter(spec)
    return ModelDrafter(load_draft(spec, target, device=device, dtype=dtype).model, spec)

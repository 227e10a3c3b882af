"""`specsim.simulate`: replay a sweep of configurations against a cache, one polars row each.

The data path of docs/design.md §2, end to end: cache → `Features` per (draft,
temperature) → a policy's acceptance table per (tree, policy) → the exact walk →
ratio-of-sums metrics with bootstrap CIs over prompts → rows. A sweep (`SweepConfig`) is the
cross product trees × budgets × drafts × policies × temperatures; features are derived once
per (draft, temperature) and kept beside the cache; `specsim.sim.replay` replays each
(draft, temperature), `specsim.sim.pricing` prices its calls, `specsim.sim.rows` shapes the
rows. numpy + polars only.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl

from specsim.cache.reader import CacheReader
from specsim.errors import ArgumentError, CacheError, SpecError
from specsim.sim.cost import ProfileCost, load_cost_profile, parse_cost
from specsim.sim.features import feature_source
from specsim.sim.policies import check_temperature
from specsim.sim.pricing import Pricing
from specsim.sim.replay import on_one_blas_thread, replay, resolve_tree
from specsim.sim.rows import MAX_BOOT, finish_columns
from specsim.specs import (BATCHING, PolicySpec, expand_trees, is_model_free, model_free_help, needs_fit,
                           parse_policy)


def _temperature_plan(reader: CacheReader, policies: list[PolicySpec], temperatures) -> list[tuple[float, PolicySpec]]:
    recorded = reader.spec.temperatures
    if temperatures is None:
        wanted = None
    else:
        wanted = [reader.check_temperature(float(t)) for t in ([temperatures] if np.isscalar(temperatures)
                                                                else temperatures)]
    plan = []
    for policy in policies:
        candidates = wanted if wanted is not None else [t for t in recorded
                                                         if policy.kind.runs_at(t, default=True)]
        ok = []
        for t in candidates:
            try:
                check_temperature(policy, t)
                ok.append(t)
            except SpecError:
                pass
        if not ok:
            if wanted is None and policy.kind.default_temperatures == "0":
                raise CacheError(f"{reader.path}: policy {policy.label} needs greedy (T=0) trajectories; recorded: "
                                 + ", ".join(f"{t:g}" for t in recorded))
            if wanted is None:
                raise CacheError(f"{reader.path}: policy {policy.label} needs trajectories at T>0; recorded: "
                                 + ", ".join(f"{t:g}" for t in recorded))
            check_temperature(policy, candidates[0])  # raises the explanation
        plan += [(t, policy) for t in ok]
    return sorted(plan, key=lambda tp: tp[0])


@dataclass(frozen=True)
class Sweep:
    """What one simulation sweep produced."""

    rows: pl.DataFrame  # one row per configuration (x batch size) x category ("all" first)
    requests: pl.DataFrame  # one row per configuration x trajectory: totals and the histogram of accepted lengths


def _strings(value) -> tuple[str, ...] | None:
    return None if value is None else (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class SweepConfig:
    """What a sweep replays: the cross product trees × budgets × drafts × policies × temperatures, priced by
    measured or assumed costs, summarised with bootstrap CIs over prompts.

    A combination of the cross product that cannot run (an adaptive rule on a branching tree, a p-vs-q rule
    with a model-free draft, a tree the profile cannot price with unpriced="skip", ...) is skipped with one
    line saying which and why; the sweep fails only when nothing is left to run.
    """

    trees: tuple[str, ...] = ()  # specs ("chain:4", "kary:2,3", "optimal:16", "file:t.json", "dynamic:...") or
    #                              families expanded over `budgets` ("chain", "optimal", "kary:2")
    drafts: tuple[str, ...] | None = None  # recorded draft columns (None: all) or model-free ones ("ngram:3", "suffix")
    policies: tuple[str, ...] = ("greedy",)  # "greedy" (T = 0), "sample" (T > 0), lossy and adaptive rules
    budgets: tuple[int, ...] | None = None  # N that bare families expand over
    temperatures: tuple[float, ...] | None = None  # recorded temperatures to use (None: each policy's usable ones)
    multi_draft: str = "iid"  # how sampling trees draw a node's candidates: "iid" or "swor"
    cost_profile: object = None  # a `specsim profile` JSON (checked against the cache's models) or a `ProfileCost`
    #                              (`load_cost_profile(path, extrapolate=True)` prices past what it measured):
    #                              measured `speedup` and `tokens_per_s` columns
    cost: str | None = None  # an assumed "c=RATIO" instead (`speedup_assumed`, an assumption); neither: no speed
    batches: tuple[int, ...] = ()  # extra rows at these batch sizes from the batch timeline (needs a profile)
    batching: str = "lockstep"  # how the batch timeline shares steps: "lockstep" or "continuous"
    by_category: bool = True  # rows per prompt category after the "all" row
    n_boot: int = 1000  # bootstrap resamples over prompts for the 95% CIs (0: none)
    samples: int = 64  # Monte-Carlo samples per position where an estimator needs them (swor trees)
    seed: int = 0  # of the bootstrap and every Monte-Carlo stream
    top_k: int = 16  # candidates per position kept when deriving features from logits
    unpriced: str = "skip"  # a tree the profile cannot price: "skip" it, or "keep" it without speed columns
    block_positions: int | None = None  # positions replayed at once (memory; None: BLOCK_POSITIONS)
    fit_positions: int | None = None  # positions of random trajectories trees fitted on the cache see (None:
    #                                   FIT_POSITIONS)
    workers: int = 1  # processes replaying blocks at once (rows do not depend on it; scripts need a __main__ guard)

    def __post_init__(self) -> None:
        for name in ("trees", "policies"):
            object.__setattr__(self, name, _strings(getattr(self, name)) or ())
        object.__setattr__(self, "drafts", _strings(self.drafts))
        if self.budgets is not None:
            object.__setattr__(self, "budgets", tuple(self.budgets))
        if self.temperatures is not None:
            t = self.temperatures
            object.__setattr__(self, "temperatures", (t,) if np.isscalar(t) else tuple(t))
        object.__setattr__(self, "batches", tuple(self.batches or ()))


def simulate(cache, trees=(), *, progress: bool = False, on_skip: Callable[[str], None] | None = None,
             **options) -> pl.DataFrame:
    """The rows of a sweep of `cache`: one per configuration (x batch size) and category ("all" first).
    `options` are `SweepConfig`'s fields (`specsim.SweepConfig` says what each means)."""
    return sweep(cache, SweepConfig(trees=trees, **options), progress=progress, on_skip=on_skip).rows


@on_one_blas_thread
def sweep(cache, config: SweepConfig, *, progress: bool = False,
          on_skip: Callable[[str], None] | None = None) -> Sweep:
    """Simulate every configuration of `config` on `cache` (a file written by `specsim cache`).

    on_skip: receives the line of each configuration that cannot run (default: printed to stderr).
    progress: a progress bar over the configurations.

    Memory: the cache is replayed a block of trajectories at a time (`block_positions`), so it stays
    bounded in the number of positions; trees fitted on the cache (optimal:N) are fitted on at most
    `fit_positions` positions of randomly chosen trajectories. Batch timelines and model-free drafts
    (suffix decoding's tree spans requests) replay in one piece.
    """
    from tqdm.auto import tqdm

    c = config
    trees, drafts, policies, budgets, temperatures = c.trees, c.drafts, c.policies, c.budgets, c.temperatures
    multi_draft, cost_profile, cost, batches, batching = c.multi_draft, c.cost_profile, c.cost, c.batches, c.batching
    by_category, n_boot, samples, seed, top_k = c.by_category, c.n_boot, c.samples, c.seed, c.top_k
    unpriced, block_positions, fit_positions, workers = c.unpriced, c.block_positions, c.fit_positions, c.workers
    if cost is not None and cost_profile is not None:
        raise ArgumentError("give a measured {cost_profile} or an assumed {cost}, not both")
    if isinstance(n_boot, bool) or not 0 <= int(n_boot) <= MAX_BOOT:
        raise ArgumentError("{n_boot} {value}: use 0 (no CIs) to {most} bootstrap resamples", value=n_boot, most=MAX_BOOT)
    if isinstance(seed, bool) or int(seed) < 0:
        raise ArgumentError("{seed} {value}: seeds are non-negative integers", value=seed)
    if isinstance(workers, bool) or int(workers) < 1:
        raise ArgumentError("{workers} {value}: use 1 or more processes", value=workers)
    workers = int(workers)
    cost_model = (cost_profile if isinstance(cost_profile, ProfileCost) else load_cost_profile(cost_profile)
                  if cost_profile is not None else parse_cost(cost) if cost is not None else None)
    batches = sorted({int(b) for b in (batches or ())})
    if batches and (cost_model is None or not cost_model.measured):
        raise ArgumentError("{batches}: batch sizes need measured costs: give {cost_profile} (a profile measured at them)")
    if batches:
        cost_model.plain_s(np.array(batches), cost_model.contexts[0])  # refuses a batch beyond its range
    if any(b < 1 for b in batches):
        raise ArgumentError("{batches} {value}: batch sizes are at least 1", value=batches)
    if batching not in BATCHING:
        raise ArgumentError("{batching} {value!r} is not one of {known}", value=batching, known=", ".join(BATCHING))
    if unpriced not in ("skip", "keep"):
        raise ArgumentError("{unpriced}={value!r}: use 'skip' or 'keep'", value=unpriced)
    specs = expand_trees(list(trees), budgets)
    fixed = {s: resolve_tree(s) for s in specs if not needs_fit(s)}  # spec errors before any work
    pols = [parse_policy(p, multi_draft=multi_draft, samples=samples) for p in policies]
    if not pols:
        raise ArgumentError("give at least one policy in {policies}, e.g. greedy")
    if on_skip is None:
        on_skip = lambda line: print(line, file=sys.stderr)  # noqa: E731
    skipped: list[str] = []
    with CacheReader(cache) as reader:
        drafts = list(reader.spec.drafts if drafts is None else drafts)
        for d in drafts:
            if d not in reader.spec.drafts and not is_model_free(d):
                raise CacheError(f"{reader.path}: no draft named {d!r}; recorded drafts: "
                                 f"{', '.join(reader.spec.drafts)}; model-free: {model_free_help()}")
        if not drafts:
            raise CacheError.naming("{path}: records no draft; name a model-free one in {drafts} (e.g. ngram:3)",
                                   path=reader.path)
        pricing = {d: Pricing.for_draft(cost_model, reader, d) for d in drafts}  # refuses a mismatched profile
        plan = _temperature_plan(reader, pols, temperatures)
        n_configs = len(plan) * len(drafts) * len(specs)
        rows: list[dict] = []
        requests: list[pl.DataFrame] = []
        bar = tqdm(total=n_configs, unit="config", desc="simulating", disable=not progress, dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| {n:.1f}/{total} configurations [{elapsed}<{remaining}]")
        try:
            for T in sorted({t for t, _ in plan}):
                for draft in drafts:
                    source = feature_source(reader, draft, T, top_k=top_k, progress=progress)
                    found, asked = replay(source, [p for t, p in plan if t == T], specs, fixed,
                                          pricing[draft].at_temperature(T), reader,
                                          batches=batches, batching=batching, n_boot=n_boot, seed=seed,
                                          unpriced=unpriced, by_category=by_category, skipped=skipped,
                                          block_positions=block_positions, fit_positions=fit_positions,
                                          workers=workers, bar=bar)
                    rows += found
                    requests += asked
        finally:
            bar.close()
    for line in skipped:
        on_skip(line)
    if not rows:
        raise SpecError("no configuration of the sweep can run: " + "; ".join(
            line.removeprefix("skipped ") for line in skipped[:3]) + ("; ..." if len(skipped) > 3 else ""))
    return Sweep(rows=finish_columns(pl.DataFrame(rows, infer_schema_length=None), cost_model),
                 requests=pl.concat(requests) if requests else pl.DataFrame())

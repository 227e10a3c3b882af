"""The hardware-aware choice: for each batch size, the draft tree and budget with the best speedup.

Serving engines pick the number of speculative tokens per batch size (verification
leaves the memory-bound regime as the batch grows, so the best budget shrinks). Given
candidate trees (the optimiser's best tree for every budget up to a maximum, which
never decodes worse than a chain or k-ary tree of the same budget), each is priced by
the cost model at every batch size (`speed_of`: batch 1 is the exact
walk, larger batches the batch timeline) and the best by speedup is kept per batch.
numpy only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specsim.errors import SpecError
from specsim.sim.features import Features
from specsim.sim.metrics import summarize_many
from specsim.sim.pricing import Pricing, priced_walk
from specsim.sim.replay import on_one_blas_thread
from specsim.sim.rows import BATCH_BOOT
from specsim.specs import PolicySpec
from specsim.trees import Tree


@dataclass(frozen=True)
class Speed:
    """One tree's speed at one batch size, from the cost model."""

    batch: int  # requests per step
    tokens_per_call: float  # on the cached trajectories
    speedup: tuple[float, float, float]  # value, 95% CI low, high (batch 1: bootstrap over prompts)
    tokens_per_s: float | None  # measured costs only
    exact: bool  # False: Monte-Carlo (sampling trees, or sampled acceptance in a batch timeline)


def speed_of(features: Features, tree: Tree, policy: PolicySpec, pricing: Pricing, *, batch: int = 1,
             batching: str = "lockstep", n_boot: int = 1000, seed: int = 0) -> Speed:
    """The speedup of decoding the cached trajectories with `tree` at `batch`, priced by `pricing`."""
    from specsim.sim.batch import simulate_batch

    label = f"{features.draft}|{features.temperature:g}|{policy.label}|{policy.multi_draft}|{tree.name}"
    rng = np.random.default_rng([seed, zlib.crc32(label.encode())])
    stats, table = priced_walk(features, tree, policy, pricing, rng)
    if table is None:
        raise SpecError(f"{policy.label} is not a fixed tree; speed_of prices fixed trees")
    row = summarize_many([stats], features, by_category=False, n_boot=n_boot, seed=seed)[0][0]
    if batch == 1:
        return Speed(batch=1, tokens_per_call=row["tokens_per_call"],
                     speedup=(row["speedup"], row["speedup_lo"], row["speedup_hi"]),
                     tokens_per_s=row["tokens_per_s"] if pricing.model.measured else None, exact=stats.exact)
    est = simulate_batch(table, features, tree, pricing.model, pricing.draft_key, batch=batch, batching=batching,
                         n_boot=min(n_boot, BATCH_BOOT), seed=seed)
    return Speed(batch=batch, tokens_per_call=row["tokens_per_call"], speedup=est.speedup,
                 tokens_per_s=est.tokens_per_s[0], exact=stats.exact and est.exact)


@dataclass(frozen=True)
class Choice:
    """The best candidate at one batch size, and what it was chosen among."""

    batch: int  # requests per step
    tree: Tree  # the winner
    speed: Speed  # its speed
    candidates: int  # trees compared
    plain_wins: bool  # True when even the best speculative tree is slower than plain decoding


@on_one_blas_thread
def best_per_batch(features, trees: Sequence[Tree], policy, pricing: Pricing, batches: Sequence[int], *,
                   batching: str = "lockstep", n_boot: int = 1000, seed: int = 0) -> list[Choice]:
    """For each batch size, the tree of `trees` with the highest speedup (its CI alongside).

    Trees the cost model refuses to price (beyond the profile's measured range) are left out;
    `Choice.candidates` counts those that were compared.
    """
    from specsim.errors import SpecError

    out = []
    for batch in batches:
        scored, refused = [], []
        for t in trees:  # a tree the profile cannot price (beyond its measured range) is not a candidate
            try:
                scored.append((speed_of(features, t, policy, pricing, batch=batch, batching=batching,
                                        n_boot=n_boot, seed=seed), t))
            except SpecError as exc:
                refused.append(f"{t.name}: {exc}")
        if not scored:
            raise SpecError(f"no candidate tree can be priced at batch {batch}: {refused[0]}")
        speed, tree = max(scored, key=lambda st: st[0].speedup[0])
        out.append(Choice(batch=batch, tree=tree, speed=speed, candidates=len(scored),
                          plain_wins=speed.speedup[0] < 1.0))
    return out


@dataclass(frozen=True)
class Fit:
    """Optimal trees fitted on one cache's trajectories for one draft, policy and temperature."""

    features: object  # specsim.sim.features.Features
    policy: object  # specsim.sim.policies.PolicySpec
    results: list  # specsim.sim.optimize.OptimalTree per budget, ascending budgets
    what: str  # what was fitted on, for the output


@on_one_blas_thread
def fit_on_cache(cache, budgets: Sequence[int], *, draft: str | None = None, policy: str = "greedy",
                 temperature: float | None = None, multi_draft: str = "iid", max_depth: int | None = None,
                 samples: int = 64, seed: int = 0, progress: bool = False) -> Fit:
    """The optimal tree for each budget on a cache (defaults: the first recorded draft, T by policy)."""
    from pathlib import Path

    from specsim.cache.reader import CacheReader
    from specsim.errors import CacheError
    from specsim.sim.replay import FIT_POSITIONS, fit_sample
    from specsim.sim.features import feature_source
    from specsim.sim.optimize import optimal_trees
    from specsim.sim.policies import check_temperature
    from specsim.specs import parse_policy

    with CacheReader(cache) as reader:
        if draft is None:
            if not reader.spec.drafts:
                raise CacheError(f"{reader.path}: records no draft column to optimise a tree for")
            draft = reader.spec.drafts[0]
        if temperature is None:
            hot = [t for t in reader.spec.temperatures if t > 0]
            if policy == "greedy" and 0.0 not in reader.spec.temperatures:
                raise CacheError.naming("{path}: no greedy (T=0) trajectories; use {policy} sample", path=reader.path)
            if policy == "sample" and not hot:
                raise CacheError.naming("{path}: only greedy (T=0) trajectories; use {policy} greedy", path=reader.path)
            temperature = 0.0 if policy == "greedy" else hot[0]
        spec = parse_policy(policy, multi_draft=multi_draft, samples=samples)
        check_temperature(spec, float(temperature))
        source = feature_source(reader, draft, temperature, progress=progress)
        features = fit_sample(source, seed)  # every trajectory of a cache this size
        results = optimal_trees(features, list(budgets), policy=spec, max_depth=max_depth, seed=seed)
    sample = "" if features.n_traj == source.n_traj else (
        f" (a random sample of {FIT_POSITIONS:,} positions at most, of {source.n_traj})")
    what = (f"draft {draft}, policy {spec.label}" + (f" {multi_draft}" if policy == "sample" else "")
            + f", T={features.temperature:g}, {features.n_traj} trajectories{sample} of {Path(cache).name}")
    return Fit(features=features, policy=spec, results=results, what=what)


def pricing_for(cache, cost_model, draft: str, temperature: float) -> Pricing:
    """How `draft`'s calls on `cache` at `temperature` are priced (refuses a profile measured for other models)."""
    from specsim.cache.reader import CacheReader

    with CacheReader(cache) as reader:
        return Pricing.for_draft(cost_model, reader, draft).at_temperature(temperature)

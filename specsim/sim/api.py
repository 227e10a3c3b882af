"""`specsim.simulate`: replay a sweep of configurations against a cache, one polars row each.

The data path of DESIGN.md §2, end to end: cache → `Features` per (draft,
temperature) → a policy's acceptance table per (tree, policy) → the exact walk →
ratio-of-sums metrics with bootstrap CIs over prompts → rows. A sweep is the cross
product trees × budgets × drafts × policies × temperatures; features are derived
once per (draft, temperature) and kept beside the cache, so a sweep costs
vectorised array work per configuration.

Tree specs are those of `specsim.trees`, plus bare family names expanded over the
budgets: ``chain`` → chain:N, ``optimal`` → optimal:N (the best static tree on this
cache, from `specsim.sim.optimize`), ``kary:W`` → kary:W@N, the first N nodes of
the W-ary tree in breadth-first order.
numpy + polars only.
"""

from __future__ import annotations

import re
import zlib
from typing import Iterable, Sequence

import numpy as np
import polars as pl

from specsim.cache.store import CacheReader
from specsim.errors import CacheError, SpecError
from specsim.sim.cost import load_cost_profile, parse_cost
from specsim.sim.engine import AcceptanceTable, walk
from specsim.sim.features import Features, is_model_free, load_features
from specsim.sim.metrics import summarize
from specsim.sim.policies import PolicySpec, check_temperature, parse_policy, run_policy
from specsim.trees import Tree, kary, parse_tree

BUDGET_FAMILIES = ("chain", "optimal")  # bare names expanded over --budget
_KARY_BARE = re.compile(r"kary:\s*(\d+)\s*$", re.IGNORECASE)
_KARY_PREFIX = re.compile(r"kary:\s*(\d+)\s*@\s*(\d+)\s*$", re.IGNORECASE)


def kary_prefix(width: int, n: int) -> Tree:
    """The first n drafts of the `width`-ary tree in breadth-first order (named kary:W@N)."""
    if width < 1 or n < 1:
        raise SpecError(f"kary:{width}@{n}: width and budget must both be at least 1")
    depth, total = 0, 0
    while total < n:
        depth += 1
        total += width**depth if width > 1 else 1
    full = kary(f"{width},{depth}")
    return Tree(full.parents[: n + 1], full.ranks[: n + 1], name=f"kary:{width}@{n}")


def expand_trees(specs: Sequence[str], budgets: Sequence[int] | None) -> list[str]:
    """Concrete tree specs: bare families once per budget, full specs as given."""
    if isinstance(specs, str):
        specs = [specs]
    if not specs:
        raise SpecError("give at least one tree, e.g. --tree chain:4 (or --tree chain --budget 4)")
    for b in budgets or ():
        if not isinstance(b, (int, np.integer)) or b < 1:
            raise SpecError(f"budget {b!r} must be an integer >= 1")
    out: list[str] = []
    for raw in specs:
        spec = str(raw).strip()
        bare = spec.lower() in BUDGET_FAMILIES or _KARY_BARE.match(spec)
        if spec.lower() == "kary":
            raise SpecError("kary needs a width: kary:W expands over --budget, kary:W,D is the full tree")
        if bare:
            if not budgets:
                raise SpecError(f"tree family {spec!r} needs --budget N (or a full spec such as {spec}:8)"
                                if not _KARY_BARE.match(spec) else
                                f"{spec} needs --budget N (or a full tree such as {spec},3)")
            family = spec.lower() if not _KARY_BARE.match(spec) else f"kary:{_KARY_BARE.match(spec).group(1)}"
            out += [f"{family}@{b}" if family.startswith("kary") else f"{family}:{b}" for b in budgets]
        else:
            out.append(spec)
    return list(dict.fromkeys(out))


def resolve_tree(spec: str, features: Features | None = None, policy: PolicySpec | None = None) -> Tree:
    """A Tree from a concrete spec; 'optimal:N' needs the features and policy it is optimal for."""
    m = _KARY_PREFIX.match(spec)
    if m:
        return kary_prefix(int(m.group(1)), int(m.group(2)))
    optimal = None
    if features is not None:
        def optimal(n: int) -> Tree:
            try:
                from specsim.sim.optimize import optimal_tree
            except ImportError:
                raise SpecError("optimal:N needs specsim.sim.optimize, which this install does not have") from None
            return optimal_tree(features, n, policy=policy).tree
    return parse_tree(spec, optimal=optimal)


def _is_optimal(spec: str) -> bool:
    return spec.strip().lower().startswith("optimal:")


def _temperature_plan(reader: CacheReader, policies: list[PolicySpec], temperatures) -> list[tuple[float, PolicySpec]]:
    recorded = reader.spec.temperatures
    if temperatures is None:
        wanted = None
    else:
        wanted = [reader.check_temperature(float(t)) for t in ([temperatures] if np.isscalar(temperatures)
                                                                else temperatures)]
    plan = []
    for policy in policies:
        candidates = wanted if wanted is not None else [t for t in recorded if (t == 0) == (policy.name == "greedy")
                                                         or policy.name.startswith("adaptive")]
        ok = []
        for t in candidates:
            try:
                check_temperature(policy, t)
                ok.append(t)
            except SpecError:
                pass
        if not ok:
            if wanted is None and policy.name == "greedy":
                raise CacheError(f"{reader.path}: policy greedy needs greedy (T=0) trajectories; recorded: "
                                 + ", ".join(f"{t:g}" for t in recorded))
            if wanted is None:
                raise CacheError(f"{reader.path}: policy {policy.label} needs trajectories at T>0; recorded: "
                                 + ", ".join(f"{t:g}" for t in recorded))
            check_temperature(policy, candidates[0])  # raises the explanation
        plan += [(t, policy) for t in ok]
    return sorted(plan, key=lambda tp: tp[0])


def _mean_context(reader: CacheReader, features: Features) -> float:
    """Mean context length (prompt + generated so far) over the positions: the cost profile's L."""
    plen = np.array([len(reader.prompt_token_ids(int(i))) for i in features.traj_prompt], dtype=np.float64)
    n = features.traj_len.astype(np.float64)
    return float((plen * n + n * (n - 1) / 2).sum() / n.sum())


def simulate(
    cache,
    trees: Sequence[str] = (),
    drafts: Sequence[str] | None = None,
    policies: Sequence[str] = ("greedy",),
    budgets: Sequence[int] | None = None,
    temperatures: Iterable[float] | float | None = None,
    multi_draft: str = "iid",
    cost: str = "c=0.05",
    cost_profile=None,
    by_category: bool = True,
    n_boot: int = 1000,
    samples: int = 64,
    seed: int = 0,
    top_k: int = 16,
    progress: bool = False,
) -> pl.DataFrame:
    """Simulate every configuration of the sweep; one row per configuration and category ("all" first).

    trees: specs ("chain:4", "kary:2,3", "optimal:16", "file:t.json") or families expanded
    over `budgets` ("chain", "optimal", "kary:2"). drafts: recorded draft columns (default:
    all) or model-free drafts ("ngram:3", "prompt-lookup:2"). policies: "greedy" (T=0),
    "sample" (T>0; trees use `multi_draft` "iid" | "swor"), lossy and adaptive rules.
    temperatures: default, per policy, every recorded temperature it can use. cost: "c=RATIO",
    or cost_profile: a `specsim profile` JSON. samples: Monte-Carlo samples per position
    (sampling trees without replacement). n_boot, seed: the bootstrap over prompts.
    """
    from tqdm.auto import tqdm

    cost_model = load_cost_profile(cost_profile) if cost_profile is not None else parse_cost(cost)
    specs = expand_trees(list(trees) if not isinstance(trees, str) else [trees], budgets)
    fixed = {s: resolve_tree(s) for s in specs if not _is_optimal(s)}  # spec errors before any work
    pols = [parse_policy(p, multi_draft=multi_draft, samples=samples)
            for p in ([policies] if isinstance(policies, str) else policies)]
    if not pols:
        raise SpecError("give at least one policy, e.g. --policy greedy")
    with CacheReader(cache) as reader:
        if drafts is None:
            drafts = list(reader.spec.drafts)
        drafts = [drafts] if isinstance(drafts, str) else list(drafts)
        for d in drafts:
            if d not in reader.spec.drafts and not is_model_free(d):
                raise CacheError(f"{reader.path}: no draft named {d!r}; recorded drafts: "
                                 f"{', '.join(reader.spec.drafts)}; model-free: ngram:N, prompt-lookup:N")
        if not drafts:
            raise CacheError(f"{reader.path}: records no draft; name a model-free one (--draft ngram:3)")
        plan = _temperature_plan(reader, pols, temperatures)
        n_configs = len(plan) * len(drafts) * len(specs)
        rows: list[dict] = []
        bar = tqdm(total=n_configs, unit="config", desc="simulating", disable=not progress, dynamic_ncols=True)
        try:
            for T in sorted({t for t, _ in plan}):
                for draft in drafts:
                    features = load_features(reader, draft, T, top_k=top_k, progress=progress)
                    context = _mean_context(reader, features)
                    for _, policy in [tp for tp in plan if tp[0] == T]:
                        for spec in specs:
                            tree = fixed.get(spec) or resolve_tree(spec, features, policy)
                            rows += _configuration(features, tree, policy, cost_model, context, reader,
                                                   by_category=by_category, n_boot=n_boot, seed=seed)
                            bar.update()
        finally:
            bar.close()
    return pl.DataFrame(rows, infer_schema_length=None)


def _configuration(features: Features, tree: Tree, policy: PolicySpec, cost_model, context: float,
                   reader: CacheReader, *, by_category: bool, n_boot: int, seed: int) -> list[dict]:
    label = f"{features.draft}|{features.temperature:g}|{policy.label}|{policy.multi_draft}|{tree.name}"
    rng = np.random.default_rng([seed, zlib.crc32(label.encode())])  # reproducible per configuration
    call_cost = cost_model.call_cost(tree, context=context, model_draft=not features.model_free)
    result = run_policy(features, tree, policy, rng, cost_model)
    stats = walk(result, features, call_cost) if isinstance(result, AcceptanceTable) else result
    storage = reader.spec.storage
    greedy_exact_tail = policy.name == "greedy" and (not tree.budget or int(tree.ranks.max()) < reader.spec.top_k)
    approximate = (not policy.lossless) or (
        not features.exact_tail and not features.model_free and not greedy_exact_tail)
    sampling_tree = policy.name != "greedy" and tree.budget and int(tree.n_children.max()) > 1
    config = {
        "tree": tree.name, "budget": tree.budget, "depth": tree.max_depth, "draft": features.draft,
        "target": features.models["target"], "policy": policy.label, "temperature": features.temperature,
        "multi_draft": policy.multi_draft if sampling_tree else None,
        "estimate": "exact" if stats.exact else "monte-carlo",
    }
    tail = {
        "lossless": policy.lossless, "storage": storage + (f":{reader.spec.top_k}" if storage == "topk" else ""),
        "approximate": bool(approximate), "cost_model": cost_model.describe(), "context": round(context, 1),
        "cache": str(reader.path), "n_boot": n_boot, "seed": seed,
        "samples": policy.samples if not stats.exact else None,
        **dict(stats.extra or {}),
    }
    return [{**config, **row, **tail} for row in summarize(stats, features, by_category=by_category,
                                                           n_boot=n_boot, seed=seed)]

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
import sys
import zlib
from typing import Callable, Iterable, Sequence

import numpy as np
import polars as pl

from specsim.cache.store import CacheReader
from specsim.errors import CacheError, SpecError
from specsim.sim.cost import load_cost_profile, parse_cost
from specsim.sim.engine import AcceptanceTable, TrajectoryStats, walk
from specsim.sim.features import Features, is_model_free, load_features
from specsim.sim.metrics import summarize_many
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
    on_skip: Callable[[str], None] | None = None,
) -> pl.DataFrame:
    """Simulate every configuration of the sweep; one row per configuration and category ("all" first).

    trees: specs ("chain:4", "kary:2,3", "optimal:16", "file:t.json") or families expanded
    over `budgets` ("chain", "optimal", "kary:2"). drafts: recorded draft columns (default:
    all) or model-free drafts ("ngram:3", "prompt-lookup:2"). policies: "greedy" (T=0),
    "sample" (T>0; trees use `multi_draft` "iid" | "swor"), lossy and adaptive rules.
    temperatures: default, per policy, every recorded temperature it can use. cost: "c=RATIO",
    or cost_profile: a `specsim profile` JSON. samples: Monte-Carlo samples per position
    (sampling trees without replacement). n_boot, seed: the bootstrap over prompts.

    A combination of the cross product that cannot run (an adaptive rule on a branching
    tree, a p-vs-q rule with a model-free draft, ...) is skipped: `on_skip` receives one
    line saying which and why (default: printed to stderr). SpecError only when nothing
    is left to run.
    """
    from tqdm.auto import tqdm

    cost_model = load_cost_profile(cost_profile) if cost_profile is not None else parse_cost(cost)
    specs = expand_trees(list(trees) if not isinstance(trees, str) else [trees], budgets)
    fixed = {s: resolve_tree(s) for s in specs if not _is_optimal(s)}  # spec errors before any work
    pols = [parse_policy(p, multi_draft=multi_draft, samples=samples)
            for p in ([policies] if isinstance(policies, str) else policies)]
    if not pols:
        raise SpecError("give at least one policy, e.g. --policy greedy")
    if on_skip is None:
        on_skip = lambda line: print(line, file=sys.stderr)  # noqa: E731
    skipped: list[str] = []
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
                        runs: list[tuple[dict, TrajectoryStats]] = []
                        trees_here = _trees_for(features, policy, specs, fixed, skipped)
                        _warm_candidates(features, policy, [t for t in trees_here.values() if t is not None], seed)
                        for spec in specs:
                            tree = trees_here[spec]
                            if tree is not None:
                                try:
                                    runs.append(_configuration(features, tree, policy, cost_model, context, reader,
                                                               n_boot=n_boot, seed=seed))
                                except SpecError as exc:
                                    skipped.append(_skip_line(features, policy, spec, exc))
                            bar.update()
                        rows += _rows(runs, features, by_category=by_category, n_boot=n_boot, seed=seed)
        finally:
            bar.close()
    for line in skipped:
        on_skip(line)
    if not rows:
        raise SpecError("no configuration of the sweep can run: " + "; ".join(
            line.removeprefix("skipped ") for line in skipped[:3]) + ("; ..." if len(skipped) > 3 else ""))
    return pl.DataFrame(rows, infer_schema_length=None)


def _skip_line(features: Features, policy: PolicySpec, spec: str, exc: Exception) -> str:
    return (f"skipped {spec} x {features.draft} x {policy.label} at T={features.temperature:g}: {exc}")


def _trees_for(features: Features, policy: PolicySpec, specs: list[str], fixed: dict[str, Tree],
               skipped: list[str]) -> dict[str, Tree | None]:
    """Every spec's tree for one (features, policy); optimal:N for all budgets from one fit."""
    out: dict[str, Tree | None] = {s: fixed[s] for s in specs if s in fixed}
    wanted = [s for s in specs if s not in fixed]
    if wanted:
        budgets = [int(s.split(":", 1)[1]) for s in wanted]
        try:
            from specsim.sim.optimize import optimal_trees

            fitted = optimal_trees(features, budgets, policy=policy)
        except SpecError as exc:
            for s in wanted:
                skipped.append(_skip_line(features, policy, s, exc))
                out[s] = None
        else:
            out.update({s: f.tree for s, f in zip(wanted, fitted)})
    return out


def _warm_candidates(features: Features, policy: PolicySpec, trees: list[Tree], seed: int) -> None:
    """Estimate sampling trees' candidate acceptance once, at the widest fan-out of the sweep.

    `multidraft.candidate_acceptance` keeps its last estimate and serves any narrower tree
    from it; estimating the widest first means one stream of the distributions per sweep.
    """
    if policy.name != "sample" or features.model_free or features.temperature <= 0:
        return
    width = max([int(t.n_children.max()) for t in trees if t.budget] or [1])
    if width <= 1:
        return
    from specsim.sim.multidraft import candidate_acceptance

    label = f"{features.draft}|{features.temperature:g}|{policy.multi_draft}|warm"
    candidate_acceptance(features, width, scheme=policy.multi_draft, samples=policy.samples,
                         rng=np.random.default_rng([seed, zlib.crc32(label.encode())]))


def _configuration(features: Features, tree: Tree, policy: PolicySpec, cost_model, context: float,
                   reader: CacheReader, *, n_boot: int, seed: int) -> tuple[dict, TrajectoryStats]:
    """The row's description columns and the walk's totals of one configuration."""
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
    return {"config": config, "tail": tail}, stats


def _rows(runs: list[tuple[dict, TrajectoryStats]], features: Features, *, by_category: bool, n_boot: int,
          seed: int) -> list[dict]:
    """Rows of several configurations on the same trajectories: one bootstrap product per group."""
    summaries = summarize_many([stats for _, stats in runs], features, by_category=by_category, n_boot=n_boot,
                               seed=seed)
    return [{**head["config"], **row, **head["tail"]} for (head, _), rows in zip(runs, summaries) for row in rows]

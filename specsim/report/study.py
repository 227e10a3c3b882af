"""The draft-strategy study: every simulation a report needs, as polars tables.

One study answers, for each cache (a target with its recorded drafts), which
draft-tree shape buys the most tokens per target call at each draft-token budget.
It sweeps tree families (chain; the first N nodes of the binary tree; the top path
branching with halving widths; the data-optimal static tree of Sequoia / docs/design.md
§2; model-free n-gram and prompt-lookup drafts) over budgets, at every recorded
temperature (greedy at T=0, speculative sampling at T>0), through
`specsim.simulate`. Beside the simulation it computes the closed form of
Leviathan et al. (2023) at the measured per-token acceptance α:

    E[tokens/call] = (1 − α^{γ+1}) / (1 − α),
    improvement    = (1 − α^{γ+1}) / ((1 − α)(γc + 1)),

so a report can show where i.i.d. acceptance is a fair model of real drafts and
where it is not. numpy + polars only; the attention table, when given, is read
as written by `specsim bench-attention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import polars as pl

from specsim.cache.provenance import shared_prompts, training_summary
from specsim.cache.reader import CacheReader
from specsim.errors import CacheError, SpecError
from specsim.sim.replay import BLOCK_POSITIONS, fit_sample
from specsim.sim.features import feature_source
from specsim.specs import is_head_draft, is_model_free, tree_family
from specsim.trees import Tree, draw_tree

ALL = "all"  # category label of the rows over every prompt (specsim.sim.metrics.ALL)


@dataclass(frozen=True)
class StudyConfig:
    """What a report simulates; the defaults keep the demo cache under ~2 minutes on 2 CPU cores."""

    budgets: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # draft tokens per call (tree nodes below the root)
    families: tuple[str, ...] = ("chain", "kary:2", "widths", "optimal")  # tree families for model drafts, greedy
    # families at T>0: a branching sampling tree streams every full distribution of the cache once per
    # configuration (minutes at a 49k vocabulary), so the default keeps to chains and the optimal tree
    sample_families: tuple[str, ...] = ("chain", "optimal")
    model_free: tuple[str, ...] = ("ngram:3", "prompt-lookup:2", "suffix")  # drafts that need no model (chains, T=0)
    draw_budgets: tuple[int, ...] = (4, 8, 16)  # budgets whose data-optimal trees are drawn (T=0)
    sample_draw_budgets: tuple[int, ...] = (4, 16)  # the same at T>0, where each fit streams the distributions
    multi_draft: str = "iid"  # candidate drawing of sampling trees: "iid" (SpecInfer) or "swor"
    samples: int = 64  # Monte-Carlo samples per position where an estimator needs them
    cost: str | None = None  # an ASSUMED draft/target step cost ratio ("c=0.1") for caches without a profile
    batches: tuple[int, ...] = (1, 4, 16)  # batch sizes of the batch analysis (those a cache's profile measured)
    batching: str = "lockstep"  # how batches run in the batch analysis
    grid_alphas: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)  # acceptance rates of the theory grid
    grid_costs: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)  # draft cost ratios c of the theory grid
    grid_gammas: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10)  # draft lengths γ of the theory grid
    n_boot: int = 1000  # bootstrap resamples over prompts for the 95% intervals
    seed: int = 0  # bootstrap and Monte-Carlo seed
    bound_candidates: int = 4  # the verifier bound's table: nodes with 1..this many candidates (T>0, full)
    bound_samples: int = 4096  # Monte-Carlo tuples per position of that table's without-replacement rows (j >= 3)


@dataclass(frozen=True)
class DrawnTree:
    """A tree shape shown in the report."""

    label: str  # "chain:8", "optimal:16 for int8 → smollm2-135m, T=0"
    family: str  # family name as in the results' `family` column
    budget: int  # draft tokens
    drawing: str  # `draw_tree` text
    note: str = ""  # where it came from (for data-optimal trees: the fit and its expected tokens/call)


@dataclass(frozen=True)
class Study:
    """Everything a report draws: tables, drawn trees and notes about what was skipped."""

    config: StudyConfig  # what was simulated
    setup: pl.DataFrame  # one row per cache × temperature: models, prompts, positions, storage
    categories: pl.DataFrame  # one row per cache × temperature × category: prompts and positions
    results: pl.DataFrame  # `specsim.simulate` rows of every configuration, plus cache_name, pair, family
    theory: pl.DataFrame  # chains: simulated tokens/call vs Leviathan's closed form at the measured α
    grid: pl.DataFrame  # Leviathan's improvement over α × c × γ
    trees: tuple[DrawnTree, ...]  # shapes drawn in the report
    cost_basis: dict[str, str]  # cache name -> what its speedups rest on (measured profile, assumption, none)
    batch: pl.DataFrame = field(default_factory=pl.DataFrame)  # best tree per batch size (measured costs only)
    attention: pl.DataFrame | None = None  # a `bench-attention` table, when given
    notes: tuple[str, ...] = field(default=())  # configurations skipped and why
    bound: pl.DataFrame = field(default_factory=pl.DataFrame)  # per node with j i.i.d. candidates: SpecInfer's
    #                                                            acceptance vs the optimal verifier's (full caches, T>0)
    heads: pl.DataFrame = field(default_factory=pl.DataFrame)  # per head draft of a cache: how it was trained and
    #                                                            on how many of the cache's prompts (None: unknown)
    verification: pl.DataFrame = field(default_factory=pl.DataFrame)  # token-wise and block verification rows of
    #                                          chains, on caches that recorded the target along the proposals (T>0)

    @property
    def measured(self) -> bool:
        return "speedup" in self.results.columns

    @property
    def assumed(self) -> bool:
        return "speedup_assumed" in self.results.columns


# -- Leviathan et al. (2023) ------------------------------------------------------------------


def leviathan_tokens(alpha, gamma):
    """Expected tokens per call of a γ-token chain with i.i.d. acceptance α: (1 − α^{γ+1}) / (1 − α)."""
    alpha, gamma = np.asarray(alpha, dtype=np.float64), np.asarray(gamma, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return np.where(alpha >= 1, gamma + 1, out)


def leviathan_improvement(alpha, gamma, c):
    """Walltime improvement factor (1 − α^{γ+1}) / ((1 − α)(γc + 1))."""
    return leviathan_tokens(alpha, gamma) / (np.asarray(gamma, dtype=np.float64) * c + 1)


def speedup_grid(alphas: Sequence[float], costs: Sequence[float], gammas: Sequence[int]) -> pl.DataFrame:
    """The classic analysis table: improvement for every α × c × γ, with the best γ per (α, c) flagged.

    Exact ties (α = 0.5, c = 0.2: γ = 1 and 2 both give 1.25) flag the shorter draft.
    """
    a, c, g = (x.ravel() for x in np.meshgrid(alphas, costs, gammas, indexing="ij"))
    table = pl.DataFrame({
        "alpha": a, "c": c, "gamma": g.astype(np.int64),
        "tokens_per_call": leviathan_tokens(a, g), "improvement": leviathan_improvement(a, g, c),
    })
    at_max = pl.col("improvement") >= pl.col("improvement").max().over("alpha", "c") - 1e-12
    first = pl.when(at_max).then(pl.col("gamma")).min().over("alpha", "c")  # ties: the shorter draft is cheaper
    return table.with_columns((pl.col("gamma") == first).alias("best_gamma"))


# -- tree families ----------------------------------------------------------------------------


def widths_spec(budget: int) -> str:
    """The top path branching with halving widths: 8 → widths:4,2,1,1."""
    widths, rest = [], int(budget)
    while rest:
        widths.append(math.ceil(rest / 2))
        rest -= widths[-1]
    return "widths:" + ",".join(map(str, widths))


def family_of(tree: str, draft: str = "") -> str:
    """The family a simulated tree belongs to: chain:4 → chain, kary:2@8 → kary:2, widths:4,2 → widths.

    Model-free drafts are families of their own (their chains are n-gram proposals); their
    rows share the pair label "model-free → TARGET".
    """
    return draft if is_model_free(draft) else tree_family(tree)


def _dynamic_args(expansion, budgets: Sequence[int]) -> list[str]:
    """EAGLE-2 trees at the report's budgets (verified draft tokens), when the cache recorded an expansion."""
    if expansion is None:
        return []
    return [f"dynamic:topk={expansion.topk},depth={expansion.depth},tokens={b}" for b in budgets
            if b <= expansion.candidates]


def _tree_args(families: Sequence[str], budgets: Sequence[int]) -> list[str]:
    """Tree arguments for `simulate`: bare families it expands, explicit widths specs."""
    out: list[str] = []
    for fam in families:
        out += [widths_spec(b) for b in budgets] if fam == "widths" else [fam]
    return out


# -- setup ------------------------------------------------------------------------------------


def short_name(name: str) -> str:
    """A model name for labels: a path becomes its last component."""
    name = str(name)
    return Path(name).name if ("/" in name and Path(name).exists()) else name


def setup_tables(reader: CacheReader) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(one row per temperature, one row per temperature × category) from a cache's metadata."""
    run, spec = reader.run, reader.spec
    drafts_meta = run.drafts
    draft_text = ", ".join(f"{d} ({_describe(drafts_meta.get(d))})".replace(" ()", "") for d in spec.drafts)
    traj = reader.trajectories
    rows, cats = [], []
    for T in spec.temperatures:
        sub = traj.filter((pl.col("temperature") - T).abs() < 1e-6)
        rows.append({
            "cache": reader.path.name, "target": short_name(run.target_name),
            "target_info": _describe(run.target), "drafts": draft_text,
            "temperature": float(T), "policy": "greedy" if T == 0 else "sample",
            "prompts": int(sub["prompt_index"].n_unique()), "trajectories": sub.height,
            "positions": int(sub["length"].sum()),
            "categories": int(sub["category"].n_unique()),
            "max_new_tokens": run.setting("max_new_tokens"),
            "storage": spec.storage + (f" (top-{spec.top_k})" if spec.storage == "topk" else ""),
            "dtype": run.setting("dtype"), "device": run.device, "vocab": spec.vocab_size,
            "created": run.created,
        })
        for (cat,), g in sorted(sub.group_by("category"), key=lambda kv: str(kv[0][0])):
            cats.append({"cache": reader.path.name, "temperature": float(T), "category": cat,
                         "prompts": int(g["prompt_index"].n_unique()), "positions": int(g["length"].sum())})
    return pl.DataFrame(rows), pl.DataFrame(cats, schema={"cache": pl.String, "temperature": pl.Float64,
                                                          "category": pl.String, "prompts": pl.Int64,
                                                          "positions": pl.Int64})


def _describe(info) -> str:
    """'135M params, derived from smollm2-135m' from a model's recorded info."""
    if not isinstance(info, Mapping) or not info:
        return ""
    parts = [f"{info['params'] / 1e6:.0f}M params"] if isinstance(info.get("params"), (int, float)) else []
    if info.get("source") == "derived":
        parts.append(f"derived from {short_name(info.get('derived_from', 'the target'))}")
    elif info.get("source"):
        parts.append(str(info["source"]))
    trained = training_summary(info) if info.get("source") == "heads" else ""  # how, from its checkpoint
    if trained:
        parts.append(trained)
    return ", ".join(parts)


# -- the study --------------------------------------------------------------------------------


def _label_rows(table: pl.DataFrame, cache_name: str) -> pl.DataFrame:
    if table.is_empty():
        return table
    fam = [family_of(t, d) for t, d in zip(table["tree"].to_list(), table["draft"].to_list())]
    target = [short_name(t) for t in table["target"].to_list()]
    return table.with_columns(
        pl.lit(cache_name).alias("cache_name"),
        pl.Series("family", fam, dtype=pl.String),
        pl.Series("pair", [f"{'model-free' if is_model_free(d) else d} → {t}"
                           for d, t in zip(table["draft"].to_list(), target)], dtype=pl.String),
    )


def _simulate(cache: Path, notes: list[str], **kwargs) -> pl.DataFrame:
    from specsim.sim.sweep import simulate

    try:
        return simulate(cache, **kwargs)
    except SpecError as exc:
        if kwargs.get("drafts") and all(is_model_free(d) for d in kwargs["drafts"]):
            notes.append(f"{cache.name}: model-free drafts {', '.join(kwargs['drafts'])} skipped ({exc})")
            return pl.DataFrame()
        raise


def _concat(tables: list[pl.DataFrame]) -> pl.DataFrame:
    tables = [t for t in tables if not t.is_empty()]
    return pl.concat(tables, how="diagonal_relaxed") if tables else pl.DataFrame()


def run_study(
    caches: Sequence[str | Path],
    config: StudyConfig = StudyConfig(),
    *,
    cost_profiles: Sequence[str | Path] = (),
    attention: pl.DataFrame | None = None,
    progress: bool = True,
) -> Study:
    """Simulate every configuration the report draws, on every cache.

    cost_profiles: `specsim profile` JSONs; each cache uses the one measured for its target
    (measured speedups and the batch analysis). A cache without one uses config.cost (an
    assumption, labelled so) or has no speedups.
    """
    from tqdm.auto import tqdm

    from specsim.sim.choose import best_per_batch, pricing_for
    from specsim.sim.cost import load_cost_profile, parse_cost
    from specsim.sim.optimize import optimal_tree, optimal_trees
    from specsim.specs import parse_policy

    if not caches:
        raise CacheError("give at least one cache file (recorded with `specsim cache`)")
    profiles = [load_cost_profile(p) for p in cost_profiles]
    assumed = parse_cost(config.cost) if config.cost is not None else None
    paths = [Path(c) for c in caches]
    names = [p.name for p in paths]
    if len(set(names)) != len(names):
        raise CacheError(f"two caches share the file name {next(n for n in names if names.count(n) > 1)!r}; "
                         "rename one so the report can tell them apart")
    common = dict(budgets=list(config.budgets), multi_draft=config.multi_draft, samples=config.samples,
                  by_category=True, n_boot=config.n_boot, seed=config.seed, unpriced="keep")
    setups, cats, results, theory, drawn, notes, batch_rows, bound_rows = [], [], [], [], [], [], [], []
    verification = []  # token-wise vs block verification, where the target along the proposals was recorded
    head_rows: list[dict] = []
    steps = []  # (cache, kind, T) in the order run, for one progress bar
    expansions: dict = {}  # cache -> its recorded draft expansion (dynamic trees), or None
    proposals: dict = {}  # cache -> how deep it recorded the target along the drafts' proposals, or None
    priced: dict[Path, dict] = {}
    basis: dict[str, str] = {}
    for path in paths:
        with CacheReader(path) as reader:
            s, c = setup_tables(reader)
            setups.append(s)
            cats.append(c)
            profile = _profile_for(reader, profiles)
            priced[path] = ({"cost_profile": profile.path} if profile is not None else
                            {"cost": config.cost} if assumed is not None else {})
            basis[path.name] = (profile.describe() if profile is not None else
                                assumed.describe() if assumed is not None else "none: no cost profile for this "
                                f"target ({short_name(reader.run.target_name)}); run `specsim profile`")
            rows, overlaps = _heads(reader, path.name)
            head_rows += rows
            notes.extend(f"{path.name}: {o.line().removeprefix('warning: ')}" for o in overlaps)
            if profiles and profile is None:
                notes.append(f"{path.name}: none of the cost profiles measured its target "
                             f"{short_name(reader.run.target_name)}; its speedups are "
                             + ("ASSUMED" if assumed is not None else "omitted"))
            recorded = set(reader.trajectories["temperature"].to_list())
            stats = reader.spec.stats
            expansions[path] = stats.expansion if stats is not None and stats.expand is not None else None
            proposals[path] = stats.expand_target[0] if stats is not None and stats.expand_target else None
            for T in reader.spec.temperatures:
                if any(abs(T - t) < 1e-6 for t in recorded):
                    steps.append((path, reader.spec.drafts, T))
                else:  # a recording still running, or interrupted before this temperature
                    notes.append(f"{path.name}: no committed trajectories at T={T:g} yet; that temperature is skipped")
    if not steps:
        raise CacheError(f"{', '.join(names)}: no committed trajectories to simulate; record some with `specsim cache`")
    bar = tqdm(total=len(steps), desc="report: simulating", unit="temperature", disable=not progress,
               dynamic_ncols=True)
    try:
        for path, drafts, T in steps:
            bar.set_postfix_str(f"{path.name} T={T:g}")
            policy = "greedy" if T == 0 else "sample"
            families = config.families if T == 0 else config.sample_families
            parts = []
            if drafts:
                parts.append(_simulate(path, notes, trees=_tree_args(families, config.budgets)
                                       + _dynamic_args(expansions[path], config.budgets),
                                       drafts=list(drafts), policies=[policy], temperatures=[T], **common,
                                       **priced[path]))
            if config.model_free and T == 0:
                parts.append(_simulate(path, notes, trees=["chain"], drafts=list(config.model_free),
                                       policies=[policy], temperatures=[T], **common, **priced[path]))
            table = _label_rows(_concat(parts), path.name)
            results.append(table)
            model_drafts = [d for d in drafts if not is_head_draft(d)]
            chains = [b for b in config.budgets if proposals[path] and b <= proposals[path]]
            if T > 0 and model_drafts and chains:
                verification.append(_label_rows(_simulate(
                    path, notes, trees=[f"chain:{b}" for b in chains], drafts=model_drafts,
                    policies=["sample", "block"], temperatures=[T], **{**common, "by_category": False},
                    **priced[path]), path.name))
            if "cost_profile" in priced[path] and "cost_basis" in table.columns:
                beyond = table.filter(pl.col("cost_basis").str.starts_with("none"))
                if not beyond.is_empty():
                    budgets = sorted(set(beyond["budget"].to_list()))
                    notes.append(f"{path.name} T={T:g}: no measured speedup for {beyond['tree'].n_unique()} trees "
                                 f"(budgets {', '.join(map(str, budgets))}): beyond what the cost profile measured, "
                                 f"e.g. {beyond['cost_basis'][0].removeprefix('none: ')}")
            spec = parse_policy(policy, multi_draft=config.multi_draft, samples=config.samples)
            for draft in drafts:
                source = feature_source(path, draft, T, progress=False)
                if T > 0 and source.has_distributions and source.depth is None:
                    bound_rows += _bound_rows(path, draft, T, config)
                alpha = _mean_alpha(source)  # the per-token α Leviathan assumes
                theory.append(_theory_rows(table, draft, T, alpha, source.n_positions))
                features = fit_sample(source, config.seed)  # fits: a bounded sample
                pair = f"{draft} → {short_name(features.models['target'])}"
                fits = optimal_trees(features, list(config.budgets), policy=spec, samples=config.samples,
                                     seed=config.seed) if "optimal" in families else []
                for b in (config.draw_budgets if T == 0 else config.sample_draw_budgets):
                    if "optimal" not in families:
                        break
                    fit = optimal_tree(features, b, policy=spec, samples=config.samples, seed=config.seed)
                    drawn.append(DrawnTree(
                        label=f"optimal:{b} for {pair}, T={T:g}", family="optimal", budget=b,
                        drawing=draw_tree(fit.tree),
                        note=f"{fit.expected_tokens_per_call:.3f} tokens/call expected; {fit.source}"))
                profile = priced[path].get("cost_profile")
                if profile is not None and fits:
                    model = next(p for p in profiles if p.path == profile)
                    sizes = [b for b in config.batches if b <= 2 * model.batches.max()]
                    try:
                        pricing = pricing_for(path, model, draft, T)
                        choices = best_per_batch(features, [f.tree for f in fits], spec, pricing, sizes,
                                                 batching=config.batching, n_boot=config.n_boot, seed=config.seed)
                    except SpecError as exc:
                        notes.append(f"{path.name}: batch analysis of {draft} at T={T:g} skipped ({exc})")
                        choices = []
                    batch_rows += [{"cache_name": path.name, "pair": pair, "draft": draft, "temperature": T,
                                    "policy": policy, "batch": c.batch, "batching": config.batching,
                                    "tree": c.tree.name, "budget": c.tree.budget,
                                    "tokens_per_call": c.speed.tokens_per_call, "speedup": c.speed.speedup[0],
                                    "speedup_lo": c.speed.speedup[1], "speedup_hi": c.speed.speedup[2],
                                    "tokens_per_s": c.speed.tokens_per_s, "candidates": c.candidates,
                                    "cost_basis": basis[path.name]} for c in choices]
            bar.update()
    finally:
        bar.close()
    from specsim.sim.replay import resolve_tree

    b = sorted(config.draw_budgets)[len(config.draw_budgets) // 2] if config.draw_budgets else 8
    shown = []
    for fam, spec_text in (("chain", f"chain:{b}"), ("kary:2", f"kary:2@{b}"), ("widths", widths_spec(b))):
        tree: Tree = resolve_tree(spec_text)
        shown.append(DrawnTree(label=spec_text, family=fam, budget=tree.budget, drawing=draw_tree(tree)))
    return Study(
        config=config, setup=_concat(setups), categories=_concat(cats), results=_concat(results),
        theory=_concat(theory),
        grid=speedup_grid(config.grid_alphas, config.grid_costs, config.grid_gammas),
        trees=tuple(shown + drawn), cost_basis=basis, batch=pl.DataFrame(batch_rows, infer_schema_length=None),
        attention=attention, notes=tuple(notes), bound=pl.DataFrame(bound_rows, infer_schema_length=None),
        heads=pl.DataFrame(head_rows, schema=HEAD_SCHEMA), verification=_concat(verification),
    )


HEAD_SCHEMA = {"cache_name": pl.String, "draft": pl.String, "trained": pl.String, "prompts_trained_on": pl.Int64,
               "prompts": pl.Int64}


def _heads(reader: CacheReader, cache_name: str) -> tuple[list[dict], list]:
    """Each head draft of an open cache: how it was trained (from its checkpoint) and on how many of the cache's
    prompts (both unknown for a head whose checkpoint says nothing of its training: a published one); and the
    overlaps with its training prompts, which the report also notes."""
    rows, overlaps = [], []
    for draft in reader.spec.drafts:
        if not is_head_draft(draft):
            continue
        trained = training_summary((reader.run.drafts or {}).get(draft) or {})
        overlap = shared_prompts(reader, draft)
        if overlap is not None:
            overlaps.append(overlap)
        rows.append({"cache_name": cache_name, "draft": draft,
                     "trained": trained or "unknown: its checkpoint does not say (not trained by specsim)",
                     "prompts_trained_on": (overlap.shared if overlap is not None else 0) if trained else None,
                     "prompts": len(reader.prompts)})
    return rows, overlaps


def _bound_rows(path: Path, draft: str, T: float, config: StudyConfig) -> list[dict]:
    """`specsim.sim.bound.node_bound` as report rows, one per way of drawing candidates and number of them."""
    from specsim.sim.bound import node_bound
    from specsim.specs import MULTI_DRAFT

    rows = []
    for sampling in MULTI_DRAFT:
        b = node_bound(path, draft, T, config.bound_candidates, sampling=sampling, samples=config.bound_samples,
                       seed=config.seed, progress=False)
        rows += [{"cache_name": path.name, "draft": draft, "temperature": T, "candidates_drawn": sampling,
                  "candidates": j + 1, "specinfer": float(b.rule[j]), "specinfer_se": float(b.rule_se[j]),
                  "optimal": float(b.bound[j]), "optimal_se": float(b.bound_se[j]),
                  "left_on_table": float(b.bound[j] - b.rule[j]), "left_se": float(b.gap_se[j]),
                  "estimate": "exact" if sampling == "iid" or j < 2 else f"Monte-Carlo ({config.bound_samples} tuples)",
                  "positions": b.positions, "trajectories": b.trajectories} for j in range(config.bound_candidates)]
    return rows


def _profile_for(reader: CacheReader, profiles):
    """The profile measured for this cache's target, or None."""
    from specsim.sim.cost import check_profile

    for profile in profiles:
        try:
            check_profile(profile, reader.run.target_name, reader.run.target)
        except SpecError:
            continue
        return profile
    return None


def _mean_alpha(source) -> float:
    """Mean one-token acceptance β over every position, a block at a time (a head draft's: its depth-1 law)."""
    total = 0.0
    for span in source.blocks(BLOCK_POSITIONS):
        beta = source.block(*span).acceptance()  # (n,), or (n, D)
        total += float((beta if beta.ndim == 1 else beta[:, 0]).sum())
    return total / max(source.n_positions, 1)


def _theory_rows(table: pl.DataFrame, draft: str, T: float, alpha: float, n_positions: int) -> pl.DataFrame:
    chains = table.filter((pl.col("family") == "chain") & (pl.col("draft") == draft)
                          & (pl.col("category") == ALL)) if not table.is_empty() else table
    if chains.is_empty():
        return pl.DataFrame()
    gamma = chains["depth"].to_numpy()
    return chains.select(
        "cache_name", "pair", "draft", "target", "temperature", "policy", "tree",
        pl.col("depth").alias("gamma"), "tokens_per_call", "tokens_per_call_lo", "tokens_per_call_hi",
        "n_prompts", "n_positions",
    ).with_columns(
        pl.lit(alpha).alias("alpha"),
        pl.lit(n_positions).alias("alpha_positions"),
        pl.Series("closed_form_tokens_per_call", leviathan_tokens(alpha, gamma)),
    )


# -- tables on disk ---------------------------------------------------------------------------


def study_tables(study: Study) -> dict[str, pl.DataFrame]:
    """name -> table, as the report writes them (list columns exploded into a per-depth table)."""
    tables = {"setup": study.setup, "categories": study.categories, "theory": study.theory,
              "speedup_grid": study.grid}
    if not study.batch.is_empty():
        tables["batch"] = study.batch
    if not study.results.is_empty():
        from specsim.report.findings import equal_budget

        tables["results"] = study.results.drop("depth_accept", "vllm_num_accepted_tokens_per_pos", strict=False)
        tables["depth_acceptance"] = per_depth(study.results)
        compared = equal_budget(study.results)
        if not compared.is_empty():
            tables["trees_at_equal_budget"] = compared
    if study.attention is not None:
        tables["attention"] = study.attention
    if not study.bound.is_empty():
        tables["verifier_bound"] = study.bound
    if not study.verification.is_empty():
        from specsim.report.findings import block_side_by_side

        tables["block_verification"] = block_side_by_side(study.verification)
    if not study.results.is_empty():
        from specsim.report.findings import heads_side_by_side

        heads = heads_side_by_side(study.results, study.heads)
        if not heads.is_empty():
            tables["heads_side_by_side"] = heads
    return tables


def per_depth(results: pl.DataFrame) -> pl.DataFrame:
    """One row per configuration × category × depth d: P(A ≥ d) per call."""
    keys = ["cache_name", "pair", "family", "tree", "budget", "draft", "target", "policy", "temperature",
            "category", "estimate", "n_prompts", "n_positions"]
    return (results.select(*keys, "depth_accept")
            .with_columns(pl.int_ranges(1, pl.col("depth_accept").list.len() + 1).alias("d"))
            .explode("depth_accept", "d")
            .rename({"depth_accept": "p_accept_at_least_d"})
            .drop_nulls("d"))


def write_tables(study: Study, out_dir: str | Path) -> list[Path]:
    """Every study table as NAME.parquet and NAME.csv under out_dir/tables."""
    out = Path(out_dir) / "tables"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, table in study_tables(study).items():
        table.write_parquet(out / f"{name}.parquet")
        table.write_csv(out / f"{name}.csv")
        written += [out / f"{name}.parquet", out / f"{name}.csv"]
    return written

"""`specsim.simulate`: replay a sweep of configurations against a cache, one polars row each.

The data path of docs/design.md §2, end to end: cache → `Features` per (draft,
temperature) → a policy's acceptance table per (tree, policy) → the exact walk →
ratio-of-sums metrics with bootstrap CIs over prompts → rows. A sweep is the cross
product trees × budgets × drafts × policies × temperatures; features are derived
once per (draft, temperature) and kept beside the cache, so a sweep costs
vectorised array work per configuration.

Tree specs, drafts and policies are those of `specsim.specs` (bare families such as
``chain``, ``optimal`` and ``kary:W`` expand over the budgets); ``optimal:N`` is fitted
here, per draft and policy, by `specsim.sim.optimize`.
numpy + polars only.
"""

from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import polars as pl

from specsim.cache.store import CacheReader
from specsim.errors import CacheError, SpecError
from specsim.sim.cost import ProfileCost, load_cost_profile, parse_cost
from specsim.sim.engine import AcceptanceTable, EngineTotals, TrajectoryStats, walk
from specsim.sim.features import Features, FeatureSource, feature_source, target_name
from specsim.sim.metrics import ALL, summarize_many
from specsim.sim.policies import check_temperature, run_adaptive, run_policy
from specsim.specs import (BATCHING, PolicySpec, check_batch, drafts_in_one_pass, expand_trees, feeds_accepted,
                           fitted_budget, is_model_free, model_free_help, needs_fit, parse_policy, parse_tree,
                           prompt_fed_at_admission)
from specsim.trees import Tree

def resolve_tree(spec: str, features: Features | None = None, policy: PolicySpec | None = None) -> Tree:
    """A Tree from a concrete spec; kinds fitted on a cache (optimal:N) need the features and policy."""
    fit = None
    if features is not None:
        def fit(family: str, arg: str) -> Tree:
            from specsim.sim.optimize import optimal_tree

            n = int(arg)
            if n < 1:
                raise SpecError(f"budget {n} must be at least 1")
            return optimal_tree(features, n, policy=policy).tree
    return parse_tree(spec, fit=fit)


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


def one_blas_thread():
    """A context in which BLAS runs on one thread. Replay's BLAS calls are vector-sized (dot products, the
    banded solves, the bootstrap's products) and OpenBLAS's idle threads spin: the 1M bench sweep in one
    process took 15.4 s wall either way, with 18.2 s CPU on two BLAS threads against 15.3 s on one.
    scipy's own OpenBLAS is loaded first, so that it is limited too."""
    import scipy.linalg.lapack  # noqa: F401
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def on_one_blas_thread(fn: Callable) -> Callable:
    """`fn` run inside `one_blas_thread`."""
    import functools

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with one_blas_thread():
            return fn(*args, **kwargs)

    return run


@dataclass(frozen=True)
class Sweep:
    """What one simulation sweep produced."""

    rows: pl.DataFrame  # one row per configuration (x batch size) x category ("all" first)
    requests: pl.DataFrame  # one row per configuration x trajectory: totals and the histogram of accepted lengths


def simulate(cache, trees: Sequence[str] = (), **kwargs) -> pl.DataFrame:
    """The rows of `sweep` (see there): one per configuration (x batch size) and category."""
    return sweep(cache, trees, **kwargs).rows


@on_one_blas_thread
def sweep(
    cache,
    trees: Sequence[str] = (),
    drafts: Sequence[str] | None = None,
    policies: Sequence[str] = ("greedy",),
    budgets: Sequence[int] | None = None,
    temperatures: Iterable[float] | float | None = None,
    multi_draft: str = "iid",
    cost_profile=None,
    cost: str | None = None,
    batches: Sequence[int] | None = None,
    batching: str = "lockstep",
    by_category: bool = True,
    n_boot: int = 1000,
    samples: int = 64,
    seed: int = 0,
    top_k: int = 16,
    progress: bool = False,
    on_skip: Callable[[str], None] | None = None,
    unpriced: str = "skip",
    block_positions: int | None = None,
    fit_positions: int | None = None,
    workers: int = 1,
) -> Sweep:
    """Simulate every configuration of the sweep; one row per configuration and category ("all" first).

    trees: specs ("chain:4", "kary:2,3", "optimal:16", "file:t.json") or families expanded
    over `budgets` ("chain", "optimal", "kary:2"). drafts: recorded draft columns (default:
    all) or model-free drafts ("ngram:3", "prompt-lookup:2"). policies: "greedy" (T=0),
    "sample" (T>0; trees use `multi_draft` "iid" | "swor"), lossy and adaptive rules.
    temperatures: default, per policy, every recorded temperature it can use. samples:
    Monte-Carlo samples per position (sampling trees without replacement). n_boot, seed:
    the bootstrap over prompts.

    Speed: cost_profile (a `specsim profile` JSON, checked against the cache's target and
    each draft, or a `ProfileCost` loaded with `load_cost_profile(path, extrapolate=True)` to
    price past what it measured) gives measured `speedup` and `tokens_per_s` columns; cost ("c=RATIO") gives
    `speedup_assumed` instead, an assumption; with neither there are no speedup columns.
    batches (needs a profile): extra rows per batch size B > 1 from the batch timeline
    (`specsim.sim.batch`, `batching` "lockstep" or "continuous"): throughput, per-request
    latency per token and speedup over plain batched decoding at the same B. A tree the
    profile cannot price (more tokens, wider draft steps or longer contexts than it measured,
    or past the 2x extrapolation limit when asked to extrapolate) is skipped (`unpriced="skip"`) or kept with empty speed columns and
    its cost_basis saying why (`unpriced="keep"`, as the report does for large budgets).

    A combination of the cross product that cannot run (an adaptive rule on a branching
    tree, a p-vs-q rule with a model-free draft, ...) is skipped: `on_skip` receives one
    line saying which and why (default: printed to stderr). SpecError only when nothing
    is left to run.

    Memory: the cache is replayed a block of trajectories at a time (`block_positions`,
    default BLOCK_POSITIONS), so it stays bounded in the number of positions, and trees
    fitted on the cache (optimal:N) are fitted on at most `fit_positions` positions
    (default FIT_POSITIONS) of randomly chosen trajectories. Batch timelines (`batches`)
    and model-free drafts (suffix decoding's tree spans requests) replay in one piece.
    """
    from tqdm.auto import tqdm

    if cost is not None and cost_profile is not None:
        raise SpecError("give a measured --cost-profile or an assumed --cost, not both")
    if isinstance(n_boot, bool) or not 0 <= int(n_boot) <= MAX_BOOT:
        raise SpecError(f"--n-boot {n_boot}: use 0 (no CIs) to {MAX_BOOT} bootstrap resamples")
    if isinstance(seed, bool) or int(seed) < 0:
        raise SpecError(f"--seed {seed}: seeds are non-negative integers")
    if isinstance(workers, bool) or int(workers) < 1:
        raise SpecError(f"--workers {workers}: use 1 or more processes")
    workers = int(workers)
    cost_model = (cost_profile if isinstance(cost_profile, ProfileCost) else load_cost_profile(cost_profile)
                  if cost_profile is not None else parse_cost(cost) if cost is not None else None)
    batches = sorted({int(b) for b in (batches or ())})
    if batches and (cost_model is None or not cost_model.measured):
        raise SpecError("--batch needs measured costs: give --cost-profile (a profile measured at those batch sizes)")
    if batches:
        cost_model.plain_s(np.array(batches), cost_model.contexts[0])  # refuses a batch beyond its range
    if any(b < 1 for b in batches):
        raise SpecError(f"batch sizes must be at least 1, got {batches}")
    if batching not in BATCHING:
        raise SpecError(f"--batching {batching!r} is not one of {', '.join(BATCHING)}")
    if unpriced not in ("skip", "keep"):
        raise SpecError(f"unpriced={unpriced!r}: use 'skip' or 'keep'")
    specs = expand_trees(list(trees) if not isinstance(trees, str) else [trees], budgets)
    fixed = {s: resolve_tree(s) for s in specs if not needs_fit(s)}  # spec errors before any work
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
                                 f"{', '.join(reader.spec.drafts)}; model-free: {model_free_help()}")
        if not drafts:
            raise CacheError(f"{reader.path}: records no draft; name a model-free one (--draft ngram:3)")
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
                    found, asked = _replay(source, [p for t, p in plan if t == T], specs, fixed,
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
    return Sweep(rows=_finish_columns(pl.DataFrame(rows, infer_schema_length=None), cost_model),
                 requests=pl.concat(requests) if requests else pl.DataFrame())


@dataclass(frozen=True)
class Pricing:
    """How one draft's calls are priced: the cost model and the profile's name for the draft."""

    model: object | None  # ProfileCost, AssumedCost or None (no speed columns)
    draft_key: str | None  # the profile's draft measured for this draft; None for model-free drafts
    basis: str  # the row's cost_basis text

    @classmethod
    def for_draft(cls, cost_model, reader: CacheReader, draft: str) -> "Pricing":
        if cost_model is None:
            return cls(None, None, "none (no --cost-profile or --cost)")
        free = is_model_free(draft)
        if not cost_model.measured:
            return cls(cost_model, None if free else draft, cost_model.describe())
        from specsim.sim.cost import check_profile

        check_profile(cost_model, target_name(reader.meta), reader.meta.get("target"))
        drafts_meta = reader.meta.get("drafts") if isinstance(reader.meta.get("drafts"), dict) else {}
        key = None if free else cost_model.draft_for(draft, drafts_meta.get(draft))
        return cls(cost_model, key, cost_model.describe())

    def at_temperature(self, temperature: float) -> "Pricing":
        """This pricing with the per-step work outside the forwards that decoding at `temperature` does
        (`ProfileCost.for_temperature`; unchanged for a cost model that measured none)."""
        at = getattr(self.model, "for_temperature", None)
        if at is None:
            return self
        model = at(temperature, model_draft=self.draft_key is not None)
        return replace(self, model=model, basis=model.describe())

    def within_range(self, features: Features, tree: Tree, unpriced: str = "skip") -> "Pricing":
        """This pricing, or (unpriced="keep") no pricing with the reason when the model cannot price `tree`.

        With unpriced="skip" the refusal surfaces later, as a SpecError that skips the configuration.
        """
        if self.model is None or unpriced == "skip":
            return self
        try:
            if isinstance(features, FeatureSource):
                self._check_range(features, tree)
            else:
                self.priced(features, tree)
        except SpecError as exc:
            return Pricing(None, None, f"none: {exc}")
        return self

    def _check_range(self, source: FeatureSource, tree: Tree) -> None:
        """SpecError where `priced` would refuse some position of `source` (its least and greatest context
        bound every lookup; a call at the least room drafts a subtree of the full one)."""
        from specsim.sim.cost import tree_by_room

        model, key = self.model, self.draft_key
        L = np.array(source.context_range(), dtype=np.float64)
        model.plain_s(1, L)
        one_pass = drafts_in_one_pass(source.draft)
        for shape in tree_by_room(tree, model_draft=key is not None, one_pass=one_pass):
            model.verify_s(1, shape.verify_tokens, L)
            for w in shape.draft_levels:
                model.draft_s(key, 1, w, L)
        if key is not None and tree.budget and not one_pass:
            every = feeds_accepted(source.draft, tree)
            for a in range(1, tree.max_depth + 1) if every else [tree.max_depth]:
                model.draft_s(key, 1, 1 + a if every else 2, L)

    def extrapolated(self, source, tree: Tree, batch: int = 1) -> bool | None:
        """Whether pricing `tree` on `source` at `batch` reads the profile past what it measured (None: no profile)."""
        if self.model is None or not getattr(self.model, "measured", False):
            return None
        from specsim.sim.cost import tree_by_room

        shape = tree_by_room(tree, model_draft=self.draft_key is not None, one_pass=drafts_in_one_pass(source.draft))[-1]
        widths = list(shape.draft_levels) + ([2] if self.draft_key is not None and tree.budget else [])
        if self.draft_key is not None and feeds_accepted(source.draft, tree):
            widths.append(1 + tree.max_depth)
        high = source.context_range()[1] if hasattr(source, "context_range") else float(source.contexts().max())
        return self.model.extrapolates(batch=batch, tokens=shape.verify_tokens, width=max(widths, default=1),
                                       context=high)

    def priced(self, features: Features, tree: Tree, batch: int = 1, drafted: np.ndarray | None = None,
               leaf: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(call cost, plain step cost, extra cost of the next call's root feed by accepted length) at every
        position: (N,), (N,) and (N, D+1) or None (`walk`'s next_feed_cost).

        `leaf` (N, D+1): P(a call's accepted path ends on a leaf | t, a) (`AcceptanceTable.leaf_given`).
        `drafted` (N,): the nodes each call proposed, for a model-free draft at batch 1, which
        verifies only those (an n-gram or suffix match fills part of the tree, or none of it; the
        live engine, like vLLM's variable-length drafts, sends the target only what was proposed).
        """
        from specsim.sim.cost import tree_by_room

        model, N = self.model, features.n_positions
        contexts = features.contexts()
        model_draft = self.draft_key is not None
        if drafted is not None and not model_draft and batch == 1:
            tokens = 1 + np.asarray(drafted, dtype=np.int64)
            call = np.zeros(N)
            for k in np.unique(tokens):
                idx = np.flatnonzero(tokens == k)
                call[idx] = model.verify_s(batch, int(k), contexts[idx])
            return call, model.plain_s(batch, contexts), None
        one_pass = drafts_in_one_pass(features.draft)
        shapes = tree_by_room(tree, model_draft=model_draft, one_pass=one_pass)
        cut = np.minimum(features.room(), tree.max_depth)
        call = np.zeros(N)
        for m, shape in enumerate(shapes):
            idx = np.flatnonzero(cut == m)
            if idx.size:
                L = contexts[idx]
                if tree.dynamic is not None and drafted is not None:  # the nodes each call kept within its room
                    seconds = model.verify_s(batch, 1 + np.asarray(drafted)[idx], L)
                else:
                    seconds = model.verify_s(batch, shape.verify_tokens, L)
                for w in shape.draft_levels:
                    seconds = seconds + model.draft_s(self.draft_key, batch, w, L)
                call[idx] = seconds
        feed = None
        if model_draft and tree.budget and not one_pass:
            feed = self._next_feed(features, tree, batch, contexts, cut, leaf)
            if prompt_fed_at_admission(features.draft):  # a request's first call feeds no root entry
                first = features.traj_start[cut[features.traj_start] >= 1]
                call[first] -= model.draft_s(self.draft_key, batch, 1, contexts[first])
        return call, model.plain_s(batch, contexts), feed

    def priced_replicas(self, features: Features, tree: Tree, batch: int = 1, drafted: np.ndarray | None = None,
                        leaf: np.ndarray | None = None) -> list[tuple]:
        """`priced` under each replica of the cost profile (`ProfileCost.replicas`; [] when it kept no rounds)."""
        return [replace(self, model=m).priced(features, tree, batch, drafted, leaf)
                for m in getattr(self.model, "replicas", ())]

    def _next_feed(self, features: Features, tree: Tree, batch: int, contexts: np.ndarray,
                   cut: np.ndarray, leaf: np.ndarray | None = None) -> np.ndarray:
        """(N, D+1) extra time the next call's root feed costs, over the one token priced in every call,
        when the call at t accepted a; priced at the next call's context, if it exists and drafts.

        A draft model feeds 2 tokens after a call whose accepted path ended on a leaf, a node it
        never fed: with `leaf` (N, D+1), P(that | t, a), else where the call
        accepted the whole depth (exact for trees whose inner depths all have children, e.g. chains).
        An EAGLE layer, and any draft of a dynamic tree (`feeds_accepted`), feeds the root and every
        accepted draft, 1 + a."""
        model, N, depth = self.model, features.n_positions, tree.max_depth
        every = feeds_accepted(features.draft, tree)
        ends = np.repeat(features.traj_start + features.traj_len, features.traj_len)
        out = np.zeros((N, depth + 1))
        leafy = not every and leaf is not None
        for a in range(1, depth + 1) if every or leafy else [depth]:
            nxt = np.arange(N) + a + 1
            ok = nxt < ends
            ok[ok] &= cut[nxt[ok]] >= 1
            L = contexts[np.minimum(nxt, N - 1)]
            extra = model.draft_s(self.draft_key, batch, 1 + a if every else 2, L) - model.draft_s(
                self.draft_key, batch, 1, L)
            out[:, a] = np.where(ok, extra * leaf[:, a], 0.0) if leafy else np.where(ok, extra, 0.0)
        return out


def _proposed(features: Features, table, tree: Tree | None = None) -> np.ndarray | None:
    """The nodes each call proposed, where pricing verifies only those: model-free drafts, and dynamic trees
    (the N best of the expansion, those deeper than the room not verified)."""
    dynamic = tree is not None and tree.dynamic is not None
    return table.drafted if (features.model_free or dynamic) and isinstance(table, AcceptanceTable) else None


def _skip_line(features: Features, policy: PolicySpec, spec: str, exc: Exception) -> str:
    return (f"skipped {spec} x {features.draft} x {policy.label} at T={features.temperature:g}: {exc}")


def _trees_for(features: Features, policy: PolicySpec, specs: list[str], fixed: dict[str, Tree],
               skipped: list[str]) -> dict[str, Tree | None]:
    """Every spec's tree for one (features, policy); optimal:N for all budgets from one fit."""
    out: dict[str, Tree | None] = {s: fixed[s] for s in specs if s in fixed}
    wanted = [s for s in specs if s not in fixed]
    if wanted:
        budgets = [fitted_budget(s) for s in wanted]
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


FOLDS = 5  # cross-fitting folds over prompts for trees fitted on the cache
IN_SAMPLE = "in-sample: fitted and scored on the same prompts (fewer than 2 prompts)"
BLOCK_POSITIONS = 1 << 17  # positions replayed at once: the sweep's memory is bounded by this, not the cache
FIT_POSITIONS = 1 << 18  # positions of random trajectories a tree fitted on the cache is fitted on, at most


def fit_sample(source: FeatureSource, seed: int, positions: int | None = None, block: int | None = None) -> Features:
    """The features trees are fitted on: random whole trajectories of at most FIT_POSITIONS positions (every
    trajectory of a smaller cache), read BLOCK_POSITIONS at a time."""
    return source.sample(int(positions or FIT_POSITIONS), seed, int(block or BLOCK_POSITIONS))


def _held_out(k: int) -> str:
    return f"held-out: {k}-fold cross-fitting over prompts (each prompt scored by a tree fitted on the others)"


@dataclass
class _Policy:
    """One policy's trees on one (draft, temperature), what its configurations accumulate, and their pricing."""

    policy: PolicySpec
    trees: dict  # spec -> Tree (None: skipped)
    folds: list  # (fold, fitted trees in `fitted` order) for cross-fitting; empty without
    fitted: list  # specs scored held out
    pricing: dict  # spec -> Pricing (held-out specs: one pricing for every fold)
    own: dict = field(default_factory=dict)  # spec -> [(trajectories, TrajectoryStats)] with its own tree
    held: dict = field(default_factory=dict)  # spec -> [(trajectories, TrajectoryStats)] held out
    tables: dict = field(default_factory=dict)  # spec -> AcceptanceTable (batch timelines only)
    failed: dict = field(default_factory=dict)  # spec -> skip line


def _replay(source: FeatureSource, policies: list[PolicySpec], specs: list[str], fixed: dict[str, Tree],
            pricing: Pricing, reader: CacheReader, *, batches: list[int], batching: str, n_boot: int, seed: int,
            unpriced: str, by_category: bool, skipped: list[str], block_positions: int | None,
            fit_positions: int | None, workers: int, bar) -> tuple[list[dict], list[pl.DataFrame]]:
    """Rows and request rows of every (policy, tree) of one (draft, temperature), a block of trajectories at a time.

    Each configuration's per-trajectory totals are merged over the blocks (the walk's totals are
    per trajectory, and blocks hold whole trajectories), so exact policies give the rows of
    one piece. One block: trees are fitted on it and every step runs in the order of a
    one-piece replay; several: trees are fitted first, on a bounded random sample.
    """
    keep_tables = any(b > 1 for b in batches)
    block = max(1, int(block_positions or BLOCK_POSITIONS))
    spans = [(0, source.n_traj)] if keep_tables or source.model_free else source.blocks(block)
    to_fit = [s for s in specs if s not in fixed]
    fold_of = _folds(source.traj_prompt, seed)
    states: list[_Policy] = []
    sampled = False  # fitted on a sample of the trajectories, not all
    if len(spans) == 1:
        features = source.block(*spans[0])
        for policy in policies:
            state = _plan(features, features, policy, specs, fixed, pricing, fold_of, seed=seed, unpriced=unpriced,
                          skipped=skipped, warm=True)
            _replay_block(features, 0, state, specs, fold_of, seed=seed, keep_tables=keep_tables, bar=bar, share=1.0)
            states.append(state)
    else:
        # with workers, the fixed trees' blocks go to them first and run while this process fits the others (the
        # cross-fitting folds stay here: they share the sample's per-trajectory sums; fitting them in the pool,
        # each fold recomputing those sums, measured 17 s against 15 s for the 1M sweep). In one process a block
        # is read once, for every tree.
        warm = _warm_width(specs, fixed)
        now = [s for s in specs if s in fixed]
        split = workers > 1 and bool(now) and bool(to_fit)
        phases = []  # (specs, plans, results in block order)
        if split:
            plans = [_plan(None, source, policy, now, fixed, pricing, fold_of, seed=seed, unpriced=unpriced,
                           skipped=skipped, warm=False) for policy in policies]
            phases.append((now, plans, _map(_block_task, _tasks(source, spans, plans, now, fold_of, seed, warm),
                                            workers)))
        these = to_fit if split else specs
        fit = fit_sample(source, seed, fit_positions, block) if to_fit else None
        sampled = fit is not None and fit.n_traj < source.n_traj
        plans = [_plan(fit, source, policy, these, fixed, pricing, fold_of, seed=seed, unpriced=unpriced,
                       skipped=skipped, warm=False) for policy in policies]
        phases.append((these, plans, _map(_block_task, _tasks(source, spans, plans, these, fold_of, seed, warm),
                                          workers)))
        states = [_Policy(policy=policy, trees={}, folds=[], fitted=[], pricing={}) for policy in policies]
        for these, plans, results in phases:
            for state, plan in zip(states, plans):
                state.trees.update(plan.trees)
                state.pricing.update(plan.pricing)
                state.folds, state.fitted = state.folds or plan.folds, state.fitted or plan.fitted
            for done in results:  # in block order, whichever process ran them
                for state, (own, held, failed) in zip(states, done):
                    for spec, pieces in own.items():
                        state.own.setdefault(spec, []).extend(pieces)
                    for spec, pieces in held.items():
                        state.held.setdefault(spec, []).extend(pieces)
                    for spec, line in failed.items():
                        state.failed.setdefault(spec, line)
                bar.update(len(states) * len(these) / len(spans))
    rows: list[dict] = []
    requests: list[pl.DataFrame] = []
    for state in states:
        runs: list[tuple[dict, TrajectoryStats]] = []
        tables = []
        for spec in specs:
            tree = state.trees[spec]
            if tree is None:
                continue
            if spec in state.failed:
                skipped.append(state.failed[spec])
                continue
            held = spec in state.fitted
            stats = _merge_stats(state.held[spec] if held else state.own[spec], source)
            here = state.pricing[spec]
            fit = _held_out(len(state.folds)) if held else (None if spec in fixed else IN_SAMPLE)
            if held and sampled:
                cap = int(fit_positions or FIT_POSITIONS)
                fit += f"; fitted on a random sample of trajectories ({cap:,} positions at most)"
            runs.append((_head(source, tree, state.policy, here, reader, stats, fit=fit, n_boot=n_boot, seed=seed),
                         stats))
            tables.append((tree, state.tables.get(spec)))
        found = _rows(runs, source, by_category=by_category, n_boot=n_boot, seed=seed)
        rows += found
        requests += _request_rows(runs, source)
        for b in batches:
            if b > 1:
                rows += _batch_rows(found, tables, features, pricing, b, batching, n_boot=n_boot, seed=seed,
                                    skipped=skipped, policy=state.policy)  # one piece: `features` is every trajectory
    return rows, requests


def _tasks(source: FeatureSource, spans, plans: list[_Policy], specs: list[str], fold_of, seed: int,
           warm: int) -> list[tuple]:
    """`_block_task`'s arguments for every block: the plans (fresh from `_plan`: nothing accumulated yet),
    and the fan-out candidate acceptance is estimated at (`_warm_width`)."""
    return [(source, t0, t1, i, plans, specs, fold_of, seed, warm) for i, (t0, t1) in enumerate(spans)]


def _warm_width(specs: list[str], fixed: dict[str, Tree]) -> int:
    """The fan-out a block's candidate acceptance is estimated at, once for every tree of a policy: the widest
    fixed tree's, and the widest a tree fitted on the cache may have. Every task of a block uses it, so
    Monte-Carlo estimates do not depend on how trees are grouped into tasks (one process or workers)."""
    from specsim.sim.optimize import fit_width

    widths = [int(t.n_children.max()) for s, t in fixed.items() if s in specs and t.budget and t.dynamic is None]
    budgets = [fitted_budget(s) for s in specs if s not in fixed]
    return max(widths + ([fit_width(budgets)] if budgets else []) + [1])


def _block_task(task) -> list[tuple[dict, dict, dict]]:
    """Replay one block of trajectories for every policy: (own, held, failed) per policy (`_Policy` fields).

    A module-level function of picklable arguments, so a process pool can run it; its Monte-Carlo
    streams are seeded by the block's index, so results do not depend on which process ran it."""
    source, t0, t1, index, plans, specs, fold_of, seed, warm = task
    features = source.block(t0, t1)
    out = []
    for plan in plans:
        state = replace(plan, own={}, held={}, tables={}, failed={})  # this block's totals only
        _warm_candidates(features, state.policy, [], _warm_rng(features, plan.policy, seed, block=index), width=warm)
        _replay_block(features, t0, state, specs, fold_of, seed=seed, keep_tables=False, bar=None, share=0.0,
                      block=index)
        out.append((state.own, state.held, state.failed))
    return out


def _worker_start() -> None:
    """A worker process's setup: BLAS on one thread for its whole life (`one_blas_thread`)."""
    one_blas_thread()


_POOLS: dict[int, object] = {}  # worker count -> process pool, started once per process and reused


def _map(fn: Callable, tasks: list, workers: int) -> Iterable:
    """fn over the tasks in order: in this process, or in a pool of `workers` processes.

    The pool is concurrent.futures' (spawned processes: a forked copy of a process running polars'
    threads can deadlock), kept for the next sweep; each worker holds one task's data at a time."""
    if workers <= 1 or len(tasks) <= 1:
        return map(fn, tasks)
    if workers not in _POOLS:
        import atexit
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        if not _POOLS:
            atexit.register(shutdown_pools)  # before the interpreter tears its modules down
        _POOLS[workers] = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                              initializer=_worker_start)
    return _POOLS[workers].map(fn, tasks)


def shutdown_pools() -> None:
    """Stop the worker processes `workers=` started (their CPU time is then counted as this process's children's)."""
    while _POOLS:
        _POOLS.popitem()[1].shutdown()


def _folds(traj_prompt: np.ndarray, seed: int) -> tuple[int, np.ndarray] | None:
    """(k, fold of each trajectory): prompts dealt at random into k <= FOLDS folds; None below 2 prompts."""
    prompts = np.unique(traj_prompt)
    k = min(FOLDS, len(prompts))
    if k < 2:
        return None
    order = np.random.default_rng([seed, 17]).permutation(prompts)
    fold_of = {int(p): i % k for i, p in enumerate(order)}
    return k, np.array([fold_of[int(p)] for p in traj_prompt], dtype=np.int64)


def _plan(fit: Features | None, where, policy: PolicySpec, specs: list[str], fixed: dict[str, Tree],
          pricing: Pricing, fold_of, *, seed: int, unpriced: str, skipped: list[str], warm: bool) -> _Policy:
    """A policy's trees (fitted ones on `fit`), cross-fitting folds and pricing; `where` (Features or
    FeatureSource) is what the pricing must cover. warm: estimate `fit`'s candidate acceptance first."""
    trees = _trees_for(fit if fit is not None else where, policy, specs, fixed, skipped)
    if warm:
        _warm_candidates(fit if fit is not None else where, policy, [t for t in trees.values() if t is not None],
                         _warm_rng(where, policy, seed))
    fitted = [s for s in specs if s not in fixed and trees.get(s) is not None]
    folds = []
    if fitted and fold_of is not None:
        from specsim.sim.optimize import optimal_trees

        k, of_traj = fold_of
        fit_fold = _folds_of(fit, where, of_traj)
        budgets = [fitted_budget(s) for s in fitted]
        folds = [(f, optimal_trees(fit.subset(np.flatnonzero(fit_fold != f)), budgets, policy=policy, seed=seed))
                 for f in range(k)]
    prices = {}
    for spec in specs:
        tree = trees.get(spec)
        if tree is None:
            continue
        if spec in fitted and folds:  # one pricing for every fold: a spec's merged totals are all priced or not
            here = pricing
            for _, fits in folds:
                if here.model is not None:
                    here = here.within_range(where, fits[fitted.index(spec)].tree, unpriced)
            prices[spec] = here
        else:
            prices[spec] = pricing.within_range(where, tree, unpriced)
    return _Policy(policy=policy, trees=trees, folds=folds, fitted=fitted if folds else [], pricing=prices)


def _folds_of(fit: Features, where, of_traj: np.ndarray) -> np.ndarray:
    """The fold of each of `fit`'s trajectories (a sample of `where`'s, or the same ones)."""
    if fit is where or fit.n_traj == len(of_traj) and np.array_equal(fit.cache_start, where.cache_start):
        return of_traj
    index = {int(c): i for i, c in enumerate(where.cache_start.tolist())}
    return of_traj[[index[int(c)] for c in fit.cache_start.tolist()]]


def _replay_block(features: Features, t0: int, state: _Policy, specs: list[str], fold_of, *, seed: int,
                  keep_tables: bool, bar, share: float, block: int | None = None) -> None:
    """Walk every configuration of `state` on one block of trajectories (the first is t0), adding its totals.

    block: the block's index when the cache is replayed in several (it seeds the Monte-Carlo streams);
    None for a replay in one piece."""
    extra = [] if block is None else [block]
    policy = state.policy
    rows_here = np.arange(features.n_traj) + t0
    together = _adaptive_together(features, state, specs)
    for spec in specs:
        tree = state.trees[spec]
        if tree is not None and spec not in state.failed:
            try:
                if spec in state.fitted:
                    tree_at = state.fitted.index(spec)
                    fold = fold_of[1][t0 : t0 + features.n_traj]
                    for f, fits in state.folds:
                        sel = np.flatnonzero(fold == f)
                        if sel.size:
                            rng = np.random.default_rng([seed, f, zlib.crc32(spec.encode()), *extra])
                            stats, _ = _walk_one(features.subset(sel), fits[tree_at].tree, policy,
                                                 state.pricing[spec], rng)
                            state.held.setdefault(spec, []).append((sel + t0, stats))
                if spec in together:
                    state.own.setdefault(spec, []).append((rows_here, together[spec]))
                elif spec not in state.fitted or keep_tables:
                    rng = _config_rng(features, policy, tree, seed, block)
                    stats, table = _walk_one(features, tree, policy, state.pricing[spec], rng)
                    state.own.setdefault(spec, []).append((rows_here, stats))
                    if keep_tables:
                        state.tables[spec] = table
            except SpecError as exc:
                state.failed[spec] = _skip_line(features, policy, spec, exc)  # its rows are skipped, totals or not
        if bar is not None:
            bar.update(share)


def _adaptive_together(features: Features, state: _Policy, specs: list[str]) -> dict:
    """spec -> totals of an adaptive rule's chains walked together (`run_adaptive`: chains of one cap
    share a pass over the positions). Empty for other rules, or when any chain would fail: each is then
    walked alone, to fail alone."""
    todo = [s for s in specs if state.trees.get(s) is not None and s not in state.failed and s not in state.fitted]
    if not state.policy.kind.adaptive or len(todo) < 2:
        return {}
    pricings = [state.pricing[s] if state.pricing[s].model is not None else None for s in todo]
    try:
        found = run_adaptive(features, [state.trees[s] for s in todo], state.policy, pricings)
    except SpecError:
        return {}
    return dict(zip(todo, found))


def _merge_stats(pieces: list[tuple[np.ndarray, TrajectoryStats]], where) -> TrajectoryStats:
    """One TrajectoryStats over all of `where`'s trajectories from pieces (trajectory indices, totals); the
    per-configuration scalars (`extra`) are merged too: maxima by max, means weighted by positions."""
    n_traj = where.n_traj
    if len(pieces) == 1 and pieces[0][0].shape[0] == n_traj and np.array_equal(pieces[0][0], np.arange(n_traj)):
        return pieces[0][1]
    depth = max(p.reach.shape[1] for _, p in pieces)
    out = {name: np.zeros(n_traj) for name in ("calls", "drafted", "accepted", "tokens", "cost")}
    plain = np.zeros(n_traj) if all(p.plain is not None for _, p in pieces) else None
    counts = {None if p.cost_replicas is None else p.cost_replicas.shape[0] for _, p in pieces}
    R = counts.pop() if len(counts) == 1 else None  # replicas only where every piece has the same number
    cost_r, plain_r = (None, None) if R is None else (np.zeros((R, n_traj)), np.zeros((R, n_traj)))
    se = np.zeros(n_traj) if any(p.se_accepted is not None for _, p in pieces) else None
    reach = np.zeros((n_traj, depth))
    for idx, p in pieces:
        for name in out:
            out[name][idx] = getattr(p, name)
        reach[idx, : p.reach.shape[1]] = p.reach
        if plain is not None:
            plain[idx] = p.plain
        if se is not None and p.se_accepted is not None:
            se[idx] = p.se_accepted
        if R is not None:
            cost_r[:, idx], plain_r[:, idx] = p.cost_replicas, p.plain_replicas
    return TrajectoryStats(**out, reach=reach, exact=all(p.exact for _, p in pieces), se_accepted=se, plain=plain,
                           cost_replicas=cost_r, plain_replicas=plain_r,
                           extra=_merge_extra([(float(where.traj_len[idx].sum()), p.extra) for idx, p in pieces]),
                           engine=_merge_engine([(idx, p.engine) for idx, p in pieces], n_traj, depth))


def _merge_engine(pieces: list[tuple[np.ndarray, EngineTotals | None]], n_traj: int, depth: int) -> EngineTotals | None:
    """One EngineTotals over all trajectories from pieces' (None if any piece has none); the first note kept."""
    if any(e is None for _, e in pieces):
        return None
    drafts, drafted, reach = np.zeros(n_traj), np.zeros(n_traj), np.zeros((n_traj, depth))
    for idx, e in pieces:
        drafts[idx], drafted[idx] = e.drafts, e.drafted
        reach[idx, : e.reach.shape[1]] = e.reach
    return EngineTotals(drafts=drafts, drafted=drafted, reach=reach,
                        note=next((e.note for _, e in pieces if e.note), None))


def _merge_extra(pieces: list[tuple[float, Mapping | None]]) -> dict | None:
    """Per-configuration scalars of several pieces: equal values kept, `*_max` by max, other numbers by the
    position-weighted mean (e.g. the mean TV distortion over positions)."""
    if all(extra is None for _, extra in pieces):
        return None
    out = {}
    for key in dict(pieces[0][1] or {}):
        values = [(w, extra[key]) for w, extra in pieces if extra and key in extra]
        if all(v == values[0][1] for _, v in values):
            out[key] = values[0][1]
        elif key.endswith("_max"):
            out[key] = max(v for _, v in values)
        elif all(isinstance(v, (int, float)) for _, v in values):
            weight = sum(w for w, _ in values)
            out[key] = sum(w * v for w, v in values) / weight if weight else values[0][1]
        else:
            out[key] = values[0][1]
    return out


def _warm_rng(features, policy: PolicySpec, seed: int, block: int | None = None) -> np.random.Generator:
    label = f"{features.draft}|{features.temperature:g}|{policy.multi_draft}|warm"
    return np.random.default_rng([seed, zlib.crc32(label.encode()), *([] if block is None else [block])])


def _warm_candidates(features: Features, policy: PolicySpec, trees: list[Tree], rng: np.random.Generator,
                     width: int = 1) -> None:
    """Estimate sampling trees' candidate acceptance once, at the widest fan-out of `trees` (or `width`).

    `multidraft.candidate_acceptance` keeps its last estimate and serves any narrower tree
    from it; estimating the widest first means one stream of the distributions per sweep.
    Where that width cannot be served (a stats-only cache recorded fewer candidates) nothing
    is estimated here: each tree then reports what it lacks.
    """
    if policy.name != "sample" or features.model_free or features.temperature <= 0:
        return
    width = max([int(t.n_children.max()) for t in trees if t.budget and t.dynamic is None] + [width])
    if width <= 1:
        return
    from specsim.sim.multidraft import candidate_acceptance

    try:
        candidate_acceptance(features, width, scheme=policy.multi_draft, samples=policy.samples, rng=rng)
    except SpecError:
        pass


def _config_rng(features, policy: PolicySpec, tree: Tree, seed: int, block: int | None = None) -> np.random.Generator:
    label = f"{features.draft}|{features.temperature:g}|{policy.label}|{policy.multi_draft}|{tree.name}"
    return np.random.default_rng([seed, zlib.crc32(label.encode()), *([] if block is None else [block])])


def _walk_one(features: Features, tree: Tree, policy: PolicySpec, pricing: Pricing, rng: np.random.Generator):
    """The walk's totals of one configuration on `features` and its acceptance table (None for adaptive rules)."""
    result = run_policy(features, tree, policy, rng, pricing if pricing.model is not None else None)
    table = result if isinstance(result, AcceptanceTable) else None
    if table is None:
        return result, None
    if pricing.model is not None:
        drafted = _proposed(features, table, tree)
        leaf = table.leaf_given()
        call, plain, feed = pricing.priced(features, tree, drafted=drafted, leaf=leaf)
        return walk(table, features, call, plain_cost=plain, next_feed_cost=feed,
                    replicas=pricing.priced_replicas(features, tree, drafted=drafted, leaf=leaf)), table
    return walk(table, features), table


def _samples_used(source: FeatureSource, tree: Tree, policy: PolicySpec) -> int:
    """Monte-Carlo samples per position behind a swor estimate: the recording's own where it recorded π for the
    tree's fan-out (`multidraft.candidate_acceptance` reads those, not --samples), else `policy.samples`."""
    recorded = getattr(source, "recorded_stats", None)
    fan_out = int(tree.n_children.max()) if tree.budget else 0
    if recorded is not None and not source.model_free and fan_out <= getattr(recorded, "candidates", 0):
        return int(recorded.swor_samples)
    return policy.samples


def _head(source: FeatureSource, tree: Tree, policy: PolicySpec, pricing: Pricing, reader: CacheReader,
          stats: TrajectoryStats, *, fit: str | None, n_boot: int, seed: int) -> dict:
    """The row's description columns of one configuration."""
    storage = reader.spec.storage
    greedy_exact_tail = policy.kind.ranked and (not tree.budget or int(tree.ranks.max()) < reader.spec.top_k)
    approximate = (not policy.lossless) or (
        not source.exact_tail and not source.model_free and not greedy_exact_tail and tree.dynamic is None)
    sampling_tree = (not policy.kind.ranked and tree.budget and int(tree.n_children.max()) > 1
                     and tree.dynamic is None)
    config = {
        "tree": tree.name, "budget": tree.budget, "depth": tree.max_depth, "draft": source.draft,
        "target": source.models["target"], "policy": policy.label, "temperature": source.temperature,
        "multi_draft": policy.multi_draft if sampling_tree else None, "batch": 1, "batching": None,
        "estimate": "exact" if stats.exact else "monte-carlo",
    }
    tail = {
        "lossless": policy.lossless, "storage": storage + (f":{reader.spec.top_k}" if storage == "topk" else ""),
        "approximate": bool(approximate), "cost_basis": pricing.basis,
        "cost_extrapolated": pricing.extrapolated(source, tree), "fit": fit,
        "context": round(source.mean_context(), 1),
        "cache": str(reader.path), "n_boot": n_boot, "seed": seed,
        "samples": _samples_used(source, tree, policy) if not stats.exact else None,
        **dict(stats.extra or {}),
    }
    return {"config": config, "tail": tail}


def _rows(runs: list[tuple[dict, TrajectoryStats]], features: Features, *, by_category: bool, n_boot: int,
          seed: int) -> list[dict]:
    """Rows of several configurations on the same trajectories: one bootstrap product per group."""
    summaries = summarize_many([stats for _, stats in runs], features, by_category=by_category, n_boot=n_boot,
                               seed=seed)
    return [{**head["config"], **row, **head["tail"]} for (head, _), rows in zip(runs, summaries) for row in rows]


def _request_rows(runs: list[tuple[dict, TrajectoryStats]], features: Features) -> list[pl.DataFrame]:
    """One row per configuration and trajectory: its totals and the expected histogram of accepted lengths
    (calls accepting 0, 1, ..., D drafts), as serving engines export per request. Built column-wise."""
    out = []
    for head, stats in runs:
        cfg = head["config"]
        reach = stats.reach  # (n_traj, D): expected calls with A >= d
        hist = np.concatenate([(stats.calls - (reach[:, 0] if reach.shape[1] else 0))[:, None],
                               reach[:, :-1] - reach[:, 1:], reach[:, -1:]], axis=1) if reach.shape[1] else \
            stats.calls[:, None]
        n = features.n_traj
        e = stats.engine
        none = np.full(n, np.nan)
        out.append(pl.DataFrame({
            **{k: pl.Series(k, [cfg[k]] * n, dtype=pl.String) for k in ("tree", "draft", "policy")},
            "temperature": np.full(n, float(cfg["temperature"])),
            "multi_draft": pl.Series("multi_draft", [cfg["multi_draft"]] * n, dtype=pl.String),
            "prompt_index": features.traj_prompt.astype(np.int64),
            "category": pl.Series("category", features.traj_category.astype(str), dtype=pl.String),
            "tokens": stats.tokens.astype(np.float64), "target_calls": stats.calls.astype(np.float64),
            "accepted": stats.accepted.astype(np.float64), "drafted": stats.drafted.astype(np.float64),
            "tokens_per_call": (stats.tokens / stats.calls).astype(np.float64),
            "accepted_length_histogram": pl.Series("h", np.ascontiguousarray(hist, dtype=np.float64)).cast(
                pl.List(pl.Float64)),
            "estimate": pl.Series("estimate", [cfg["estimate"]] * n, dtype=pl.String),
            "vllm_num_drafts": none if e is None else e.drafts.astype(np.float64),
            "vllm_num_draft_tokens": none if e is None else e.drafted.astype(np.float64),
            "vllm_num_accepted_tokens": none if e is None else e.accepted.astype(np.float64),
        }))
    return out


MAX_BOOT = 100_000  # bootstrap resamples allowed: each is a row of a (resamples x prompts) matrix
BATCH_BOOT = 200  # bootstrap replicates of a batch timeline (each replays the whole schedule)


def _batch_rows(rows_b1: list[dict], tables: list, features: Features, pricing: Pricing, batch: int, batching: str, *,
                n_boot: int, seed: int, skipped: list[str], policy: PolicySpec) -> list[dict]:
    """One 'all' row per configuration at batch size `batch`: the B=1 row with the batch timeline's speed columns."""
    from specsim.sim.batch import simulate_batch

    out = []
    alls = [r for r in rows_b1 if r["category"] == ALL]
    for row, (tree, table) in zip(alls, tables):
        if table is None:
            skipped.append(_skip_line(features, policy, tree.name, SpecError(
                "adaptive rules are replayed at batch 1 only (their γ differs per request)")))
            continue
        try:
            check_batch(features.draft, batch)  # a draft the live engine decodes one request at a time is not
            #                                     replayed in batches either: its history would not be the cache's
            est = simulate_batch(table, features, tree, pricing.model, pricing.draft_key, batch=batch,
                                 batching=batching, n_boot=min(n_boot, BATCH_BOOT), seed=seed)
        except SpecError as exc:
            skipped.append(_skip_line(features, policy, f"{tree.name} at batch {batch}", exc))
            continue
        fit = row.get("fit")
        out.append({
            **row, "batch": batch, "batching": batching,
            "fit": fit and "in-sample: the batch timeline decodes with the tree fitted on all prompts",
            "speedup": est.speedup[0], "speedup_lo": est.speedup[1], "speedup_hi": est.speedup[2],
            "tokens_per_s": est.tokens_per_s[0], "tokens_per_s_lo": est.tokens_per_s[1],
            "tokens_per_s_hi": est.tokens_per_s[2],
            "plain_tokens_per_s": est.plain_tokens_per_s[0],
            "latency_per_token_ms": est.latency_per_token_ms,
            "plain_latency_per_token_ms": est.plain_latency_per_token_ms,
            "mean_batch": est.mean_batch, "mc_se_speedup": est.mc_se_speedup,
            "speedup_ci_covers": est.covers,
            "cost_extrapolated": pricing.extrapolated(features, tree, batch),
            "n_boot": min(n_boot, BATCH_BOOT),
            "estimate": row["estimate"] if est.exact else "monte-carlo",
        })
    return out


def _finish_columns(df: pl.DataFrame, cost_model) -> pl.DataFrame:
    """Name the speed columns after their basis: measured `speedup`, `speedup_assumed`, or none at all."""
    speed = [c for c in df.columns if c.startswith(("speedup", "tokens_per_s", "plain_tokens_per_s", "latency",
                                                    "plain_latency", "mc_se_speedup", "mean_batch"))]
    if cost_model is None:
        return df.drop(speed + ["call_cost", "cost_extrapolated"])
    if "cost_basis" in df.columns:  # configurations the model could not price (unpriced="keep"): no speed
        unpriced = pl.col("cost_basis").str.starts_with("none")
        df = df.with_columns([pl.when(unpriced).then(None).otherwise(pl.col(c)).alias(c)
                              for c in speed + ["call_cost", "cost_extrapolated"] if c in df.columns])
    if not cost_model.measured:
        keep = {"speedup": "speedup_assumed", "speedup_lo": "speedup_assumed_lo", "speedup_hi": "speedup_assumed_hi"}
        return df.drop([c for c in speed if c not in keep]).rename({**keep, "call_cost": "call_cost_assumed"})
    if "plain_tokens_per_s" not in df.columns:  # batch-1 rows: plain rate from the same walk
        df = df.with_columns((pl.col("tokens_per_s") * pl.col("speedup").pow(-1)).alias("plain_tokens_per_s"))
    else:
        df = df.with_columns(pl.coalesce("plain_tokens_per_s", pl.col("tokens_per_s") / pl.col("speedup"))
                             .alias("plain_tokens_per_s"))
    return df.with_columns((1000 * pl.col("call_cost")).alias("call_ms")).drop("call_cost")


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
    result = run_policy(features, tree, policy, rng, pricing)
    if not isinstance(result, AcceptanceTable):
        raise SpecError(f"{policy.label} is not a fixed tree; speed_of prices fixed trees")
    drafted = _proposed(features, result, tree)
    leaf = result.leaf_given()
    call, plain, feed = pricing.priced(features, tree, drafted=drafted, leaf=leaf)
    stats = walk(result, features, call, plain_cost=plain, next_feed_cost=feed,
                 replicas=pricing.priced_replicas(features, tree, drafted=drafted, leaf=leaf))
    row = summarize_many([stats], features, by_category=False, n_boot=n_boot, seed=seed)[0][0]
    if batch == 1:
        return Speed(batch=1, tokens_per_call=row["tokens_per_call"],
                     speedup=(row["speedup"], row["speedup_lo"], row["speedup_hi"]),
                     tokens_per_s=row["tokens_per_s"] if pricing.model.measured else None, exact=stats.exact)
    est = simulate_batch(result, features, tree, pricing.model, pricing.draft_key, batch=batch, batching=batching,
                         n_boot=min(n_boot, BATCH_BOOT), seed=seed)
    return Speed(batch=batch, tokens_per_call=row["tokens_per_call"], speedup=est.speedup,
                 tokens_per_s=est.tokens_per_s[0], exact=stats.exact and est.exact)

"""Replay every configuration of one (draft, temperature): trees, blocks of trajectories, folds, workers.

Trees fitted on the cache (optimal:N) are fitted on a bounded random sample and scored held
out by cross-fitting over prompts; the cache is walked a block of whole trajectories at a
time (memory bounded by BLOCK_POSITIONS, not by the cache), in this process or in a pool of
spawned workers, and each configuration's per-trajectory totals are merged over the blocks,
so exact policies give the numbers of a replay in one piece. numpy + polars only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

import numpy as np
import polars as pl

from specsim.cache.reader import CacheReader
from specsim.errors import SpecError
from specsim.sim.engine import EngineTotals, TrajectoryStats
from specsim.sim.features import Features, FeatureSource
from specsim.sim.policies import run_adaptive
from specsim.sim.pricing import Pricing, priced_walk
from specsim.sim.rows import batch_rows, config_rows, request_rows, row_head, skip_line
from specsim.specs import PolicySpec, fitted_budget, parse_tree
from specsim.expansion import DynamicTree
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
                skipped.append(skip_line(features, policy, s, exc))
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


def replay(source: FeatureSource, policies: list[PolicySpec], specs: list[str], fixed: dict[str, Tree],
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
            runs.append((row_head(source, tree, state.policy, here, reader, stats, fit=fit, n_boot=n_boot,
                                  seed=seed), stats))
            tables.append((tree, state.tables.get(spec)))
        found = config_rows(runs, source, by_category=by_category, n_boot=n_boot, seed=seed)
        rows += found
        requests += request_rows(runs, source)
        for b in batches:
            if b > 1:
                rows += batch_rows(found, tables, features, pricing, b, batching, n_boot=n_boot, seed=seed,
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

    widths = [int(t.n_children.max()) for s, t in fixed.items() if s in specs and t.budget and not isinstance(t, DynamicTree)]
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
    pricing = pricing.for_rule(policy.name)
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
                            stats, _ = priced_walk(features.subset(sel), fits[tree_at].tree, policy,
                                                   state.pricing[spec], rng)
                            state.held.setdefault(spec, []).append((sel + t0, stats))
                if spec in together:
                    state.own.setdefault(spec, []).append((rows_here, together[spec]))
                elif spec not in state.fitted or keep_tables:
                    rng = _config_rng(features, policy, tree, seed, block)
                    stats, table = priced_walk(features, tree, policy, state.pricing[spec], rng)
                    state.own.setdefault(spec, []).append((rows_here, stats))
                    if keep_tables:
                        state.tables[spec] = table
            except SpecError as exc:
                state.failed[spec] = skip_line(features, policy, spec, exc)  # its rows are skipped, totals or not
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
    width = max([int(t.n_children.max()) for t in trees if t.budget and not isinstance(t, DynamicTree)] + [width])
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

"""The decoding walk: from per-position acceptance laws to expected totals per trajectory.

docs/design.md §2. Given the trajectory, the accepted length A of a call depends only on
where the call starts (the coupling), so a policy reduces to a table
P(A = a | a call starts at t). Decoding a trajectory of n tokens is then a Markov
chain over start positions: a call at t accepts A drafts, emits A + 1 tokens and the
next call starts at t + A + 1. Every total we report is an additive reward along
that chain, so its expectation is an exact dynamic program over start positions,

    C(t) = r(t) + Σ_a P(a | t) · C(t + a + 1),     C(n) = 0,

for all rewards at once (calls, drafted, accepted, reach per depth). It is computed
in its forward form: the expected number of calls starting at each position
(occupancy) times each position's expected reward. The occupancy is a banded
unit-triangular linear system, solved for every trajectory at once by one LAPACK
call (scipy), with no Python loop over positions.
No Monte-Carlo noise enters here; a Monte-Carlo table's standard error of the totals is a
delete-a-group jackknife of the whole walk over its replicates (`AcceptanceTable.jackknife`):
overlapping calls read the same draws, so per-position errors summed in quadrature (the
fallback, for tables without groups) misstate it (by 1.7-2.8x on the tests' random caches).
numpy (and scipy's LAPACK wrapper for the banded solve).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class EngineTail:
    """What a call near a trajectory's end accepts in an engine that verifies drafts past the end (vLLM
    drafts without looking at max_tokens or EOS and counts every accepted draft before it trims the
    output): the policy replayed on the positions the cache recorded past the end (`Features.tail`)."""

    rows: np.ndarray  # (M,) int64 start positions whose capped law hides acceptance past the end
    reach: np.ndarray  # (M, D) P(A >= d | t), d = 1..D, without the end cap


@dataclass(frozen=True)
class AcceptanceTable:
    """Law of the accepted length of a call, for every start position."""

    p_len: np.ndarray  # (N, D+1) float64: P(A = a | a call starts at local position t), rows sum to 1,
    #                    already capped at the end of each trajectory (a <= n-1-t); a Monte-Carlo table's
    #                    is an unbiased estimate whose entries may dip slightly below 0 (see `law`)
    drafted: np.ndarray  # (N,) draft tokens proposed by a call starting at t (usually tree.budget)
    exact: bool  # False for Monte-Carlo estimates
    se_len: np.ndarray | None = None  # (N,) standard error of E[A | t] when Monte-Carlo
    extra: Mapping | None = None  # per-configuration scalars for the result row, e.g. {"tv_distortion": 0.02}
    length: np.ndarray | None = None  # (N,) int accepted length when every law is a point mass (greedy,
    #                                   model-free): p_len is then one-hot and the walk follows pointers
    engine_drafted: np.ndarray | float | None = None  # (N,) or scalar: drafts an engine that does not cap them at
    #                                   the output limit proposes at t (vLLM: num_speculative_tokens, or what an
    #                                   n-gram match gives); None: no engine counters for this table
    engine_tail: EngineTail | None = None  # the law past the recorded end at calls near each end (None: capped)
    engine_length: np.ndarray | None = None  # (N,) the engine's own point-mass lengths (end-capped as `length`)
    #                                   where its proposals differ from this replay's (suffix decoding: vLLM's
    #                                   global tree also holds what it accepted past each end); None: `length`
    engine_note: str | None = None  # why the engine counters are not what the engine would report, if they are not
    jackknife: np.ndarray | None = None  # (G, N, D+1) Monte-Carlo: p_len with one group of replicates left out
    #                                   (the walk's totals are jackknifed over them: overlapping calls covary)
    leaf_end: np.ndarray | None = None  # (N,) bool, point masses: the call's accepted path ends on a leaf (a node
    #                                   the draft never fed, so the next call feeds it and the bonus: 2 tokens);
    #                                   None: a leaf is accepted exactly when the whole depth is (chains)
    leaf_law: np.ndarray | None = None  # (N, D+1) laws: P(A = a and the path ends on a leaf | t); None as above

    @property
    def depth(self) -> int:
        return int(self.p_len.shape[1]) - 1

    def mean_len(self) -> np.ndarray:
        """(N,) E[A | t]."""
        return self.p_len @ np.arange(self.p_len.shape[1], dtype=np.float64)

    def law(self) -> np.ndarray:
        """(N, D+1) a valid law to sample lengths from: p_len itself, or for a Monte-Carlo table whose
        unbiased estimate has small negative entries, the same table clipped and made monotone."""
        if self.exact:
            return self.p_len
        tail = np.cumsum(self.p_len[:, ::-1], axis=1)[:, ::-1][:, 1:]  # (N, D): estimated P(A >= d)
        tail = np.minimum.accumulate(np.clip(tail, 0.0, 1.0), axis=1)
        ge = np.concatenate([np.ones((tail.shape[0], 1)), tail, np.zeros((tail.shape[0], 1))], axis=1)
        return ge[:, :-1] - ge[:, 1:]

    def leaf_given(self) -> np.ndarray | None:
        """(N, D+1) P(the accepted path ends on a leaf the draft never fed | t, A = a): the next call then feeds
        2 tokens. None: exactly when A = D (trees whose inner depths all have children, e.g. chains)."""
        if self.leaf_end is not None:
            return np.repeat(self.leaf_end[:, None].astype(np.float64), self.p_len.shape[1], axis=1)
        if self.leaf_law is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(self.p_len > 0, np.clip(self.leaf_law / self.p_len, 0.0, 1.0), 0.0)
        return None

    def reach(self) -> np.ndarray:
        """(N, D) P(A >= d | t) for d = 1..D."""
        tail = np.cumsum(self.p_len[:, ::-1], axis=1)[:, ::-1]  # (N, D+1): P(A >= a)
        return tail[:, 1:]


@dataclass(frozen=True)
class EngineTotals:
    """vLLM's spec-decode counters of one decoding walk, per trajectory (docs/design.md §6): the prompt pass
    emits the first token (the first call starts at output position 1), a call that proposes nothing is no
    draft, a call drafts what the engine proposes (not capped at the output limit) and every accepted draft
    counts, also past max_tokens or EOS, where the engine trims the output afterwards."""

    drafts: np.ndarray  # (n_traj,) expected calls that proposed at least one token (num_drafts)
    drafted: np.ndarray  # (n_traj,) expected draft tokens proposed (num_draft_tokens)
    reach: np.ndarray  # (n_traj, D) expected calls whose first d drafts were all accepted (..._per_pos)
    note: str | None = None  # None: the engine's counts (exact, or their expectation); else what they miss

    @property
    def accepted(self) -> np.ndarray:
        """(n_traj,) expected accepted draft tokens (num_accepted_tokens)."""
        return self.reach.sum(axis=1)


@dataclass(frozen=True)
class TrajectoryStats:
    """Expected totals of one decoding walk per trajectory (arrays over trajectories)."""

    calls: np.ndarray  # (n_traj,) expected target calls
    drafted: np.ndarray  # (n_traj,) expected drafted tokens
    accepted: np.ndarray  # (n_traj,) expected accepted draft tokens
    tokens: np.ndarray  # (n_traj,) output tokens (= trajectory length)
    reach: np.ndarray  # (n_traj, D) expected number of calls with A >= d, d = 1..D (per-depth acceptance)
    cost: np.ndarray  # (n_traj,) expected total time of the calls (cost model's unit: seconds, or assumed steps)
    exact: bool  # False when built from a Monte-Carlo table
    se_accepted: np.ndarray | None = None  # (n_traj,) Monte-Carlo standard error of `accepted`
    extra: Mapping | None = None  # per-configuration scalars for the result row (passed on from the table)
    plain: np.ndarray | None = None  # (n_traj,) time of plain decoding of the trajectory (same unit as cost)
    engine: EngineTotals | None = None  # vLLM's counters of the same decoding (None: the policy has none)
    cost_replicas: np.ndarray | None = None  # (R, n_traj) `cost` priced by each replica of the cost profile
    plain_replicas: np.ndarray | None = None  # (R, n_traj) `plain` likewise (None: the profile kept no rounds)


def leaves_above_full_depth(tree) -> bool:
    """Whether a call's accepted path can end on a leaf short of the full depth (then the next call's root feed
    depends on which node it ended on: `AcceptanceTable.leaf_end` / `leaf_law`); not for chains or k-ary trees."""
    return bool(((tree.n_children == 0) & (tree.depths < tree.max_depth)).any())


def at_depth(x: np.ndarray, d: int, keyed: bool) -> np.ndarray:
    """Depth d's entries of a per-position array: x itself for a draft with one law per position, column d - 1
    of a head draft's (N, D, ...) array (`specsim.sim.features`)."""
    return x[:, d - 1] if keyed else x


class EndCap:
    """Where a node of depth d must stop: the start positions t with remaining[t] = d − 1 (computed once
    per depth). A node's reach is its parent's times π, and the parent's is already 0 where remaining
    < d − 1, so zeroing these positions alone gives reach = 0 wherever remaining < d: one scatter of a
    position per trajectory instead of a mask over every position."""

    def __init__(self, remaining: np.ndarray) -> None:
        self.remaining, self.at = remaining, {}

    def __call__(self, d: int) -> np.ndarray:
        if d not in self.at:
            n = max(self.remaining.shape[0] - (d - 1), 0)
            self.at[d] = np.flatnonzero(self.remaining[:n] == d - 1)
        return self.at[d]


def drafted_per_call(tree, room: np.ndarray) -> np.ndarray:
    """(N,) draft tokens a call drafts when it can accept at most room[t]: the tree's nodes of depth <= room.

    The counting convention of live decoding and of Hugging Face's assisted generation: a call
    near the output limit drafts only what it could accept, so acceptance rate = accepted /
    drafted counts the same tokens a real run verifies.
    """
    per_depth = np.bincount(tree.depths, minlength=tree.max_depth + 1).astype(np.float64)
    per_depth[0] = 0.0  # the root is not drafted
    within = np.cumsum(per_depth)  # within[d]: nodes of depth 1..d
    return within[np.clip(np.asarray(room, dtype=np.int64), 0, tree.max_depth)]


def check_table(table: AcceptanceTable, features) -> None:
    """ValueError when a table does not fit the features (a policy bug, not a user error)."""
    N = features.n_positions
    if table.p_len.ndim != 2 or table.p_len.shape[0] != N:
        raise ValueError(f"p_len has shape {table.p_len.shape}, expected ({N}, D+1)")
    if table.length is not None:  # point masses: p_len is their one-hot, built beside them
        if table.length.shape != (N,) or (N and (table.length.min() < 0 or table.length.max() >= table.p_len.shape[1])):
            raise ValueError("length must hold one accepted length 0..D per position")
        if np.any(table.length > features.remaining()):
            raise ValueError("p_len puts mass past the end of a trajectory (a > n-1-t)")
        return
    if N and float(np.abs(table.p_len.sum(axis=1) - 1.0).max()) > 1e-9:
        raise ValueError("p_len rows must sum to 1")
    remaining = features.remaining()
    near = np.flatnonzero(remaining < table.p_len.shape[1] - 1)  # only calls near an end can overflow
    beyond = np.arange(table.p_len.shape[1])[None, :] > remaining[near, None]  # (n_near, D+1)
    if np.any(table.p_len[near][beyond] > 1e-12):
        raise ValueError("p_len puts mass past the end of a trajectory (a > n-1-t)")


def walk(table: AcceptanceTable, features, call_cost=0.0, *, plain_cost=None, next_feed_cost=None,
         replicas: Sequence[tuple] = ()) -> TrajectoryStats:
    """Expected calls, drafted/accepted tokens, per-depth reach and time of decoding each trajectory.

    Every total is additive over calls, so E[total] = Σ_t visits(t) · r(t), with visits(t)
    the probability that a call starts at t (`occupancy`) — the same numbers as the
    backward recursion C(t) = r(t) + Σ_a P(a | t) C(t + a + 1), for all rewards at once.
    call_cost: time of a call starting at each position ((N,) or a scalar); plain_cost: time
    of a plain decode step at each position ((N,), summed over every position); and
    next_feed_cost (N, D+1) [t, a]: extra time the NEXT call pays when the call at t accepted a
    (its root feed: 2 tokens after a draft model's full acceptance, 1 + a entries for EAGLE),
    charged to the call at t in expectation, Σ_a P(a | t) · next_feed_cost[t, a].
    replicas: (call_cost, plain_cost, next_feed_cost) of each replica of the cost profile
    (`ProfileCost.replicas`); the same visits price each, giving `cost_replicas` and `plain_replicas`.
    """
    check_table(table, features)
    occ = occupancy(table, features)  # (N,)
    bounds = features.traj_start  # trajectories are contiguous, so sums per trajectory are segment sums
    per_traj = lambda x: np.add.reduceat(x, bounds, axis=0) if x.shape[0] else x  # noqa: E731
    calls = per_traj(occ)
    drafted = per_traj(occ * np.asarray(table.drafted, dtype=np.float64))
    if table.length is not None:  # point masses: count the visited calls by accepted length
        D1 = table.p_len.shape[1]
        visited = np.flatnonzero(occ)
        traj_of = np.repeat(np.arange(features.n_traj), features.traj_len)[visited]
        law = np.bincount(traj_of * D1 + table.length[visited], weights=occ[visited],
                          minlength=features.n_traj * D1).reshape(features.n_traj, D1)
    else:
        law = per_traj(occ[:, None] * table.p_len)  # (n_traj, D+1): expected calls accepting a drafts
    accepted = law @ np.arange(law.shape[1], dtype=np.float64)
    reach = np.cumsum(law[:, ::-1], axis=1)[:, ::-1][:, 1:]  # (n_traj, D): expected calls with A >= d
    se = None
    if not table.exact and table.jackknife is not None:  # the whole walk without each group of replicates
        G = table.jackknife.shape[0]
        acc = np.stack([per_traj(occupancy(replace(table, p_len=jack, jackknife=None), features)[:, None] * jack)
                        @ np.arange(jack.shape[1], dtype=np.float64) for jack in table.jackknife])  # (G, n_traj)
        se = np.sqrt((G - 1) / G * ((acc - acc.mean(axis=0)) ** 2).sum(axis=0))
    elif not table.exact and table.se_len is not None:
        se = np.sqrt(per_traj((occ * table.se_len) ** 2))
    def priced(call_cost, next_feed_cost):
        cost = per_traj(occ * np.broadcast_to(np.asarray(call_cost, dtype=np.float64), occ.shape))
        if next_feed_cost is not None and table.depth:
            cost = cost + per_traj(occ * (table.p_len * next_feed_cost).sum(axis=1))
        return cost

    cost = priced(call_cost, next_feed_cost)
    cost_replicas = plain_replicas = None
    if replicas:
        cost_replicas = np.stack([priced(c, f) for c, _, f in replicas])
        plain_replicas = np.stack([per_traj(np.asarray(p, dtype=np.float64)) for _, p, _ in replicas])
    return TrajectoryStats(
        calls=calls, drafted=drafted, accepted=accepted, tokens=features.traj_len.astype(np.float64),
        reach=np.ascontiguousarray(reach), cost=cost, exact=table.exact, se_accepted=se,
        extra=table.extra, plain=None if plain_cost is None else per_traj(np.asarray(plain_cost, dtype=np.float64)),
        engine=engine_totals(table, features), cost_replicas=cost_replicas, plain_replicas=plain_replicas,
    )


def engine_totals(table: AcceptanceTable, features) -> EngineTotals | None:
    """vLLM's counters of decoding each trajectory with `table` (`EngineTotals`); None without `engine_drafted`.

    The engine's walk is this one started at output position 1: the same calls follow (a call that
    would accept past the end ends the request either way), so its occupancy solves the same system
    with the first visit one position later. Each call's counted acceptance is the table's law, except
    near the end, where `engine_tail` holds the law past the end."""
    if table.engine_drafted is None:
        return None
    length = table.engine_length if table.engine_length is not None else table.length
    occ = occupancy(table, features, first=1) if length is None else deterministic_occupancy(length, features, 1)
    N, D1 = table.p_len.shape
    bounds = features.traj_start
    per_traj = lambda x: np.add.reduceat(x, bounds, axis=0) if x.shape[0] else x  # noqa: E731
    proposed = np.broadcast_to(np.asarray(table.engine_drafted, dtype=np.float64), (N,))
    if length is not None:
        visited = np.flatnonzero(occ)
        traj_of = np.repeat(np.arange(features.n_traj), features.traj_len)[visited]
        law = np.bincount(traj_of * D1 + length[visited], weights=occ[visited],
                          minlength=features.n_traj * D1).reshape(features.n_traj, D1)
    else:
        law = per_traj(occ[:, None] * table.p_len)  # (n_traj, D+1)
    reach = np.cumsum(law[:, ::-1], axis=1)[:, ::-1][:, 1:]  # (n_traj, D)
    tail = table.engine_tail
    if tail is not None and tail.rows.size:
        if length is not None:
            capped = (length[tail.rows, None] >= np.arange(1, D1)[None, :]).astype(np.float64)  # (M, D)
        else:
            capped = np.cumsum(table.p_len[tail.rows][:, ::-1], axis=1)[:, ::-1][:, 1:]  # (M, D)
        traj_of = np.searchsorted(bounds, tail.rows, side="right") - 1
        np.add.at(reach, traj_of, occ[tail.rows, None] * (tail.reach[:, : D1 - 1] - capped))
    return EngineTotals(drafts=per_traj(occ * (proposed > 0)), drafted=per_traj(occ * proposed),
                        reach=np.ascontiguousarray(reach), note=table.engine_note)


def occupancy(table: AcceptanceTable, features, first: int = 0) -> np.ndarray:
    """(N,) probability that a call starts at each position (expected visits of the walk).

    first: the output position of each trajectory's first call (1: the prompt pass emitted the first
    token, as in vLLM; a trajectory no longer than that has no call).

    The forward DP visits(t + a + 1) += visits(t) · P(a | t), started with one visit at each
    trajectory's first position, is the unit lower-triangular banded system
    (I − M) visits = e_starts with M[t + a + 1, t] = P(a | t): bandwidth D + 1, so one
    LAPACK banded triangular solve (dtbtrs, O(N·D)) does every trajectory at once. A call
    that accepts every remaining draft ends its trajectory; that mass leaves the system
    (it would otherwise land on the next trajectory's first position).
    """
    if table.length is not None:
        return deterministic_occupancy(table.length, features, first)
    from scipy.linalg.lapack import dtbtrs  # scipy.linalg is slow to import: not at CLI start

    P = table.p_len
    N, D1 = P.shape
    if N == 0:
        return np.zeros(0)
    band = np.empty((N, D1 + 1))  # (N, D+2); its transpose is LAPACK's Fortran-ordered lower band
    band[:, 0] = 1.0
    np.negative(P, out=band[:, 1:])
    remaining = features.remaining()
    near = np.flatnonzero(remaining < D1)  # calls whose a = remaining would step onto the next trajectory
    band[near, 1 + remaining[near]] = 0.0
    starts = np.zeros((N, 1))
    starts[(features.traj_start + first)[features.traj_len > first], 0] = 1.0
    visits, info = dtbtrs(band.T, starts, uplo="L", trans="N", diag="U")
    if info != 0:  # pragma: no cover - a unit-diagonal band cannot be singular
        raise ValueError(f"banded solve failed (LAPACK info {info})")
    return visits[:, 0]


def deterministic_occupancy(length: np.ndarray, features, first: int = 0) -> np.ndarray:
    """(N,) 0/1 visits when a call at t always accepts length[t] drafts (greedy, model-free).

    Follows next(t) = t + length[t] + 1 for every trajectory at once: one step per call of
    the longest walk, each a handful of array operations over the trajectories.
    """
    N = features.n_positions
    nxt = np.arange(N) + np.asarray(length, dtype=np.int64) + 1
    visits = np.zeros(N)
    cur = features.traj_start.astype(np.int64) + first
    end = features.traj_start.astype(np.int64) + features.traj_len
    cur, end = cur[end > cur], end[end > cur]
    while cur.size:
        visits[cur] = 1.0
        cur = nxt[cur]
        alive = cur < end
        cur, end = cur[alive], end[alive]
    return visits


def engine_calls(table: AcceptanceTable, features, i_traj: int) -> list[tuple[int, int, int]]:
    """(start, drafted, accepted) of every call vLLM makes decoding trajectory `i_traj` when each call's
    acceptance is a point mass (greedy, model-free): its walk from output position 1, with the
    acceptance past the end from `engine_tail` (`engine_totals`' walk, call by call)."""
    if table.length is None or table.engine_drafted is None:
        raise ValueError("engine_calls follows point-mass tables with engine counters")
    own = table.engine_length if table.engine_length is not None else table.length
    start, n = int(features.traj_start[i_traj]), int(features.traj_len[i_traj])
    proposed = np.broadcast_to(np.asarray(table.engine_drafted, dtype=np.float64), (features.n_positions,))
    past = {}
    tail = table.engine_tail
    if tail is not None:
        mine = (tail.rows >= start) & (tail.rows < start + n)
        past = {int(r): int(reach.sum()) for r, reach in zip(tail.rows[mine], tail.reach[mine])}
    calls, t = [], 1
    while t < n:
        row = start + t
        accepted = past.get(row, int(own[row]))
        calls.append((t, int(proposed[row]), accepted))
        t += int(own[row]) + 1
    return calls

"""The decoding walk: from per-position acceptance laws to expected totals per trajectory.

DESIGN.md §2. Given the trajectory, the accepted length A of a call depends only on
where the call starts (the coupling), so a policy reduces to a table
P(A = a | a call starts at t). Decoding a trajectory of n tokens is then a Markov
chain over start positions: a call at t accepts A drafts, emits A + 1 tokens and the
next call starts at t + A + 1. Every total we report is an additive reward along
that chain, so its expectation is an exact dynamic program over start positions,

    C(t) = r(t) + Σ_a P(a | t) · C(t + a + 1),     C(n) = 0,

for all rewards at once (calls, drafted, accepted, reach per depth). It is computed
in its forward form: the expected number of calls starting at each position
(occupancy) times each position's expected reward, vectorised across trajectories
by looping over the offset from the trajectory end.
No Monte-Carlo noise enters here; a Monte-Carlo table's standard errors are carried
to the totals by the delta method (expected visits × per-position SE).
numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


@dataclass(frozen=True)
class AcceptanceTable:
    """Law of the accepted length of a call, for every start position."""

    p_len: np.ndarray  # (N, D+1) float64: P(A = a | a call starts at local position t), rows sum to 1,
    #                    already capped at the end of each trajectory (a <= n-1-t)
    drafted: np.ndarray  # (N,) draft tokens proposed by a call starting at t (usually tree.budget)
    exact: bool  # False for Monte-Carlo estimates
    se_len: np.ndarray | None = None  # (N,) standard error of E[A | t] when Monte-Carlo
    extra: Mapping | None = None  # per-configuration scalars for the result row, e.g. {"tv_distortion": 0.02}

    @property
    def depth(self) -> int:
        return int(self.p_len.shape[1]) - 1

    def mean_len(self) -> np.ndarray:
        """(N,) E[A | t]."""
        return self.p_len @ np.arange(self.p_len.shape[1], dtype=np.float64)

    def reach(self) -> np.ndarray:
        """(N, D) P(A >= d | t) for d = 1..D."""
        tail = np.cumsum(self.p_len[:, ::-1], axis=1)[:, ::-1]  # (N, D+1): P(A >= a)
        return tail[:, 1:]


@dataclass(frozen=True)
class TrajectoryStats:
    """Expected totals of one decoding walk per trajectory (arrays over trajectories)."""

    calls: np.ndarray  # (n_traj,) expected target calls
    drafted: np.ndarray  # (n_traj,) expected drafted tokens
    accepted: np.ndarray  # (n_traj,) expected accepted draft tokens
    tokens: np.ndarray  # (n_traj,) output tokens (= trajectory length)
    reach: np.ndarray  # (n_traj, D) expected number of calls with A >= d, d = 1..D (per-depth acceptance)
    cost: np.ndarray  # (n_traj,) expected total cost in plain-target-step units (from the cost model)
    exact: bool  # False when built from a Monte-Carlo table
    se_accepted: np.ndarray | None = None  # (n_traj,) Monte-Carlo standard error of `accepted`
    extra: Mapping | None = None  # per-configuration scalars for the result row (passed on from the table)


def check_table(table: AcceptanceTable, features) -> None:
    """ValueError when a table does not fit the features (a policy bug, not a user error)."""
    N = features.n_positions
    if table.p_len.ndim != 2 or table.p_len.shape[0] != N:
        raise ValueError(f"p_len has shape {table.p_len.shape}, expected ({N}, D+1)")
    if not np.allclose(table.p_len.sum(axis=1), 1.0, atol=1e-9):
        raise ValueError("p_len rows must sum to 1")
    remaining = features.remaining()
    near = np.flatnonzero(remaining < table.p_len.shape[1] - 1)  # only calls near an end can overflow
    beyond = np.arange(table.p_len.shape[1])[None, :] > remaining[near, None]  # (n_near, D+1)
    if np.any(table.p_len[near][beyond] > 1e-12):
        raise ValueError("p_len puts mass past the end of a trajectory (a > n-1-t)")


def walk(table: AcceptanceTable, features, call_cost: float) -> TrajectoryStats:
    """Expected calls, drafted/accepted tokens and per-depth reach of decoding each trajectory.

    Every total is additive over calls, so E[total] = Σ_t visits(t) · r(t), with visits(t)
    the probability that a call starts at t (`occupancy`) — the same numbers as the
    backward recursion C(t) = r(t) + Σ_a P(a | t) C(t + a + 1), for all rewards at once.
    """
    check_table(table, features)
    occ = occupancy(table, features)  # (N,)
    bounds = features.traj_start  # trajectories are contiguous, so sums per trajectory are segment sums
    per_traj = lambda x: np.add.reduceat(x, bounds, axis=0) if x.shape[0] else x  # noqa: E731
    calls = per_traj(occ)
    drafted = per_traj(occ * np.asarray(table.drafted, dtype=np.float64))
    accepted = per_traj(occ * table.mean_len())
    reach = per_traj(occ[:, None] * table.reach())  # (n_traj, D)
    se = None
    if not table.exact and table.se_len is not None:
        se = np.sqrt(per_traj((occ * table.se_len) ** 2))
    return TrajectoryStats(
        calls=calls, drafted=drafted, accepted=accepted, tokens=features.traj_len.astype(np.float64), reach=reach,
        cost=calls * float(call_cost), exact=table.exact, se_accepted=se, extra=table.extra,
    )


def _right_aligned(features) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Trajectories longest first, their ends, and how many have length >= o for each offset o."""
    order = np.argsort(-features.traj_len, kind="stable")  # (n_traj,)
    lens = features.traj_len[order].astype(np.int64)
    ends = features.traj_start[order] + lens
    alive = np.searchsorted(-lens, -np.arange(int(lens[0]) + 1), side="right")  # alive[o] = #{len >= o}
    return order, ends, alive


def occupancy(table: AcceptanceTable, features) -> np.ndarray:
    """(N,) probability that a call starts at each position (expected visits of the walk).

    Forward DP, visits(t + a + 1) += visits(t) · P(a | t), run for all trajectories at once
    over the offset from the end: a trajectory's visits at offset o are final once every
    larger offset has been processed.
    """
    order, ends, alive = _right_aligned(features)
    P = table.p_len
    D1 = P.shape[1]
    max_len = len(alive) - 1
    n_traj = len(order)
    # occ[i, D1 + o]: visits at offset o from the end; D1 columns of padding on the left take the
    # (zero) mass a table puts past the end, so the scatter below never repeats an index.
    occ = np.zeros((n_traj, max_len + 1 + D1))
    occ[np.arange(n_traj), D1 + features.traj_len[order]] = 1.0
    out = np.zeros(features.n_positions)
    back = np.arange(D1)
    for o in range(max_len, 0, -1):
        m = alive[o]
        t = ends[:m] - o  # (m,) local positions at offset o
        here = occ[:m, D1 + o]  # (m,)
        out[t] = here
        occ[:m, D1 + o - 1 - back] += here[:, None] * P[t]  # (m, D+1)
    return out

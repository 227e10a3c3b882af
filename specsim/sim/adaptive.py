"""Adaptive speculation length for chains, replayed exactly.

Two rules change the number of drafts γ between target calls:

* ``adaptive-hf`` — Hugging Face assisted generation's heuristic schedule
  (`num_assistant_tokens_schedule="heuristic"`): start at γ = the chain's length G; after a
  call that accepted all γ drafts, γ += 2; otherwise γ = max(1, γ − 1).
* ``adaptive-history[:hi,lo]`` — an acceptance-history rule: after each call, the acceptance
  rate of that call, A/γ, grows γ by 1 when above ``hi`` (default 0.8) and shrinks it by 1
  (not below 1) when below ``lo`` (default 0.4).

γ is capped at Γ = max(16, 2G) so the state space stays finite (reported in the row).

Given a cached trajectory, a chain of γ drafts from position t accepts A with
P(A ≥ k) = Π_{j<k} β_{t+j}, k ≤ min(γ, n − 1 − t) (docs/design.md §2; β_t = min(1, q_t(y_t)/p_t(y_t))
when sampling, 1[ρ_t = 0] when greedy). The walk is a Markov chain over (start position, γ):
a forward pass pushes the probability of each state to its successors, so the expected totals
(calls, drafts, accepted tokens, per-depth reach, cost) are exact sums of per-state rewards —
no Monte-Carlo. Vectorised over trajectories, looping over the offset from the trajectory end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from specsim.errors import SpecError
from specsim.expansion import DynamicTree
from specsim.trees import Tree, chain

if TYPE_CHECKING:  # pragma: no cover
    from specsim.sim.engine import TrajectoryStats
    from specsim.sim.features import Features

HISTORY_DEFAULTS = (0.8, 0.4)  # (hi, lo) acceptance-rate thresholds of adaptive-history
MIN_GAMMA_CAP = 16  # Γ = max(this, 2G): largest speculation length the state space holds


def next_gamma_table(rule: str, gamma_cap: int, params: tuple = ()) -> np.ndarray:
    """(Γ+1, Γ+1) int: γ' after a call with γ drafts (row) that accepted a (column); row 0 unused."""
    g = np.arange(gamma_cap + 1)[:, None]
    a = np.arange(gamma_cap + 1)[None, :]
    if rule == "adaptive-hf":
        nxt = np.where(a >= g, g + 2, g - 1)
    elif rule == "adaptive-history":
        hi, lo = (float(x) for x in params) if params else HISTORY_DEFAULTS
        if not 0 <= lo <= hi <= 1:
            raise SpecError(f"adaptive-history:{hi:g},{lo:g}: need 0 <= lo <= hi <= 1 (rates of accepted drafts)")
        rate = a / np.maximum(g, 1)
        nxt = np.where(rate > hi, g + 1, np.where(rate < lo, g - 1, g))
    else:
        raise SpecError(f"{rule!r} is not an adaptive rule; use adaptive-hf or adaptive-history[:hi,lo]")
    return np.clip(nxt, 1, gamma_cap)


def adaptive_walks(beta: np.ndarray, features: "Features", starts: Sequence[int], nxt: np.ndarray,
                   call_cost: np.ndarray | None, full_cost: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
    """Expected totals per trajectory of the (position, γ) chain, for each start γ in `starts` (one rule
    and cap: Markov walks share one pass).

    call_cost (N, Γ+1): time of a call of γ drafts starting at each position (None: unpriced, the
    cost totals are 0). full_cost (N, Γ+1): the extra time when that call accepts all γ (a draft
    model then feeds the next call 2 tokens, its last draft and the bonus; None: none). A call drafts
    min(γ, room) tokens, room = drafts it could still accept before the output limit.
    Point-mass acceptance (greedy: every β is 0 or 1) takes the deterministic walk.
    """
    if np.all((beta == 0) | (beta == 1)):
        return [deterministic_walk(beta, features, s, nxt, call_cost, full_cost) for s in starts]
    return markov_walks(beta, features, starts, nxt, call_cost, full_cost)


def markov_walk(beta: np.ndarray, features: "Features", start_gamma: int, nxt: np.ndarray,
                call_cost: np.ndarray | None, full_cost: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The forward pass over (offset, γ) states for one start γ: `markov_walks`' totals."""
    return markov_walks(beta, features, [start_gamma], nxt, call_cost, full_cost)[0]


def markov_walks(beta: np.ndarray, features: "Features", starts: Sequence[int], nxt: np.ndarray,
                 call_cost: np.ndarray | None, full_cost: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
    """The forward pass over (offset, γ) states, vectorised over trajectories (any β in [0, 1]), for
    each start γ in `starts` at once (one rule, one cap: the walks differ only in their first call).

    A call of γ drafts from offset o' (tokens left to the trajectory's end) that accepts a < γ
    lands at offset o = o' − a − 1 with probability Π_{j<a} β_{t'+j} · (1 − β_{t'+a}), and the
    rejected position t' + a is the same for every source: the one before o's start. For each
    source γ, the a that lead to one γ' form runs [lo, hi] of the next-γ table, so the inflow to
    (o, γ') is (1 − β) times a window sum over sources, R_w(o) = Σ_{a=lo..hi} here(o+1+a, γ) ·
    S(o+1+a, a) (S(o', k): the first k drafts from o' accepted), kept by the recurrence

        R_w(o) = here(o+1+lo, γ) · S(o+1+lo, lo) + β_{t(o+2)} · (R_w(o+1) − here(o+2+hi, γ) · S(o+2+hi, hi)).

    Full acceptance (a = γ) is scattered ahead. O(positions × (Γ + runs)), against the
    O(positions × Γ³) of a dense transition product. The walks of several start γ share the
    survival products S and every per-position read, and one numpy call covers them all.
    """
    cap = nxt.shape[0] - 1
    starts = [int(s) for s in starts]
    n_walks = len(starts)
    order = np.argsort(-features.traj_len, kind="stable")
    lens = features.traj_len[order].astype(np.int64)
    ends = (features.traj_start[order] + lens).astype(np.int64)
    n_traj, max_len = len(order), int(lens[0]) if len(order) else 0
    gammas = np.arange(cap + 1)
    # the windows: for each source γ, maximal runs of a < γ with one destination nxt[γ, a]
    runs = sorted((int(nxt[g, lo]), g, lo, hi) for g in range(1, cap + 1) for lo, hi in _runs(nxt[g, :g]))
    w_to, w_gamma, w_lo, w_hi = (np.array(c, dtype=np.int64) for c in zip(*runs))  # grouped by destination
    to_gamma, first, size = np.unique(w_to, return_index=True, return_counts=True)
    # a destination's runs are summed level by level (its first run, then its second, ...), in the order
    # np.add.reduceat adds them: a few row gathers instead of reduceat along the first axis, and not a
    # BLAS product, which stays on one core
    levels = [(np.flatnonzero(size > j), first[size > j] + j) for j in range(1, int(size.max()))]
    # per-position inputs by offset (row o: the position o before each trajectory's end; 0 past its start),
    # so every read below is a row slice rather than a gather
    offsets = np.arange(max_len + 3)[:, None]
    inside = (offsets >= 1) & (offsets <= lens[None, :])
    at = np.where(inside, ends[None, :] - offsets, 0)
    beta_at = np.where(inside, beta[at], 0.0)  # (max_len + 3, n_traj)
    room_at = features.room()[at]
    cost_at = None if call_cost is None else np.where(inside[..., None], call_cost[at], 0.0)  # (.., n_traj, Γ+1)
    full_at = None if full_cost is None else np.where(inside[..., None], full_cost[at], 0.0)
    slots = cap + 1  # reads reach back to o + Γ + 1 (before o's slot is rewritten), scatters ahead to o − Γ − 1
    walks = np.arange(n_walks)
    # trajectories on the last axis (walks before them), so every gather below copies contiguous rows
    occ = np.zeros((slots, cap + 1, n_walks, n_traj))  # full-acceptance inflow, by offset slot
    hist_here = np.zeros((slots, cap + 1, n_walks, n_traj))  # probability a call starts at offset o with γ
    hist_surv = np.zeros((slots, cap + 2, n_traj))  # S(o, k) = Π_{j<k} β_{t(o)+j}: the same for every walk
    window = np.zeros((len(runs), n_walks, n_traj))
    totals = {name: np.zeros((n_walks, n_traj)) for name in ("calls", "drafted", "accepted", "cost")}
    reach = np.zeros((cap, n_walks, n_traj))
    diag_to = nxt[gammas, gammas]  # γ' after a call of γ that accepted all γ
    for o in range(max_len, 0, -1):
        m = int(np.searchsorted(-lens, -o, side="right"))  # trajectories with length >= o
        s_in, s_out = (o + 1 + w_lo) % slots, (o + 2 + w_hi) % slots
        enter = hist_here[s_in, w_gamma, :, :m] * hist_surv[s_in, w_lo, None, :m]  # (runs, walks, m)
        leave = hist_here[s_out, w_gamma, :, :m] * hist_surv[s_out, w_hi, None, :m]
        # β_{t−2}: the β a window's older sources also had to pass (0 past the start, where the window is 0)
        window[..., :m] = enter + beta_at[o + 2, :m] * (window[..., :m] - leave)
        here = occ[o % slots, ..., :m].copy()  # (Γ+1, walks, m)
        occ[o % slots, ..., :m] = 0.0
        inflow = window[..., :m] * (1.0 - beta_at[o + 1, :m])  # (runs, walks, m): rejected at t − 1
        into = inflow[first]  # (destinations, walks, m)
        for dest, rows in levels:
            into[dest] += inflow[rows]
        here[to_gamma] += into
        new = np.flatnonzero(lens[:m] == o)  # trajectories whose first call is at this offset
        if new.size:
            here[np.asarray(starts)[:, None], walks[:, None], new[None, :]] += 1.0
        top = min(cap, o - 1)  # most drafts acceptable from offset o
        surv = hist_surv[o % slots, :, :m]
        surv[0] = 1.0
        for j in range(top):  # S(o, j + 1) = S(o, j) · β_{t+j}, zero past the output end (rows: see _suffix_sums)
            np.multiply(surv[j], beta_at[o - j, :m], out=surv[j + 1])
        surv[top + 1 :] = 0.0
        hist_here[o % slots, ..., :m] = here
        at_least = _suffix_sums(here)  # (Γ+1, walks, m): Σ_{γ >= k} here
        tail = surv[1 : cap + 1, None] * at_least[1:]  # (Γ, walks, m): Σ_γ here · P(A >= k | γ)
        totals["calls"][:, :m] += at_least[0]
        totals["drafted"][:, :m] += (here * np.minimum(gammas[:, None], room_at[o, :m])[:, None]).sum(axis=0)
        if cost_at is not None:
            totals["cost"][:, :m] += (here * cost_at[o, :m].T[:, None]).sum(axis=0)
        if full_at is not None:  # a call of γ accepts all γ with probability S(o, γ)
            totals["cost"][:, :m] += (here * (surv[: cap + 1] * full_at[o, :m].T)[:, None]).sum(axis=0)
        totals["accepted"][:, :m] += tail.sum(axis=0)
        reach[..., :m] += tail
        full = np.arange(1, min(top, o - 2) + 1)  # a call accepting all γ lands at o − γ − 1 > 0
        if full.size:
            occ[(o - full - 1) % slots, diag_to[full], :, :m] += here[full] * surv[full, None]
    out = []
    for w in range(n_walks):
        one = {name: np.empty(n_traj) for name in totals}
        for name, v in totals.items():
            one[name][order] = v[w]
        one["reach"] = np.empty((n_traj, cap))
        one["reach"][order] = reach[:, w].T
        out.append(one)
    return out


def _suffix_sums(x: np.ndarray) -> np.ndarray:
    """out[i] = Σ_{j >= i} x[j] along the first axis, row by row: the same sums as np.cumsum(x[::-1],
    axis=0)[::-1], added in the same order, about 5x faster for a few dozen rows of a few hundred
    trajectories (numpy's accumulate along the first axis of a C-ordered array steps across rows
    element by element)."""
    out = np.empty_like(x)
    out[-1] = x[-1]
    for i in range(x.shape[0] - 2, -1, -1):
        np.add(out[i + 1], x[i], out=out[i])
    return out


def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs [lo, hi] of equal values in a 1-D array."""
    cuts = np.flatnonzero(np.diff(row)) + 1
    starts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [len(row)]]) - 1
    return [(int(a), int(b)) for a, b in zip(starts, stops)]


def deterministic_walk(beta: np.ndarray, features: "Features", start_gamma: int, nxt: np.ndarray,
                       call_cost: np.ndarray | None, full_cost: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """`adaptive_walks` when every β is 0 or 1: each trajectory is one path of calls, walked in lockstep.

    A call of γ drafts at t accepts A = min(γ, run_t), run_t = the β = 1 run from t, stopped
    before the trajectory's last position (its last token is always the target's); the next
    call starts at t + A + 1 with γ' = nxt[γ, A]. The same totals as the Markov walk, in
    O(calls) instead of O(positions × Γ²).
    """
    cap = nxt.shape[0] - 1
    N, n_traj = beta.shape[0], features.n_traj
    ends = (features.traj_start + features.traj_len).astype(np.int64)
    pos = np.arange(N)
    last = np.zeros(N, dtype=bool)
    last[ends[features.traj_len > 0] - 1] = True
    barrier = np.where((beta == 0) | last, pos, N)  # where a run from an earlier t must stop
    run = np.minimum.accumulate(barrier[::-1])[::-1] - pos  # (N,)
    room_all = features.room()
    totals = {name: np.zeros(n_traj) for name in ("calls", "drafted", "accepted", "cost")}
    reach = np.zeros((n_traj, cap))
    t = features.traj_start.astype(np.int64).copy()
    gamma = np.full(n_traj, start_gamma, dtype=np.int64)
    live = np.flatnonzero(features.traj_len > 0)
    depth = np.arange(cap)
    while live.size:
        tt, g = t[live], gamma[live]
        a = np.minimum(g, run[tt])
        totals["calls"][live] += 1
        totals["drafted"][live] += np.minimum(g, room_all[tt])
        totals["accepted"][live] += a
        if call_cost is not None:
            totals["cost"][live] += call_cost[tt, g]
        if full_cost is not None:
            totals["cost"][live] += np.where(a == g, full_cost[tt, g], 0.0)
        reach[live] += depth[None, :] < a[:, None]
        t[live] = tt + a + 1
        gamma[live] = nxt[g, a]
        live = live[t[live] < ends[live]]
    return {**totals, "reach": reach}


BLOCK_ON_CHAINS = "block verification applies"  # check_chain's rule for block verification (live and replay)


def check_chain(tree: Tree, what: str = "", rule: str = "adaptive speculation lengths apply") -> None:
    """SpecError unless `tree` is a static chain, what an adaptive length schedule and block verification draft
    (`what` prefixes the message, `rule` names what needs the chain)."""
    if isinstance(tree, DynamicTree) or (tree.budget and int(tree.n_children.max()) > 1):
        raise SpecError(f"{what}{rule} to chains, not to the tree {tree.name or tree.to_spec()}")


def adaptive_stats_many(features: "Features", trees: Sequence[Tree], spec, pricings: Sequence) -> list["TrajectoryStats"]:
    """Exact expected totals per trajectory of each chain in `trees` whose length adapts by `spec.name`.

    pricings[i] (`specsim.sim.pricing.Pricing`, or None for no speed columns) prices trees[i]: a call
    of γ drafts at t costs what a chain:γ call costs there (its context, its output cap), as fixed
    trees are priced, and a call that accepts all γ adds what chain:γ's does: the next call's 2-token
    root feed. Chains with the same cap Γ and pricing are walked together, sharing every per-position
    read (the totals are the same as walking each alone)."""
    from specsim.sim.engine import TrajectoryStats

    for tree in trees:
        check_chain(tree)
    if features.model_free:
        raise SpecError(f"adaptive rules need a model draft; {features.draft!r} is model-free")
    beta = features.acceptance()
    starts = [max(1, tree.max_depth) for tree in trees]
    groups: dict[tuple, list[int]] = {}  # (Γ, pricing) -> trees walked together
    for i, start in enumerate(starts):
        groups.setdefault((max(MIN_GAMMA_CAP, 2 * start), id(pricings[i])), []).append(i)
    out: list = [None] * len(trees)
    for (cap, _), members in groups.items():
        pricing = pricings[members[0]]
        nxt = next_gamma_table(spec.name, cap, tuple(getattr(spec, "params", ())))
        call_cost, full_cost, plain = None, None, None  # (N, Γ+1) when priced
        if pricing is not None:
            call_cost, full_cost = np.zeros((features.n_positions, cap + 1)), np.zeros((features.n_positions, cap + 1))
            for g in range(1, cap + 1):
                call, _, feed = pricing.priced(features, chain(str(g)))
                call_cost[:, g] = call
                if feed is not None:  # (N, g + 1): the next call's extra root feed after accepting a
                    full_cost[:, g] = feed[:, g]
            plain_steps = pricing.priced(features, chain("1"))[1]
            plain = np.add.reduceat(plain_steps, features.traj_start) if features.n_positions else plain_steps
        walks = adaptive_walks(beta, features, [starts[i] for i in members], nxt, call_cost, full_cost)
        for i, totals in zip(members, walks):
            extra = {"gamma_start": starts[i], "gamma_cap": cap, "adaptive_rule": spec.label}
            out[i] = TrajectoryStats(calls=totals["calls"], drafted=totals["drafted"], accepted=totals["accepted"],
                                     tokens=features.traj_len.astype(np.float64), reach=totals["reach"],
                                     cost=totals["cost"], exact=True, extra=extra, plain=plain)
    return out

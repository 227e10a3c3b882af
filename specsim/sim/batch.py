"""Batched speculative decoding on a timeline: B requests per engine step, step times from a profile.

docs/design.md §3. At batch size B an engine step drafts and verifies every active request
together: its time is the profile's at the step's batch, token and width counts, and it
yields Σ (A_i + 1) tokens over the requests. Each request's accepted lengths come from
the exact per-position law of the replay (`AcceptanceTable`): greedy and model-free
tables are point masses, so a schedule is deterministic; sampling tables are drawn, one
uniform coin per call (Monte-Carlo). Two schedules, as serving engines run them:

* ``lockstep`` (static batching): B trajectories start together; finished requests leave
  and the batch shrinks until the last one finishes; then the next B start;
* ``continuous``: a finished request's lane takes the next trajectory before the next step.

A step pays: the draft's root feed (width 1, or 2 for a request whose last call accepted
a leaf the draft never fed) and one draft forward per tree level needed by the deepest
request (a request drafts no deeper than its room before the output limit), plus one
target forward over the widest request's nodes — for a model-free draft, over what each
request's match proposed (`timeline`'s `proposed`) — at the longest context in the batch
(rows are padded to it, as in the live engine's slot cache). Plain decoding runs the same
schedule with one token per request per step. Prompt passes are outside both (speculation
does not change them).

Replicates run side by side as rows of every array: the cache's trajectory order (the
point estimate; with sampling, `coins` replicates of it give its mean and standard error)
and `n_boot` bootstrap resamples of the trajectories with fresh coins (the 95% CI over
prompts and coins: the replicates' percentile interval rescaled to the point estimate, since
a resample's repeated requests shorten lockstep batches; `recentred`). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.sim.cost import StepShape, tree_by_room
from specsim.sim.engine import AcceptanceTable
from specsim.sim.metrics import expanded_tail
from specsim.specs import BATCHING
from specsim.expansion import DynamicTree
from specsim.trees import Tree


def recentred(value: float, replicates: np.ndarray, rows: int) -> tuple[float, float, float]:
    """(value, lo, hi): the point estimate `value` of a positive quantity (a rate, a speedup) and its
    replicates' 95% percentile interval (expanded for `rows` resampled requests, as every CI of
    `sim.metrics`), moved to it. Why move it: a resample repeats requests, and in
    lockstep a batch waits for its slowest request, so copies of one request in a batch (the same calls) end
    speculative batches sooner than distinct requests do, while plain batches run to the output limit alike;
    every replicate's speedup is shifted up by that, not by the prompts drawn (six requests at batch 4: the
    point estimate at the interval's lower edge, and the live value below it in 13 of 18 batch-4 rows of
    three bench_speedup runs). The spread is the replicates'; the location is the point estimate's, which
    decodes distinct requests as the engine does. Moved by scaling (the interval times value / median), not
    by shifting: the quantities are positive, and a shift of a wide interval (a profile round measured in a
    slow phase of the host prices some replicates far slower) can put its lower end below zero, an impossible
    speedup. Without two replicates, no interval (NaN)."""
    if len(replicates) < 2:
        return value, float("nan"), float("nan")
    tail = expanded_tail(int(rows))
    lo, mid, hi = np.percentile(replicates, [tail, 50, 100 - tail])
    return value, float(lo * value / mid), float(hi * value / mid)


@dataclass(frozen=True)
class Timeline:
    """Totals of one schedule per replicate."""

    seconds: np.ndarray  # (R,) decode time
    tokens: np.ndarray  # (R,) output tokens
    latency: np.ndarray  # (R,) mean over requests of (time in the engine / tokens)
    steps: np.ndarray  # (R,) engine steps
    lane_steps: np.ndarray  # (R,) Σ over steps of the requests in the step (mean batch = lane_steps / steps)


@dataclass(frozen=True)
class BatchEstimate:
    """What the batch simulator reports for one configuration and batch size."""

    batch: int  # requests per step (at most)
    batching: str  # 'lockstep' | 'continuous'
    tokens_per_s: tuple[float, float, float]  # speculative throughput: value, CI low, high
    plain_tokens_per_s: tuple[float, float, float]  # plain batched decoding at the same B
    speedup: tuple[float, float, float]  # throughput ratio
    latency_per_token_ms: float  # mean per-request time in the engine per token, speculative
    plain_latency_per_token_ms: float
    mean_batch: float  # mean requests per speculative step
    mc_se_speedup: float | None  # Monte-Carlo standard error of the point estimate (sampling tables)
    exact: bool  # True when every accepted length is a point mass (no coins)
    covers: str = "prompts"  # what the CIs account for (the cost profile's rounds too, when it kept them)


class _Shapes:
    """Per-room step shapes of a tree as arrays: verify tokens and draft level widths."""

    def __init__(self, tree: Tree, model_draft: bool, one_pass: bool = False):
        shapes: list[StepShape] = tree_by_room(tree, model_draft=model_draft, one_pass=one_pass)
        self.one_pass = one_pass
        self.depth = tree.max_depth
        self.verify = np.array([s.verify_tokens for s in shapes], dtype=np.float64)  # (D+1,)
        width = max((len(s.draft_levels) for s in shapes), default=0)
        self.levels = np.zeros((len(shapes), width))  # (D+1, levels): 0 = no forward
        for m, s in enumerate(shapes):
            self.levels[m, : len(s.draft_levels)] = s.draft_levels


def timeline(lengths, features, tree: Tree, cost_model, draft_key: str | None, *, batch: int, batching: str,
             orders: np.ndarray, coins: np.random.Generator | None = None, plain: bool = False,
             proposed: np.ndarray | None = None, ragged: bool = False, leaf: np.ndarray | None = None) -> Timeline:
    """Run the schedule for every replicate (a row of `orders`: trajectory indices in decoding order).

    lengths: (N,) int accepted length per position (point masses), or an (N, D+1) law to draw from
    with `coins`. plain=True: plain decoding (one token per request per step, no draft).
    proposed: (N,) drafts each position's call proposed, for a model-free draft: a step verifies
    1 + proposed tokens of each request, not the whole tree (an n-gram or suffix match fills part
    of the tree, or none of it). Padded to the step's widest request (specsim's live engine), or,
    with ragged=True, the step's tokens spread evenly over its requests (vLLM flattens a batch's
    tokens into one forward: Σ (1 + proposed) tokens, priced as B requests of their mean).
    leaf: (N, D+1) P(the call's accepted path ends on a leaf the draft never fed | t, a) (the next root
    feed is 2 tokens; drawn with a coin for sampled lengths); None: exactly when it accepts the whole depth.
    """
    if batching not in BATCHING:
        raise ValueError(f"batching {batching!r} is not one of {BATCHING}")
    R, n_req = orders.shape
    from specsim.specs import drafts_in_one_pass, feeds_accepted, prompt_fed_at_admission

    shapes = _Shapes(tree, model_draft=draft_key is not None and not plain, one_pass=drafts_in_one_pass(draft_key))
    accepted_feed = feeds_accepted(draft_key, tree)  # EAGLE, dynamic: a lane's next call feeds 1 + its last A
    room = np.minimum(features.room(), tree.max_depth)  # (N,)
    context = features.contexts()  # (N,)
    starts, lens = features.traj_start.astype(np.int64), features.traj_len.astype(np.int64)
    law = None if plain or np.ndim(lengths) == 1 else np.cumsum(lengths, axis=1)  # (N, D+1) CDF
    traj = np.full((R, batch), -1, dtype=np.int64)  # trajectory in each lane, -1 empty
    pos = np.zeros((R, batch), dtype=np.int64)  # next output position of each lane's request
    joined = np.zeros((R, batch))  # time the lane's request joined
    last = np.zeros((R, batch), dtype=np.int64)  # drafts its last call accepted: decides the next root feed
    leafed = np.zeros((R, batch), dtype=bool)  # its last call's accepted path ended on a leaf
    fresh = np.zeros((R, batch), dtype=bool)  # no call yet (an EAGLE layer fed its prompt at admission)
    prompt_fed = prompt_fed_at_admission(draft_key)
    nxt = np.zeros(R, dtype=np.int64)  # next request in each replicate's order
    clock, tokens, steps, lane_steps = np.zeros(R), np.zeros(R), np.zeros(R), np.zeros(R)
    latency_sum, finished = np.zeros(R), np.zeros(R)
    while True:
        # admissions: lockstep refills a replicate only when it is empty, continuous any empty lane
        empty = traj < 0
        can = empty & (nxt < n_req)[:, None]
        if batching == "lockstep":
            can &= empty.all(axis=1)[:, None]
        if can.any():
            order_rank = np.cumsum(can, axis=1) - 1  # k-th free lane takes the k-th next request
            take = nxt[:, None] + order_rank
            ok = can & (take < n_req)
            traj[ok] = orders[np.nonzero(ok)[0], take[ok]]
            pos[ok], joined[ok], last[ok], leafed[ok] = 0, np.broadcast_to(clock[:, None], ok.shape)[ok], 0, False
            fresh[ok] = True
            nxt += ok.sum(axis=1)
        active = traj >= 0
        live = active.any(axis=1)
        if not live.any():
            break
        g = np.where(active, starts[np.maximum(traj, 0)] + pos, 0)  # (R, B) global position
        b_act = active.sum(axis=1).astype(np.float64)  # (R,)
        ctx = np.where(active, context[g], 0.0).max(axis=1)  # padded to the longest context
        if plain:
            step_s = cost_model.plain_s(np.maximum(b_act, 1), ctx)
            accepted = np.zeros((R, batch), dtype=np.int64)
        else:
            m = np.where(active, room[g], 0).max(axis=1)  # the deepest cut any request needs
            if proposed is None:
                n_verify = shapes.verify[m]
            else:  # only what was proposed goes to the target
                n_req_tokens = np.where(active, 1.0 + np.asarray(proposed)[g], 0.0)  # (R, B)
                n_verify = np.maximum(n_req_tokens.sum(axis=1) / np.maximum(b_act, 1) if ragged
                                      else n_req_tokens.max(axis=1), 1.0)  # (a finished replicate: 1, unused)
            step_s = cost_model.verify_s(np.maximum(b_act, 1), n_verify, ctx)
            for k in range(shapes.levels.shape[1]):
                w = shapes.levels[m, k]
                if k == 0 and accepted_feed:  # root feed: 1 + the most any lane accepted last call (padded)
                    need = np.where(active & ~(fresh & prompt_fed), 1 + last, 0)  # a fresh EAGLE lane: none
                    w = np.where(w > 0, need.max(axis=1).astype(np.float64), 0.0)
                elif k == 0 and not shapes.one_pass:  # root feed: 2 tokens when a request's last call accepted a leaf
                    w = np.where(w > 0, np.where((active & leafed).any(axis=1), 2.0, w), 0.0)
                run = w > 0
                if run.any():
                    step_s = step_s + np.where(run, cost_model.draft_s(draft_key, np.maximum(b_act, 1),
                                                                       np.maximum(w, 1), ctx), 0.0)
            if law is None:
                accepted = np.where(active, np.asarray(lengths)[g], 0)
            else:
                u = coins.random((R, batch))
                accepted = np.where(active, (law[g] < u[..., None]).sum(axis=-1), 0)  # inverse CDF
            last = np.where(active, accepted, 0)
            fresh &= ~active
            if leaf is None:
                leafed = active & (accepted >= shapes.depth)
            else:
                chance = np.asarray(leaf)[g, accepted]  # (R, B)
                leafed = active & (chance > 0.5 if law is None else coins.random((R, batch)) < chance)
        step_s = np.where(live, step_s, 0.0)
        clock += step_s
        steps += live
        lane_steps += b_act
        emitted = np.where(active, accepted + 1, 0)
        tokens += emitted.sum(axis=1)
        pos += emitted
        done = active & (pos >= lens[np.maximum(traj, 0)])
        if done.any():
            n_tok = lens[traj[done]]
            latency_sum += np.bincount(np.nonzero(done)[0], weights=(clock[:, None] - joined)[done] / n_tok,
                                       minlength=R)
            finished += done.sum(axis=1)
            traj[done] = -1
    return Timeline(seconds=clock, tokens=tokens, latency=latency_sum / np.maximum(finished, 1), steps=steps,
                    lane_steps=lane_steps)


def simulate_batch(table: AcceptanceTable, features, tree: Tree, cost_model, draft_key: str | None, *,
                   batch: int, batching: str = "lockstep", n_boot: int = 200, coins: int = 32,
                   seed: int = 0) -> BatchEstimate:
    """Throughput, latency and speedup over plain batched decoding at batch size `batch`.

    Replicate 0 (or `coins` replicates, for sampling tables) decodes the trajectories in cache
    order: the point estimate. `n_boot` bootstrap replicates resample trajectories (and coins), each
    decoded in cache order too: the 95% CI.
    """
    rng = np.random.default_rng([seed, batch, list(BATCHING).index(batching)])
    deterministic = table.length is not None
    lengths = table.length if deterministic else table.law()
    n = features.n_traj
    n_point = 1 if deterministic else max(2, int(coins))
    # a replicate resamples trajectories and keeps them in cache order, as the point estimate's requests
    # arrive: shuffled replicates mixed long and short requests that cache order batches together, and
    # their percentile interval missed the point estimate (measured: 0.641, CI 0.650-0.702)
    orders = np.concatenate([np.tile(np.arange(n), (n_point, 1)),
                             np.sort(rng.integers(0, n, size=(max(int(n_boot), 0), n)), axis=1)])
    replicas = len(getattr(cost_model, "replicas", ()))
    covers = "prompts"
    if replicas and orders.shape[0] > n_point:  # bootstrap replicate b priced by profile replica b mod R
        cost_model = cost_model.by_row(np.concatenate([np.full(n_point, -1),
                                                       np.arange(orders.shape[0] - n_point) % replicas]))
        covers = f"prompts and cost-profile rounds ({replicas} replicas)"
    proposed = table.drafted if features.model_free or isinstance(tree, DynamicTree) else None  # what each call verifies
    ragged = getattr(cost_model, "engine", "specsim") != "specsim"  # an engine profile: vLLM flattens a step's tokens
    spec = timeline(lengths, features, tree, cost_model, draft_key, batch=batch, batching=batching, orders=orders,
                    coins=rng, proposed=proposed, ragged=ragged, leaf=table.leaf_given())
    base = timeline(None, features, tree, cost_model, draft_key, batch=batch, batching=batching, orders=orders,
                    plain=True)
    rate, plain_rate = spec.tokens / spec.seconds, base.tokens / base.seconds
    speedup = base.seconds / spec.seconds
    point, boot = slice(0, n_point), slice(n_point, None)

    def est(x: np.ndarray) -> tuple[float, float, float]:
        return recentred(float(x[point].mean()), x[boot], n)

    se = None if deterministic else float(speedup[point].std(ddof=1) / np.sqrt(n_point))
    return BatchEstimate(
        batch=batch, batching=batching, tokens_per_s=est(rate), plain_tokens_per_s=est(plain_rate),
        speedup=est(speedup), latency_per_token_ms=1000 * float(spec.latency[point].mean()),
        plain_latency_per_token_ms=1000 * float(base.latency[point].mean()),
        mean_batch=float((spec.lane_steps[point] / spec.steps[point]).mean()), mc_se_speedup=se,
        exact=deterministic, covers=covers,
    )

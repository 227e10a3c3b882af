"""Structural cost fidelity: the replay prices exactly the forwards the live engine runs.

A probe cost model turns a price into a count: a target forward costs its tokens per request
(or 1: a forward), a draft forward its width (or 1). Priced on the replay's own path (`Pricing`
and the walk at batch 1, the batch timeline above it), a trajectory's total is then the number
of target tokens, target forwards, draft tokens and draft forwards the replay charges for it.
The live engine records what it ran at every step (`EngineStep.verified`, `.draft_levels`, with
the batch). At T = 0 both sides are deterministic, so the counts must be equal, trajectory by
trajectory at batch 1 and run by run in batches. A speed error can then only come from the
profile's times, not from pricing the wrong work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from specsim.expansion import DynamicTree

PROBES = {  # name: (target forward's price, draft forward's price) from (batch, tokens or width)
    "target tokens": (lambda b, n: b * n, lambda b, w: 0 * w),
    "target forwards": (lambda b, n: 1 + 0 * n, lambda b, w: 0 * w),
    "draft tokens": (lambda b, n: 0 * n, lambda b, w: b * w),
    "draft forwards": (lambda b, n: 0 * n, lambda b, w: 1 + 0 * w),
}


@dataclass(frozen=True)
class Probe:
    """A cost model whose 'seconds' count what a step runs (see the module doc)."""

    name: str
    measured: bool = False
    unit: str = "probe"

    def verify_s(self, batch, tokens, context):
        b, n, _ = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (batch, tokens, context)))
        return np.asarray(PROBES[self.name][0](b, n), dtype=np.float64)

    def draft_s(self, draft, batch, width, context):
        b, w, _ = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (batch, width, context)))
        return np.asarray(PROBES[self.name][1](b, w), dtype=np.float64)

    def plain_s(self, batch, context):
        return self.verify_s(batch, 1, context)

    def describe(self) -> str:
        return f"probe: {self.name}"


def live_counts(steps) -> dict[str, int]:
    """What a sequence of live engine steps ran, in the probes' terms."""
    return {"target tokens": sum(s.batch * s.verified for s in steps), "target forwards": len(steps),
            "draft tokens": sum(s.batch * w for s in steps for w in s.draft_levels),
            "draft forwards": sum(len(s.draft_levels) for s in steps)}


def replayed_counts(features, tree, draft: str, *, model_free: bool, policy: str = "greedy") -> list[dict[str, float]]:
    """Per trajectory, what the replay's batch-1 pricing charges (greedy, or an adaptive schedule at T = 0),
    in the probes' terms."""
    from specsim.sim.pricing import Pricing, priced_walk
    from specsim.specs import parse_policy

    out = [{} for _ in range(features.n_traj)]
    for name in PROBES:
        pricing = Pricing(Probe(name), None if model_free else draft, "probe")
        stats, _ = priced_walk(features, tree, parse_policy(policy), pricing, np.random.default_rng(0))
        for i, value in enumerate(stats.cost):
            out[i][name] = float(value)
    return out


def timeline_counts(features, tree, draft: str, *, model_free: bool, batch: int, batching: str) -> dict[str, float]:
    """What the batch timeline charges for decoding every trajectory in cache order (greedy)."""
    from specsim.sim.policies import run_policy
    from specsim.sim.batch import timeline
    from specsim.specs import parse_policy

    table = run_policy(features, tree, parse_policy("greedy"), np.random.default_rng(0))
    orders = np.arange(features.n_traj)[None]
    return {name: float(timeline(table.length, features, tree, Probe(name), None if model_free else draft,
                                 batch=batch, batching=batching, orders=orders,
                                 proposed=table.drafted if model_free or isinstance(tree, DynamicTree) else None,
                                 leaf=table.leaf_given()).seconds[0])
            for name in PROBES}


def decode_live(cache, draft: str, tree_spec: str, *, batch: int = 1, batching: str = "lockstep",
                policy: str = "greedy", temperature: float = 0.0, multi_draft: str = "iid"):
    """The cache's prompts decoded live with its target and `draft` (float32; greedy verification at T = 0)."""
    from specsim.live.decoder import LiveConfig, Target
    from specsim.live.runs import build_drafter, run_live
    from specsim.live.validate import cache_setup
    from specsim.record.models import eos_token_ids, load_model
    from specsim.specs import parse_tree

    setup = cache_setup(cache)
    loaded = load_model(setup.target)
    config = LiveConfig.for_policy(parse_tree(tree_spec), policy, temperature, max_new_tokens=setup.max_new_tokens,
                                   batch=batch, batching=batching, multi_draft=multi_draft)
    run = run_live(Target(loaded.model, eos_token_ids(loaded)), build_drafter(draft, loaded, device="cpu",
                                                                              dtype="float32"),
                   list(setup.prompts), config, target_name=loaded.name, plain=False, progress=False)
    return run


def per_request_steps(run) -> list[list]:
    """Batch 1: the engine's steps of each request, in request order (a request's steps are consecutive)."""
    out, k = [], 0
    for decoded in run.spec_run.decoded:
        n = decoded.target_calls
        out.append(run.spec_run.steps[k: k + n])
        k += n
    assert k == len(run.spec_run.steps)
    return out


def features_of(cache, draft: str, temperature: float = 0.0):
    from specsim.sim.features import load_features

    return load_features(cache, draft, temperature, progress=False)



def assert_priced_as_live(cache, draft: str, tree_spec: str, *, model_free: bool = False, policy: str = "greedy"):
    """Batch 1: decode the cache's prompts live with `draft` drafting `tree_spec`; every request's output has the
    recorded length and the replay's charges for it equal what live ran. Returns the live run."""
    from specsim.specs import parse_tree

    run = decode_live(cache, draft, tree_spec, policy=policy)
    features = features_of(cache, draft)
    replay = replayed_counts(features, parse_tree(tree_spec), draft, model_free=model_free, policy=policy)
    by_prompt = {int(p): i for i, p in enumerate(features.traj_prompt)}
    for trajectory, steps in zip(run.trajectories, per_request_steps(run)):
        i = by_prompt[trajectory.prompt.prompt_index]
        assert trajectory.live.tokens.size == features.traj_len[i]
        assert replay[i] == pytest.approx(live_counts(steps)), f"prompt {trajectory.prompt.prompt_index}"
    return run


def assert_timeline_priced_as_live(cache, draft: str, tree_spec: str, *, batch: int, batching: str,
                                   model_free: bool = False):
    """Batch > 1: decode the cache's prompts live together; the batch timeline's charges for decoding them in cache
    order equal what live ran."""
    from specsim.specs import parse_tree

    run = decode_live(cache, draft, tree_spec, batch=batch, batching=batching)
    features = features_of(cache, draft)
    assert [int(p) for p in features.traj_prompt] == [t.prompt.prompt_index for t in run.trajectories]
    replay = timeline_counts(features, parse_tree(tree_spec), draft, model_free=model_free, batch=batch,
                             batching=batching)
    assert replay == pytest.approx(live_counts(run.spec_run.steps))

def realized_path(run, features, tree):
    """A sampled live run's path on the cache's positions: (N,) the drafts accepted by the call live started
    at each position (0 elsewhere) and (N, D+1) 1 where that call's accepted path ended on a leaf.

    At T > 0 live samples its own tokens, so its calls start elsewhere than any one replayed path; what the
    replay prices for a call depends only on where it starts (context, room) and, for the next root
    feed, on what it accepted. Priced along live's own path, the replay's charges must equal what live ran.
    """
    lengths = np.zeros(features.n_positions, dtype=np.int64)
    leaf = np.zeros((features.n_positions, tree.max_depth + 1))
    by_prompt = {int(p): i for i, p in enumerate(features.traj_prompt)}
    for trajectory in run.trajectories:
        i = by_prompt[trajectory.prompt.prompt_index]
        live_len, cached_len = trajectory.live.tokens.size, int(features.traj_len[i])
        # same positions, so the same contexts and rooms; a live request that sampled EOS earlier (a lossy rule's
        # law is not the target's) made its calls at positions the cache holds, with the same rooms
        assert live_len == cached_len or (trajectory.live.stop_reason == "eos" and live_len < cached_len)
        for step in trajectory.live.steps:
            n = int(features.traj_start[i]) + step.start
            lengths[n] = step.accepted
            path = step.path[: step.accepted]
            leaf[n, step.accepted] = float(bool(path) and tree.n_children[path[-1]] == 0)
    return lengths, leaf


def replayed_along(run, features, tree, draft: str) -> list[dict[str, float]]:
    """Per live request, the replay's batch-1 charges (`Pricing.priced`) for the calls live made."""
    from specsim.sim.pricing import Pricing

    _, leaf = realized_path(run, features, tree)
    by_prompt = {int(p): i for i, p in enumerate(features.traj_prompt)}
    out = [{} for _ in run.trajectories]
    for name in PROBES:
        # with the realized leaf indicator as `leaf`, feed[n, a] is what the call at n charges the next one
        call, _, feed = Pricing(Probe(name), draft, "probe").priced(features, tree, leaf=leaf)
        for k, trajectory in enumerate(run.trajectories):
            start = int(features.traj_start[by_prompt[trajectory.prompt.prompt_index]])
            out[k][name] = sum(call[start + s.start] + (0.0 if feed is None else feed[start + s.start, s.accepted])
                               for s in trajectory.live.steps)
    return out


@pytest.mark.parametrize("draft,tree_spec", [
    ("layers:2", "chain:3"), ("int8", "kary:2,2"), ("layers:2", "widths:3,2,1"),
    ("ngram:1", "chain:4"), ("prompt-lookup:2", "widths:2,1"), ("suffix", "chain:3"),
])
def test_replay_prices_the_forwards_live_runs_at_batch_one(tiny_cache, draft, tree_spec):
    from specsim.specs import is_model_free

    assert_priced_as_live(tiny_cache, draft, tree_spec, model_free=is_model_free(draft))


@pytest.mark.parametrize("policy,draft,tree_spec", [
    ("adaptive-hf", "layers:2", "chain:2"), ("adaptive-history", "int8", "chain:3"),
    ("adaptive-history:0.6,0.2", "layers:2", "chain:1"),
])
def test_adaptive_schedules_are_priced_as_live_runs_them(tiny_cache, policy, draft, tree_spec):
    """A chain whose length changes call by call (the replay's exact walk over (position, γ)) charges the
    draft and target forwards live ran, including the 2-token root feed after a call that accepted all γ."""
    run = assert_priced_as_live(tiny_cache, draft, tree_spec, policy=policy)
    lengths = {s.drafted for t in run.trajectories for s in t.live.steps}
    assert len(lengths) > 2, f"the schedule never moved: drafted {sorted(lengths)}"


def test_the_probes_catch_an_adaptive_walk_without_the_root_feed(tiny_cache, monkeypatch):
    """Reintroduce the mismatch the adaptive test found: a call that accepted all γ charged no 2-token root
    feed for the next call (live feeds the last draft and the bonus). The draft-token counts disagree."""
    import specsim.sim.adaptive as adaptive
    from specsim.specs import parse_tree

    run = decode_live(tiny_cache, "layers:2", "chain:2", policy="adaptive-hf")
    features = features_of(tiny_cache, "layers:2")
    live = sum(live_counts(steps)["draft tokens"] for steps in per_request_steps(run))
    count = lambda: sum(c["draft tokens"] for c in replayed_counts(  # noqa: E731
        features, parse_tree("chain:2"), "layers:2", model_free=False, policy="adaptive-hf"))
    assert count() == pytest.approx(live)
    walks = adaptive.adaptive_walks
    monkeypatch.setattr(adaptive, "adaptive_walks", lambda *a, **k: walks(*a[:5]))
    assert count() < live


@pytest.mark.parametrize("draft,tree_spec,multi_draft", [
    ("layers:2", "chain:3", "iid"), ("int8", "kary:2,2", "iid"), ("int8", "kary:3,2", "swor"),
    ("layers:2", "widths:3,2,1", "swor"), ("int8", "widths:3,2,1", "iid"),
])
def test_sampling_is_priced_as_live_runs_it(tiny_cache, draft, tree_spec, multi_draft):
    """Speculative sampling at T = 1 (chains, and trees drawing candidates i.i.d. or without replacement): the
    replay's charges for each call live made, including the 2-token root feed after a path that ended on a
    leaf, equal what live ran, request by request at batch 1."""
    from specsim.specs import parse_tree

    tree = parse_tree(tree_spec)
    run = decode_live(tiny_cache, draft, tree_spec, policy="sample", temperature=1.0, multi_draft=multi_draft)
    features = features_of(tiny_cache, draft, 1.0)
    for trajectory, steps, replay in zip(run.trajectories, per_request_steps(run),
                                         replayed_along(run, features, tree, draft)):
        assert replay == pytest.approx(live_counts(steps)), f"prompt {trajectory.prompt.prompt_index}"
    assert sum(s.accepted for t in run.trajectories for s in t.live.steps) > 0


@pytest.mark.parametrize("policy,draft,tree_spec", [
    ("p>=q", "layers:2", "chain:3"), ("typical", "int8", "kary:2,2"), ("p>=lq:0.5", "int8", "widths:3,2,1"),
])
def test_lossy_rules_are_priced_as_live_runs_them(tiny_cache, policy, draft, tree_spec):
    """A lossy rule run live (`verify_lossy` on a sampled tree) runs the forwards speculative sampling runs: the
    replay's charges for each call live made equal what live ran, request by request. (This test found that live
    stopped drafting below a drafted end-of-sequence token while the replay priced the whole tree: in the p>=q
    case, replay 24 target / 18 draft tokens for prompt 0, live 22 / 16. Live now drafts past EOS, as vLLM's
    proposers do.)"""
    from specsim.specs import parse_tree

    tree = parse_tree(tree_spec)
    run = decode_live(tiny_cache, draft, tree_spec, policy=policy, temperature=1.0)
    features = features_of(tiny_cache, draft, 1.0)
    for trajectory, steps, replay in zip(run.trajectories, per_request_steps(run),
                                         replayed_along(run, features, tree, draft)):
        assert replay == pytest.approx(live_counts(steps)), f"prompt {trajectory.prompt.prompt_index}"
    assert sum(s.accepted for t in run.trajectories for s in t.live.steps) > 0


def test_the_probes_catch_sampling_priced_without_the_short_leaf_feed(tiny_cache, monkeypatch):
    """Reintroduce a mismatch: the 2-token root feed charged only after a path of full depth, not after one
    that ended early on a leaf (the draft's first choice is a leaf here). Live's draft tokens exceed it."""
    from specsim.sim.pricing import Pricing
    from specsim.specs import parse_tree

    spec = "medusa:[[0],[1],[1,0],[1,0,0]]"
    tree = parse_tree(spec)
    run = decode_live(tiny_cache, "int8", spec, policy="sample", temperature=1.0)
    features = features_of(tiny_cache, "int8", 1.0)
    _, leaf = realized_path(run, features, tree)
    assert leaf[:, 1:tree.max_depth].sum() > 0, "no path ended on a short leaf: the probe cannot tell"
    live = sum(live_counts(steps)["draft tokens"] for steps in per_request_steps(run))
    count = lambda: sum(r["draft tokens"] for r in replayed_along(run, features, tree, "int8"))  # noqa: E731
    assert count() == pytest.approx(live)
    feed = Pricing._next_feed
    monkeypatch.setattr(Pricing, "_next_feed", lambda self, *a: feed(self, *a[:5]))  # drop `leaf`
    assert count() < live


@pytest.mark.parametrize("draft,tree_spec,multi_draft,batch,batching", [
    ("int8", "widths:3,2,1", "iid", 2, "lockstep"), ("layers:2", "kary:2,2", "swor", 3, "continuous"),
    ("int8", "chain:4", "iid", 2, "continuous"),
])
def test_batch_timeline_prices_sampling_as_live_runs_it(tiny_cache, draft, tree_spec, multi_draft, batch, batching):
    """The batch timeline walked along live's own sampled path (each call's accepted length and leaf as live
    had them) charges the forwards live ran, step for step in total."""
    from specsim.sim.batch import timeline
    from specsim.specs import parse_tree

    tree = parse_tree(tree_spec)
    run = decode_live(tiny_cache, draft, tree_spec, batch=batch, batching=batching, policy="sample",
                      temperature=1.0, multi_draft=multi_draft)
    features = features_of(tiny_cache, draft, 1.0)
    assert [int(p) for p in features.traj_prompt] == [t.prompt.prompt_index for t in run.trajectories]
    lengths, leaf = realized_path(run, features, tree)
    replay = {name: float(timeline(lengths, features, tree, Probe(name), draft, batch=batch, batching=batching,
                                   orders=np.arange(features.n_traj)[None], leaf=leaf).seconds[0])
              for name in PROBES}
    assert replay == pytest.approx(live_counts(run.spec_run.steps))


@pytest.mark.parametrize("draft,tree_spec,batch,batching", [
    ("layers:2", "chain:3", 2, "lockstep"), ("int8", "kary:2,2", 3, "continuous"),
    ("ngram:1", "chain:4", 2, "lockstep"),
])
def test_batch_timeline_prices_the_forwards_live_runs(tiny_cache, draft, tree_spec, batch, batching):
    from specsim.specs import is_model_free

    assert_timeline_priced_as_live(tiny_cache, draft, tree_spec, batch=batch, batching=batching,
                                   model_free=is_model_free(draft))


def test_the_probes_catch_a_priced_shape_that_live_does_not_run(tiny_cache, monkeypatch):
    """Reintroduce a mismatch: the root feed after a call whose accepted path ended on a leaf above the full
    depth priced as 1 token (live feeds 2: the leaf was never fed). The counts disagree, so the tests above
    can fail."""
    from specsim.sim.pricing import Pricing
    from specsim.specs import parse_tree

    run = decode_live(tiny_cache, "layers:2", "widths:3,2,1")
    features = features_of(tiny_cache, "layers:2")
    live = [live_counts(steps) for steps in per_request_steps(run)]
    by_prompt = {int(p): i for i, p in enumerate(features.traj_prompt)}
    right = replayed_counts(features, parse_tree("widths:3,2,1"), "layers:2", model_free=False)
    assert all(right[by_prompt[t.prompt.prompt_index]] == pytest.approx(c) for t, c in zip(run.trajectories, live))
    priced = Pricing.priced
    monkeypatch.setattr(Pricing, "priced", lambda self, *a, leaf=None, **k: priced(self, *a, **k))
    wrong = replayed_counts(features, parse_tree("widths:3,2,1"), "layers:2", model_free=False)
    assert any(wrong[by_prompt[t.prompt.prompt_index]] != pytest.approx(c) for t, c in zip(run.trajectories, live))


@pytest.mark.parametrize("draft,tree_spec", [("layers:2", "widths:3,2,1"), ("ngram:1", "chain:3")])
def test_predicted_speedup_is_plain_time_over_the_time_of_what_live_ran(tiny_cache, tmp_path, draft, tree_spec):
    """The speedup a row reports, recomputed from outside the replay: every forward live ran, priced by the
    profile's formula at the context it ran at (prompt + output so far), against one plain step per output
    token. A replay that priced other shapes or other contexts gives another number."""
    import json

    import specsim
    from specsim.live.validate import cache_setup
    from tests.test_cost import profile_body

    body = profile_body(target={"name": cache_setup(tiny_cache).target}, drafts={draft: {"name": draft}},
                        contexts=[1, 512])  # the formula below holds on this grid and between its points
    body["draft_step_s"] = {draft: body["draft_step_s"].pop("d")}
    for table in (body["target_verify_s"], body["draft_step_s"][draft]):
        for b, by_L in table.items():
            by_L["1"] = by_L.pop("128")
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(body))
    scale = lambda L: 1 + (L - 1) / 511  # noqa: E731  time x2 from L = 1 to 512, linear between
    verify = lambda n, L: (0.010 + 0.001 * n + 0.002) * scale(L)  # noqa: E731
    forward = lambda w, L: (0.002 + 0.0005 * w + 0.002) * scale(L)  # noqa: E731
    run = decode_live(tiny_cache, draft, tree_spec)
    spec = plain = 0.0
    for trajectory, steps in zip(run.trajectories, per_request_steps(run)):
        prompt = len(trajectory.prompt.token_ids)  # a call at output position t runs at context prompt + t
        for record, step in zip(trajectory.live.steps, steps):
            L = prompt + record.start
            spec += verify(step.verified, L) + sum(forward(w, L) for w in step.draft_levels)
        plain += sum(verify(1, prompt + t) for t in range(trajectory.live.tokens.size))
    row = specsim.simulate(tiny_cache, trees=[tree_spec], drafts=[draft], cost_profile=profile, n_boot=0,
                           by_category=False).row(0, named=True)
    assert row["speedup"] == pytest.approx(plain / spec, rel=1e-9)

"""The batch timeline: equal to a step-by-step brute force, to the exact walk at batch 1, and CLI rows."""

from __future__ import annotations

import json
from collections import deque

import numpy as np
import pytest

import specsim
from specsim.errors import SpecError
from specsim.sim.batch import simulate_batch, timeline
from specsim.sim.cost import load_cost_profile, step_shape
from specsim.sim.features import load_features
from specsim.sim.policies import run_policy
from specsim.specs import parse_policy
from specsim.specs import parse_tree
from tests.synthetic import TARGET_NAME, random_cache
from tests.test_cost import profile_body


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch")
    path = random_cache(tmp / "c.h5", n_prompts=7, length=18, vocab=10, drafts=("d",), temperatures=(0.0, 1.0),
                        noise=0.6)
    body = profile_body()
    body["batches"] = [1, 2, 4]
    for table in (body["target_verify_s"], body["draft_step_s"]["d"]):
        table["2"] = {L: {x: {"median": c["median"] * 1.3} for x, c in row.items()} for L, row in table["1"].items()}
    profile = tmp / "p.json"
    profile.write_text(json.dumps(body))
    return path, load_cost_profile(profile)


def brute(lengths, features, tree, model, key, *, batch, batching, plain=False):
    """One engine step at a time, one request at a time, in plain Python."""
    D = tree.max_depth
    room, ctx = features.room(), features.contexts()
    starts, lens = features.traj_start.tolist(), features.traj_len.tolist()
    shapes = [step_shape(tree, room=m, model_draft=key is not None and not plain) for m in range(D + 1)]
    queue, lanes = deque(range(features.n_traj)), []
    clock = tokens = 0.0
    latencies = []
    while queue or lanes:
        if batching == "continuous" or not lanes:
            while len(lanes) < batch and queue:
                lanes.append({"traj": queue.popleft(), "pos": 0, "joined": clock, "fed2": False})
        b = len(lanes)
        g = [starts[lane["traj"]] + lane["pos"] for lane in lanes]
        L = max(ctx[i] for i in g)
        if plain:
            seconds, accepted = float(model.plain_s(b, L)), [0] * b
        else:
            shape = shapes[max(min(int(room[i]), D) for i in g)]
            seconds = float(model.verify_s(b, shape.verify_tokens, L))
            for k, w in enumerate(shape.draft_levels):
                if k == 0 and any(lane["fed2"] for lane in lanes):
                    w = 2
                seconds += float(model.draft_s(key, b, w, L))
            accepted = [int(lengths[i]) for i in g]
            for lane, a in zip(lanes, accepted):
                lane["fed2"] = a >= D
        clock += seconds
        for lane, a in zip(lanes, accepted):
            lane["pos"] += a + 1
            tokens += a + 1
        for lane in [lane for lane in lanes if lane["pos"] >= lens[lane["traj"]]]:
            latencies.append((clock - lane["joined"]) / lens[lane["traj"]])
            lanes.remove(lane)
    return clock, tokens, float(np.mean(latencies))


@pytest.mark.parametrize("batching", ["lockstep", "continuous"])
@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("tree_spec", ["chain:3", "kary:2,2"])
def test_timeline_equals_brute_force(setup, batching, batch, tree_spec):
    path, model = setup
    features = load_features(path, "d", 0.0, progress=False)
    tree = parse_tree(tree_spec)
    table = run_policy(features, tree, parse_policy("greedy"), np.random.default_rng(0))
    orders = np.arange(features.n_traj)[None, :]
    for plain in (False, True):
        got = timeline(None if plain else table.length, features, tree, model, "d", batch=batch, batching=batching,
                       orders=orders, plain=plain)
        want = brute(table.length, features, tree, model, "d", batch=batch, batching=batching, plain=plain)
        assert got.seconds[0] == pytest.approx(want[0], rel=1e-12)
        assert got.tokens[0] == want[1] == features.traj_len.sum()
        assert got.latency[0] == pytest.approx(want[2], rel=1e-12)


def test_the_comparison_can_fail(setup):
    """A replay that is off by one token per call, or the other schedule, is told apart."""
    path, model = setup
    features = load_features(path, "d", 0.0, progress=False)
    tree = parse_tree("chain:3")
    table = run_policy(features, tree, parse_policy("greedy"), np.random.default_rng(0))
    orders = np.arange(features.n_traj)[None, :]
    right = timeline(table.length, features, tree, model, "d", batch=3, batching="lockstep", orders=orders)
    wrong = np.maximum(table.length - 1, 0)
    assert brute(wrong, features, tree, model, "d", batch=3, batching="lockstep")[0] != pytest.approx(right.seconds[0])
    assert brute(table.length, features, tree, model, "d", batch=3, batching="continuous")[0] != pytest.approx(
        right.seconds[0])


def test_batch_one_equals_the_exact_walk(setup):
    """Greedy at batch 1: the timeline's time and speedup are the exact walk's, to rounding."""
    path, model = setup
    df = specsim.simulate(path, trees=["chain:3", "kary:2,2"], cost_profile=model.path, n_boot=0, by_category=False)
    features = load_features(path, "d", 0.0, progress=False)
    for tree_spec in ("chain:3", "kary:2,2"):
        tree = parse_tree(tree_spec)
        table = run_policy(features, tree, parse_policy("greedy"), np.random.default_rng(0))
        est = simulate_batch(table, features, tree, model, "d", batch=1, n_boot=0)
        row = df.filter(df["tree"] == tree_spec).row(0, named=True)
        assert est.speedup[0] == pytest.approx(row["speedup"], rel=1e-12) and est.exact
        assert est.tokens_per_s[0] == pytest.approx(row["tokens_per_s"], rel=1e-12)


def test_sampling_at_batch_one_agrees_with_the_walk_within_its_error(setup):
    path, model = setup
    features = load_features(path, "d", 1.0, progress=False)
    tree = parse_tree("chain:3")
    table = run_policy(features, tree, parse_policy("sample"), np.random.default_rng(0))
    est = simulate_batch(table, features, tree, model, "d", batch=1, n_boot=0, coins=400, seed=3)
    row = specsim.simulate(path, trees=["chain:3"], policies=["sample"], cost_profile=model.path, n_boot=0,
                           by_category=False).row(0, named=True)
    assert not est.exact and est.mc_se_speedup > 0
    # Jensen: E[plain / spec time] >= plain / E[spec time]; the gap is second order, far below 4 SE here
    assert abs(est.speedup[0] - row["speedup"]) < 4 * est.mc_se_speedup + 0.01 * row["speedup"]


def test_simulate_batch_rows_and_their_limits(setup):
    path, model = setup
    df = specsim.simulate(path, trees=["chain:3"], cost_profile=model.path, batches=[1, 4], n_boot=50,
                          by_category=False)
    assert df["batch"].to_list() == [1, 4]
    b4 = df.row(1, named=True)
    assert b4["batching"] == "lockstep" and b4["speedup_lo"] <= b4["speedup"] <= b4["speedup_hi"]
    assert b4["tokens_per_s"] > df.row(0, named=True)["tokens_per_s"]  # a batch of 4 serves more tokens/s
    assert b4["mean_batch"] <= 4 and b4["latency_per_token_ms"] > 0
    # accept rate and tokens/call do not depend on the batch
    assert b4["tokens_per_call"] == df.row(0, named=True)["tokens_per_call"]
    with pytest.raises(SpecError, match=r"batch 9 is beyond what it measured \(1-4"):
        specsim.simulate(path, trees=["chain:3"], cost_profile=model.path, batches=[9], n_boot=0)
    with pytest.raises(SpecError, match="^batches: batch sizes need measured costs: give cost_profile"):
        specsim.simulate(path, trees=["chain:3"], cost="c=0.1", batches=[2])
    assert TARGET_NAME in df["target"][0]


def _batched_profile(tmp_path):
    """The hand-made profile measured at batch 1, 2 and 4 (x1.3 and x1.8 a batch-1 step), extrapolating."""
    body = profile_body()
    body["batches"] = [1, 2, 4]
    for table in (body["target_verify_s"], body["draft_step_s"]["d"]):
        for b, scale in (("2", 1.3), ("4", 1.8)):
            table[b] = {L: {x: {"median": c["median"] * scale} for x, c in row.items()} for L, row in table["1"].items()}
    (tmp_path / "p.json").write_text(json.dumps(body))
    return load_cost_profile(tmp_path / "p.json", extrapolate=True)  # chain:8 verifies 9 tokens, 8 measured


def test_the_interval_holds_the_point_estimate_when_cache_order_groups_requests(tmp_path):
    """Long, well-drafted requests first, then short badly drafted ones: cache order batches alike with alike.
    Replicates must arrive in cache order too; shuffled ones measured a different schedule, and their
    interval missed the point estimate."""
    from tests.synthetic import rank_cache

    rng = np.random.default_rng(0)
    seqs = [np.where(rng.random(80) < 0.9, 0, 3) for _ in range(12)] + \
        [np.where(rng.random(6) < 0.1, 0, 3) for _ in range(12)]
    path = rank_cache(tmp_path / "r.h5", seqs)
    model = _batched_profile(tmp_path)
    features = load_features(path, "d", 0.0, progress=False)
    for spec in ("chain:2", "chain:4", "chain:8"):
        tree = parse_tree(spec)
        table = run_policy(features, tree, parse_policy("greedy"), np.random.default_rng(0))
        est = simulate_batch(table, features, tree, model, "d", batch=4, n_boot=200)
        value, lo, hi = est.speedup
        assert lo <= value <= hi, (spec, est.speedup)


def test_repeated_requests_in_a_resample_do_not_shift_the_lockstep_interval(tmp_path):
    """A bootstrap resample repeats requests (it holds about 1 - 1/e of the distinct ones), and in lockstep a batch
    waits for its slowest request: a resample's speedups are shifted by the repeats, not by the prompts drawn
    (bench_speedup's six requests at batch 4: the point estimate sat at the interval's lower edge). Six requests
    of alternating length and acceptance: the replicates' median lies above the point estimate, and the interval
    is their spread placed around the point estimate as around their median, scaled by the ratio of the two (the
    raw percentile interval is not)."""
    from tests.synthetic import rank_cache

    rng = np.random.default_rng(2)
    seqs = [np.where(rng.random(n) < p, 0, 3) for p, n in zip((0.95, 0.2, 0.9, 0.3, 0.8, 0.1), (10, 48) * 3)]
    path = rank_cache(tmp_path / "r.h5", seqs)
    model = _batched_profile(tmp_path)
    features = load_features(path, "d", 0.0, progress=False)
    tree = parse_tree("chain:4")
    table = run_policy(features, tree, parse_policy("greedy"), np.random.default_rng(0))
    orders = np.concatenate([np.arange(6)[None], np.sort(rng.integers(0, 6, size=(4000, 6)), axis=1)])
    spec = timeline(table.length, features, tree, model, "d", batch=4, batching="lockstep", orders=orders,
                    leaf=table.leaf_given())
    plain = timeline(None, features, tree, model, "d", batch=4, batching="lockstep", orders=orders, plain=True)
    speedup = plain.seconds / spec.seconds
    from scipy.stats import norm, t

    tail = 100 * norm.cdf(-np.sqrt(6 / 5) * t.ppf(0.975, 5))  # the expanded percentile interval over 6 requests
    low, mid, high = np.percentile(speedup[1:], [tail, 50, 100 - tail])
    assert mid - speedup[0] > 0.02  # the repeats' shift
    value, lo, hi = simulate_batch(table, features, tree, model, "d", batch=4, n_boot=4000).speedup
    assert value == pytest.approx(speedup[0])
    assert (lo / value, hi / value) == pytest.approx((low / mid, high / mid), abs=0.01)  # its own resamples


def test_a_wide_interval_is_scaled_to_the_point_estimate_and_stays_positive():
    """Replicates priced by a profile round measured in a slow phase of the host spread far below their median.
    Shifted to the point estimate, such an interval's lower end went below zero (under load, a report's batch
    row gave a speedup CI from -0.013, which tests/test_report.py caught as a number missing from the tables);
    scaled, it keeps the replicates' relative spread and stays positive."""
    from specsim.sim.batch import recentred
    from specsim.sim.metrics import expanded_tail

    replicates = np.concatenate([np.full(900, 1.0), np.full(100, 0.1)])  # a tenth priced by the slow round
    tail = expanded_tail(24)  # replicates of 24 requests: the expanded percentile interval's tail
    assert 1.5 < tail < 2.5
    low, mid, high = np.percentile(replicates, [tail, 50, 100 - tail])
    assert low - mid + 0.5 < 0  # the shifted interval: an impossible speedup
    value, lo, hi = recentred(0.5, replicates, 24)
    assert value == 0.5 and 0 < lo < value <= hi
    assert (lo / value, hi / value) == pytest.approx((low / mid, high / mid))
    assert np.isnan(recentred(0.5, replicates[:1], 24)[1:]).all()  # one replicate: no interval


@pytest.mark.parametrize("batching", ["lockstep", "continuous"])
def test_model_free_steps_verify_only_what_was_proposed(tmp_path, batching):
    """A model-free draft sends the target only its match's tokens: where nothing ever matches, every step
    verifies one token per request, exactly a plain step, so the batched speedup is 1 (the whole tree priced
    instead made it 0.84 here). And where matches happen, steps cost no more than the full tree."""
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), n_prompts=6, length=24, vocab=4096)
    model = load_cost_profile(tmp_path.joinpath("p.json").write_text(json.dumps(profile_body())) and tmp_path / "p.json")
    tree = parse_tree("chain:3")
    never = load_features(path, "ngram:12", 0.0, progress=False)  # 12-token repeats of random text: none
    table = run_policy(never, tree, parse_policy("greedy"), np.random.default_rng(0))
    assert table.drafted.sum() == 0
    est = simulate_batch(table, never, tree, model, None, batch=2, batching=batching, n_boot=0)
    assert est.speedup[0] == pytest.approx(1.0, rel=1e-12)
    some = load_features(path, "ngram:1", 0.0, progress=False)  # one-token matches: often
    table = run_policy(some, tree, parse_policy("greedy"), np.random.default_rng(0))
    assert 0 < table.drafted.sum() < 3 * some.n_positions
    est = simulate_batch(table, some, tree, model, None, batch=2, batching=batching, n_boot=0)
    whole = timeline(table.length, some, tree, model, None, batch=2, batching=batching,
                     orders=np.arange(some.n_traj)[None, :])  # every step priced at the full chain
    part = timeline(table.length, some, tree, model, None, batch=2, batching=batching,
                    orders=np.arange(some.n_traj)[None, :], proposed=table.drafted)
    assert part.tokens[0] == whole.tokens[0] and part.seconds[0] < whole.seconds[0]
    plain = timeline(None, some, tree, model, None, batch=2, batching=batching, orders=np.arange(some.n_traj)[None, :],
                     plain=True)
    assert est.speedup[0] == pytest.approx(plain.seconds[0] / part.seconds[0], rel=1e-12)


def test_drafts_live_decodes_one_request_at_a_time_get_no_batch_rows(tmp_path):
    """suffix's global tree holds the earlier requests' outputs in cache order: live decoding refuses batches,
    and the replay does not price a batch it cannot replay (a skip line with the reason, not a row)."""
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), n_prompts=4, length=16, vocab=6)
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(profile_body()))
    skipped = []
    from specsim.sim.sweep import SweepConfig, sweep

    df = sweep(path, SweepConfig(trees=["chain:2"], drafts=["suffix", "ngram:1"], cost_profile=profile, batches=[1, 2], n_boot=0, by_category=False), on_skip=skipped.append).rows
    assert sorted(df.filter(df["draft"] == "suffix")["batch"].to_list()) == [1]
    assert sorted(df.filter(df["draft"] == "ngram:1")["batch"].to_list()) == [1, 2]  # other model-free drafts batch
    assert any("suffix" in line and "one request at a time" in line for line in skipped), skipped

"""Cost models: the shape of a step, measured profiles (interpolation, limits, model matching), assumed ratios."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import specsim
from specsim.cache.stats import StatsSpec
from specsim.errors import SpecError
from specsim.sim.cost import (
    AssumedCost,
    ModelId,
    check_profile,
    load_cost_profile,
    parse_cost,
    step_shape,
)
from specsim.specs import parse_tree
from tests.synthetic import TARGET_NAME, iid_sample_cache, random_cache


def test_step_shape_is_what_the_live_engine_runs():
    assert step_shape(parse_tree("chain:4")) == step_shape(parse_tree("chain:4"), room=9)
    shape = step_shape(parse_tree("chain:4"))
    assert shape.verify_tokens == 5 and shape.draft_levels == (1, 1, 1, 1)  # root feed + depths 1..3 fed
    kary = step_shape(parse_tree("kary:2,2"))
    assert kary.verify_tokens == 7 and kary.draft_levels == (1, 2)  # the leaves at depth 2 are never fed
    cut = step_shape(parse_tree("chain:4"), room=2)  # near the output limit: no deeper than 2
    assert cut.verify_tokens == 3 and cut.draft_levels == (1, 1)
    assert step_shape(parse_tree("chain:4"), room=0).draft_levels == ()  # nothing to accept: nothing drafted
    assert step_shape(parse_tree("kary:2,2"), model_draft=False).draft_levels == ()
    assert step_shape(parse_tree("chain:3"), root_feed=2).draft_levels == (2, 1, 1)


@pytest.mark.parametrize("alpha,gamma,c", [(0.7, 4, 0.05), (0.9, 8, 0.1), (0.5, 1, 0.2)])
def test_assumed_cost_gives_leviathans_improvement_on_long_trajectories(tmp_path, alpha, gamma, c):
    # Renewal argument: on long trajectories tokens/call tends to the per-call expectation. A chain reads only the
    # first candidate's statistics: the later candidates' Monte-Carlo (most of the writing time) is not recorded.
    path, a = iid_sample_cache(tmp_path / "s.h5", alpha=alpha, n_traj=2, length=4000,
                               stats=StatsSpec(candidates=1))
    df = specsim.simulate(path, trees=[f"chain:{gamma}"], policies=["sample"], cost=f"c={c}", n_boot=0)
    row = df.row(0, named=True)
    improvement = (1 - a ** (gamma + 1)) / ((1 - a) * (gamma * c + 1))
    assert row["speedup_assumed"] == pytest.approx(improvement, rel=3e-3)
    assert row["call_cost_assumed"] == pytest.approx(1 + gamma * c, rel=1e-3)
    assert "speedup" not in df.columns and "tokens_per_s" not in df.columns
    assert row["cost_basis"].startswith("ASSUMED") and "not measured" in row["cost_basis"]


def test_without_costs_there_is_no_speedup(tmp_path):
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,))
    df = specsim.simulate(path, trees=["chain:2"], n_boot=0)
    assert not [c for c in df.columns if "speedup" in c or "tokens_per_s" in c]
    assert df["cost_basis"][0].startswith("none")


@pytest.mark.parametrize("text", ["0.05", "c=", "c=abc", "d=0.1", "c=-1"])
def test_bad_cost_specs_are_refused(text):
    with pytest.raises(SpecError, match="c=0.1|>= 0"):
        parse_cost(text)


def profile_body(**override) -> dict:
    """A hand-made v2 profile: verify time = 10 ms + 1 ms per token + 2 ms per request, x2 at L=512."""
    grid = {"batches": [1, 4], "contexts": [128, 512], "sizes": [1, 2, 4, 8], "widths": [1, 2, 4]}

    def table(xs, base, per):
        return {str(b): {str(L): {str(x): {"median": (base + per * x + 0.002 * b) * (2 if L == 512 else 1)}
                                  for x in xs} for L in grid["contexts"]} for b in grid["batches"]}

    data = {
        "format": "specsim-cost-profile", "version": 2, "device": "cpu (2 threads)", "dtype": "float32",
        "target": {"name": TARGET_NAME}, "drafts": {"d": {"name": "d"}}, **grid,
        "target_verify_s": table(grid["sizes"], 0.010, 0.001),
        "draft_step_s": {"d": table(grid["widths"], 0.002, 0.0005)},
        "fit": {"max_relative_error": 0.05},
    }
    data.update(override)
    return data


def write(path, body):
    path.write_text(json.dumps(body))
    return path


def test_profile_interpolates_in_batch_tokens_and_context(tmp_path):
    model = load_cost_profile(write(tmp_path / "p.json", profile_body()), extrapolate=True)
    f = lambda b, n, L: (0.010 + 0.001 * n + 0.002 * b) * (1 + (L - 128) / 384)  # noqa: E731 linear in all three
    for b, n, L in [(1, 1, 128), (4, 8, 512), (1, 3, 128), (2, 5, 320), (3, 6, 200)]:
        assert float(model.verify_s(b, n, L)) == pytest.approx(f(b, n, L))
    assert float(model.plain_s(1, 128)) == pytest.approx(0.013)
    assert float(model.draft_s("d", 1, 3, 128)) == pytest.approx(0.002 + 0.0015 + 0.002)
    # vectorised over positions
    np.testing.assert_allclose(model.verify_s(1, 5, np.array([128.0, 512.0])), [f(1, 5, 128), f(1, 5, 512)])
    # below the smallest context: that context's time; beyond the largest N up to 2x: linear extrapolation
    assert float(model.verify_s(1, 2, 10)) == pytest.approx(f(1, 2, 128))
    assert float(model.verify_s(1, 16, 128)) == pytest.approx(f(1, 16, 128))
    assert "MEASURED" in model.describe() and "p.json" in model.describe()


@pytest.mark.parametrize("args,message", [
    ((9, 1, 128), r"batch 9 is beyond what it measured \(1-4"),
    ((1, 17, 128), r"target tokens N 17 is beyond what it measured \(1-8"),
    ((1, 1, 1025), r"context 1025 is beyond what it measured \(128-512"),
])
def test_profile_refuses_to_extrapolate_far(tmp_path, args, message):
    model = load_cost_profile(write(tmp_path / "p.json", profile_body()), extrapolate=True)
    with pytest.raises(SpecError, match=message):
        model.verify_s(*args)


def test_past_the_grid_is_refused_unless_asked_for(tmp_path):
    model = load_cost_profile(write(tmp_path / "p.json", profile_body()))
    assert float(model.verify_s(1, 8, 512)) > 0  # the grid's edge is measured
    with pytest.raises(SpecError, match=r"target tokens N 9 is beyond what it measured \(1-8; --cost-extrapolate"):
        model.verify_s(1, 9, 128)
    with pytest.raises(SpecError, match=r"context 513 is beyond what it measured \(128-512; --cost-extrapolate"):
        model.verify_s(1, 1, 513)
    assert float(load_cost_profile(model.path, extrapolate=True).verify_s(1, 9, 128)) > float(model.verify_s(1, 8, 128))


def test_a_profile_for_other_models_is_refused_naming_both(tmp_path):
    body = profile_body(
        target={"name": "big", "architecture_sha256": "aaa", "architecture": {"model_type": "llama"}},
        drafts={"int8": {"name": "int8", "architecture_sha256": "bbb", "architecture": {"quantization": "W8A8"}}})
    body["draft_step_s"] = {"int8": body["draft_step_s"]["d"]}
    model = load_cost_profile(write(tmp_path / "p.json", body))
    with pytest.raises(SpecError, match=r"measured for target big \(model_type=llama\), not for this cache's target "
                                        r"small"):
        check_profile(model, "small", {"spec": "small", "architecture_sha256": "ccc"})
    check_profile(model, "big-as-a-hub-id", {"spec": "big-as-a-hub-id", "architecture_sha256": "aaa"})  # same shape
    with pytest.raises(SpecError, match=r"not measured for draft layers:20 .* \(it measured: int8 \(quantization"):
        model.draft_for("layers:20", {"spec": "layers:20", "architecture_sha256": "ddd", "architecture": {"layers": 20}})
    assert model.draft_for("int8", {"spec": "int8", "architecture_sha256": "bbb"}) == "int8"
    # files without fingerprints fall back to names
    assert ModelId("x", None).same_as(ModelId("x", "abc")) and not ModelId("x", None).same_as(ModelId("y", None))


def test_a_head_field_added_later_at_its_default_does_not_part_a_profile_from_an_older_cache(tmp_path):
    """A head recorded before its config gained a field (qk_norm) is the same model as the profile's head with
    that field off; the field on, or another size, is refused, naming the fields that differ."""
    from specsim.record.models import architecture_sha256

    old = {"kind": "mtp", "hidden_size": 576, "layers": 1, "fc_bias": False, "aux_layers": []}
    new = {**old, "qk_norm": False}
    body = profile_body(drafts={"mtp:head": {"name": "mtp:head", "architecture_sha256": architecture_sha256(new),
                                             "architecture": new}})
    body["draft_step_s"] = {"mtp:head": body["draft_step_s"]["d"]}
    model = load_cost_profile(write(tmp_path / "p.json", body))
    cache_info = lambda arch: {"spec": "mtp:head", "architecture_sha256": architecture_sha256(arch),  # noqa: E731
                               "architecture": arch}
    assert model.draft_for("mtp:head", cache_info(old)) == "mtp:head"
    for other, differs in [({**old, "qk_norm": True}, "qk_norm=-/True"), ({**old, "layers": 2}, "layers=1/2")]:
        with pytest.raises(SpecError, match=rf"not measured for draft mtp:head .*\[differs: {differs} "):
            model.draft_for("mtp:head", cache_info(other))


def test_simulate_refuses_a_profile_of_another_target(tmp_path):
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",))
    other = write(tmp_path / "p.json", profile_body(target={"name": "another-model"}))
    with pytest.raises(SpecError, match="measured for target another-model, not for this cache's target "
                                        f"{TARGET_NAME}"):
        specsim.simulate(path, trees=["chain:2"], cost_profile=other, n_boot=0)
    good = write(tmp_path / "q.json", profile_body())
    df = specsim.simulate(path, trees=["chain:2"], cost_profile=good, n_boot=0)
    assert {"speedup", "tokens_per_s", "plain_tokens_per_s", "call_ms"} <= set(df.columns)
    assert df["cost_basis"][0].startswith("MEASURED")
    with pytest.raises(SpecError, match="not both"):
        specsim.simulate(path, trees=["chain:2"], cost_profile=good, cost="c=0.1")


def test_measured_speedup_is_plain_time_over_speculative_time(tmp_path):
    """Model-free drafts cost no draft steps: a call that accepts nothing costs a verify of its nodes."""
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",), n_prompts=3, length=20)
    good = write(tmp_path / "q.json", profile_body())
    df = specsim.simulate(path, trees=["chain:2"], drafts=["d", "ngram:2"], cost_profile=good, n_boot=0,
                          by_category=False)
    for row in df.iter_rows(named=True):  # the speedup itself is recomputed from what live ran in
        assert row["call_ms"] >= 1000 * 0.013  # tests/test_structure.py; here: a call costs at least a plain step
        assert row["speedup"] > 0 and row["tokens_per_s"] > row["speedup"]


def test_trees_beyond_the_profile_are_skipped_or_kept_without_speed(tmp_path):
    """The profile measured N <= 8 (2x: 16); a chain of 20 verifies up to 21 tokens where trajectories have room."""
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",), n_prompts=4, length=40)
    profile = write(tmp_path / "q.json", profile_body())
    skipped = []
    df = specsim.simulate(path, trees=["chain:2", "chain:20"], cost_profile=profile, n_boot=0, by_category=False)
    assert df["tree"].to_list() == ["chain:2"]
    from specsim.sim.sweep import SweepConfig, sweep

    sweep(path, SweepConfig(trees=["chain:2", "chain:20"], cost_profile=profile, n_boot=0, by_category=False), on_skip=skipped.append)
    assert len(skipped) == 1 and "chain:20" in skipped[0] and "is beyond what it measured (1-8" in skipped[0]
    kept = specsim.simulate(path, trees=["chain:2", "chain:20", "optimal:20"], cost_profile=profile, n_boot=0,
                            by_category=False, unpriced="keep")
    rows = {r["tree"]: r for r in kept.iter_rows(named=True)}
    assert rows["chain:2"]["speedup"] > 0 and rows["chain:2"]["cost_basis"].startswith("MEASURED")
    for name in ("chain:20", "optimal:20"):  # acceptance stays; speed is empty and says why
        assert rows[name]["tokens_per_call"] > 1
        assert rows[name]["speedup"] is None and rows[name]["tokens_per_s"] is None and rows[name]["call_ms"] is None
        assert rows[name]["cost_basis"].startswith("none: cost profile") and "beyond what it measured" in \
            rows[name]["cost_basis"]
    assert rows["optimal:20"]["fit"].startswith("held-out")
    with pytest.raises(SpecError, match="unpriced='maybe'"):
        specsim.simulate(path, trees=["chain:2"], cost_profile=profile, unpriced="maybe")


def test_best_per_batch_leaves_out_trees_it_cannot_price(tmp_path):
    from specsim.sim.choose import best_per_batch, pricing_for
    from specsim.sim.features import load_features
    from specsim.specs import parse_policy

    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",), n_prompts=4, length=40)
    model = load_cost_profile(write(tmp_path / "q.json", profile_body()))
    features = load_features(path, "d", 0.0, progress=False)
    trees = [parse_tree("chain:2"), parse_tree("chain:20")]
    [choice] = best_per_batch(features, trees, parse_policy("greedy"), pricing_for(path, model, "d", 0.0), [1], n_boot=0)
    assert choice.tree.name == "chain:2" and choice.candidates == 1
    with pytest.raises(SpecError, match="no candidate tree can be priced at batch 1: chain:20: .*beyond what it measured"):
        best_per_batch(features, trees[1:], parse_policy("greedy"), pricing_for(path, model, "d", 0.0), [1], n_boot=0)


@pytest.mark.parametrize("override,message", [
    ({"format": "x"}, "not a specsim-cost-profile"),
    ({"version": 1}, r"version 1; this specsim reads version 2 .*re-run `specsim profile`"),
    ({"sizes": [2, 4]}, "sizes must start at 1"),
    ({"target_verify_s": {"1": {"128": {"1": "fast"}}}}, "malformed field"),
])
def test_malformed_profiles_say_what_is_wrong(tmp_path, override, message):
    with pytest.raises(SpecError, match=message):
        load_cost_profile(write(tmp_path / "p.json", profile_body(**override)))


def test_binary_and_missing_profiles_are_one_clean_error(tmp_path):
    binary = tmp_path / "b.json"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(SpecError, match="not a text file|not JSON"):
        load_cost_profile(binary)
    with pytest.raises(SpecError, match="cannot read"):
        load_cost_profile(tmp_path / "missing.json")


def test_assumed_cost_is_flat_and_says_so():
    model = AssumedCost(0.3)
    assert float(model.verify_s(4, 17, 999)) == 1.0 and float(model.draft_s("any", 8, 3, 1)) == 0.3
    assert "ASSUMED" in model.describe() and not model.measured


def test_extrapolation_never_drops_below_the_grids_edge_and_rows_say_when_it_was_used(tmp_path):
    """Noisy last points can slope down (the H100 profile priced N = 14 below its plain step): past the grid a
    time is at least the edge's. Rows priced past the grid carry cost_extrapolated."""
    body = profile_body()
    for L in ("128", "512"):  # N = 8 measured faster than N = 4: a downward last segment
        body["target_verify_s"]["1"][L]["8"]["median"] = 0.5 * body["target_verify_s"]["1"][L]["4"]["median"]
    model = load_cost_profile(write(tmp_path / "down.json", body), extrapolate=True)
    edge = float(model.verify_s(1, 8, 128))
    assert float(model.verify_s(1, 12, 128)) == pytest.approx(edge)  # linear would go below it
    assert model.extrapolates(tokens=9) and not model.extrapolates(tokens=8, batch=4, context=512)
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",), n_prompts=3, length=20)
    profile = write(tmp_path / "p.json", profile_body())
    rows = specsim.simulate(path, trees=["chain:4", "chain:9"], drafts=["d"], by_category=False, n_boot=0,
                            cost_profile=load_cost_profile(profile, extrapolate=True))
    flags = dict(zip(rows["tree"], rows["cost_extrapolated"]))
    assert flags == {"chain:4": False, "chain:9": True}  # 10 tokens verified, 8 measured
    refused = specsim.simulate(path, trees=["chain:4", "chain:9"], drafts=["d"], by_category=False, n_boot=0,
                               cost_profile=profile)
    assert refused["tree"].to_list() == ["chain:4"]  # not asked to extrapolate: chain:9 is skipped
    assert "cost_extrapolated" not in specsim.simulate(path, trees=["chain:4"], drafts=["d"], n_boot=0).columns


def with_rounds(body: dict, factors, noise: float = 0.0, seed: int = 0) -> dict:
    """`body` with `runs` per entry: round k times every entry at factors[k] x its median, times independent
    noise (lognormal, sigma `noise`) per entry and round."""
    rng = np.random.default_rng(seed)

    def cells(table):
        for b in table.values():
            for row in b.values():
                yield from row.values()

    for cell in [*cells(body["target_verify_s"]), *(c for t in body["draft_step_s"].values() for c in cells(t))]:
        cell["runs"] = [cell["median"] * f * float(np.exp(noise * rng.normal())) for f in factors]
    return body


def test_profile_replicas_resample_rounds_jointly(tmp_path):
    """A slow round slows every entry it timed: replicas draw whole rounds, so ratios between entries survive a
    round-wide slowdown (resampling each entry on its own would scatter them)."""
    from specsim.sim.cost import REPLICAS

    factors = [1.0, 1.3, 0.9, 1.6, 1.1]
    model = load_cost_profile(write(tmp_path / "r.json", with_rounds(profile_body(), factors)))
    assert model.rounds == 5 and len(model.replicas) == REPLICAS and "5 rounds per entry" in model.describe()
    base = float(model.verify_s(1, 4, 128)) / float(model.plain_s(1, 128))
    plains = [float(r.plain_s(1, 128)) for r in model.replicas]
    assert len(set(np.round(plains, 12))) > 3  # the replicas differ ...
    for r in model.replicas:  # ... but every entry by the same round factor
        assert float(r.verify_s(1, 4, 128)) / float(r.plain_s(1, 128)) == pytest.approx(base)
        assert float(r.draft_s("d", 4, 2, 512)) / float(model.draft_s("d", 4, 2, 512)) == pytest.approx(
            float(r.plain_s(1, 128)) / float(model.plain_s(1, 128)))
    # without runs (or one round) there is nothing to resample: said, not invented
    assert load_cost_profile(write(tmp_path / "m.json", profile_body())).replicas == ()
    assert "not carried" in load_cost_profile(write(tmp_path / "m.json", profile_body())).uncertainty()
    one = load_cost_profile(write(tmp_path / "o.json", with_rounds(profile_body(), [1.0])))
    assert one.rounds == 0 and one.replicas == ()  # a single round is no spread


def test_further_rounds_of_some_blocks_are_resampled_apart_and_narrow_only_those_blocks(tmp_path):
    """`profile --max-repeats` gives only the uncertain (B, L) blocks further rounds: the cost model loads the unequal
    rounds (NaN past an entry's own), resamples the rounds every entry has jointly as before (a profile with equal
    rounds gets the very same replicas) and the further ones apart, and the block with 8x the rounds scatters less
    across replicas while the others scatter as before."""
    from specsim.sim.cost import REPLICAS

    body = with_rounds(profile_body(), [1.0] * 4, noise=0.3, seed=1)
    equal = load_cost_profile(write(tmp_path / "e.json", body))
    rng = np.random.default_rng(2)
    for table in (body["target_verify_s"], *body["draft_step_s"].values()):
        for row in table["1"]["512"].values():  # B = 1, L = 512: 28 more rounds, same noise
            row["runs"] += [row["median"] * float(np.exp(0.3 * rng.normal())) for _ in range(28)]
    more = load_cost_profile(write(tmp_path / "m.json", body))
    assert (equal.rounds, equal.max_rounds, more.rounds, more.max_rounds) == (4, 4, 4, 32)
    assert "4-32 rounds per entry" in more.describe() and "4-32 timed rounds" in more.uncertainty()
    assert len(more.replicas) == REPLICAS and all(np.isfinite(r.verify).all() and np.isfinite(r.draft["d"]).all()
                                                  for r in more.replicas)
    spread = lambda m, L: np.std([np.log(float(r.verify_s(1, 4, L))) for r in m.replicas])  # noqa: E731
    assert spread(more, 512) < 0.6 * spread(equal, 512)
    assert spread(more, 128) == pytest.approx(spread(equal, 128))  # the blocks without further rounds: as before
    assert more.stalls[1] == equal.stalls[1] + 28 * (4 + 3)  # timed runs counted, the missing ones not


def test_speedup_cis_carry_the_profiles_error(tmp_path):
    """Noise common to a round cancels in plain / speculative time of the same replica (CI as without rounds);
    noise per entry does not (wider CI, same point estimate); the rows say what their CI covers."""
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",), n_prompts=6, length=24)
    run = lambda body, name: specsim.simulate(  # noqa: E731
        path, trees=["chain:3"], drafts=["d"], by_category=False, n_boot=400,
        cost_profile=write(tmp_path / name, body)).row(0, named=True)
    bare = run(profile_body(), "bare.json")
    common = run(with_rounds(profile_body(), [1.0, 1.5, 0.7, 1.2, 2.0, 0.9]), "common.json")
    noisy = run(with_rounds(profile_body(), [1.0] * 6, noise=0.3), "noisy.json")
    assert bare["speedup_ci_covers"] == "prompts"
    assert common["speedup_ci_covers"].startswith("prompts and cost-profile rounds")
    assert common["speedup"] == pytest.approx(bare["speedup"])  # medians equal: the point estimate is the same
    assert (common["speedup_lo"], common["speedup_hi"]) == pytest.approx((bare["speedup_lo"], bare["speedup_hi"]))
    width = lambda r: r["speedup_hi"] - r["speedup_lo"]  # noqa: E731
    assert width(noisy) > 1.5 * width(bare)
    assert noisy["tokens_per_call_lo"] == bare["tokens_per_call_lo"]  # acceptance CIs are the prompts' alone


def test_extrapolation_follows_the_upper_half_of_the_grid_not_its_last_point(tmp_path):
    """One noisy last point does not set the slope past the grid: least squares over the upper half does."""
    body = profile_body()
    for L in ("128", "512"):
        body["target_verify_s"]["1"][L]["8"]["median"] *= 1.5  # a high last point: two-point slope 3x too steep
    model = load_cost_profile(write(tmp_path / "hi.json", body), extrapolate=True)
    edge = float(model.verify_s(1, 8, 128))
    two_point = (edge - float(model.verify_s(1, 4, 128))) / 4
    slope = (float(model.verify_s(1, 12, 128)) - edge) / 4
    xs = np.array([2.0, 4.0, 8.0])
    ys = np.array([float(model.verify_s(1, x, 128)) for x in xs])
    assert slope == pytest.approx(np.polyfit(xs, ys, 1)[0]) and 0 < slope < 0.8 * two_point


def test_batch_rows_carry_the_profiles_error_too(tmp_path):
    """The batch timeline prices bootstrap replicate b with profile replica b mod R: per-entry noise widens the
    batch rows' CI, round-wide noise cancels, and the point estimate is the medians'."""
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",), n_prompts=8, length=24)
    rows = lambda body, name: specsim.simulate(  # noqa: E731
        path, trees=["chain:3"], drafts=["d"], by_category=False, n_boot=200, batches=[4],
        cost_profile=write(tmp_path / name, body)).filter(pl_col("batch") == 4).row(0, named=True)
    bare = rows(profile_body(), "bare.json")
    common = rows(with_rounds(profile_body(), [1.0, 1.5, 0.7, 1.2, 2.0, 0.9]), "common.json")
    noisy = rows(with_rounds(profile_body(), [1.0] * 6, noise=0.3), "noisy.json")
    assert bare["speedup_ci_covers"] == "prompts" and noisy["speedup_ci_covers"].startswith("prompts and cost-profile")
    assert noisy["speedup"] == pytest.approx(bare["speedup"]) == pytest.approx(common["speedup"])
    assert (common["speedup_lo"], common["speedup_hi"]) == pytest.approx((bare["speedup_lo"], bare["speedup_hi"]))
    assert noisy["speedup_hi"] - noisy["speedup_lo"] > 1.5 * (bare["speedup_hi"] - bare["speedup_lo"])


def pl_col(name):
    import polars as pl

    return pl.col(name)


def test_cli_extrapolates_only_when_asked(tmp_path):
    from click.testing import CliRunner

    from specsim.cli import main

    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",), n_prompts=3, length=20)
    profile = write(tmp_path / "p.json", profile_body())
    run = lambda *extra: CliRunner().invoke(main, ["simulate", str(path), "--tree", "chain:9", "--draft", "d",  # noqa: E731
                                                   *extra, "--quiet"])
    refused = run("--cost-profile", str(profile))
    assert "skipped chain:9" in refused.output and "--cost-extrapolate" in refused.output
    asked = run("--cost-profile", str(profile), "--cost-extrapolate")
    assert asked.exit_code == 0, asked.output
    assert "priced past what the profile measured (--cost-extrapolate" in asked.output
    alone = run("--cost-extrapolate")
    assert alone.exit_code == 2 and "--cost-extrapolate goes with --cost-profile" in alone.output


def test_stalled_runs_are_counted_and_reported(tmp_path):
    from specsim.cli.profile_cmd import stall_lines

    body = with_rounds(profile_body(), [1.0, 1.1, 0.9, 1.05, 0.95])
    cell = body["target_verify_s"]["4"]["512"]["2"]
    cell["runs"][3] = 40 * cell["median"]  # one forward stalled (the machine was busy)
    model = load_cost_profile(write(tmp_path / "s.json", body))
    runs = 5 * (2 * 2 * 4 + 2 * 2 * 3)  # rounds x (B x L x N + B x L x w)
    assert model.stalls == (1, runs) and f"1 of {runs} timed runs stalled" in model.uncertainty()
    assert "1 stalled runs" in model.describe()
    [line] = stall_lines(body)
    assert line.startswith("1 entries had a stalled run") and "B=4 L=512 target N=2 (40x)" in line
    assert stall_lines(with_rounds(profile_body(), [1.0, 1.1, 0.9])) == []


def overhead_tables(batches=(1, 4), sizes=(1, 2, 4, 8)) -> dict:
    """step_overhead_s: walk_greedy 0.1 ms, walk_sample 1 ms, draft_sample 0.5 ms per token per request."""
    per = {"walk_greedy": 1e-4, "walk_sample": 1e-3, "draft_sample": 5e-4}
    return {kind: {str(b): {str(n): {"median": rate * n * b} for n in sizes} for b in batches}
            for kind, rate in per.items()}


def test_the_work_outside_the_forwards_is_priced_by_temperature_and_draft(tmp_path):
    """The profile's per-step walks and candidate draws are added to every target step: the greedy walk at
    T = 0; at T > 0 the sampling walk, plus drawing candidates from the draft's law where one exists."""
    plain = load_cost_profile(write(tmp_path / "old.json", profile_body()))
    model = load_cost_profile(write(tmp_path / "p.json", profile_body(step_overhead_s=overhead_tables())))
    base = lambda b, n: float(plain.verify_s(b, n, 128))  # noqa: E731
    assert float(model.verify_s(4, 8, 128)) == pytest.approx(base(4, 8))  # not bound to a temperature: forwards
    greedy = model.for_temperature(0.0, model_draft=True)
    assert float(greedy.verify_s(1, 4, 128)) == pytest.approx(base(1, 4) + 4e-4)
    hot = model.for_temperature(0.7, model_draft=True)
    assert float(hot.verify_s(4, 2, 128)) == pytest.approx(base(4, 2) + 8 * (1e-3 + 5e-4))
    assert float(hot.plain_s(1, 512)) == pytest.approx(float(plain.plain_s(1, 512)) + 1e-3 + 5e-4)
    free = model.for_temperature(0.7, model_draft=False)  # n-gram candidates: no draft law to draw from
    assert float(free.verify_s(1, 8, 128)) == pytest.approx(base(1, 8) + 8e-3)
    assert float(hot.draft_s("d", 1, 2, 128)) == pytest.approx(float(plain.draft_s("d", 1, 2, 128)))
    assert "walk_sample + draft_sample" in hot.describe() and "walk_greedy" in greedy.describe()
    assert plain.for_temperature(0.7, model_draft=True) is plain
    assert "work outside the forwards not priced" in plain.describe()
    # the replicas that carry the profile's error price it too (a body whose entries kept three rounds)
    body = profile_body(step_overhead_s=overhead_tables())
    for table in (body["target_verify_s"], body["draft_step_s"]["d"]):
        for cell in (c for by_l in table.values() for by_x in by_l.values() for c in by_x.values()):
            cell["runs"] = [cell["median"] * f for f in (0.9, 1.0, 1.2)]
    rounds = load_cost_profile(write(tmp_path / "r.json", body))
    bare, hot = rounds.replicas, rounds.for_temperature(1.0, model_draft=True)
    assert len(hot.replicas) == len(bare) > 0
    for r, b in zip(hot.replicas, bare):
        assert float(r.verify_s(1, 4, 128)) == pytest.approx(float(b.verify_s(1, 4, 128)) + 4 * 1.5e-3)
    assert float(hot.by_row(np.array([0, 1])).verify_s(1, 4, np.array([128.0, 128.0]))[1]) == pytest.approx(
        float(bare[1].verify_s(1, 4, 128)) + 4 * 1.5e-3)
    with pytest.raises(SpecError, match="malformed step_overhead_s"):
        load_cost_profile(write(tmp_path / "bad.json", profile_body(step_overhead_s={"walk_greedy": {}})))


def test_block_verification_is_charged_its_own_walk(tmp_path):
    """At T > 0, policy block pays `walk_block` (every drafted position's laws, thresholds and correction) where the
    token-wise rules pay `walk_sample`; greedy and sampling are unchanged; a profile that never measured
    `walk_block` still loads, prices block as the sampling walk and says so."""
    tables = overhead_tables()
    tables["walk_block"] = {b: {n: {"median": 3 * c["median"]} for n, c in by_n.items()}
                            for b, by_n in tables["walk_sample"].items()}  # 3 ms per token per request
    model = load_cost_profile(write(tmp_path / "p.json", profile_body(step_overhead_s=tables)))
    hot = model.for_temperature(0.7, model_draft=True)
    block = hot.for_rule("block")
    assert float(block.verify_s(4, 2, 128)) == pytest.approx(float(hot.verify_s(4, 2, 128)) + 8 * 2e-3)
    assert "walk_block + draft_sample" in block.describe() and "walk_sample" not in block.describe()
    assert hot.for_rule("sample") is hot and hot.for_rule("p>=q") is hot
    greedy = model.for_temperature(0.0, model_draft=True)
    assert greedy.for_rule("block") is greedy  # at T = 0 block verification is greedy verification
    old = load_cost_profile(write(tmp_path / "old.json", profile_body(step_overhead_s=overhead_tables())))
    old_block = old.for_temperature(0.7, model_draft=True).for_rule("block")
    assert float(old_block.verify_s(4, 2, 128)) == pytest.approx(float(hot.verify_s(4, 2, 128)))
    assert "block verification's own walk not measured by this profile" in old_block.describe()
    assert "not measured" not in old.for_temperature(0.7, model_draft=True).describe()


def test_rows_at_each_temperature_carry_their_own_overhead(tmp_path):
    path = random_cache(tmp_path / "c.h5", temperatures=(0.0, 1.0), drafts=("d",), n_prompts=4, length=40)
    old = write(tmp_path / "old.json", profile_body())
    new = write(tmp_path / "new.json", profile_body(step_overhead_s=overhead_tables()))
    rows = lambda p: {(r["policy"], r["temperature"]): r for r in specsim.simulate(  # noqa: E731
        path, trees=["chain:2"], policies=["greedy", "sample"], cost_profile=p, n_boot=0,
        by_category=False).iter_rows(named=True)}
    before, after = rows(old), rows(new)
    assert set(before) == {("greedy", 0.0), ("sample", 1.0)}
    for key, row in after.items():
        assert row["speedup"] < before[key]["speedup"]  # a speculative step verifies 3 tokens, plain steps 1
        assert row["tokens_per_call"] == before[key]["tokens_per_call"]
    assert "walk_greedy" in after[("greedy", 0.0)]["cost_basis"]
    assert "walk_sample + draft_sample" in after[("sample", 1.0)]["cost_basis"]
    assert "not priced" in before[("sample", 1.0)]["cost_basis"]


def test_the_least_certain_median_per_model_is_reported_with_the_rounds_it_would_need():
    from specsim.cli.profile_cmd import spread_lines

    body = with_rounds(profile_body(), [1.0, 1.1, 0.9, 1.05, 0.95])  # quartiles 0.95 and 1.05 of each median
    cell = body["draft_step_s"]["d"]["1"]["512"]["2"]
    cell["runs"] = [cell["median"] * f for f in (0.6, 0.8, 1.0, 1.2, 1.4)]  # quartiles 0.8 and 1.2
    [line] = spread_lines(body)
    quiet = 1.2533 * 0.1 / 1.349 / 5 ** 0.5  # 4.2%: needs no more rounds
    noisy = 1.2533 * 0.4 / 1.349 / 5 ** 0.5  # 16.6%
    assert f"target {100 * quiet:.1f}%" in line and f"draft d {100 * noisy:.1f}% (B=1 L=512 w=2)" in line
    assert f"draft d would need about {math.ceil(5 * (noisy / 0.05) ** 2)} rounds (--repeats or --max-repeats) for 5%" in line
    assert "target would need" not in line
    assert spread_lines(profile_body()) == []  # medians only: nothing to estimate from


def test_pooled_profiles_average_their_times_and_the_speedup_ci_spans_the_drift_between_them(tmp_path):
    """Two profiles of one machine minutes apart: the second found the draft 3x slower (a drift no single profile's
    rounds show). Pooled, the point estimate prices with their average and every CI replicate with one of the two, so
    the speedup CI covers both profiles' own predictions, which neither profile's CI does; replicas that averaged the
    two (or kept one) would not."""
    from specsim.sim.cost import load_cost_profiles

    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",), n_prompts=6, length=24)
    fast = with_rounds(profile_body(), [1.0] * 4, noise=0.01, seed=1)
    slow = with_rounds(profile_body(), [1.0] * 4, noise=0.01, seed=2)
    for cell in (c for b in slow["draft_step_s"]["d"].values() for row in b.values() for c in row.values()):
        cell["median"] *= 3
        cell["runs"] = [3 * r for r in cell["runs"]]
    a, b = write(tmp_path / "a.json", fast), write(tmp_path / "b.json", slow)
    pooled = load_cost_profiles([a, b])
    assert float(pooled.draft_s("d", 1, 2, 128)) == pytest.approx(2 * float(load_cost_profile(a).draft_s("d", 1, 2, 128)))
    assert "profiles a.json, b.json, averaged" in pooled.describe() and "2 profiles" in pooled.uncertainty()
    picked = [float(r.draft_s("d", 1, 2, 128)) / float(pooled.draft_s("d", 1, 2, 128)) for r in pooled.replicas]
    assert min(picked) < 0.55 and max(picked) > 1.45  # each replica is one of the two (0.5x and 1.5x the average)
    run = lambda cost: specsim.simulate(  # noqa: E731
        path, trees=["chain:3"], drafts=["d"], by_category=False, n_boot=400, cost_profile=cost).row(0, named=True)
    one_a, one_b, both = run(a), run(b), run(pooled)
    assert one_b["speedup"] < both["speedup"] < one_a["speedup"]
    assert both["speedup_lo"] <= one_b["speedup"] and one_a["speedup"] <= both["speedup_hi"]
    assert not one_a["speedup_lo"] <= one_b["speedup"] and not one_a["speedup"] <= one_b["speedup_hi"]


def test_profiles_of_other_grids_or_models_are_not_pooled(tmp_path):
    from specsim.sim.cost import load_cost_profiles

    a = write(tmp_path / "a.json", profile_body())
    other_grid = profile_body(contexts=[128, 1024])
    other_grid["target_verify_s"] = {b: {"128": t["128"], "1024": t["512"]} for b, t in
                                     other_grid["target_verify_s"].items()}
    other_grid["draft_step_s"]["d"] = {b: {"128": t["128"], "1024": t["512"]} for b, t in
                                       other_grid["draft_step_s"]["d"].items()}
    with pytest.raises(SpecError, match=r"a\.json and .*g\.json measured different contexts"):
        load_cost_profiles([a, write(tmp_path / "g.json", other_grid)])
    with pytest.raises(SpecError, match=r"differ in device"):
        load_cost_profiles([a, write(tmp_path / "v.json", profile_body(device="cuda (H100)"))])
    assert load_cost_profiles([a]).pooled == ()  # one profile is itself


def test_simulate_and_optimize_take_several_profiles_and_say_they_pooled_them(tmp_path):
    from click.testing import CliRunner

    from specsim.cli import main

    path = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("d",), n_prompts=3, length=20)
    a = write(tmp_path / "a.json", with_rounds(profile_body(), [1.0, 1.1, 0.9]))
    b = write(tmp_path / "b.json", with_rounds(profile_body(device="cpu (2 threads)"), [1.2, 1.3, 1.1]))
    out = CliRunner().invoke(main, ["simulate", str(path), "--tree", "chain:3", "--draft", "d", "--cost-profile",
                                    str(a), "--cost-profile", str(b), "--quiet"])
    assert out.exit_code == 0, out.output
    assert "MEASURED profiles a.json, b.json, averaged, the CIs carrying the drift between them" in out.output
    chosen = CliRunner().invoke(main, ["optimize", str(path), "--draft", "d", "--budget", "3", "--cost-profile",
                                       str(a), "--cost-profile", str(b)])
    assert chosen.exit_code == 0, chosen.output
    other = write(tmp_path / "o.json", profile_body(device="cuda (H100)"))
    refused = CliRunner().invoke(main, ["simulate", str(path), "--tree", "chain:3", "--cost-profile", str(a),
                                        "--cost-profile", str(other), "--quiet"])
    assert refused.exit_code != 0 and "differ in device" in refused.output


def test_pooled_profiles_without_rounds_still_carry_the_drift_between_them(tmp_path):
    """Profiles that kept medians only have no rounds to resample, but pooled, each replica is still one of them."""
    from specsim.sim.cost import load_cost_profiles

    slow = profile_body()
    for cell in (c for b in slow["draft_step_s"]["d"].values() for row in b.values() for c in row.values()):
        cell["median"] *= 3
    pooled = load_cost_profiles([write(tmp_path / "a.json", profile_body()), write(tmp_path / "b.json", slow)])
    picked = {round(float(r.draft_s("d", 1, 2, 128)) / float(pooled.draft_s("d", 1, 2, 128)), 6)
              for r in pooled.replicas}
    assert picked == {0.5, 1.5} and "2 profiles" in pooled.uncertainty()

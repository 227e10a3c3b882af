"""Cost models: Leviathan's ratio model and measured profiles."""

from __future__ import annotations

import json

import numpy as np
import pytest

import specsim
from specsim.errors import SpecError
from specsim.sim.cost import load_cost_profile, parse_cost
from specsim.sim.engine import walk
from specsim.sim.features import load_features
from specsim.sim.policies import parse_policy, run_policy
from specsim.trees import parse_tree
from tests.synthetic import iid_sample_cache


@pytest.mark.parametrize("alpha,gamma,c", [(0.7, 4, 0.05), (0.9, 8, 0.1), (0.5, 1, 0.2)])
def test_ratio_cost_gives_leviathans_improvement_factor(tmp_path, alpha, gamma, c):
    path, a = iid_sample_cache(tmp_path / "s.h5", alpha=alpha, n_traj=2, length=40)
    f = load_features(path, "d", 1.0, progress=False)
    tree = parse_tree(f"chain:{gamma}")
    model = parse_cost(f"c={c}")
    kappa = model.call_cost(tree, context=100.0, model_draft=True)
    assert kappa == pytest.approx(1 + gamma * c)
    table = run_policy(f, tree, parse_policy("sample"), np.random.default_rng(0))
    away = f.remaining() >= gamma
    improvement = (1 - a ** (gamma + 1)) / ((1 - a) * (gamma * c + 1))
    np.testing.assert_allclose((1 + table.mean_len()[away]) / kappa, improvement, rtol=0, atol=1e-9)
    # The walk over whole trajectories: speedup = tokens / (calls x call cost), ends included.
    stats = walk(table, f, kappa)
    assert stats.tokens.sum() / stats.cost.sum() == pytest.approx(stats.tokens.sum() / stats.calls.sum() / kappa)
    assert stats.tokens.sum() / stats.cost.sum() < improvement  # the end cap only loses tokens


def test_simulate_speedup_matches_long_run_leviathan(tmp_path):
    # Renewal argument: on long trajectories tokens/call tends to the per-call expectation.
    path, a = iid_sample_cache(tmp_path / "s.h5", alpha=0.8, n_traj=2, length=4000)
    df = specsim.simulate(path, trees=["chain:5"], policies=["sample"], cost="c=0.05", n_boot=0)
    row = df.row(0, named=True)
    assert row["speedup"] == pytest.approx((1 - a**6) / ((1 - a) * 1.25), rel=2e-3)
    assert row["call_cost"] == pytest.approx(1.25)


def test_model_free_drafts_cost_nothing_to_draft():
    assert parse_cost("c=0.3").call_cost(parse_tree("chain:5"), context=1, model_draft=False) == 1.0


@pytest.mark.parametrize("text", ["0.05", "c=", "c=abc", "d=0.1", "c=-1"])
def test_bad_cost_specs_are_refused(text):
    with pytest.raises(SpecError, match="c=0.05|>= 0"):
        parse_cost(text)


def write_profile(path, **override):
    data = {
        "format": "specsim-cost-profile", "version": 1, "device": "cpu", "target": "t", "draft": "d",
        "dtype": "float32", "mask": "tree-4d", "contexts": [128, 512],
        "target_verify_s": {"128": {"1": 0.010, "2": 0.011, "4": 0.012, "8": 0.016},
                            "512": {"1": 0.020, "2": 0.022, "4": 0.026, "8": 0.030}},
        "draft_step_s": {"128": {"1": 0.002, "2": 0.0025, "4": 0.003},
                         "512": {"1": 0.004, "2": 0.0045, "4": 0.005}},
        "repeats": 10, "statistic": "median",
    }
    data.update(override)
    path.write_text(json.dumps(data))
    return path


def test_profile_costs_interpolate_sizes_and_contexts(tmp_path):
    model = load_cost_profile(write_profile(tmp_path / "p.json"))
    chain2 = parse_tree("chain:2")  # 3 tree tokens, two draft levels of width 1
    # At a measured context: verify(3) interpolated between N=2 and N=4, plus two draft steps.
    assert model.call_cost(chain2, context=128, model_draft=True) == pytest.approx((0.0115 + 2 * 0.002) / 0.010)
    at512 = model.call_cost(chain2, context=512, model_draft=True)
    assert at512 == pytest.approx((0.024 + 2 * 0.004) / 0.020)
    # Halfway between contexts: timings interpolated in L, then divided by the interpolated unit.
    mid = model.call_cost(chain2, context=320, model_draft=True)
    assert mid == pytest.approx((0.5 * (0.0115 + 0.024) + 2 * 0.003) / 0.015)
    assert model.call_cost(chain2, context=50, model_draft=True) == model.call_cost(chain2, context=128,
                                                                                      model_draft=True)
    # Level widths: kary:2,2 drafts levels of 2 and 4 and verifies 7 tokens.
    kary = parse_tree("kary:2,2")
    assert model.call_cost(kary, context=128, model_draft=False) == pytest.approx(0.015 / 0.010)
    assert model.call_cost(kary, context=128, model_draft=True) == pytest.approx((0.015 + 0.0025 + 0.003) / 0.010)
    # Beyond the largest measured size: linear extrapolation from the last two points.
    assert model.call_cost(parse_tree("chain:11"), context=128, model_draft=False) == pytest.approx(0.020 / 0.010)  # 12 tokens
    assert "p.json" in model.describe() and "cpu" in model.describe()


@pytest.mark.parametrize("override,message", [
    ({"format": "x"}, "not a specsim-cost-profile"),
    ({"version": 2}, "version 2"),
    ({"target_verify_s": {"128": {"2": 0.01}}, "draft_step_s": {"128": {"1": 0.001}}}, "lacks N=1"),
    ({"draft_step_s": {"128": {"1": 0.001}}}, "different contexts"),
    ({"target_verify_s": {"128": {"1": "fast"}}}, r"target_verify_s\['128'\]"),
])
def test_malformed_profiles_say_what_is_wrong(tmp_path, override, message):
    with pytest.raises(SpecError, match=message):
        load_cost_profile(write_profile(tmp_path / "p.json", **override))

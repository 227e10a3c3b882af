"""Lossy rules along target trajectories: vectorised laws equal specsim.verify's, TV reported."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim import verify
from specsim.errors import SpecError
from specsim.sim.sweep import simulate
from specsim.sim.features import load_features
from specsim.cache.stats import lossy_output_law as output_law, lossy_passes as passes
from specsim.sim.lossy import lossy_table, rule_of
from specsim.sim.policies import run_policy
from specsim.specs import parse_policy
from specsim.specs import parse_tree
from tests.strategies import distribution_pairs
from tests.synthetic import random_cache

RULES = [verify.LossyRule("p>=q"), verify.LossyRule("p>=lq", lam=0.5), verify.LossyRule("typical"),
         verify.LossyRule("typical", eps=0.3, delta=0.5)]


@given(distribution_pairs(max_size=6), st.sampled_from(RULES))
@settings(max_examples=150, deadline=None)
def test_vectorised_rule_equals_verify(pq, rule):
    p, q = pq
    np.testing.assert_array_equal(passes(rule, p[None], q[None])[0], rule.passes(p, q))
    np.testing.assert_allclose(output_law(rule, p[None], q[None])[0],
                               verify.output_distribution(rule, p, q, 1), atol=1e-12)


def test_rule_of_policy_specs():
    assert rule_of(parse_policy("p>=lq:0.25")).lam == 0.25
    t = rule_of(parse_policy("typical:0.2,0.4"))
    assert (t.eps, t.delta) == (0.2, 0.4)
    assert rule_of(parse_policy("typical")) == verify.LossyRule("typical")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return random_cache(tmp_path_factory.mktemp("lossy") / "r.h5", n_prompts=4, length=12, vocab=6, noise=1.5)


def test_chain_acceptance_and_tv_are_the_per_position_laws(cache):
    features = load_features(cache, "small", 1.0, progress=False)
    rule = verify.LossyRule("p>=q")
    table = lossy_table(features, parse_tree("chain:2"), parse_policy("p>=q"), np.random.default_rng(0))
    alpha, tv = [], []
    for _, _, p, q in features.iter_distributions():
        for j in range(p.shape[0]):
            alpha.append(float(q[j][rule.passes(p[j], q[j])].sum()))
            tv.append(verify.total_variation(verify.output_distribution(rule, p[j], q[j], 1), p[j]))
    alpha = np.array(alpha)
    remaining = features.remaining()
    at_least_1 = 1 - table.p_len[:, 0]
    # p>=q is a recorded rule: α and TV come from the recording's float32 statistics
    np.testing.assert_allclose(at_least_1, np.where(remaining >= 1, alpha, 0.0), atol=1e-6)
    nxt = np.append(alpha[1:], 0.0)
    np.testing.assert_allclose(table.p_len[:, 2], np.where(remaining >= 2, alpha * nxt, 0.0), atol=1e-6)
    assert table.extra["tv_distortion"] == pytest.approx(np.mean(tv), abs=1e-6)
    assert table.extra["tv_distortion_max"] == pytest.approx(np.max(tv), abs=1e-6)
    assert table.extra["tv_distortion"] > 0.01  # the noisy draft really distorts p


def test_more_lenient_rule_accepts_more(cache):
    features = load_features(cache, "small", 1.0, progress=False)
    tree = parse_tree("kary:2,2")
    strict = run_policy(features, tree, parse_policy("p>=q"), np.random.default_rng(0))
    lenient = run_policy(features, tree, parse_policy("p>=lq:0.3"), np.random.default_rng(0))
    assert lenient.mean_len().sum() > strict.mean_len().sum()
    # λ → 0 accepts every candidate: the chain always runs to the end cap and emits q itself
    anything = run_policy(features, parse_tree("chain:2"), parse_policy("p>=lq:1e-9"), np.random.default_rng(0))
    np.testing.assert_allclose(anything.mean_len(), np.minimum(2, features.remaining()), atol=1e-12)
    tv_q = np.mean([verify.total_variation(p[j], q[j]) for _, _, p, q in features.iter_distributions()
                    for j in range(p.shape[0])])
    assert anything.extra["tv_distortion"] == pytest.approx(tv_q, abs=1e-12)


def test_identical_draft_is_accepted_always_without_distortion(tmp_path):
    from tests.synthetic import write_cache

    rng = np.random.default_rng(0)
    logits = np.round(rng.normal(0, 2, (10, 5)), 2).astype(np.float32)
    tokens = rng.integers(0, 5, 10).astype(np.int32)
    path = write_cache(tmp_path / "same.h5", [dict(prompt_index=0, temperature=1.0, tokens=tokens,
                       target_logits=logits, draft_logits={"d": logits})], vocab=5, drafts=["d"],
                       temperatures=[1.0], categories=["c"])
    features = load_features(path, "d", 1.0, progress=False)
    table = lossy_table(features, parse_tree("chain:3"), parse_policy("p>=q"), np.random.default_rng(0))
    np.testing.assert_allclose(table.mean_len(), np.minimum(3, features.remaining()), atol=1e-12)
    assert table.extra["tv_distortion"] == pytest.approx(0.0, abs=1e-12)


def test_rows_are_flagged_approximate_with_tv_column(cache):
    df = simulate(cache, trees=["chain:3"], policies=["p>=q", "sample"], temperatures=[1.0], by_category=False,
                  n_boot=20)
    lossy = df.filter(df["policy"] == "p>=q").row(0, named=True)
    exact = df.filter(df["policy"] == "sample").row(0, named=True)
    assert lossy["approximate"] and lossy["tv_distortion"] > 0
    assert not exact["approximate"] and exact["tv_distortion"] is None


def test_lossy_swor_trees_and_greedy_trajectories_refused(cache):
    features = load_features(cache, "small", 1.0, progress=False)
    swor = parse_policy("p>=q", multi_draft="swor")
    with pytest.raises(SpecError, match="i.i.d. candidates"):
        lossy_table(features, parse_tree("kary:2,2"), swor, np.random.default_rng(0))
    greedy = load_features(cache, "small", 0.0, progress=False)
    with pytest.raises(SpecError, match="T > 0"):
        lossy_table(greedy, parse_tree("chain:2"), parse_policy("p>=q"), np.random.default_rng(0))

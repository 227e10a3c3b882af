"""Adaptive chain lengths: the exact forward pass over (position, γ) against independent recursions."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from specsim.errors import SpecError
from specsim.sim.adaptive import next_gamma_table
from specsim.sim.pricing import Pricing
from specsim.sim.cost import parse_cost
from specsim.sim.engine import walk
from specsim.sim.features import load_features
from specsim.sim.policies import run_adaptive, run_policy
from specsim.specs import parse_policy
from specsim.specs import parse_tree
from tests.synthetic import random_cache, rank_cache


def test_next_gamma_rules():
    hf = next_gamma_table("adaptive-hf", 16)
    assert hf[3, 3] == 5 and hf[3, 2] == 2 and hf[1, 0] == 1 and hf[16, 16] == 16
    hist = next_gamma_table("adaptive-history", 16, (0.8, 0.4))
    assert hist[5, 5] == 6 and hist[5, 4] == 5 and hist[5, 2] == 5 and hist[5, 1] == 4 and hist[1, 0] == 1
    with pytest.raises(SpecError, match="lo <= hi"):
        next_gamma_table("adaptive-history", 16, (0.2, 0.6))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return random_cache(tmp_path_factory.mktemp("adaptive") / "r.h5", n_prompts=5, length=16, vocab=6, noise=0.7)


@pytest.mark.parametrize("T, policy", [(1.0, "sample"), (0.0, "greedy")])
def test_frozen_rule_equals_the_fixed_chain_walk(cache, T, policy):
    features = load_features(cache, "small", T, progress=False)
    pricing = Pricing(parse_cost("c=0.1"), "small", "assumed")
    tree = parse_tree("chain:3")
    frozen = run_adaptive(features, [tree], parse_policy("adaptive-history:1,0"), [pricing])[0]
    call, plain, feed = pricing.priced(features, tree)
    fixed = walk(run_policy(features, tree, parse_policy(policy), np.random.default_rng(0)), features, call,
                 plain_cost=plain, next_feed_cost=feed)
    for name in ("calls", "drafted", "accepted", "cost", "plain"):
        np.testing.assert_allclose(getattr(frozen, name), getattr(fixed, name), atol=1e-12)
    np.testing.assert_allclose(frozen.reach[:, :3], fixed.reach, atol=1e-12)
    assert np.all(frozen.reach[:, 3:] == 0) and frozen.exact


@pytest.mark.parametrize("rule", ["adaptive-hf", "adaptive-history", "adaptive-history:0.6,0.3"])
@pytest.mark.parametrize("T", [1.0, 0.0])
def test_forward_pass_equals_backward_recursion(cache, rule, T):
    features = load_features(cache, "small", T, progress=False)
    spec = parse_policy(rule)
    stats = run_adaptive(features, [parse_tree("chain:2")], spec, [None])[0]
    beta = (features.rank == 0).astype(float) if T == 0 else np.exp(np.minimum(0, features.logq - features.logp))
    nxt = next_gamma_table(spec.name, 16, spec.params)
    for i in range(features.n_traj):
        s, n = int(features.traj_start[i]), int(features.traj_len[i])
        b = beta[s : s + n]

        @lru_cache(maxsize=None)
        def value(t: int, g: int) -> tuple[float, float]:  # (expected calls, expected accepted) from t
            if t >= n:
                return 0.0, 0.0
            limit, surv, calls, acc = min(g, n - 1 - t), 1.0, 1.0, 0.0
            for a in range(limit + 1):
                p_a = surv * (1 - b[t + a]) if a < limit else surv
                c, x = value(t + a + 1, int(nxt[g, a]))
                calls += p_a * c
                acc += p_a * (a + x)
                if a < limit:
                    surv *= b[t + a]
            return calls, acc

        calls, acc = value(0, 2)
        assert stats.calls[i] == pytest.approx(calls, abs=1e-12)
        assert stats.accepted[i] == pytest.approx(acc, abs=1e-12)
    assert np.allclose(stats.reach[:, 0], stats.accepted - (stats.reach[:, 1:]).sum(axis=1))


def test_hf_schedule_grows_by_two_on_full_acceptance(tmp_path):
    path = rank_cache(tmp_path / "zeros.h5", [np.zeros(30, dtype=int)])  # the draft's top choice, always
    features = load_features(path, "d", 0.0, progress=False)
    stats = run_adaptive(features, [parse_tree("chain:3")], parse_policy("adaptive-hf"), [None])[0]
    # calls of γ = 3, 5, 7, 9 emit 4 + 6 + 8 + 10 = 28 tokens; γ = 11 is capped to the last 2, and that
    # call drafts only the 1 token it could accept (as HF's assisted generation does near max_new_tokens)
    assert stats.calls[0] == 5 and stats.accepted[0] == 25 and stats.drafted[0] == 3 + 5 + 7 + 9 + 1


def test_adaptive_rules_need_a_chain_and_a_model_draft(cache):
    features = load_features(cache, "small", 1.0, progress=False)
    with pytest.raises(SpecError, match="apply to chains"):
        run_adaptive(features, [parse_tree("kary:2,2")], parse_policy("adaptive-hf"), [None])
    free = load_features(cache, "ngram:2", 1.0, progress=False)
    with pytest.raises(SpecError, match="model-free"):
        run_adaptive(free, [parse_tree("chain:2")], parse_policy("adaptive-hf"), [None])


def test_each_entry_point_returns_one_type(cache):
    """run_policy gives acceptance tables only; an adaptive rule (no single table) is run_adaptive's."""
    features = load_features(cache, "small", 1.0, progress=False)
    with pytest.raises(SpecError, match="run_adaptive"):
        run_policy(features, parse_tree("chain:2"), parse_policy("adaptive-hf"), np.random.default_rng(0))
    with pytest.raises(SpecError, match="not an adaptive rule"):
        run_adaptive(features, [parse_tree("chain:2")], parse_policy("sample"), [None])


@pytest.mark.parametrize("rule", ["adaptive-hf", "adaptive-history", "adaptive-history:0.6,0.3"])
@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_walk_equals_the_markov_walk(cache, rule, gamma):
    """Point-mass acceptance takes the deterministic lockstep walk; it must give the forward pass's totals."""
    from specsim.sim.adaptive import deterministic_walk, markov_walk

    features = load_features(cache, "small", 0.0, progress=False)
    beta = (features.rank == 0).astype(float)
    assert 0 < beta.mean() < 1
    spec = parse_policy(rule)
    cap = max(16, 2 * gamma)
    nxt = next_gamma_table(spec.name, cap, spec.params)
    cost, full = np.random.default_rng(1).random((2, features.n_positions, cap + 1))
    fast = deterministic_walk(beta, features, gamma, nxt, cost, full)
    slow = markov_walk(beta, features, gamma, nxt, cost, full)
    for name in ("calls", "drafted", "accepted", "cost", "reach"):
        np.testing.assert_allclose(fast[name], slow[name], atol=1e-12, err_msg=name)


@pytest.fixture(scope="module")
def long_cache(tmp_path_factory):
    """Trajectories of 30-60 tokens with a good draft: calls run past the history window's edges."""
    return random_cache(tmp_path_factory.mktemp("adaptive_long") / "l.h5", n_prompts=4, length=60, vocab=5,
                        noise=0.3, temperatures=(1.0,))


@pytest.mark.parametrize("table", ["adaptive-hf", "random"])
@pytest.mark.parametrize("starts", [(2,), (9, 1, 2, 18)])
def test_forward_pass_with_any_next_gamma_table(long_cache, table, starts):
    """The window recurrence against the plain recursion, on long trajectories, a cap of 18 and a
    next-γ table with many runs per row (destinations that jump around, clipped at both ends); several
    start γ walked together must each give their own walk's totals."""
    from specsim.sim.adaptive import markov_walks

    features = load_features(long_cache, "small", 1.0, progress=False)
    beta = np.exp(np.minimum(0, features.logq - features.logp))
    rng = np.random.default_rng(starts[0])
    cap = 18
    nxt = next_gamma_table("adaptive-hf", cap) if table == "adaptive-hf" else rng.integers(1, cap + 1, (cap + 1, cap + 1))
    cost, full = rng.random((2, features.n_positions, cap + 1))
    for gamma, got in zip(starts, markov_walks(beta, features, starts, nxt, cost, full), strict=True):
        _check_recursion(features, beta, nxt, cost, gamma, got, full)


def _check_recursion(features, beta, nxt, cost, gamma, got, full):
    """`got` against the plain recursion over (t, γ); `full[t, γ]`: the extra cost of a call of γ at t
    that accepts all γ (the next call's 2-token root feed)."""
    room = features.room()
    for i in range(features.n_traj):
        s, n = int(features.traj_start[i]), int(features.traj_len[i])
        b = beta[s : s + n]

        @lru_cache(maxsize=None)
        def value(t: int, g: int) -> np.ndarray:  # expected (calls, drafted, accepted, cost) from t
            if t >= n:
                return np.zeros(4)
            limit, surv = min(g, n - 1 - t), 1.0
            total = np.array([1.0, min(g, room[s + t]), 0.0, cost[s + t, g]])
            for a in range(limit + 1):
                p_a = surv * (1 - b[t + a]) if a < limit else surv
                extra = full[s + t, g] if a == g else 0.0
                total += p_a * (value(t + a + 1, int(nxt[g, a])) + np.array([0, 0, a, extra]))
                if a < limit:
                    surv *= b[t + a]
            return total

        want = value(0, gamma)
        np.testing.assert_allclose([got[k][i] for k in ("calls", "drafted", "accepted", "cost")], want, rtol=1e-11)
    assert 20 < features.traj_len.max() and 0.3 < beta.mean() < 0.95


@pytest.mark.parametrize("trees", [["chain"], ["chain", "kary:2"]])
def test_a_sweep_walks_chains_together_to_each_chains_totals(cache, trees):
    """simulate walks an adaptive rule's chains together (one pass per cap); every row must equal the
    chain walked alone, and a tree the rule cannot replay (kary) is skipped without taking the chains along."""
    import specsim

    df = specsim.simulate(cache, trees=trees, budgets=[1, 2, 3, 9], policies=["adaptive-hf"], temperatures=[1.0],
                          cost="c=0.1", by_category=False, n_boot=20)
    features = load_features(cache, "small", 1.0, progress=False)
    pricing = Pricing(parse_cost("c=0.1"), "small", "assumed")
    want = ["chain:1", "chain:2", "chain:3", "chain:9"] + (["kary:2@1"] if "kary:2" in trees else [])  # a 1-node chain
    assert df["tree"].to_list() == want
    for row in df.iter_rows(named=True):
        alone = run_adaptive(features, [parse_tree(row["tree"])], parse_policy("adaptive-hf"), [pricing])[0]
        assert row["tokens_per_call"] == pytest.approx(alone.tokens.sum() / alone.calls.sum(), rel=1e-12)
        assert row["speedup_assumed"] == pytest.approx(alone.plain.sum() / alone.cost.sum(), rel=1e-12)

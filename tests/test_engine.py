"""The walk DP and the closed-form policies against independent computations."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.sim.engine import AcceptanceTable, check_table, occupancy, walk
from specsim.sim.features import Features, load_features
from specsim.sim.policies import chain_table, greedy_table, run_policy
from specsim.specs import parse_policy
from specsim.trees import Tree
from specsim.specs import parse_tree
from tests.strategies import trees
from tests.synthetic import iid_greedy_cache, iid_sample_cache

RNG = np.random.default_rng(0)


def memory_features(lengths, *, rank=None, logp=None, logq=None, temperature=0.0) -> Features:
    """Features built in memory (no cache file): enough for policies and the walk."""
    lens = np.asarray(lengths, dtype=np.int32)
    N = int(lens.sum())
    return Features(
        draft="d", temperature=temperature, cache_path=Path("/nonexistent.h5"), models={"target": "t", "draft": "d"},
        traj_start=np.concatenate([[0], np.cumsum(lens[:-1])]).astype(np.int64), traj_len=lens,
        traj_prompt=np.arange(len(lens), dtype=np.int32), traj_category=np.array(["c"] * len(lens), dtype=object),
        cache_start=np.zeros(len(lens), dtype=np.int64), token=np.zeros(N, dtype=np.int32),
        rank=None if rank is None else np.asarray(rank, dtype=np.int32), logp=logp, logq=logq, top_ids=None,
        exact_tail=True,
    )


def brute_greedy_length(ranks, t, end, paths) -> int:
    """Largest d with (ρ_t..ρ_{t+d-1}) a rank path of the tree and d <= end-1-t."""
    best = 0
    for d in range(1, end - t):
        if tuple(int(r) for r in ranks[t : t + d]) in paths:
            best = d
        else:
            break
    return best


@settings(max_examples=150, deadline=None)
@given(tree=trees(max_nodes=16, max_rank=3, max_depth=5),
       lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4), data=st.data())
def test_greedy_walk_equals_brute_force(tree, lengths, data):
    N = sum(lengths)
    ranks = np.array(data.draw(st.lists(st.integers(0, 4), min_size=N, max_size=N)))
    f = memory_features(lengths, rank=ranks)
    table = greedy_table(f, tree, parse_policy("greedy"), RNG)
    got = table.p_len.argmax(axis=1)
    assert np.all(table.p_len.max(axis=1) == 1.0)  # deterministic
    paths = set(tree.rank_paths()[1:])
    ends = np.repeat(f.traj_start + f.traj_len, f.traj_len)
    want = [brute_greedy_length(ranks, t, ends[t], paths) for t in range(N)]
    assert got.tolist() == want
    assert np.all(got <= tree.max_depth)
    assert np.all(got <= f.remaining())  # the end-of-trajectory cap


@pytest.mark.parametrize("k,m,gamma", [(1, 2, 3), (3, 4, 4), (2, 5, 3), (1, 3, 5)])
def test_greedy_iid_cache_reproduces_leviathan(tmp_path, k, m, gamma):
    path, n_windows = iid_greedy_cache(tmp_path / "g.h5", k=k, m=m, gamma=gamma)
    f = load_features(path, "d", 0.0, progress=False)
    table = run_policy(f, parse_tree(f"chain:{gamma}"), parse_policy("greedy"), RNG)
    alpha = k / m
    expected = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert 1 + table.mean_len()[:n_windows].mean() == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("alpha,gamma", [(0.6, 4), (0.85, 7), (0.3, 2)])
def test_sample_chain_iid_cache_reproduces_leviathan(tmp_path, alpha, gamma):
    path, a = iid_sample_cache(tmp_path / "s.h5", alpha=alpha, n_traj=3, length=30)
    assert a == pytest.approx(alpha, rel=2e-3)  # float16 logits move α only slightly
    f = load_features(path, "d", 1.0, progress=False)
    table = run_policy(f, parse_tree(f"chain:{gamma}"), parse_policy("sample"), RNG)
    away = f.remaining() >= gamma  # start positions the end cap does not reach
    expected = (1 - a ** (gamma + 1)) / (1 - a)
    np.testing.assert_allclose(1 + table.mean_len()[away], expected, rtol=0, atol=1e-9)
    assert table.exact


def brute_walk_chain(beta, gamma):
    """Enumerate every accept/reject pattern of a short trajectory and decode each one."""
    n = len(beta)
    totals = np.zeros(3 + gamma)  # calls, drafted, accepted, reach_1..reach_gamma
    for bits in itertools.product([0, 1], repeat=n):
        prob = np.prod([b if x else 1 - b for b, x in zip(beta, bits)])
        t = 0
        while t < n:
            a = 0
            while a < min(gamma, n - 1 - t) and bits[t + a]:
                a += 1
            totals[0] += prob
            totals[1] += prob * min(gamma, n - 1 - t)  # a call drafts only what it could accept (room)
            totals[2] += prob * a
            totals[3 : 3 + a] += prob
            t += a + 1
    return totals


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_walk_equals_enumeration_of_acceptance_patterns(gamma):
    rng = np.random.default_rng(gamma)
    lengths = [9, 1, 6]
    N = sum(lengths)
    logp = np.log(rng.uniform(0.05, 1, N))
    logq = np.log(rng.uniform(0.05, 1, N))
    f = memory_features(lengths, logp=logp, logq=logq, temperature=1.0)
    table = run_policy(f, parse_tree(f"chain:{gamma}"), parse_policy("sample"), RNG)
    stats = walk(table, f, call_cost=1.25)
    beta = np.minimum(1, np.exp(logq - logp))
    for i, (s, n) in enumerate(zip(f.traj_start, f.traj_len)):
        want = brute_walk_chain(beta[s : s + n], gamma)
        got = np.concatenate([[stats.calls[i], stats.drafted[i], stats.accepted[i]], stats.reach[i]])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        assert stats.cost[i] == pytest.approx(1.25 * stats.calls[i], abs=1e-12)
    # every call emits A + 1 tokens, so accepted + calls is the trajectory length
    np.testing.assert_allclose(stats.accepted + stats.calls, stats.tokens, atol=1e-12)


def random_table(f: Features, D: int, rng) -> AcceptanceTable:
    """Arbitrary end-capped laws of A, not of the chain form."""
    cap = np.minimum(f.remaining(), D)
    w = rng.uniform(size=(f.n_positions, D + 1)) * (np.arange(D + 1)[None, :] <= cap[:, None])
    return AcceptanceTable(p_len=w / w.sum(axis=1, keepdims=True), drafted=rng.integers(1, 5, f.n_positions),
                           exact=True)


def brute_expectation(P, drafted, start, n, D):
    """Recursive expectation over every sequence of accepted lengths (no DP table)."""
    def go(t):
        if t >= start + n:
            return np.zeros(3 + D)
        out = np.zeros(3 + D)
        for a in range(D + 1):
            if P[t, a] == 0:
                continue
            here = np.zeros(3 + D)
            here[0], here[1], here[2] = 1, drafted[t], a
            here[3 : 3 + a] = 1
            out += P[t, a] * (here + go(t + a + 1))
        return out
    return go(start)


def test_walk_equals_recursive_expectation_on_arbitrary_tables():
    rng = np.random.default_rng(7)
    f = memory_features([7, 3, 10, 1])
    table = random_table(f, 3, rng)
    stats = walk(table, f, call_cost=1.0)
    for i, (s, n) in enumerate(zip(f.traj_start, f.traj_len)):
        want = brute_expectation(table.p_len, table.drafted, int(s), int(n), 3)
        got = np.concatenate([[stats.calls[i], stats.drafted[i], stats.accepted[i]], stats.reach[i]])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_walk_charges_each_accepted_length_its_own_extra_cost():
    """An (N, D+1) extra cost by the call's accepted length (EAGLE's next root feed of 1 + A entries)
    is charged in expectation as the recursion C(t) = c(t) + Σ_a P(a | t) (extra[t, a] + C(t + a + 1))."""
    rng = np.random.default_rng(11)
    f = memory_features([6, 9, 2])
    D = 3
    table = random_table(f, D, rng)
    call = rng.uniform(1, 2, f.n_positions)
    extra = rng.uniform(0, 1, (f.n_positions, D + 1))
    stats = walk(table, f, call_cost=call, next_feed_cost=extra)

    def cost(t, end):
        if t >= end:
            return 0.0
        return call[t] + sum(table.p_len[t, a] * (extra[t, a] + cost(t + a + 1, end)) for a in range(D + 1))

    for i, (s, n) in enumerate(zip(f.traj_start, f.traj_len)):
        assert stats.cost[i] == pytest.approx(cost(int(s), int(s + n)), abs=1e-12)


def test_occupancy_sums_to_expected_calls_and_starts_each_trajectory():
    rng = np.random.default_rng(3)
    f = memory_features([5, 8, 2])
    table = random_table(f, 4, rng)
    occ = occupancy(table, f)
    stats = walk(table, f, 1.0)
    owner = np.repeat(np.arange(f.n_traj), f.traj_len)
    np.testing.assert_allclose(np.bincount(owner, weights=occ), stats.calls, atol=1e-12)
    np.testing.assert_allclose(occ[f.traj_start], 1.0)


def test_monte_carlo_se_is_carried_to_totals():
    rng = np.random.default_rng(4)
    f = memory_features([6, 6])
    exact = random_table(f, 2, rng)
    se_len = np.full(f.n_positions, 0.1)
    mc = AcceptanceTable(p_len=exact.p_len, drafted=exact.drafted, exact=False, se_len=se_len)
    stats = walk(mc, f, 1.0)
    assert not stats.exact
    occ = occupancy(mc, f)
    np.testing.assert_allclose(stats.se_accepted ** 2, [np.sum((occ[:6] * 0.1) ** 2), np.sum((occ[6:] * 0.1) ** 2)])


def test_table_with_mass_past_the_end_is_rejected():
    f = memory_features([3])
    p_len = np.zeros((3, 3))
    p_len[:, 2] = 1.0  # a call at t=2 cannot accept anything
    with pytest.raises(ValueError, match="past the end"):
        check_table(AcceptanceTable(p_len=p_len, drafted=np.ones(3), exact=True), f)


def test_chain_table_caps_at_the_end():
    beta = np.ones(5)
    table = chain_table(beta, remaining=np.array([4, 3, 2, 1, 0]), depth=3)
    assert table.argmax(axis=1).tolist() == [3, 3, 2, 1, 0]


def test_root_only_tree_accepts_nothing():
    f = memory_features([4], rank=[0, 0, 0, 0])
    table = greedy_table(f, Tree([-1], [-1]), parse_policy("greedy"), RNG)
    assert table.p_len.shape == (4, 1)
    assert walk(table, f, 1.0).calls[0] == 4


def test_point_mass_walk_follows_pointers_and_equals_the_banded_solve():
    """A table with `length` (greedy, model-free) is walked by pointers; dropping it gives the banded solve."""
    rng = np.random.default_rng(11)
    f = memory_features([9, 1, 14, 5])
    cap = np.minimum(f.remaining(), 3)
    length = (rng.integers(0, 4, f.n_positions) % (cap + 1)).astype(np.int64)
    p_len = np.zeros((f.n_positions, 4))
    p_len[np.arange(f.n_positions), length] = 1.0
    drafted = rng.integers(1, 5, f.n_positions)
    fast = AcceptanceTable(p_len=p_len, drafted=drafted, exact=True, length=length)
    dense = AcceptanceTable(p_len=p_len, drafted=drafted, exact=True)
    occ = occupancy(fast, f)
    np.testing.assert_array_equal(occ, occupancy(dense, f))
    assert set(np.unique(occ)) <= {0.0, 1.0}
    a, b = walk(fast, f, 1.0), walk(dense, f, 1.0)
    for name in ("calls", "drafted", "accepted", "reach"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=1e-12)
    for i, (s, n) in enumerate(zip(f.traj_start, f.traj_len)):  # and both equal the brute-force expectation
        want = brute_expectation(p_len, drafted, int(s), int(n), 3)
        np.testing.assert_allclose(np.concatenate([[a.calls[i], a.drafted[i], a.accepted[i]], a.reach[i]]), want,
                                   atol=1e-12)


def test_occupancy_of_a_long_sweep_sized_walk_keeps_unit_starts():
    """The banded solve on thousands of positions: starts visited once, calls = tokens - accepted."""
    rng = np.random.default_rng(5)
    f = memory_features(rng.integers(1, 300, 40))
    table = random_table(f, 6, rng)
    occ = occupancy(table, f)
    np.testing.assert_allclose(occ[f.traj_start], 1.0, atol=1e-12)
    assert occ.min() >= -1e-12 and occ.max() <= 1 + 1e-12
    stats = walk(table, f, 1.0)
    np.testing.assert_allclose(stats.accepted + stats.calls, stats.tokens, atol=1e-9)


@settings(max_examples=80, deadline=None)
@given(gamma=st.integers(1, 12), lengths=st.lists(st.integers(1, 15), min_size=1, max_size=4), data=st.data())
def test_top_choice_chains_stop_at_the_first_miss_and_the_trajectory_end(gamma, lengths, data):
    """Chains take a run-length shortcut; runs of rank 0 cross trajectory boundaries in the flat arrays."""
    N = sum(lengths)
    ranks = np.array(data.draw(st.lists(st.sampled_from([0, 0, 0, 1]), min_size=N, max_size=N)))
    f = memory_features(lengths, rank=ranks)
    got = greedy_table(f, parse_tree(f"chain:{gamma}"), parse_policy("greedy"), RNG).length
    ends = np.repeat(f.traj_start + f.traj_len, f.traj_len)
    paths = {(0,) * d for d in range(1, gamma + 1)}
    assert got.tolist() == [brute_greedy_length(ranks, t, ends[t], paths) for t in range(N)]

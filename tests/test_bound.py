"""The most any valid verifier can accept of i.i.d. candidates (Hu et al., ICLR 2025), against enumeration.

`specsim.cache.stats.optimal_acceptance_iid` takes the minimum of p(A) + 1 − q(A)^k over the prefixes of the
tokens sorted by p/q; here it must equal (1) the minimum over all 2^V token sets and (2) the optimal transport
itself, solved as a linear program over every candidate tuple and output token (scipy). SpecInfer's rule, the
one specsim replays for i.i.d. trees, may not exceed it, and equals it for one candidate.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest


def _laws(rng, n, V, concentration=0.5):
    p = rng.dirichlet(np.full(V, concentration), size=n)
    q = rng.dirichlet(np.full(V, concentration), size=n)
    q[:, rng.integers(0, V)] = 0.0  # a token the draft never proposes
    return p, q / q.sum(axis=1, keepdims=True)


def _over_all_sets(p, q, k):
    V = p.shape[0]
    best = np.inf
    for mask in itertools.product([False, True], repeat=V):
        A = np.array(mask)
        best = min(best, p[A].sum() + 1.0 - q[A].sum() ** k)
    return best


def _transport(p, q, k):
    """max P(output ∈ candidates) over couplings of k i.i.d. candidates ~ q with an output ~ p (an LP)."""
    return _transport_of(p, [(xs, np.prod([q[x] for x in xs])) for xs in itertools.product(range(len(q)), repeat=k)])


def _transport_of(p, tuples):
    """max P(output ∈ candidates) over couplings of a candidate tuple (law: (tuple, probability) pairs) with an
    output ~ p: a linear program over every (tuple, output) pair (scipy)."""
    from scipy.optimize import linprog

    V = p.shape[0]
    n = len(tuples) * V  # variable (tuple t, output y) at t * V + y
    c = np.zeros(n)
    A_eq, b_eq = [], []
    for t, (xs, prob) in enumerate(tuples):
        row = np.zeros(n)
        row[t * V:(t + 1) * V] = 1.0
        A_eq.append(row)
        b_eq.append(prob)
        c[[t * V + y for y in set(xs)]] = -1.0
    for y in range(V):
        row = np.zeros(n)
        row[y::V] = 1.0
        A_eq.append(row)
        b_eq.append(p[y])
    res = linprog(c, A_eq=np.array(A_eq), b_eq=np.array(b_eq), bounds=(0, None), method="highs")
    assert res.status == 0
    return -res.fun


def test_the_prefix_minimum_is_the_minimum_over_every_token_set():
    from specsim.cache.stats import optimal_acceptance_iid

    rng = np.random.default_rng(0)
    p, q = _laws(rng, 40, 7)
    got = optimal_acceptance_iid(p, q, 4)
    want = np.array([[_over_all_sets(p[i], q[i], k) for k in range(1, 5)] for i in range(p.shape[0])])
    np.testing.assert_allclose(got, want, atol=1e-12)
    # the order matters: prefixes in descending p/q miss the minimum on these laws (the check can fail)
    order = np.argsort(-(p / np.where(q > 0, q, 1e-300)), axis=1)
    wrong = 1.0 + np.min(np.cumsum(np.take_along_axis(p, order, 1), 1)
                         - np.cumsum(np.take_along_axis(q, order, 1), 1) ** 2, axis=1).clip(max=0.0)
    assert np.abs(wrong - want[:, 1]).max() > 1e-3


@pytest.mark.parametrize("V, k", [(4, 2), (3, 3), (5, 2)])
def test_the_bound_is_the_optimal_transport(V, k):
    from specsim.cache.stats import optimal_acceptance_iid

    rng = np.random.default_rng(V * 10 + k)
    p, q = _laws(rng, 6, V)
    got = optimal_acceptance_iid(p, q, k)[:, k - 1]
    want = np.array([_transport(p[i], q[i], k) for i in range(p.shape[0])])
    np.testing.assert_allclose(got, want, atol=1e-8)


def test_specinfers_rule_reaches_the_bound_with_one_candidate_and_never_passes_it():
    from specsim.cache.stats import node_acceptance_iid, optimal_acceptance_iid

    rng = np.random.default_rng(3)
    p, q = _laws(rng, 500, 12)
    rule, best = node_acceptance_iid(p, q, 4), optimal_acceptance_iid(p, q, 4)
    np.testing.assert_allclose(rule[:, 0], np.minimum(p, q).sum(axis=1), atol=1e-12)
    np.testing.assert_allclose(best[:, 0], rule[:, 0], atol=1e-12)
    assert (rule <= best + 1e-12).all()
    assert (np.diff(rule, axis=1) >= -1e-12).all() and (np.diff(best, axis=1) >= -1e-12).all()
    assert (best[:, 1:] - rule[:, 1:]).max() > 1e-3  # the rule leaves acceptance on the table at k >= 2


def test_the_rules_node_acceptance_is_what_the_replay_integrates():
    """node_acceptance_iid = Σ_y p(y) Σ_{i<j} π_i(y), with π the per-candidate law the replay walks trees with."""
    from specsim.cache.stats import acceptance_iid, node_acceptance_iid

    rng = np.random.default_rng(5)
    p, q = _laws(rng, 30, 9)
    k = 3
    by_y = np.stack([acceptance_iid(p, q, np.full(p.shape[0], y), k) for y in range(9)], axis=1)  # (n, V, k)
    integrated = np.cumsum((p[:, :, None] * by_y).sum(axis=1), axis=1)
    np.testing.assert_allclose(node_acceptance_iid(p, q, k), integrated, atol=1e-12)


def test_specsim_bound_averages_both_over_the_recorded_positions(tiny_cache):
    """`specsim bound`: the rule's and the optimal acceptance per number of candidates, averaged over every position
    of the T = 1 trajectories; recomputed here from the cache's logits directly, trajectory by trajectory."""
    from click.testing import CliRunner

    from specsim.cache.stats import node_acceptance_iid, optimal_acceptance_iid, probabilities
    from specsim.cache.reader import CacheReader
    from specsim.cli import main
    from specsim.sim.bound import node_bound

    got = node_bound(tiny_cache, "layers:2", 1.0, 3, progress=False)
    rule, best = [], []
    with CacheReader(tiny_cache) as reader:
        for row in reader.iter_trajectories(1.0):
            lo, hi = row.start, row.stop
            p = probabilities(reader.logits("target", lo, hi).astype(np.float64), 1.0)
            q = probabilities(reader.logits("layers:2", lo, hi).astype(np.float64), 1.0)
            rule.append(node_acceptance_iid(p, q, 3))
            best.append(optimal_acceptance_iid(p, q, 3))
    np.testing.assert_allclose(got.rule, np.concatenate(rule).mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(got.bound, np.concatenate(best).mean(axis=0), atol=1e-6)
    assert got.positions == sum(len(r) for r in rule) and (got.bound >= got.rule - 1e-12).all()
    assert (got.rule_se > 0).all() and got.trajectories == len(rule)

    out = CliRunner().invoke(main, ["bound", str(tiny_cache), "--draft", "layers:2", "--temperature", "1",
                                    "--candidates", "3"])
    assert out.exit_code == 0, out.output
    assert "optimal (Hu et al.)" in out.output and f"{got.bound[2]:.4f} ± {got.bound_se[2]:.4f}" in out.output
    assert f"over {got.positions:,} positions of {got.trajectories} target-sampled trajectories at T=1" in out.output
    for args, message in [(["--draft", "layers:2", "--temperature", "0"], "at T = 0 a verifier accepts exactly"),
                          (["--draft", "ngram:3", "--temperature", "1"], "model-free")]:
        bad = CliRunner().invoke(main, ["bound", str(tiny_cache), *args])
        assert bad.exit_code != 0 and message in bad.output and len(bad.output.strip().splitlines()) == 1, bad.output


# -- candidates drawn without replacement ---------------------------------------------------------------------


def _swor_tuples(q, k):
    """Every ordered tuple of k distinct tokens with its probability under sequential draws without replacement."""
    for xs in itertools.permutations(np.flatnonzero(q > 0), k):
        prob, used = 1.0, 0.0
        for x in xs:
            prob *= q[x] / (1.0 - used)
            used += q[x]
        yield xs, prob


def _swor_over_all_sets(p, q, k):
    V = p.shape[0]
    tuples = list(_swor_tuples(q, k))
    best = np.inf
    for mask in itertools.product([False, True], repeat=V):
        inside = sum(prob for xs, prob in tuples if all(mask[x] for x in xs))
        best = min(best, p[np.array(mask)].sum() + 1.0 - inside)
    return best


def _normalised_marginals_grow(q, all_in):
    """The smallest [Q(B + a + b) − Q(B + a)] / q(b) − [Q(B + a) − Q(B)] / q(a) over every set B and tokens a ≠ b
    outside it (docs/design.md §2e, the lemma behind the prefix rule), Q(A) = all_in(mask of A)."""
    V = len(q)
    Q = {mask: all_in(np.array(mask)) for mask in itertools.product([False, True], repeat=V)}
    worst = np.inf
    for mask in Q:
        for a, b in itertools.permutations([x for x in range(V) if not mask[x]], 2):
            with_a = tuple(m or x == a for x, m in enumerate(mask))
            with_ab = tuple(m or x == b for x, m in enumerate(with_a))
            worst = min(worst, (Q[with_ab] - Q[with_a]) / q[b] - (Q[with_a] - Q[mask]) / q[a])
    return worst


@pytest.mark.parametrize("V, k", [(5, 2), (5, 3), (6, 4)])
def test_without_replacement_the_lemma_behind_the_prefix_rule_holds(V, k):
    """P(every candidate ∈ A) for a tuple drawn without replacement has growing normalised marginals, which puts
    the minimum cut at a prefix of the ascending p/q order (the proof in docs/design.md §2e). Enumerated over every
    set and pair, for flat, peaked and mixed draft laws. P(some candidate ∈ A), whose marginals shrink, fails it:
    the check can fail."""
    rng = np.random.default_rng(100 + V + k)
    for concentration in (0.1, 1.0, 5.0):
        q = rng.dirichlet(np.full(V, concentration))
        q = np.maximum(q, 1e-6) / np.maximum(q, 1e-6).sum()
        tuples = list(_swor_tuples(q, k))
        assert _normalised_marginals_grow(q, lambda A: sum(pr for xs, pr in tuples if A[list(xs)].all())) > -1e-12
        some_in = _normalised_marginals_grow(q, lambda A: sum(pr for xs, pr in tuples if A[list(xs)].any()))
        assert some_in < -1e-3, some_in


def _swor_transport(p, q, k):
    """max P(output ∈ candidates) over couplings of a without-replacement tuple with an output ~ p (an LP)."""
    return _transport_of(p, list(_swor_tuples(q, k)))


def _swor_laws(rng, n, V):
    p = rng.dirichlet(np.full(V, 0.7), size=n)
    q = rng.dirichlet(np.full(V, 0.7), size=n)
    return p, q


def test_without_replacement_the_prefix_minimum_is_the_optimal_transport():
    """Two candidates: exact, equal to the minimum over every token set and to the transport LP; the i.i.d. bound
    (the same cut with q(A)^2) is another number on these laws, so the check can fail."""
    from specsim.cache.stats import optimal_acceptance_iid, optimal_acceptance_swor

    rng = np.random.default_rng(11)
    p, q = _swor_laws(rng, 30, 6)
    got = optimal_acceptance_swor(p, q, 2, 16, rng)
    np.testing.assert_allclose(got[:, 0], np.minimum(p, q).sum(axis=1), atol=1e-12)
    want = np.array([_swor_over_all_sets(p[i], q[i], 2) for i in range(p.shape[0])])
    np.testing.assert_allclose(got[:, 1], want, atol=1e-12)
    lp = np.array([_swor_transport(p[i], q[i], 2) for i in range(8)])
    np.testing.assert_allclose(got[:8, 1], lp, atol=1e-8)
    assert np.abs(optimal_acceptance_iid(p, q, 2)[:, 1] - want).max() > 1e-2
    assert (got[:, 1] >= optimal_acceptance_iid(p, q, 2)[:, 1] - 1e-12).all()  # distinct candidates cover more


@pytest.mark.parametrize("V, k", [(5, 3), (6, 4)])
def test_without_replacement_more_candidates_are_estimated_within_their_error(V, k):
    """Three and four candidates: the Monte-Carlo prefix minimum against the minimum over every token set (and the
    LP): within 5 standard errors of a tuple share; the i.i.d. bound is another number on these laws."""
    from specsim.cache.stats import optimal_acceptance_iid, optimal_acceptance_swor

    rng = np.random.default_rng(V + k)
    p, q = _swor_laws(rng, 12, V)
    samples = 20_000
    got = optimal_acceptance_swor(p, q, k, samples, rng)[:, k - 1]
    want = np.array([_swor_over_all_sets(p[i], q[i], k) for i in range(p.shape[0])])
    assert np.abs(got - want).max() < 5 * 0.5 / np.sqrt(samples), (got, want)
    np.testing.assert_allclose(want[:3], [_swor_transport(p[i], q[i], k) for i in range(3)], atol=1e-8)
    wrong = optimal_acceptance_iid(p, q, k)[:, k - 1]  # the same cut with tuples drawn with replacement
    assert np.abs(wrong - want).max() > 0.05


def _swor_rule_by_enumeration(p, q, k):
    """P(one of j candidates accepted), j = 1..k, of the recursive rule without replacement, from its definition:
    over every tuple, candidate i is accepted with min(1, r_i(x_i) / q_i(x_i)), q_i the draft over the undrawn
    tokens, and r_{i+1} = norm(max(0, r_i − q_i)) after a rejection."""
    out = np.zeros(k)
    for xs, prob in _swor_tuples(q, k):
        r, undrawn, survive = p.copy(), np.ones(len(q), dtype=bool), 1.0
        for i, x in enumerate(xs):
            q_i = np.where(undrawn, q, 0.0) / q[undrawn].sum()
            a = min(1.0, r[x] / q_i[x])
            survive *= 1.0 - a
            out[i] += prob * (1.0 - survive)
            rest = np.maximum(r - q_i, 0.0)
            if rest.sum() <= 1e-15:
                survive = 0.0
                r = rest
            else:
                r = rest / rest.sum()
            undrawn[x] = False
    return out


def test_without_replacement_the_rules_node_acceptance_against_its_definition():
    """node_acceptance_swor: exact for one and two candidates, within 5 standard errors beyond, against the rule
    enumerated over every tuple; what the replay integrates (Σ_y p(y) Σ_i π_i(y)); never above the bound; and the
    i.i.d. rule's acceptance is another number on these laws (the check can fail)."""
    from specsim.cache.stats import (acceptance_swor, node_acceptance_iid, node_acceptance_swor,
                                     optimal_acceptance_swor)

    rng = np.random.default_rng(4)
    p, q = _swor_laws(rng, 10, 6)
    samples = 20_000
    got = node_acceptance_swor(p, q, 4, samples, rng)
    want = np.array([_swor_rule_by_enumeration(p[i], q[i], 4) for i in range(p.shape[0])])
    np.testing.assert_allclose(got[:, :2], want[:, :2], atol=1e-12)
    assert np.abs(got[:, 2:] - want[:, 2:]).max() < 5 * 0.5 / np.sqrt(samples), (got, want)
    assert np.abs(node_acceptance_iid(p, q, 4)[:, 1] - want[:, 1]).max() > 1e-2
    by_y = np.stack([acceptance_swor(p, q, np.full(p.shape[0], y), 2, 1, rng)[:, 0] for y in range(6)], axis=1)
    np.testing.assert_allclose(np.cumsum((p[:, :, None] * by_y).sum(axis=1), axis=1), got[:, :2], atol=1e-12)
    best = optimal_acceptance_swor(p, q, 4, samples, rng)
    np.testing.assert_allclose(best[:, 0], got[:, 0], atol=1e-12)
    assert (got[:, 1] <= best[:, 1] + 1e-12).all() and (got[:, 2:] <= best[:, 2:] + 0.02).all()
    assert (best[:, 1] - got[:, 1]).max() > 1e-3


def test_specsim_bound_without_replacement_over_the_recorded_positions(tiny_cache):
    """--multi-draft swor: for 1 and 2 candidates the rule and the bound (both exact) recomputed from the cache's
    logits trajectory by trajectory; 3 candidates (Monte-Carlo) between them and 1."""
    from click.testing import CliRunner

    from specsim.cache.stats import node_acceptance_swor, optimal_acceptance_swor, probabilities
    from specsim.cache.reader import CacheReader
    from specsim.cli import main
    from specsim.sim.bound import node_bound

    got = node_bound(tiny_cache, "layers:2", 1.0, 3, sampling="swor", samples=2000, progress=False)
    rule, best = [], []
    rng = np.random.default_rng(0)
    with CacheReader(tiny_cache) as reader:
        for row in reader.iter_trajectories(1.0):
            lo, hi = row.start, row.stop
            p = probabilities(reader.logits("target", lo, hi).astype(np.float64), 1.0)
            q = probabilities(reader.logits("layers:2", lo, hi).astype(np.float64), 1.0)
            rule.append(node_acceptance_swor(p, q, 2, 1, rng))
            best.append(optimal_acceptance_swor(p, q, 2, 1, rng))
    np.testing.assert_allclose(got.rule[:2], np.concatenate(rule).mean(axis=0), atol=1e-9)
    np.testing.assert_allclose(got.bound[:2], np.concatenate(best).mean(axis=0), atol=1e-9)
    assert got.sampling == "swor" and (np.diff(got.rule) >= 0).all() and got.bound[2] <= 1.0
    assert (got.bound[:2] >= got.rule[:2] - 1e-12).all() and got.bound[2] >= got.rule[2] - 0.01
    iid = node_bound(tiny_cache, "layers:2", 1.0, 3, progress=False)
    assert got.bound[1] >= iid.bound[1] - 1e-12  # two distinct candidates cover at least what two i.i.d. ones do

    out = CliRunner().invoke(main, ["bound", str(tiny_cache), "--draft", "layers:2", "--temperature", "1",
                                    "--candidates", "2", "--multi-draft", "swor"])
    assert out.exit_code == 0, out.output
    assert f"{got.bound[1]:.4f} ± {got.bound_se[1]:.4f}" in out.output and "without replacement" in out.output

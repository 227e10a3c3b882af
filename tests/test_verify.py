"""Verification rules: lossless rules emit exactly p; lossy rules do not; the sampled
functions live decoding runs agree with the exact laws."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from specsim.errors import SpecError
from specsim.verify import (
    LossyRule,
    StepResult,
    accept_probability_given_output,
    output_distribution,
    output_joint,
    residual,
    sample_candidates,
    total_variation,
    verify_greedy,
    verify_lossy,
    verify_multi_iid,
    verify_multi_swor,
    verify_point_mass,
    verify_single,
)
from tests.strategies import distribution_pairs, probability_vectors

LOSSY = [LossyRule("p>=q"), LossyRule("p>=lq", lam=0.5), LossyRule("typical")]
VERIFY = {"iid": verify_multi_iid, "swor": verify_multi_swor}


def reference_joint(p, q, k, scheme):
    """Independent oracle: enumerate ordered candidate tuples, integrate each coin."""
    v = len(p)
    joint = np.zeros((v, k + 1))
    for tup in itertools.product(range(v), repeat=k):
        if scheme == "swor" and len(set(tup)) < k:
            continue
        prob, removed = 1.0, np.zeros(v, dtype=bool)
        proposals = []
        for x in tup:
            q_i = np.where(removed, 0.0, q) if scheme == "swor" else q
            q_i = q_i / q_i.sum() if q_i.sum() > 0 else q_i
            prob *= q_i[x]
            proposals.append(q_i)
            removed[x] = True
        if prob == 0:
            continue
        reach, r = prob, p.copy()
        for i, (x, q_i) in enumerate(zip(tup, proposals)):
            a = 1.0 if r[x] >= q_i[x] else r[x] / q_i[x]
            joint[x, i] += reach * a
            reach *= 1 - a
            nxt = np.maximum(r - q_i, 0)
            r = nxt / nxt.sum() if nxt.sum() > 1e-12 else r
        joint[:, k] += reach * r
    return joint


# ---------------------------------------------------------------------------- exactness


@settings(max_examples=150, deadline=None)
@given(pair=distribution_pairs(2, 6), k=st.integers(1, 3), scheme=st.sampled_from(["iid", "swor"]))
def test_speculative_sampling_emits_exactly_p(pair, k, scheme):
    p, q = pair
    np.testing.assert_allclose(output_distribution("sample", p, q, k, scheme), p, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(pair=distribution_pairs(2, 5), k=st.integers(1, 3), scheme=st.sampled_from(["iid", "swor"]))
def test_exact_joint_matches_independent_enumeration(pair, k, scheme):
    p, q = pair
    if scheme == "swor" and (q > 0).sum() < k:
        k = int((q > 0).sum())
    np.testing.assert_allclose(output_joint("sample", p, q, k, scheme), reference_joint(p, q, k, scheme), atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(pair=distribution_pairs(2, 6), k=st.integers(1, 3), scheme=st.sampled_from(["iid", "swor"]))
def test_greedy_emits_the_argmax(pair, k, scheme):
    p, q = pair
    out = output_distribution("greedy", p, q, k, scheme)
    assert out[np.argmax(p)] == pytest.approx(1.0)
    assert out.sum() == pytest.approx(1.0)


@settings(max_examples=100, deadline=None)
@given(pair=distribution_pairs(2, 6))
def test_single_draft_accepts_with_overlap_probability(pair):
    """P(x = y = a) = min(p(a), q(a)): the maximal coupling of DESIGN section 2."""
    p, q = pair
    joint = output_joint("sample", p, q, 1)
    np.testing.assert_allclose(joint[:, 0], np.minimum(p, q), atol=1e-12)
    given_y = accept_probability_given_output("sample", p, q, 1)
    ok = p > 1e-9
    np.testing.assert_allclose(given_y[ok, 0], np.minimum(1, q[ok] / p[ok]), atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(p=probability_vectors(2, 6), data=st.data())
def test_point_mass_candidates_are_accepted_iff_output_is_one(p, data):
    """A model-free draft (q one-hot) through the iid rule: lossless, and accepted <=> y = x."""
    x = data.draw(st.integers(0, len(p) - 1))
    q = np.eye(len(p))[x]
    joint = output_joint("sample", p, q, 2, "iid")
    np.testing.assert_allclose(joint.sum(axis=1), p, atol=1e-12)
    assert joint[x, 0] == pytest.approx(p[x])
    assert joint[:, 1].sum() == 0.0  # the repeated candidate can never be accepted
    assert joint[x, 2] == 0.0


@settings(max_examples=100, deadline=None)
@given(pair=distribution_pairs(2, 6))
def test_residual_is_a_distribution_off_the_overlap(pair):
    p, q = pair
    r = residual(p, q)
    assert r.sum() == pytest.approx(1.0)
    assert (r >= 0).all()
    if np.maximum(p - q, 0).sum() > 1e-12:
        assert (r[p <= q] == 0).all()
    else:
        np.testing.assert_array_equal(r, p)


# ---------------------------------------------------------------------------- sampling


CASES = [
    (np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.1, 0.1, 0.4, 0.4])),
    (np.array([0.25, 0.25, 0.25, 0.25]), np.array([0.7, 0.1, 0.1, 0.1])),
]


def _chi_square(counts, expected_probs):
    keep = expected_probs.ravel() > 0
    observed = counts.ravel()
    assert observed[~keep].sum() == 0, "an outcome of probability zero occurred"
    expected = expected_probs.ravel()[keep] * counts.sum()
    return stats.chisquare(observed[keep], expected * observed[keep].sum() / expected.sum()).pvalue


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("scheme", ["iid", "swor"])
def test_sampled_verification_agrees_with_exact_law(case, k, scheme):
    p, q = CASES[case]
    rng = np.random.default_rng(1234 + k)
    counts = np.zeros((len(p), k + 1))
    for _ in range(6000):
        c = sample_candidates(q, k, rng, scheme=scheme)
        step = VERIFY[scheme](p, q, c, rng) if k > 1 else verify_single(p, q, int(c[0]), rng)
        counts[step.token, step.accepted if step.accepted >= 0 else k] += 1
    assert _chi_square(counts, output_joint("sample", p, q, k, scheme)) > 1e-3


@pytest.mark.parametrize("rule", LOSSY, ids=lambda r: r.name)
def test_sampled_lossy_verification_agrees_with_exact_law(rule):
    p, q = CASES[0]
    rng = np.random.default_rng(7)
    counts = np.zeros((len(p), 3))
    for _ in range(6000):
        c = sample_candidates(q, 2, rng, scheme="iid")
        step = verify_lossy(rule, p, q, c, rng)
        counts[step.token, step.accepted if step.accepted >= 0 else 2] += 1
    assert _chi_square(counts, output_joint(rule, p, q, 2, "iid")) > 1e-3


@pytest.mark.parametrize("scheme", ["iid", "swor"])
def test_sample_candidates_follow_the_scheme(scheme):
    q = np.array([0.5, 0.3, 0.2, 0.0])
    rng = np.random.default_rng(3)
    counts = np.zeros((4, 4))
    for _ in range(6000):
        a, b = sample_candidates(q, 2, rng, scheme=scheme)
        counts[a, b] += 1
    if scheme == "iid":
        expected = np.outer(q, q)
    else:
        expected = np.outer(q, q) / (1 - q)[:, None]
        np.fill_diagonal(expected, 0)
    assert _chi_square(counts, expected) > 1e-3


def test_swor_returns_the_whole_support_when_k_exceeds_it():
    rng = np.random.default_rng(0)
    assert sample_candidates(np.array([0.0, 1.0, 0.0]), 3, rng, scheme="swor").tolist() == [1]
    assert sorted(sample_candidates(np.array([0.5, 0.0, 0.5]), 5, rng, scheme="swor").tolist()) == [0, 2]


def test_point_mass_verification_accepts_exactly_the_output():
    p = np.array([0.1, 0.6, 0.3])
    rng = np.random.default_rng(5)
    steps = [verify_point_mass(p, np.array([1, 2]), rng) for _ in range(4000)]
    for s in steps:
        assert s.accepted == {1: 0, 2: 1}.get(s.token, -1)
    tokens = np.bincount([s.token for s in steps], minlength=3)
    assert stats.chisquare(tokens, p * len(steps)).pvalue > 1e-3


def test_one_hot_draft_is_accepted_with_probability_p_of_it():
    p = np.array([0.2, 0.8])
    rng = np.random.default_rng(11)
    accepted = sum(verify_single(p, np.array([0.0, 1.0]), 1, rng).accepted == 0 for _ in range(4000))
    assert stats.binomtest(accepted, 4000, 0.8).pvalue > 1e-3


def test_greedy_accepts_the_argmax_with_lowest_id_on_ties():
    p = np.array([0.1, 0.4, 0.4, 0.1])
    assert verify_greedy(p, np.array([2, 1])) == StepResult(accepted=1, token=1)
    assert verify_greedy(p, np.array([3, 2])) == StepResult(accepted=-1, token=1)


def test_certain_draft_is_always_accepted():
    p = np.array([0.3, 0.7])
    rng = np.random.default_rng(0)
    assert all(verify_single(p, p, x, rng).accepted == 0 for x in (0, 1) for _ in range(100))


# ---------------------------------------------------------------------------- lossy


@settings(max_examples=100, deadline=None)
@given(pair=distribution_pairs(2, 5), k=st.integers(1, 2), rule=st.sampled_from(LOSSY))
def test_lossy_output_is_a_distribution(pair, k, rule):
    p, q = pair
    out = output_distribution(rule, p, q, k, "iid")
    assert (out >= 0).all()
    assert out.sum() == pytest.approx(1.0)
    if k == 1:  # the O(V) closed form agrees with summing over the one candidate
        # q as output_distribution reads it (normalised): with q == p summing to 1 - 1e-16, normalising moves
        # some q(x) one ulp above p(x), and p>=q then rejects x; the reference must see the same q
        q = q / q.sum()
        fallback = p if rule.name == "typical" else residual(p, q)
        expected = sum(
            q[x] * (np.eye(len(p))[x] if rule.passes(p, q)[x] else fallback) for x in range(len(p))
        )
        np.testing.assert_allclose(out, expected, atol=1e-12)


@pytest.mark.parametrize(
    "rule, p, q",
    [
        (LossyRule("p>=q"), [0.5, 0.5], [0.9, 0.1]),
        (LossyRule("p>=lq", lam=0.5), [0.3, 0.7], [0.5, 0.5]),
        (LossyRule("typical"), [0.95, 0.05], [0.5, 0.5]),
    ],
    ids=lambda v: getattr(v, "name", None),
)
def test_lossy_rules_distort_the_output(rule, p, q):
    p, q = np.array(p), np.array(q)
    assert total_variation(output_distribution(rule, p, q, 1), p) > 0.01
    assert total_variation(output_distribution("sample", p, q, 1), p) < 1e-12


def test_typical_threshold_is_medusas():
    p = np.array([0.5, 0.3, 0.2])
    entropy = -(p * np.log(p)).sum()
    assert LossyRule("typical").threshold(p) == pytest.approx(min(0.09, 0.3 * np.exp(-entropy)))
    assert LossyRule("typical", eps=0.01).threshold(p) == 0.01


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "nope"}, "not one of"),
        ({"name": "p>=q", "lam": 0.5}, "use the rule 'p>=lq'"),
        ({"name": "p>=lq", "lam": 0.0}, "positive"),
        ({"name": "typical", "eps": -1.0}, "non-negative"),
    ],
)
def test_bad_lossy_rules_are_spec_errors(kwargs, message):
    with pytest.raises(SpecError, match=message):
        LossyRule(**kwargs)


def test_bad_inputs_are_rejected():
    p = np.array([0.5, 0.5])
    with pytest.raises(ValueError, match="shape"):
        verify_single(p, np.array([1.0]), 0, np.random.default_rng())
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        verify_greedy(p, np.array([2]))
    with pytest.raises(ValueError, match="scheme"):
        sample_candidates(p, 1, np.random.default_rng(), scheme="beam")

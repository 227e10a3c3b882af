"""Statistics computed where the models run (torch) equal the numpy reference; swor estimates are unbiased."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim import verify
from specsim.cache import stats as ref
from specsim.record import statistics as dev
from tests.strategies import distribution_pairs

SPEC = ref.StatsSpec(candidates=5, swor_samples=64, swor_groups=16)


def _logits(seed: int, n: int = 40, V: int = 50, ties: bool = True):
    rng = np.random.default_rng(seed)
    p = (rng.normal(size=(n, V)) * 2).astype(np.float32)
    q = (p + rng.normal(size=(n, V))).astype(np.float32)
    if ties:  # whole-number logits tie often: ranks must break ties by the lower id, as live drafting does
        q[: n // 2] = np.round(q[: n // 2])
    y = np.array([rng.choice(V, p=ref.probabilities(p[i : i + 1], 0.8)[0]) for i in range(n)])
    return p, q, y


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_device_statistics_equal_the_numpy_reference(temperature):
    p, q, y = _logits(0)
    ours = dev.draft_stats(torch.tensor(p), torch.tensor(q), torch.tensor(y), temperature, SPEC,
                           torch.Generator().manual_seed(0))
    theirs = ref.draft_stats(p, q, y, temperature, SPEC, np.random.default_rng(0))
    assert set(ours) == set(theirs) == set(ref.draft_stat_shapes(SPEC))
    for name, (dtype, tail) in ref.draft_stat_shapes(SPEC).items():
        assert ours[name].shape == theirs[name].shape == (len(y), *tail), name
    np.testing.assert_array_equal(ours["rank"], theirs["rank"])
    np.testing.assert_array_equal(ours["top_ids"], theirs["top_ids"])
    np.testing.assert_allclose(ours["logprob"], theirs["logprob"], atol=1e-9)
    np.testing.assert_allclose(ours["overlap"], theirs["overlap"], atol=1e-9)
    target_dev = dev.target_stats(torch.tensor(p), torch.tensor(y), temperature)
    target_ref = ref.target_stats(p, y, temperature)
    np.testing.assert_allclose(target_dev["logprob"], target_ref["logprob"], atol=1e-9)
    np.testing.assert_array_equal(target_dev["top_id"], target_ref["top_id"])
    if temperature == 0:
        assert np.isnan(ours["pi_iid"]).all() and np.isnan(theirs["pi_swor"]).all()
        return
    np.testing.assert_allclose(ours["pi_iid"], theirs["pi_iid"], atol=1e-6)
    np.testing.assert_allclose(ours["lossy_alpha"], theirs["lossy_alpha"], atol=1e-6)
    np.testing.assert_allclose(ours["lossy_tv"], theirs["lossy_tv"], atol=1e-6)
    np.testing.assert_allclose(ours["pi_swor"][:, :2], theirs["pi_swor"][:, :2], atol=1e-6)  # closed forms
    # Monte-Carlo columns: two independent estimates of the same values, within their standard errors
    se = np.sqrt(ours["pi_swor_groups"].astype(np.float64).var(axis=1, ddof=1) / SPEC.swor_groups
                 + theirs["pi_swor_groups"].astype(np.float64).var(axis=1, ddof=1) / SPEC.swor_groups)
    gap = np.abs(ours["pi_swor"] - theirs["pi_swor"])[:, 2:]
    assert np.all(gap <= 6 * se[:, 2:] + 2e-3)


def test_a_cpu_works_in_pieces_and_records_what_one_block_records(monkeypatch):
    """A CPU computes each block of positions in cache-sized pieces; the swor estimates' uniforms are still drawn
    per block, so a seed records the same numbers, bit for bit, as one block at a time (and as a GPU, which
    takes whole blocks). Drawing them per piece instead would change every Monte-Carlo column."""
    p, q, y = _logits(1, n=23)
    spec = ref.StatsSpec(candidates=5, swor_samples=32, swor_groups=8, lossy=("p>=q", "p>=lq:0.5", "typical"))
    monkeypatch.setattr(dev, "CHUNK_ELEMENTS", 10 * 50)  # blocks of 10 positions (V = 50)
    got = {}
    for piece in (10, 3):  # one piece per block, then pieces of 3 positions (the last block's: 3)
        monkeypatch.setattr(dev, "CPU_CHUNK_ELEMENTS", piece * 50)
        got[piece] = dev.draft_stats(torch.tensor(p), torch.tensor(q), torch.tensor(y), 0.8, spec,
                                     torch.Generator().manual_seed(0))
    for name, value in got[10].items():
        np.testing.assert_array_equal(got[3][name], value, err_msg=name)
    assert np.isfinite(got[3]["pi_swor"]).all() and got[3]["pi_swor"][:, 2:].std() > 0


@given(distribution_pairs(max_size=5), st.integers(3, 4), st.integers(0, 2**31 - 1))
@settings(max_examples=25, deadline=None)
def test_device_swor_estimates_are_unbiased(pq, k, seed):
    """Against exact enumeration of every ordered candidate draw (specsim.verify), on small vocabularies."""
    p, q = pq
    V = len(p)
    exact = verify.accept_probability_given_output("sample", p, q, k, "swor")[:, :k]  # (V, k)
    P, Q, y = torch.tensor(np.tile(p, (V, 1))), torch.tensor(np.tile(q, (V, 1))), torch.arange(V)
    reps = dev.acceptance_swor(P, Q, y, k, 4000, torch.Generator().manual_seed(seed)).numpy()  # (V, M, k)
    M = reps.shape[1]
    mean, se = reps.mean(axis=1), reps.std(axis=1, ddof=1) / np.sqrt(M)
    # a rare candidate prefix's share arrives in a few large hits; when M draws saw none, the sample SE is 0.
    # sqrt(exact / M) is the SE of such hits of size <= 1 (found by hypothesis: a prefix of probability 1/2016
    # missed by all 4,000 draws, which happens 14% of the time)
    se = np.maximum(se, np.sqrt(exact / M))
    emitted = p > 0
    assert np.all(np.abs(mean - exact)[emitted] <= 5 * se[emitted] + 1e-4)


def test_a_replay_that_ignores_the_residual_shape_is_caught():
    """The unbiasedness check can fail: i.i.d. acceptance is a wrong answer for swor and is rejected."""
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    P, Q, y = np.tile(p, (4, 1)), np.tile(q, (4, 1)), np.arange(4)
    exact = verify.accept_probability_given_output("sample", p, q, 3, "swor")[:3, :3]
    wrong = ref.acceptance_iid(P, Q, y, 3)[:3]
    reps = ref.acceptance_swor(P, Q, y, 3, 20000, np.random.default_rng(0))[:3]
    se = reps.std(axis=1, ddof=1) / np.sqrt(reps.shape[1])
    assert np.all(np.abs(reps.mean(axis=1) - exact) <= 5 * se + 1e-9)
    assert np.max(np.abs(wrong - exact)[:, 2] / (se[:, 2] + 1e-15)) > 10


def test_candidates_beyond_the_support_of_q_are_never_accepted():
    """A vocabulary smaller than the candidates asked for (once a crash): the extra candidates have π = 0."""
    p, q = np.array([0.6, 0.4]), np.array([0.3, 0.7])
    for fn in (lambda: ref.acceptance_swor(p[None].repeat(2, 0), q[None].repeat(2, 0), np.arange(2), 6, 32,
                                           np.random.default_rng(0)),
               lambda: dev.acceptance_swor(torch.tensor(p[None].repeat(2, 0)), torch.tensor(q[None].repeat(2, 0)),
                                           torch.arange(2), 6, 32, torch.Generator().manual_seed(0)).numpy()):
        reps = fn()
        assert np.all(reps[:, :, 2:] == 0)
        exact = verify.accept_probability_given_output("sample", p, q, 2, "swor")[:, :2]
        np.testing.assert_allclose(reps.mean(axis=1)[:, :2], exact, atol=1e-12)


def test_ranks_break_float32_ties_by_the_lower_id_where_float16_would_tie_more():
    q = np.array([[1.0, 1.0 + 2**-12, 1.0, 0.5]], dtype=np.float32)  # equal in float16, distinct in float32
    y = np.array([0])
    assert dev.token_rank(torch.tensor(q), torch.tensor(y)).item() == 1  # only id 1 is larger in float32
    assert ref.token_rank(q.astype(np.float16).astype(np.float32), y)[0] == 0  # float16 rounding ties it away

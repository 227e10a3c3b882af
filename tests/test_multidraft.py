"""Multi-draft acceptance given the output: exact for iid, unbiased with an honest SE for swor."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim import verify
from specsim.errors import SpecError
from specsim.sim.features import load_features
from specsim.cache.stats import acceptance_iid, acceptance_swor
from specsim.sim.multidraft import (
    candidate_acceptance,
    length_distribution,
    reach_by_depth,
    sample_tree_table,
    sibling_index,
)
from specsim.sim.policies import chain_table
from specsim.specs import parse_policy
from specsim.specs import parse_tree
from tests.strategies import distribution_pairs, trees
from tests.synthetic import random_cache


def beta(p_target: np.ndarray, q_draft: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Reference: min(1, q(y) / p(y)) from whole distributions, written apart from Features.acceptance."""
    p_y, q_y = p_target[np.arange(len(y)), y], q_draft[np.arange(len(y)), y]
    return np.where(p_y > 0, np.minimum(p_y, q_y) / np.where(p_y > 0, p_y, 1.0), 0.0)


def _rows(p, q):
    V = p.shape[0]
    return np.tile(p, (V, 1)), np.tile(q, (V, 1)), np.arange(V)


@given(distribution_pairs(max_size=5), st.integers(1, 3))
@settings(max_examples=150, deadline=None)
def test_iid_closed_form_equals_exact_enumeration(pq, k):
    p, q = pq
    P, Q, y = _rows(p, q)
    exact = verify.accept_probability_given_output("sample", p, q, k, "iid")[:, :k]  # (V, k)
    est = acceptance_iid(P, Q, y, k)
    emitted = p > 0
    np.testing.assert_allclose(est[emitted], exact[emitted], atol=1e-9)


@given(distribution_pairs(max_size=4), st.integers(2, 3), st.integers(0, 2**32 - 1))
@settings(max_examples=25, deadline=None)
def test_swor_estimates_are_unbiased(pq, k, seed):
    p, q = pq
    P, Q, y = _rows(p, q)
    exact = verify.accept_probability_given_output("sample", p, q, k, "swor")[:, :k]
    reps = acceptance_swor(P, Q, y, k, 3000, np.random.default_rng(seed))  # (V, M, k)
    mean, M = reps.mean(axis=1), reps.shape[1]
    # a rare candidate prefix's share arrives in a few large hits, unseen by the sample SE when none came:
    # sqrt(exact / M) is the SE of hits of size <= 1; 1e-4: a prefix far rarer than 1/M may never be drawn
    se = np.maximum(reps.std(axis=1, ddof=1) / np.sqrt(M), np.sqrt(exact / M))
    emitted = p > 0
    err = np.abs(mean - exact)[emitted]
    assert np.all(err <= 5 * se[emitted] + 1e-4), (err, se[emitted])


def test_swor_estimator_resolves_a_wrong_answer():
    """The SE is small enough to tell swor from iid where they differ (so unbiasedness means something)."""
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    P, Q, y = _rows(p, q)
    reps = acceptance_swor(P, Q, y, 3, 20000, np.random.default_rng(0))
    mean, se = reps.mean(axis=1), reps.std(axis=1, ddof=1) / np.sqrt(20000)
    iid = acceptance_iid(P, Q, y, 3)
    gap = np.abs(iid - mean)[:3, 1:]
    assert np.max(gap / (se[:3, 1:] + 1e-15)) > 10


@given(distribution_pairs(max_size=6), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_one_candidate_is_beta_without_monte_carlo(pq, seed):
    p, q = pq
    P, Q, y = _rows(p, q)
    b = beta(P, Q, y)
    emitted = p > 0
    np.testing.assert_allclose(b[emitted], np.minimum(1, q / np.where(p > 0, p, 1))[emitted], atol=1e-12)
    np.testing.assert_allclose(acceptance_iid(P, Q, y, 1)[:, 0][emitted], b[emitted], atol=1e-12)
    reps = acceptance_swor(P, Q, y, 1, 7, np.random.default_rng(seed))  # no draws needed: every sample equal
    assert np.all(reps == reps[:, :1])
    np.testing.assert_allclose(reps[:, 0, 0][emitted], b[emitted], atol=1e-12)


@given(trees(max_nodes=12, max_rank=2, max_depth=4), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_tree_dp_is_a_valid_capped_law(tree, seed):
    rng = np.random.default_rng(seed)
    N = 9
    k = int(sibling_index(tree).max(initial=0)) + 1
    raw = rng.dirichlet(np.ones(k + 1), size=N)[:, :k]  # (N, k): π_i(s), Σ_i ≤ 1
    remaining = np.concatenate([np.arange(4, -1, -1), np.arange(3, -1, -1)])  # two trajectories
    at_least = reach_by_depth(raw, tree, remaining)
    p_len = length_distribution(at_least)
    assert p_len.shape == (N, tree.max_depth + 1)
    np.testing.assert_allclose(p_len.sum(axis=1), 1.0)
    assert np.all(p_len >= -1e-15)
    beyond = np.arange(tree.max_depth + 1)[None, :] > remaining[:, None]
    assert np.all(p_len[beyond] == 0)  # accepted length <= n-1-t and <= tree depth
    # depth 1 is one categorical draw: Σ over the root's children of π_index(t)
    kids = tree.children(0)
    if kids.size:
        expect = raw[:, sibling_index(tree)[kids]].sum(axis=1) * (remaining >= 1)
        np.testing.assert_allclose(at_least[:, 0], expect, atol=1e-12)


def test_chain_of_betas_matches_the_chain_closed_form():
    rng = np.random.default_rng(1)
    b = rng.random(12)
    remaining = np.concatenate([np.arange(6, -1, -1), np.arange(4, -1, -1)])
    tree = parse_tree("chain:3")
    ours = length_distribution(reach_by_depth(b[:, None], tree, remaining))
    np.testing.assert_allclose(ours, chain_table(b, remaining, 3), atol=1e-14)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return random_cache(tmp_path_factory.mktemp("md") / "r.h5", n_prompts=4, length=12, vocab=6)


def test_sample_tree_table_iid_is_exact_per_position(cache):
    features = load_features(cache, "small", 1.0, progress=False)
    tree = parse_tree("widths:3,2")
    table = sample_tree_table(features, tree, parse_policy("sample"), np.random.default_rng(0))
    assert table.exact and table.se_len is None
    # depth-1 acceptance at every position equals Σ_i P(accepted as candidate i | y_t) from the exact law
    for start, stop, p, q in features.iter_distributions():
        for j, t in enumerate(range(start, stop)):
            if features.remaining()[t] < 1:
                assert table.p_len[t, 0] == 1.0
                continue
            law = verify.accept_probability_given_output("sample", p[j], q[j], 3, "iid")
            y = int(features.token[t])
            np.testing.assert_allclose(1 - table.p_len[t, 0], law[y, :3].sum(), atol=1e-9)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded-statistics", "from-logits"])
def test_swor_table_reports_monte_carlo_error_and_chains_stay_exact(cache, recorded):
    features = load_features(cache, "small", 1.0, progress=False)
    if not recorded:
        features = replace(features, recorded_stats=None)
    spec = parse_policy("sample", multi_draft="swor", samples=16)
    two = sample_tree_table(features, parse_tree("kary:2,2"), spec, np.random.default_rng(0))
    assert two.exact and two.se_len is None  # two candidates per node: both closed forms
    table = sample_tree_table(features, parse_tree("kary:3,2"), spec, np.random.default_rng(0))
    assert not table.exact and table.se_len.shape == (features.n_positions,)
    assert np.all(table.se_len >= 0) and table.se_len.max() > 0
    chain = sample_tree_table(features, parse_tree("chain:3"), spec, np.random.default_rng(0))
    assert chain.exact and chain.se_len is None
    b = np.exp(np.minimum(0, features.logq - features.logp))
    np.testing.assert_allclose(chain.p_len, chain_table(b, features.remaining(), 3), atol=1e-12)
    pi, reps = candidate_acceptance(features, 1, scheme="swor", samples=16, rng=np.random.default_rng(0))
    assert reps is None


def test_sampling_trees_refuse_greedy_trajectories(cache):
    features = load_features(cache, "small", 0.0, progress=False)
    with pytest.raises(SpecError, match="temperature > 0; at T=0 use --policy greedy"):
        sample_tree_table(features, parse_tree("kary:2,2"), parse_policy("sample"), np.random.default_rng(0))


def test_a_sweep_streams_the_distributions_once(cache, monkeypatch):
    """Without recorded π (caches older than format 3), the distributions are streamed once per sweep."""
    from specsim.sim.features import Features

    features = replace(load_features(cache, "small", 1.0, progress=False), recorded_stats=None)
    calls = []
    original = Features.iter_distributions

    def counting(self, *args, **kwargs):
        calls.append(1)
        yield from original(self, *args, **kwargs)

    monkeypatch.setattr(Features, "iter_distributions", counting)
    spec = parse_policy("sample")
    first = sample_tree_table(features, parse_tree("kary:3,2"), spec, np.random.default_rng(0))
    again = sample_tree_table(features, parse_tree("widths:2,2,1"), spec, np.random.default_rng(0))
    assert len(calls) == 1 and first.exact and again.exact
    fresh = replace(load_features(cache, "small", 1.0, progress=False), recorded_stats=None)  # computed afresh
    redo = sample_tree_table(fresh, parse_tree("widths:2,2,1"), spec, np.random.default_rng(0))
    assert len(calls) == 2
    np.testing.assert_allclose(redo.p_len, again.p_len, atol=1e-12)


def test_recorded_pi_is_read_without_streaming_and_equals_the_estimate_from_logits(cache, monkeypatch):
    from specsim.sim.features import Features

    features = load_features(cache, "small", 1.0, progress=False)
    streams = []
    original = Features.iter_distributions
    monkeypatch.setattr(Features, "iter_distributions", lambda self, *a, **k: (streams.append(1), original(self, *a, **k))[1])
    pi, reps = candidate_acceptance(features, 5, scheme="iid", samples=16, rng=np.random.default_rng(0))
    assert not streams and reps is None
    monkeypatch.setattr(Features, "iter_distributions", original)
    again, _ = candidate_acceptance(replace(features, recorded_stats=None), 5, scheme="iid", samples=16,
                                    rng=np.random.default_rng(0))
    np.testing.assert_allclose(pi, again, atol=1e-6)  # recorded in float32
    pi_swor, groups = candidate_acceptance(features, 5, scheme="swor", samples=16, rng=np.random.default_rng(0))
    assert groups.shape == (features.n_positions, 16, 5)  # the recording's 16 group means: replicates
    np.testing.assert_allclose(pi_swor[:, 0], pi[:, 0], atol=1e-12)  # the first candidate is β for both schemes


@given(trees(max_nodes=12, max_rank=2, max_depth=4), st.integers(1, 40), st.integers(1, 9), st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_replicate_means_in_blocks_equal_one_pass(tree, n, chunk, seed):
    """The swor standard error's replicates, walked in blocks of positions (bounded memory), are the
    numbers of one pass over every position."""
    import specsim.sim.multidraft as md

    rng = np.random.default_rng(seed)
    k = max(1, int(tree.n_children.max()))
    reps = rng.uniform(0, 1, (n, 5, k)).astype(np.float32)
    remaining = rng.integers(0, 6, n)
    whole = md.reach_by_depth(np.swapaxes(reps, -1, -2).astype(np.float64), tree, remaining).sum(axis=1)
    saved = md.REPLICATE_CHUNK
    md.REPLICATE_CHUNK = chunk
    try:
        blocks = md.replicate_means(reps, tree, remaining)
    finally:
        md.REPLICATE_CHUNK = saved
    np.testing.assert_allclose(blocks, whole, rtol=1e-12, atol=1e-12)


def test_rows_report_the_samples_the_swor_estimate_used(tmp_path):
    """Where the recording holds π for the tree's fan-out, its own samples are used, not --samples: rows say so."""
    import specsim
    from specsim.cache.reader import CacheReader

    path = random_cache(tmp_path / "c.h5", storage="stats", temperatures=(1.0,), n_prompts=3, length=10)
    with CacheReader(path) as reader:
        recorded = reader.spec.stats
    within = specsim.simulate(path, trees=["kary:3,1"], policies=["sample"], multi_draft="swor", samples=8, n_boot=0,
                              by_category=False)
    assert within["samples"].to_list() == [recorded.swor_samples] and recorded.swor_samples != 8
    full = random_cache(tmp_path / "f.h5", storage="full", temperatures=(1.0,), n_prompts=3, length=10)
    wide = f"kary:{recorded.candidates + 1},1"  # beyond what was recorded: streamed from the distributions
    beyond = specsim.simulate(full, trees=[wide], policies=["sample"], multi_draft="swor", samples=8, n_boot=0,
                              by_category=False)
    assert beyond["samples"].to_list() == [8]


@pytest.mark.parametrize("noise,tree", [(0.3, "kary:3,3"), (1.0, "widths:3,3,3,3")])
def test_swor_standard_errors_match_the_spread_over_seeds(tmp_path, noise, tree):
    """The walk's Monte-Carlo standard error of accepted tokens is the spread its estimate really has across
    seeds: a delete-a-group jackknife of the whole walk (overlapping calls read the same draws, and the
    estimate multiplies per-position means). Per-position errors summed in quadrature were off by 1.7-2.8x
    here; this test fails for them."""
    import specsim.sim.multidraft as md
    from specsim.sim.engine import walk

    path = random_cache(tmp_path / "c.h5", n_prompts=6, length=40, vocab=8, noise=noise, temperatures=(1.0,))
    features = replace(load_features(path, "small", 1.0, progress=False), recorded_stats=None)
    spec = parse_policy("sample", multi_draft="swor", samples=16)
    totals, reported, per_position = [], [], []
    for seed in range(40):
        md._memo.clear()  # a fresh Monte-Carlo estimate per seed
        table = sample_tree_table(features, parse_tree(tree), spec, np.random.default_rng(seed))
        stats = walk(table, features)
        totals.append(stats.accepted.sum())
        reported.append(np.sqrt((stats.se_accepted ** 2).sum()))
        per_position.append(np.sqrt((walk(replace(table, jackknife=None), features).se_accepted ** 2).sum()))
    spread = np.std(totals, ddof=1)  # 40 seeds: its own relative error is about 11%
    assert 0.75 < np.mean(reported) / spread < 1.33
    assert not 0.75 < np.mean(per_position) / spread < 1.33


def test_sampling_tables_know_when_a_path_ends_on_a_leaf(cache):
    """Above full depth a leaf (a node the draft never fed) can end the accepted path: the next call then feeds 2
    tokens. P(A = a and the path ends on a leaf | t) is the summed reach of the leaves at depth a, each reach the
    product of its path's π (brute force here, node by node)."""
    from specsim.sim.multidraft import sibling_index

    features = load_features(cache, "small", 1.0, progress=False)
    tree = parse_tree("widths:3,2,1")
    table = sample_tree_table(features, tree, parse_policy("sample"), np.random.default_rng(0))
    pi, _ = candidate_acceptance(features, 3, scheme="iid", samples=0, rng=np.random.default_rng(0))
    index, remaining = sibling_index(tree), features.remaining()
    expect = np.zeros_like(table.leaf_law)
    for t in range(features.n_positions):
        for v in np.flatnonzero(tree.n_children == 0):
            path = [int(v)]
            while path[-1] != 0:
                path.append(int(tree.parents[path[-1]]))
            nodes = path[-2::-1]  # depth 1 .. depth(v)
            d = int(tree.depths[v])
            if d <= remaining[t]:
                expect[t, d] += np.prod([pi[t + tree.depths[u] - 1, index[u]] for u in nodes])
    np.testing.assert_allclose(table.leaf_law, expect, atol=1e-12)
    assert expect[:, 1:3].sum() > 0  # leaves above full depth were reached
    given = table.leaf_given()
    assert np.all((given >= 0) & (given <= 1)) and np.allclose(given[:, 3][table.p_len[:, 3] > 0], 1.0)
    chain = sample_tree_table(features, parse_tree("chain:3"), parse_policy("sample"), np.random.default_rng(0))
    assert chain.leaf_law is None and chain.leaf_given() is None  # only the full depth ends on a leaf

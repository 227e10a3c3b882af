"""Features derived from a cache equal direct computations, are kept beside it and invalidated."""

from __future__ import annotations

import numpy as np
import pytest

import specsim.sim.features as features_mod
from specsim.cache.reader import CacheReader
from specsim.cache.writer import CacheWriter
from specsim.errors import CacheError
from specsim.sim.features import features_path, load_features, token_rank, top_k_ids
from tests.synthetic import random_cache, rank_cache


def log_softmax(x, T):
    z = x.astype(np.float64) / T
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def test_ranks_are_the_prescribed_ones(tmp_path):
    ranks = [[0, 3, 1, 0, 7, 2], [5, 0, 0]]
    path = rank_cache(tmp_path / "r.h5", ranks, vocab=8, categories=["x", "y"])
    f = load_features(path, "d", 0.0, progress=False)
    assert f.rank.tolist() == ranks[0] + ranks[1]
    assert f.traj_len.tolist() == [6, 3] and f.traj_start.tolist() == [0, 6]
    assert f.traj_category.tolist() == ["x", "y"]
    assert f.remaining().tolist() == [5, 4, 3, 2, 1, 0, 2, 1, 0]


@pytest.mark.parametrize("T", [0.0, 1.0])
def test_logp_logq_top_ids_equal_direct_computation(tmp_path, T):
    path = random_cache(tmp_path / "c.h5", n_prompts=3, length=10, vocab=12, drafts=("a", "b"))
    f = load_features(path, "b", T, top_k=5, progress=False)
    Ts = T if T > 0 else 1.0  # greedy trajectories: the T=1 softmax
    with CacheReader(path) as r:
        rows = list(r.iter_trajectories(T))
        y = np.concatenate([r.tokens(x.start, x.stop) for x in rows])
        lp = np.concatenate([log_softmax(r.logits("target", x.start, x.stop), Ts) for x in rows])
        lq_logits = np.concatenate([r.logits("b", x.start, x.stop) for x in rows])
    idx = np.arange(len(y))
    np.testing.assert_array_equal(f.token, y)
    np.testing.assert_allclose(f.logp, lp[idx, y], atol=1e-12)
    np.testing.assert_allclose(f.logq, log_softmax(lq_logits, Ts)[idx, y], atol=1e-12)
    order = np.array([sorted(range(12), key=lambda v: (-row[v], v)) for row in lq_logits])
    np.testing.assert_array_equal(f.top_ids, order[:, :5])
    np.testing.assert_array_equal(f.rank, [list(order[i]).index(y[i]) for i in idx])


def test_ties_go_to_the_lower_id():
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 3.0]], dtype=np.float32)
    assert token_rank(np.repeat(logits, 3, axis=0), np.array([1, 2, 4])).tolist() == [0, 1, 2]
    assert top_k_ids(logits, 3).tolist() == [[1, 2, 4]]
    wide = np.zeros((1, 40), dtype=np.float32)  # a tie run longer than the partition's slack
    wide[0, 30] = 1.0
    assert top_k_ids(wide, 4).tolist() == [[30, 0, 1, 2]]


def test_iter_distributions_streams_every_position_at_T(tmp_path):
    path = random_cache(tmp_path / "c.h5", n_prompts=4, length=12, vocab=10)
    f = load_features(path, "small", 1.0, progress=False)
    seen = []
    for a, b, p_target, q_draft in f.iter_distributions(block=5):
        assert b - a <= 5 and p_target.shape == q_draft.shape == (b - a, 10)
        np.testing.assert_allclose(p_target.sum(axis=1), 1.0)
        np.testing.assert_allclose(np.log(p_target[np.arange(b - a), f.token[a:b]]), f.logp[a:b], atol=1e-12)
        np.testing.assert_allclose(np.log(q_draft[np.arange(b - a), f.token[a:b]]), f.logq[a:b], atol=1e-12)
        seen.extend(range(a, b))
    assert seen == list(range(f.n_positions))


def test_features_are_kept_beside_the_cache_and_rebuilt_when_it_changes(tmp_path, monkeypatch):
    path = random_cache(tmp_path / "c.h5", n_prompts=2, length=8, vocab=8)
    first = load_features(path, "small", 1.0, progress=False)
    assert features_path(path).exists()

    def no_derive(*a, **k):
        raise AssertionError("features derived again although the cache did not change")

    with monkeypatch.context() as m:
        m.setattr(features_mod, "_derive", no_derive)
        again = load_features(path, "small", 1.0, progress=False)
    np.testing.assert_array_equal(first.rank, again.rank)
    np.testing.assert_array_equal(first.logq, again.logq)

    with CacheWriter.resume(path) as w:  # one more trajectory: the stored features are stale
        n = 5
        w.append_trajectory(prompt_index=0, temperature=1.0, seed=9, tokens=np.zeros(n, dtype=np.int32),
                            target_logits=np.zeros((n, 8)), draft_logits={"small": np.zeros((n, 8))},
                            stop_reason="eos")
    grown = load_features(path, "small", 1.0, progress=False)
    assert grown.n_positions == first.n_positions + 5


def test_unrecorded_temperature_and_unknown_draft_are_refused(tmp_path):
    path = random_cache(tmp_path / "c.h5", n_prompts=2, length=6, vocab=8)
    with pytest.raises(CacheError, match=r"temperature 0.7 was not recorded; recorded: 0, 1$"):
        load_features(path, "small", 0.7, progress=False)
    with pytest.raises(CacheError, match=r"no draft named 'large'; recorded drafts: small"):
        load_features(path, "large", 1.0, progress=False)


def test_model_free_draft_has_tokens_only(tmp_path):
    path = random_cache(tmp_path / "c.h5", n_prompts=2, length=6, vocab=8)
    f = load_features(path, "ngram:3", 0.0, progress=False)
    assert f.model_free and f.rank is None and f.logq is None and f.top_ids is None
    with CacheReader(path) as r:
        row = next(r.iter_trajectories(0.0))
        np.testing.assert_array_equal(f.token[: row.length], r.tokens(row.start, row.stop))
        np.testing.assert_array_equal(f.prompt_ids(0), r.prompt_token_ids(row.prompt_index))


def test_topk_cache_is_flagged_inexact(tmp_path):
    path = random_cache(tmp_path / "k.h5", n_prompts=2, length=6, vocab=16, storage="topk", top_k=4)
    f = load_features(path, "small", 1.0, progress=False)
    assert not f.exact_tail
    assert load_features(random_cache(tmp_path / "f.h5", n_prompts=2), "small", 1.0, progress=False).exact_tail


def test_streaming_reads_interleaved_trajectories_in_few_spans(tmp_path, monkeypatch):
    """T=0 and T=1 trajectories alternate in the cache: one read spans many of them, the others' rows dropped."""
    from specsim.cache.reader import CacheReader

    path = random_cache(tmp_path / "c.h5", n_prompts=6, length=12, vocab=10)
    f = load_features(path, "small", 1.0, progress=False)
    from specsim.sim.features import _runs

    assert len(_runs(f)) == f.n_traj == 6  # no two T=1 trajectories adjacent in the cache
    reads = []
    original = CacheReader.logits
    monkeypatch.setattr(CacheReader, "logits", lambda self, c, a, b: reads.append((c, a, b)) or original(self, c, a, b))
    pieces = list(f.iter_distributions())
    assert len(reads) == 2  # target and draft, each once for every trajectory at T=1
    assert [(a, b) for a, b, *_ in pieces] == [(0, f.n_positions)]
    _, _, p_target, q_draft = pieces[0]
    rows = np.arange(f.n_positions)
    np.testing.assert_allclose(np.log(p_target[rows, f.token]), f.logp, atol=1e-12)
    np.testing.assert_allclose(np.log(q_draft[rows, f.token]), f.logq, atol=1e-12)


def test_a_feature_source_declares_every_per_trajectory_field_of_features():
    """FeatureSource carries Features' fields that are not per-position arrays as declared, typed fields (no
    attribute lookup into a dict): adding a field to Features without it fails here."""
    from dataclasses import fields

    from specsim.sim.features import ARRAYS, TRAJECTORY_FIELDS, Features, FeatureSource

    per_trajectory = {f.name for f in fields(Features)} - set(ARRAYS) - {"parent", "_memo"}
    assert set(TRAJECTORY_FIELDS) == per_trajectory
    assert set(TRAJECTORY_FIELDS) <= {f.name for f in fields(FeatureSource)}
    assert not hasattr(FeatureSource, "__getattr__")

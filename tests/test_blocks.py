"""A sweep replays the cache a block of trajectories at a time: the same rows as one piece, in bounded memory."""

from __future__ import annotations

import h5py
import numpy as np
import polars as pl
import pytest

import specsim.sim.replay as replay_mod
import specsim.sim.features as features_mod
from benchmarks.bench_scale import build
from specsim.errors import SpecError
from specsim.sim.sweep import SweepConfig, simulate, sweep
from specsim.sim.features import feature_source, features_path, load_features

# Exact policies on a synthetic stats cache with every recorded statistic: greedy chains and trees, fitted
# trees (held out), sampling chains and i.i.d. trees, both adaptive rules, and lossy rules (their TV distortion
# is a mean over positions, merged over blocks).
EXACT = [
    (["chain:4", "kary:2,2", "optimal:6"], ["greedy", "adaptive-hf"], 0.0, "iid"),
    (["chain:3", "kary:3,2", "optimal:5"], ["sample", "adaptive-history"], 0.7, "iid"),
    (["chain:2", "kary:2,1"], ["p>=q", "typical:0.09,0.3"], 0.7, "iid"),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("blocks") / "c.h5"
    build(path, 3_000)  # 11 trajectories of 256 tokens per temperature
    return path


def _numeric(df: pl.DataFrame) -> list[str]:
    return [c for c, t in df.schema.items() if t in (pl.Float64, pl.Float32, pl.Int64)]


def _same_rows(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.height == b.height > 0 and a.columns == b.columns
    for c in _numeric(a):
        np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=1e-12, atol=1e-9, equal_nan=True, err_msg=c)
    for c in ("tree", "policy", "category", "estimate"):
        assert a[c].to_list() == b[c].to_list()


@pytest.mark.parametrize("trees,policies,temperature,multi_draft", EXACT)
def test_blocks_give_the_rows_of_one_piece(cache, trees, policies, temperature, multi_draft):
    kw = dict(trees=trees, policies=policies, temperatures=[temperature], multi_draft=multi_draft, n_boot=50,
              on_skip=lambda line: None)
    whole = simulate(cache, **kw)
    blocks = simulate(cache, block_positions=600, **kw)  # 256-token trajectories: 5 blocks of 2 and one of 1
    _same_rows(whole, blocks)
    fitted = whole.filter(pl.col("tree").str.starts_with("optimal"))
    assert (fitted.height > 0) == any(t.startswith("optimal") for t in trees)
    assert all(fit.startswith("held-out") for fit in fitted["fit"].to_list())


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the lost block's trajectories have no calls
def test_the_comparison_rejects_a_replay_that_loses_a_block(cache, monkeypatch):
    kw = dict(trees=["chain:4"], policies=["greedy"], temperatures=[0.0], n_boot=50)
    whole = simulate(cache, **kw)
    merge = replay_mod._merge_stats
    monkeypatch.setattr(replay_mod, "_merge_stats", lambda pieces, where: merge(pieces[:-1], where))  # drops the last block
    with pytest.raises(AssertionError):
        _same_rows(whole, simulate(cache, block_positions=600, **kw))


def test_swor_blocks_agree_within_their_standard_errors(cache):
    kw = dict(trees=["kary:3,2", "kary:4,1"], policies=["sample"], temperatures=[0.7], multi_draft="swor", n_boot=50)
    whole = simulate(cache, **kw)
    blocks = simulate(cache, block_positions=600, **kw)
    assert (whole["estimate"] == "monte-carlo").all() and whole.height == blocks.height
    # recorded replicates: the same per-position estimates in any block, so the same totals and SEs
    for c in ("tokens_per_call", "mc_se_tokens_per_call"):
        np.testing.assert_allclose(whole[c].to_numpy(), blocks[c].to_numpy(), rtol=1e-12)


def test_fits_on_a_bounded_sample_say_so_and_are_reproducible(cache):
    kw = dict(trees=["optimal:4"], policies=["greedy"], temperatures=[0.0], n_boot=20, block_positions=600)
    a = simulate(cache, fit_positions=700, **kw)
    b = simulate(cache, fit_positions=700, **kw)
    assert a.equals(b)
    assert "fitted on a random sample of trajectories (700 positions at most)" in a["fit"][0]
    assert "sample" not in simulate(cache, **{**kw, "block_positions": None})["fit"][0]


def test_a_sample_holds_whole_trajectories_up_to_the_bound(cache):
    source = feature_source(cache, "draft", 0.7, progress=False)
    whole = source.whole()
    s = source.sample(700, seed=3, block=600)
    assert 700 <= s.n_positions < 700 + int(whole.traj_len.max())
    assert np.all(np.diff(s.cache_start) > 0)  # cache order
    for i in range(s.n_traj):  # each sampled trajectory's arrays are those of the whole set
        j = int(np.flatnonzero(whole.cache_start == s.cache_start[i])[0])
        a = slice(s.traj_start[i], s.traj_start[i] + s.traj_len[i])
        b = slice(whole.traj_start[j], whole.traj_start[j] + whole.traj_len[j])
        np.testing.assert_array_equal(s.rank[a], whole.rank[b])
        np.testing.assert_array_equal(s.recorded("pi_iid")[a], whole.recorded("pi_iid")[b])
    assert source.sample(10**9, seed=3, block=600).n_positions == whole.n_positions


def test_blocks_cover_every_trajectory_once(cache):
    source = feature_source(cache, "draft", 0.0, progress=False)
    spans = source.blocks(600)
    assert spans[0][0] == 0 and spans[-1][1] == source.n_traj
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(source.traj_len[t0:t1].sum() <= 600 for t0, t1 in spans)
    whole = source.whole()
    parts = [source.block(*span) for span in spans]
    np.testing.assert_array_equal(np.concatenate([p.logq for p in parts]), whole.logq)
    assert source.mean_context() == pytest.approx(whole.contexts().mean(), rel=1e-12)
    assert source.context_range() == (whole.contexts().min(), whole.contexts().max())


def test_an_interrupted_derivation_is_derived_again(cache, tmp_path, monkeypatch):
    path = tmp_path / "c.h5"
    path.write_bytes(cache.read_bytes())
    derive = features_mod._derive

    def crash(reader, base, draft, T, K, progress, out):
        out["token"][:5] = 0
        raise KeyboardInterrupt

    monkeypatch.setattr(features_mod, "_derive", crash)
    with pytest.raises(KeyboardInterrupt):
        load_features(path, "draft", 0.0, progress=False)
    with h5py.File(features_path(path), "r") as f:  # the half-written group is marked as such
        assert any(features_mod.FILLING in f[k].attrs for k in f)
    monkeypatch.setattr(features_mod, "_derive", derive)
    again = load_features(path, "draft", 0.0, progress=False)
    np.testing.assert_array_equal(again.token, load_features(cache, "draft", 0.0, progress=False).token)


def test_worker_processes_give_the_rows_of_one_process(cache):
    kw = dict(trees=["chain:3", "kary:3,2", "optimal:5"], policies=["sample", "adaptive-hf"], temperatures=[0.7],
              multi_draft="swor", n_boot=50, block_positions=600, on_skip=lambda line: None)
    _same_rows(simulate(cache, **kw), simulate(cache, workers=2, **kw))
    assert 2 in replay_mod._POOLS  # the blocks did go to a pool of two processes


def test_monte_carlo_rows_do_not_depend_on_the_worker_count(tmp_path):
    """With workers the fixed trees' blocks run in tasks of their own (during the fits), in one process a
    block is one task for every tree; on a cache with distributions and Monte-Carlo swor rows (a tree wider
    than the minimum estimation width, and a fitted one) the rows must not depend on that grouping."""
    from tests.synthetic import random_cache

    path = random_cache(tmp_path / "full.h5", n_prompts=8, length=24, vocab=12, temperatures=(1.0,))
    kw = dict(trees=["chain:2", "kary:5,1", "kary:3,2", "optimal:5"], policies=["sample"], temperatures=[1.0],
              multi_draft="swor", samples=8, n_boot=20, block_positions=50, on_skip=lambda line: None)
    one = simulate(path, **kw)
    assert one.filter(pl.col("tree") == "kary:3,2")["estimate"].to_list()[0] == "monte-carlo"
    _same_rows(one, simulate(path, workers=2, **kw))


def test_workers_must_be_a_positive_count(cache):
    with pytest.raises(SpecError, match="^workers 0: use 1 or more processes"):  # the argument, not the flag
        simulate(cache, trees=["chain:2"], workers=0)


def test_blocks_give_the_request_rows_of_one_piece(cache):
    kw = dict(trees=["chain:4", "kary:2,2", "optimal:6"], policies=["sample", "adaptive-hf"], temperatures=[0.7],
              n_boot=20)
    quiet = lambda line: None  # noqa: E731
    a = sweep(cache, SweepConfig(**kw), on_skip=quiet).requests
    b = sweep(cache, SweepConfig(block_positions=600, **kw), on_skip=quiet).requests
    assert a.height == b.height > 0 and a.columns == b.columns
    for c, t in a.schema.items():
        if t == pl.Float64:
            np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=1e-12, atol=1e-9, err_msg=c)
        elif c == "accepted_length_histogram":
            np.testing.assert_allclose(np.concatenate(a[c].to_list()), np.concatenate(b[c].to_list()), atol=1e-9)
        else:
            assert a[c].to_list() == b[c].to_list(), c

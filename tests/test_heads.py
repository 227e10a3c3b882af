"""Head drafts (Medusa, EAGLE) replay exactly from a depth-keyed cache.

Their law depends on (call start, depth): `tests.toy_heads` decodes for real with such a
draft on the toy Markov target, and the simulator replays a cache whose head statistics are
keyed by depth. Greedy must agree call for call on every trajectory; sampling (chains and
i.i.d./swor trees) within 4 standard errors. The same checks reject a recording that keys
the heads by position only (q_{t+d-1} instead of q_{t,d}): replay has to read the depth axis.
"""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecError
from specsim.sim.engine import walk
from specsim.sim.features import load_features
from specsim.sim.optimize import optimal_tree
from specsim.sim.policies import run_policy
from specsim.specs import parse_policy, parse_tree
from tests.toy_heads import heads_decode, record_heads_cache, toy_heads
from tests.toy_markov import random_prompts, sticky_pair

VOCAB, N_TOKENS, N_GREEDY, N_SAMPLED, N_REAL = 8, 16, 60, 600, 600
NAME = "medusa:toy"
Z = 4.0


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    target, _ = sticky_pair(VOCAB, 1, seed=0)
    heads = toy_heads(target, depth=3, seed=1)
    prompts = random_prompts(VOCAB, 1, N_SAMPLED, seed=2)
    folder = tmp_path_factory.mktemp("heads")
    caches = {
        (0.0, False): record_heads_cache(folder / "greedy.h5", target, heads, prompts[:N_GREEDY], N_TOKENS,
                                         temperatures=(0.0,)),
        (0.0, True): record_heads_cache(folder / "greedy-wrong.h5", target, heads, prompts[:N_GREEDY], N_TOKENS,
                                        temperatures=(0.0,), wrong=True),
        (1.0, False): record_heads_cache(folder / "sampled.h5", target, heads, prompts, N_TOKENS,
                                         temperatures=(1.0,), seed=3),
        (1.0, True): record_heads_cache(folder / "sampled-wrong.h5", target, heads, prompts, N_TOKENS,
                                        temperatures=(1.0,), seed=3, wrong=True),
    }
    return target, heads, prompts, caches


def _sim(path, tree, policy, temperature, multi_draft="iid"):
    features = load_features(path, NAME, temperature, progress=False)
    spec = parse_policy(policy, multi_draft=multi_draft, samples=32)
    return features, walk(run_policy(features, tree, spec, np.random.default_rng(0)), features, 1.0)


@pytest.mark.parametrize("spec", ["chain:3", "kary:2,2", "widths:3,2,1"])
def test_greedy_replay_equals_head_decoding_call_for_call(toy, spec):
    target, heads, prompts, caches = toy
    tree = parse_tree(spec)
    features, stats = _sim(caches[0.0, False], tree, "greedy", 0.0)
    assert features.depth == 3 and features.rank.shape == (features.n_positions, 3)
    _, wrong = _sim(caches[0.0, True], tree, "greedy", 0.0)
    rng = np.random.default_rng(0)
    differs = 0
    for i in range(features.n_traj):
        real = heads_decode(target, heads, prompts[int(features.traj_prompt[i])], N_TOKENS, tree, rng, greedy=True)
        start = int(features.traj_start[i])
        assert np.array_equal(real.tokens, features.token[start : start + N_TOKENS])
        assert stats.calls[i] == real.calls and stats.accepted[i] == real.accepted, (spec, i)
        differs += wrong.calls[i] != real.calls
    assert 0 < stats.accepted.sum() < stats.drafted.sum()
    assert differs >= features.n_traj // 10, differs  # keyed by position only: wrong on many trajectories


@pytest.mark.parametrize("spec, scheme", [("chain:3", "iid"), ("kary:2,2", "iid"), ("widths:3,2,1", "swor")])
def test_sampling_replay_agrees_with_head_decoding(toy, spec, scheme):
    target, heads, prompts, caches = toy
    tree = parse_tree(spec)
    features, stats = _sim(caches[1.0, False], tree, "sample", 1.0, scheme)
    _, wrong = _sim(caches[1.0, True], tree, "sample", 1.0, scheme)
    rng = np.random.default_rng(4)
    runs = np.array([heads_decode(target, heads, prompts[i], N_TOKENS, tree, rng, greedy=False, scheme=scheme).calls
                     for i in range(N_REAL)], dtype=float)
    real, real_se = runs.mean(), runs.std(ddof=1) / np.sqrt(len(runs))
    sim, sim_se = stats.calls.mean(), stats.calls.std(ddof=1) / np.sqrt(features.n_traj)
    assert abs(real - sim) < Z * np.hypot(real_se, sim_se), (spec, real, sim, real_se, sim_se)
    off = abs(real - wrong.calls.mean()) / np.hypot(real_se, sim_se)
    assert off > 2 * Z, (spec, real, wrong.calls.mean(), off)  # the position-keyed replay is far off


def test_head_drafts_refuse_what_they_cannot_replay(toy):
    _, _, _, caches = toy
    features = load_features(caches[1.0, False], NAME, 1.0, progress=False)
    rng = np.random.default_rng(0)
    with pytest.raises(SpecError, match="recorded to depth 3"):
        run_policy(features, parse_tree("chain:4"), parse_policy("sample"), rng)
    with pytest.raises(SpecError, match="not replayed for head draft"):
        run_policy(features, parse_tree("chain:2"), parse_policy("p>=q"), rng)
    with pytest.raises(SpecError, match="not replayed for head draft"):
        run_policy(features, parse_tree("chain:2"), parse_policy("adaptive-history"), rng)


@pytest.mark.parametrize("temperature, policy", [(0.0, "greedy"), (1.0, "sample")])
def test_optimal_trees_for_head_drafts_stay_within_the_recorded_depth(toy, temperature, policy):
    _, _, _, caches = toy
    features = load_features(caches[temperature, False], NAME, temperature, progress=False)
    found = optimal_tree(features, 8, policy=parse_policy(policy))
    assert found.tree.max_depth <= 3
    _, stats = _sim(caches[temperature, False], found.tree, policy, temperature)
    _, chain = _sim(caches[temperature, False], parse_tree("chain:3"), policy, temperature)
    assert stats.calls.sum() <= chain.calls.sum() + 1e-9  # at least as good as the chain it could have been

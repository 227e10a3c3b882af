"""THE coupling test: the simulator, replaying cached target trajectories, predicts what
real speculative decoding does (DESIGN.md §2).

On a toy language model whose next-token law is known for every prefix (`tests.toy_markov`),
three numbers must agree for every configuration:

* the real algorithm (draft proposes a tree, target verifies with `specsim.verify`), run many
  times: Monte-Carlo mean ± SE;
* the EXACT expectation of the real algorithm, a dynamic program over (position, node, state)
  with the exact one-step laws of `verify.output_joint` — no sampling, no coupling argument;
* the simulator on a cache of target-sampled trajectories (`CacheWriter`, logits = the chains'
  logits): mean ± SE over trajectories (+ its Monte-Carlo SE for 'swor').

Greedy decoding must agree step for step. For sampling, the toy is built so that acceptance
is strongly autocorrelated; the test also checks that the simulator's error bars are tight
enough to reject the positional (i.i.d. per candidate index) approximation, so passing is
not an artefact of loose tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest

from specsim.cache.stats import StatsSpec
from specsim.sim.engine import AcceptanceTable, walk
from specsim.sim.features import load_features
from specsim.sim.multidraft import candidate_acceptance, length_distribution, reach_by_depth
from specsim.sim.policies import run_policy
from specsim.specs import parse_policy
from specsim.specs import parse_tree
from tests.toy_markov import (
    exact_totals,
    random_prompts,
    record_cache,
    speculative_decode,
    sticky_pair,
)

VOCAB, N_TOKENS, N_PROMPTS, N_GREEDY, N_REAL = 8, 20, 1200, 150, 800
Z = 4.0  # agreement within 4 standard errors (fixed seeds: deterministic outcomes)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    target, draft = sticky_pair(VOCAB, 1, seed=0)
    prompts = random_prompts(VOCAB, 1, N_PROMPTS, seed=1)
    folder = tmp_path_factory.mktemp("toy")
    stats = StatsSpec(candidates=3)  # the widest node here drafts 3: later candidates' Monte-Carlo is never read
    sampled = record_cache(folder / "sampled.h5", target, draft, prompts, N_TOKENS, temperatures=(1.0,), seed=2,
                           stats_spec=stats)
    greedy = record_cache(folder / "greedy.h5", target, draft, prompts[:N_GREEDY], N_TOKENS, temperatures=(0.0,),
                          stats_spec=stats)
    return target, draft, prompts, {0.0: greedy, 1.0: sampled}


def _sim(path, tree, policy, *, multi_draft="iid", temperature=1.0, samples=32):
    features = load_features(path, "toy-draft", temperature, progress=False)
    spec = parse_policy(policy, multi_draft=multi_draft, samples=samples)
    stats = walk(run_policy(features, tree, spec, np.random.default_rng(0)), features, 1.0)
    return features, stats


def _mean_se(x: np.ndarray) -> tuple[float, float]:
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x)))


@pytest.mark.parametrize("spec", ["chain:4", "kary:2,2", "widths:3,2,1"])
def test_greedy_simulation_equals_real_decoding_step_for_step(toy, spec):
    target, draft, prompts, path = toy
    tree = parse_tree(spec)
    features, stats = _sim(path[0.0], tree, "greedy", temperature=0.0)
    rng = np.random.default_rng(0)
    for i in range(features.n_traj):
        prompt = prompts[int(features.traj_prompt[i])]
        real = speculative_decode(target, draft, prompt, N_TOKENS, tree, rng, greedy=True)
        start = int(features.traj_start[i])
        assert np.array_equal(real.tokens, features.token[start : start + N_TOKENS])
        assert stats.calls[i] == real.calls and stats.accepted[i] == real.accepted, (spec, i)
    assert stats.exact and 0 < stats.accepted.sum() < stats.drafted.sum()


@pytest.mark.parametrize(
    "spec, scheme",
    [("chain:3", "iid"), ("kary:2,2", "iid"), ("widths:3,2,1", "swor"), ("widths:2,2,2", "iid")],
)
def test_sampling_simulation_agrees_with_real_decoding_and_exact_law(toy, spec, scheme):
    target, draft, prompts, path = toy
    tree = parse_tree(spec)
    features, stats = _sim(path[1.0], tree, "sample", multi_draft=scheme)

    by_state = {s: exact_totals(target, draft, [0, s], N_TOKENS, tree, scheme=scheme) for s in range(VOCAB)}
    exact = np.array([by_state[int(prompts[i % N_PROMPTS][-1])] for i in range(N_REAL)]).mean(axis=0)
    exact_sim = np.array([by_state[int(prompts[p][-1])] for p in features.traj_prompt]).mean(axis=0)

    rng = np.random.default_rng(3)
    runs = [speculative_decode(target, draft, prompts[i % N_PROMPTS], N_TOKENS, tree, rng, greedy=False,
                               scheme=scheme) for i in range(N_REAL)]
    real = {"calls": _mean_se(np.array([r.calls for r in runs])),
            "accepted": _mean_se(np.array([r.accepted for r in runs]))}
    sim = {"calls": _mean_se(stats.calls), "accepted": _mean_se(stats.accepted)}
    if not stats.exact:  # swor: add the estimator's own Monte-Carlo error
        mc = float(np.sqrt((stats.se_accepted**2).sum()) / features.n_traj)
        assert 0 < mc < sim["accepted"][1]
        sim = {k: (m, float(np.hypot(se, mc))) for k, (m, se) in sim.items()}

    for j, key in enumerate(("calls", "accepted")):
        (rm, rse), (sm, sse) = real[key], sim[key]
        assert abs(rm - exact[j]) < Z * rse, (key, "real vs exact", rm, exact[j], rse)
        assert abs(sm - exact_sim[j]) < Z * sse, (key, "simulated vs exact", sm, exact_sim[j], sse)
        assert abs(rm - sm) < Z * np.hypot(rse, sse), (key, "real vs simulated", rm, sm)

    # Tight enough to matter: the positional approximation (each candidate index accepted
    # i.i.d. with its average rate) is off by far more than the simulator's error bar.
    pi, _ = candidate_acceptance(features, int(tree.n_children.max()), scheme=scheme, samples=4,
                                 rng=np.random.default_rng(0))  # only its mean over 24k positions is used
    positional = np.broadcast_to(pi.mean(axis=0), pi.shape)
    table = AcceptanceTable(p_len=length_distribution(reach_by_depth(positional, tree, features.remaining())),
                            drafted=np.full(features.n_positions, float(tree.budget)), exact=True)
    approx = walk(table, features, 1.0).calls.mean()
    assert abs(approx - exact_sim[0]) > Z * sim["calls"][1], (approx, exact_sim[0], sim["calls"][1])


def test_order2_chain_greedy_step_for_step(tmp_path):
    target, draft = sticky_pair(6, 2, seed=4)
    prompts = random_prompts(6, 2, 60, seed=5)
    path = record_cache(tmp_path / "o2.h5", target, draft, prompts, 16, seed=6)
    tree = parse_tree("kary:2,2")
    features, stats = _sim(path, tree, "greedy", temperature=0.0)
    rng = np.random.default_rng(0)
    for i in range(features.n_traj):
        real = speculative_decode(target, draft, prompts[int(features.traj_prompt[i])], 16, tree, rng, greedy=True)
        assert stats.calls[i] == real.calls and stats.accepted[i] == real.accepted

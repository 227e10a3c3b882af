"""Tree optimisers: exact optima against brute force, prefix-closure, budgets; the CLI."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.cli import main
from specsim.sim.engine import walk
from specsim.sim.features import load_features
from specsim.sim.optimize import best_first_paths, optimal_tree, optimal_tree_from_vector, optimal_trees, tree_value
from specsim.sim.policies import greedy_table
from specsim.specs import parse_policy
from specsim.trees import Tree
from tests.synthetic import random_cache, rank_cache
from tests.cli_helpers import one_line_error


def _contiguous_trees(n: int, width: int, depth: int):
    """Every tree of <= n nodes, fan-out <= width, depth <= depth, children = the first k candidates."""
    def forests(budget: int, d: int, prefix: tuple):
        yield []
        if d == 0:
            return
        def children(i: int, left: int):
            yield []
            if i >= width or left == 0:
                return
            for size in range(1, left + 1):
                for sub in forests(size - 1, d - 1, prefix + (i,)):
                    if len(sub) == size - 1:
                        for rest in children(i + 1, left - size):
                            yield [prefix + (i,)] + sub + rest
        yield from children(0, budget)
    seen = set()
    for f in forests(n, depth, ()):
        key = frozenset(f)
        if f and key not in seen:
            seen.add(key)
            yield Tree.from_paths(f)


@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 4), st.booleans(), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_sequoia_dp_equals_brute_force(width, budget, depth, monotone, seed):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(width + 1))[:width]
    if monotone:
        p = np.sort(p)[::-1]
    vector = [0.0, *p.tolist()]
    best = max(tree_value(t, vector) for t in _contiguous_trees(budget, width, depth))
    got = optimal_tree_from_vector(vector, budget, max_depth=depth)
    assert got.tree.budget <= budget and got.tree.max_depth <= depth
    assert got.expected_tokens_per_call == pytest.approx(best, abs=1e-12)
    assert tree_value(got.tree, vector) == pytest.approx(best, abs=1e-12)
    assert set(got.tree.rank_paths()[1:]) >= {(0,)}  # candidates are used in order


def test_sequoia_vector_known_case():
    # p_1 = 0.8: a chain beats siblings; expected length of chain:3 = 1 + .8 + .64 + .512
    got = optimal_tree_from_vector([0, 0.8, 0.1], 3)
    assert got.tree.rank_paths()[1:] == [(0,), (0, 0), (0, 0, 0)]
    assert got.expected_tokens_per_call == pytest.approx(1 + 0.8 + 0.64 + 0.512)


@pytest.mark.parametrize("bad, message", [([0.5], "at least one"), ([0, 0.7, 0.6], "sum to"), ([0, -0.1], "entry 1")])
def test_sequoia_vector_errors(bad, message):
    from specsim.errors import SpecError

    with pytest.raises(SpecError, match=message):
        optimal_tree_from_vector(bad, 4)


def _prefix_counts(seqs, max_depth):
    counts = {}
    for seq in seqs:
        n = len(seq)
        for t in range(n):
            for d in range(1, min(max_depth, n - 1 - t) + 1):
                key = tuple(seq[t : t + d])
                counts[key] = counts.get(key, 0) + 1
    return counts


@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=3),
       st.integers(1, 4), st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_greedy_best_first_equals_brute_force(seqs, budget, max_depth):
    symbols = np.array([s for seq in seqs for s in seq])
    remaining = np.concatenate([np.arange(len(seq) - 1, -1, -1) for seq in seqs])
    paths, counts = best_first_paths(symbols, remaining, budget, max_depth)
    truth = _prefix_counts(seqs, max_depth)
    assert len(paths) == min(budget, len(truth)) and len(set(paths)) == len(paths)
    assert all(p[:-1] == () or p[:-1] in paths[:i] for i, p in enumerate(paths))  # prefix-closed, parents first
    assert [truth[p] for p in paths] == counts.tolist()
    best = 0
    nodes = list(truth)
    for r in range(1, min(budget, len(nodes)) + 1):
        for subset in itertools.combinations(nodes, r):
            chosen = set(subset)
            if all(len(p) == 1 or p[:-1] in chosen for p in chosen):
                best = max(best, sum(truth[p] for p in chosen))
    assert counts.sum() == best


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    folder = tmp_path_factory.mktemp("opt")
    rng = np.random.default_rng(0)
    ranks = [np.minimum(rng.geometric(0.55, 30) - 1, 5) for _ in range(5)]
    return {"rank": rank_cache(folder / "ranks.h5", ranks), "random": random_cache(folder / "rand.h5", vocab=8)}


def test_greedy_optimal_tree_values_are_its_mean_and_walk(caches):
    features = load_features(caches["rank"], "d", 0.0, progress=False)
    for budget in (1, 4, 9):
        got = optimal_tree(features, budget, policy="greedy", max_depth=3)
        assert got.tree.budget <= budget and got.tree.max_depth <= 3
        table = greedy_table(features, got.tree, None, None)
        assert got.expected_tokens_per_call == pytest.approx(1 + table.mean_len().mean(), abs=1e-12)
        stats = walk(table, features, 1.0)
        assert got.walk_tokens_per_call == pytest.approx(stats.tokens.sum() / stats.calls.sum())


def _walk_value(features, tree):
    stats = walk(greedy_table(features, tree, None, None), features, 1.0)
    return stats.tokens.sum() / stats.calls.sum()


@pytest.fixture(scope="module")
def bursty(tmp_path_factory):
    """Greedy ranks with easy and hard stretches: misses cluster, as in real text."""
    rng = np.random.default_rng(0)
    seqs = []
    for _ in range(30):
        easy, ranks = True, []
        for _ in range(200):
            easy = easy != (rng.random() < 0.08)
            ranks.append(0 if easy and rng.random() < 0.95 else int(min(rng.geometric(0.35) - 1, 7)))
        seqs.append(ranks)
    return load_features(rank_cache(tmp_path_factory.mktemp("bursty") / "b.h5", seqs), "d", 0.0, progress=False)


def test_optimal_decodes_at_least_as_well_as_simple_trees_and_the_all_positions_fit(bursty):
    """The objective is the walk's tokens/call; where misses cluster the all-positions optimum is not its optimum."""
    from specsim.sim.optimize import simple_trees

    paths, _ = best_first_paths(bursty.rank.astype(np.int64), bursty.remaining(), 16, 16)
    for budget in (4, 8, 16):
        got = optimal_tree(bursty, budget, policy="greedy")
        assert got.walk_tokens_per_call == pytest.approx(_walk_value(bursty, got.tree), abs=1e-12)
        simple = [_walk_value(bursty, t) for t in simple_trees(budget, budget).values()]
        assert len(simple) >= 3 and got.walk_tokens_per_call >= max(simple) - 1e-12
        all_positions = Tree.from_paths(paths[:budget])
        assert got.walk_tokens_per_call >= _walk_value(bursty, all_positions) - 1e-12
        # the all-positions value of the all-positions fit is still the largest of all trees
        mean = 1 + greedy_table(bursty, all_positions, None, None).mean_len().mean()
        assert mean >= got.expected_tokens_per_call - 1e-12
    got = optimal_tree(bursty, 16, policy="greedy")
    assert got.walk_tokens_per_call > _walk_value(bursty, Tree.from_paths(paths[:16])) + 0.2  # refits matter here
    assert "refit" in got.source.split("chosen:")[1]


def test_sampling_optimal_tree_decodes_at_least_as_well_as_a_chain_or_a_star(caches):
    from specsim.sim.policies import run_policy

    features = load_features(caches["random"], "small", 1.0, progress=False)
    policy = parse_policy("sample")
    got = optimal_tree(features, 4, policy=policy)

    def walk_value(tree):
        stats = walk(run_policy(features, tree, policy, np.random.default_rng(0)), features, 1.0)
        return stats.tokens.sum() / stats.calls.sum()

    assert got.walk_tokens_per_call == pytest.approx(walk_value(got.tree), abs=1e-12)  # iid: exact, no MC
    for other in (Tree.from_paths([(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]), Tree.from_paths([(0,), (1,), (2,), (3,)])):
        assert got.walk_tokens_per_call >= walk_value(other) - 1e-12
    assert "exact" in got.source and got.tree.budget <= 4


def test_cli_optimize_prints_writes_and_round_trips(caches, tmp_path):
    out = tmp_path / "tree.json"
    result = CliRunner().invoke(main, ["optimize", str(caches["rank"]), "--budget", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    features = load_features(caches["rank"], "d", 0.0, progress=False)
    expected = optimal_tree(features, 5, policy="greedy")
    assert (f"objective, tokens/call decoding the cached trajectories: {expected.walk_tokens_per_call:.3f} "
            "(total tokens / total expected target calls, as `specsim simulate` reports)") in result.output
    assert f"over {features.n_positions} start positions" in result.output
    assert ("expected tokens/call of a call at a uniformly chosen start position: "
            f"{expected.expected_tokens_per_call:.3f}") in result.output
    assert "root\n" in result.output and "r0" in result.output
    tree = Tree.from_json(out.read_text())
    assert tree.rank_paths() == expected.tree.rank_paths()
    sim = CliRunner().invoke(main, ["simulate", str(caches["rank"]), "--tree", f"file:{out}",
                                    "-q", "--n-boot", "10"])
    assert sim.exit_code == 0, sim.output
    assert f"{expected.walk_tokens_per_call:.3f}" in sim.output


def test_cli_hardware_aware_choice(caches):
    """With costs the budget N = 1..6 with the best speedup is chosen, and it is labelled by its basis."""
    result = CliRunner().invoke(main, ["optimize", str(caches["rank"]), "--budget", "6", "--cost", "c=0.3",
                                       "--n-boot", "0"])
    assert result.exit_code == 0, result.output
    import specsim

    options = optimal_trees(load_features(caches["rank"], "d", 0.0, progress=False), range(1, 7), policy="greedy")
    speed = [specsim.simulate(caches["rank"], trees=[f"file:{_saved(r.tree)}"], cost="c=0.3", n_boot=0,
                              by_category=False)["speedup_assumed"][0] for r in options]
    n = int(np.argmax(speed)) + 1
    m = re.search(r"batch 1: N = (\d+) \(optimal:\d+\), ([\d.]+) tokens/call, speedup ASSUMED ([\d.]+)", result.output)
    assert m, result.output
    assert int(m.group(1)) == n and float(m.group(3)) == pytest.approx(max(speed), abs=6e-4)
    assert "ASSUMED c=0.3" in result.output and "fewer than 8 prompts" not in result.output  # no CI printed
    with_ci = CliRunner().invoke(main, ["optimize", str(caches["rank"]), "--budget", "6", "--cost", "c=0.3",
                                        "--n-boot", "200"])
    assert with_ci.exit_code == 0, with_ci.output
    assert "CIs over fewer than 8 prompts (here 5) cover about 85-90%" in with_ci.output  # 5 ranked trajectories


def _saved(tree) -> str:
    import tempfile

    path = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    path.write(tree.to_json())
    path.close()
    return path.name


def test_cli_acceptance_vector(tmp_path):
    vec = tmp_path / "v.json"
    vec.write_text(json.dumps([0, 0.8, 0.1]))
    result = CliRunner().invoke(main, ["optimize", "--acceptance-vector", str(vec), "--budget", "3"])
    assert result.exit_code == 0, result.output
    assert f"expected tokens/call: {1 + 0.8 + 0.64 + 0.512:.3f}" in result.output
    vec.write_text("[0, 0.9, 0.5]")
    bad = CliRunner().invoke(main, ["optimize", "--acceptance-vector", str(vec), "--budget", "3"])
    one_line_error(bad, "sum to 1.4000 > 1", code=2)


@pytest.mark.parametrize("args, message", [
    (["--budget", "3"], "give a CACHE or --acceptance-vector"),
    (["CACHE", "--budget", "3", "--cost", "c=0.1", "--cost-profile", "CACHE"], "not both"),
    (["CACHE", "--budget", "3", "--policy", "sample", "--temperature", "0"], "temperature > 0"),
    (["CACHE", "--budget", "3", "--draft", "nope"], "no draft named 'nope'"),
])
def test_cli_errors_are_one_line(caches, args, message):
    args = [str(caches["random"]) if a == "CACHE" else a for a in args]
    one_line_error(CliRunner().invoke(main, ["optimize", *args]), message)


def test_optimal_rows_are_scored_on_prompts_the_tree_was_not_fitted_on(tmp_path):
    """Two prompts with opposite rank patterns: each is decoded by the tree fitted on the other."""
    import specsim
    from specsim.sim.optimize import optimal_tree

    path = rank_cache(tmp_path / "two.h5", [[0, 0, 0, 0] * 6, [1, 1, 1, 1] * 6], vocab=8, categories=["a", "b"])
    row = specsim.simulate(path, trees=["optimal:2"], n_boot=0, by_category=False).row(0, named=True)
    assert row["fit"].startswith("held-out: 2-fold cross-fitting over prompts")
    features = load_features(path, "d", 0.0, progress=False)
    calls = 0.0
    for held in (0, 1):
        tree = optimal_tree(features.subset([1 - held]), 2, policy="greedy").tree  # fitted on the other prompt
        table = greedy_table(features.subset([held]), tree, parse_policy("greedy"), None)
        calls += walk(table, features.subset([held])).calls.sum()
    assert row["tokens_per_call"] == pytest.approx(48 / calls)
    in_sample = optimal_tree(features, 2, policy="greedy").tree
    assert row["tokens_per_call"] < 48 / walk(greedy_table(features, in_sample, parse_policy("greedy"), None),
                                                features).calls.sum()  # held out: worse than the in-sample optimum
    single = rank_cache(tmp_path / "one.h5", [[0, 1, 0, 0] * 6], vocab=8)
    assert specsim.simulate(single, trees=["optimal:2"], n_boot=0).row(0, named=True)["fit"].startswith("in-sample")


@pytest.mark.parametrize("policy,temperature", [("greedy", 0.0), ("sample", 1.0)])
def test_folds_scored_from_the_whole_sets_sums_equal_folds_fitted_alone(tiny_cache, policy, temperature):
    """Cross-fitting folds reuse the whole set's per-trajectory scores of each candidate tree: the fits must be
    those of the fold on its own (a fold scored with the whole set's totals picks other trees and values)."""
    from dataclasses import replace

    spec = parse_policy(policy)
    budgets = [2, 3, 4, 6]
    for draft in ("int8", "layers:2"):
        features = load_features(tiny_cache, draft, temperature)
        optimal_trees(features, budgets, policy=spec)  # the in-sample fit first, as a sweep does
        assert features.n_traj == 4
        for fold in ([0, 2], [1, 3], [3]):
            train = np.setdiff1d(np.arange(features.n_traj), fold)
            shared = optimal_trees(features.subset(train), budgets, policy=spec)
            alone = optimal_trees(replace(features.subset(train), parent=None, _memo={}), budgets, policy=spec)
            for a, b in zip(shared, alone):
                assert a.tree.rank_paths() == b.tree.rank_paths()
                assert a.walk_tokens_per_call == pytest.approx(b.walk_tokens_per_call, rel=1e-12)
                assert a.expected_tokens_per_call == pytest.approx(b.expected_tokens_per_call, rel=1e-12)

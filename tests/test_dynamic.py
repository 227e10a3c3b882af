"""Dynamic draft trees (EAGLE-2): selection, exact replay against real dynamic-tree decoding, refusals."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specsim
from specsim.sim.sweep import SweepConfig, sweep
from specsim.errors import SpecError
from specsim.sim.dynamic import DynamicShape, expand_reference, node_depths, parse_dynamic, select, select_reference
from specsim.specs import parse_tree
from tests.toy_markov import (
    MarkovLM,
    dynamic_decode,
    random_prompts,
    record_cache,
    record_dynamic_cache,
    sticky_pair,
)

# -- the tree a call builds ------------------------------------------------------------------------


@st.composite
def expansions(draw):
    """A random draft (a table of log-probs per path hash) expanded at one position, and a shape."""
    vocab = draw(st.integers(2, 7))
    topk = draw(st.integers(1, vocab))
    depth = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31))
    coarse = draw(st.booleans())  # few distinct log-probs: ties everywhere

    def logq(path):
        rng = np.random.default_rng([seed, *path, len(path)])
        w = rng.integers(1, 4, vocab).astype(float) if coarse else rng.dirichlet(np.ones(vocab))
        return np.log(w / w.sum())

    tok, par, score = expand_reference(logq, topk, depth)
    m = tok.shape[0]
    tokens = draw(st.integers(1, m))
    sub_depth = draw(st.integers(1, depth))
    return tok, par, score, DynamicShape(topk, sub_depth, min(tokens, topk + (sub_depth - 1) * topk * topk))


@given(expansions())
@settings(max_examples=200, deadline=None)
def test_selection_is_prefix_closed_sized_and_equals_the_reference(case):
    tok, par, score, shape = case
    chosen = select(score[None].astype(np.float32), shape)[0]
    assert chosen.tolist() == select_reference(score.astype(np.float32), shape)
    assert chosen.shape[0] == min(shape.tokens, shape.candidates)
    kept = set(chosen.tolist())
    assert all(par[i] == -1 or par[i] in kept for i in kept), "a kept node's parent was dropped"
    assert node_depths(shape.topk, shape.depth)[chosen].max() <= shape.depth
    # siblings are distinct tokens: the replay's "at most one child matches" holds
    for parent in {int(par[i]) for i in kept}:
        kids = [int(tok[i]) for i in kept if par[i] == parent]
        assert len(kids) == len(set(kids))


def test_expansion_follows_eagle2_beam():
    """A hand-checked expansion: V=3, K=2, D=2."""
    table = {(): [0.5, 0.3, 0.2], (0,): [0.1, 0.6, 0.3], (1,): [0.7, 0.2, 0.1]}
    tok, par, score = expand_reference(lambda path: np.log(table[tuple(path)]), 2, 2)
    assert tok.tolist() == [0, 1, 1, 2, 0, 1]  # root top-2, then top-2 children of each beam node
    assert par.tolist() == [-1, -1, 0, 0, 1, 1]
    np.testing.assert_allclose(np.exp(score), [0.5, 0.3, 0.3, 0.15, 0.21, 0.06])
    chosen = select(score[None], DynamicShape(2, 2, 4))[0]
    assert chosen.tolist() == [0, 1, 2, 4]  # 0.5, 0.3, 0.3 (earlier of the tie), 0.21


def test_spec_errors_name_the_problem():
    with pytest.raises(SpecError, match="exceeds the 52 candidates"):
        parse_tree("dynamic:topk=4,depth=4,tokens=53")
    with pytest.raises(SpecError, match="topk >= 1"):
        parse_tree("dynamic:topk=0,depth=4,tokens=3")
    with pytest.raises(SpecError, match="missing tokens"):
        parse_tree("dynamic:topk=4,depth=4")
    assert parse_dynamic("topk=4, depth=4, tokens=8") == DynamicShape(4, 4, 8)


# -- replay equals real dynamic-tree decoding ------------------------------------------------------

VOCAB, N_TOKENS, K, D = 8, 24, 2, 3


@pytest.fixture(scope="module")
def pair():
    return sticky_pair(VOCAB, order=1, stay=0.9, seed=3)


@pytest.mark.parametrize("tokens", [3, 4])
def test_greedy_replay_equals_real_decoding_per_trajectory(tmp_path, tokens):
    target, draft = sticky_pair(VOCAB, order=2, stay=0.9, seed=3)  # order 2: greedy paths that vary
    prompts = random_prompts(VOCAB, 2, 12, seed=5)
    cache = record_dynamic_cache(tmp_path / "d.h5", target, draft, prompts, N_TOKENS, topk=K, depth=D,
                                 temperatures=(0.0,))
    shape = DynamicShape(K, D, tokens)
    real = [dynamic_decode(target, draft, pr, N_TOKENS, shape, np.random.default_rng(0), greedy=True).calls
            for pr in prompts]
    spec = f"dynamic:topk={K},depth={D},tokens={tokens}"
    req = sweep(cache, SweepConfig(trees=[spec], policies=["greedy"], n_boot=0, by_category=False)).requests.sort("prompt_index")
    assert req["target_calls"].to_list() == pytest.approx([float(c) for c in real])
    # a wrong recording (children read on the target's path, ignoring off-path nodes) is caught
    wrong = record_dynamic_cache(tmp_path / "w.h5", target, draft, prompts, N_TOKENS, topk=K, depth=D,
                                 temperatures=(0.0,), on_path_only=True)
    bad = sweep(wrong, SweepConfig(trees=[spec], policies=["greedy"], n_boot=0, by_category=False)).requests.sort("prompt_index")
    assert bad["target_calls"].to_list() != pytest.approx([float(c) for c in real])


def decoy_pair() -> tuple[MarkovLM, MarkovLM]:
    """(target, draft) where off-path nodes matter: the draft puts 0.3 on a decoy token (4) the target
    never emits, and is nearly sure (0.97) what follows a decoy, so the decoy's children outscore the
    target's path at depth 2 and crowd it out of small trees: a recording that scores children on
    the target's path instead (ignoring off-path nodes) keeps the path and overstates acceptance."""
    V = 6
    p, q = np.full((V, V), 1e-3), np.full((V, V), 1e-3)
    for a in range(V):
        nxt = (a + 1) % 4
        p[a, :4], p[a, nxt] = 0.05, 0.8
        if a < 4:
            q[a, :4], q[a, nxt], q[a, 4] = 0.05, 0.45, 0.3
        else:
            q[a, 0] = 0.97
    return (MarkovLM.from_probs(p / p.sum(1, keepdims=True)), MarkovLM.from_probs(q / q.sum(1, keepdims=True)))


def test_sampling_replay_matches_real_decoding_in_distribution(tmp_path):
    """Point-mass verification: replay on target-sampled trajectories = real decoding's law."""
    target, draft = decoy_pair()
    prompts = random_prompts(4, 1, 300, seed=7)
    shape = DynamicShape(K, D, 3)
    spec = "dynamic:topk=2,depth=3,tokens=3"
    cache = record_dynamic_cache(tmp_path / "s.h5", target, draft, prompts, N_TOKENS, topk=K, depth=D,
                                 temperatures=(1.0,), seed=11)
    sim = sweep(cache, SweepConfig(trees=[spec], policies=["sample"], n_boot=0, by_category=False)).requests["target_calls"].to_numpy()
    rng = np.random.default_rng(12)
    real = np.array([dynamic_decode(target, draft, pr, N_TOKENS, shape, rng, greedy=False).calls for pr in prompts])
    se = np.sqrt(sim.var(ddof=1) / sim.size + real.var(ddof=1) / real.size)
    z = (sim.mean() - real.mean()) / se
    assert abs(z) < 4, f"replay {sim.mean():.3f} vs real {real.mean():.3f} calls per trajectory (z={z:.2f})"
    # the wrong recording (children scored on the target's path) is far off the real law
    wrong = record_dynamic_cache(tmp_path / "w.h5", target, draft, prompts, N_TOKENS, topk=K, depth=D,
                                 temperatures=(1.0,), seed=11, on_path_only=True)
    bad = sweep(wrong, SweepConfig(trees=[spec], policies=["sample"], n_boot=0, by_category=False)).requests["target_calls"].to_numpy()
    assert (bad.mean() - real.mean()) / se < -8, "a replay ignoring off-path nodes must be rejected"


def test_point_mass_rule_accepts_exactly_the_sampled_token():
    """By enumeration: sequential point-mass verification of distinct candidates accepts candidate c
    with probability p(c) — so given the emitted token y, a candidate is accepted iff it equals y."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = rng.dirichlet(np.ones(6))
        cands = rng.permutation(6)[: rng.integers(1, 6)]
        residual, reach = p.copy(), 1.0
        for c in cands:  # EAGLE's evaluate_posterior: accept x w.p. r(x), else zero it and renormalise
            accept = reach * residual[c]
            assert accept == pytest.approx(p[c])
            reach *= 1 - residual[c]
            residual[c] = 0.0
            residual /= residual.sum()
        # the residual after all rejections is p restricted to the other tokens
        np.testing.assert_allclose(residual * reach, np.where(np.isin(np.arange(6), cands), 0, p))


# -- refusals ---------------------------------------------------------------------------------------


def test_dynamic_tree_needs_a_matching_expansion(tmp_path, pair):
    target, draft = pair
    prompts = random_prompts(VOCAB, 1, 3, seed=1)
    plain = record_cache(tmp_path / "p.h5", target, draft, prompts, 10, temperatures=(0.0,))
    with pytest.raises(SpecError, match=r"--expand topk=2,depth=3"):
        specsim.simulate(plain, ["dynamic:topk=2,depth=3,tokens=4"], policies=["greedy"], n_boot=0)
    cache = record_dynamic_cache(tmp_path / "d.h5", target, draft, prompts, 10, topk=2, depth=2, temperatures=(0.0,))
    with pytest.raises(SpecError, match="expanded topk=2"):
        specsim.simulate(cache, ["dynamic:topk=3,depth=2,tokens=4"], policies=["greedy"], n_boot=0)
    with pytest.raises(SpecError, match="depth 2 only"):
        specsim.simulate(cache, ["dynamic:topk=2,depth=3,tokens=4"], policies=["greedy"], n_boot=0)
    with pytest.raises(SpecError, match="adaptive"):
        specsim.simulate(cache, ["dynamic:topk=2,depth=2,tokens=2"], policies=["adaptive-hf"], n_boot=0)


def test_rows_of_dynamic_trees(tmp_path, pair):
    """One sweep: several token budgets and depths from one recording, beside static trees."""
    target, draft = pair
    prompts = random_prompts(VOCAB, 1, 6, seed=2)
    cache = record_dynamic_cache(tmp_path / "d.h5", target, draft, prompts, 20, topk=2, depth=3)
    df = specsim.simulate(cache, ["dynamic:topk=2,depth=3,tokens=2", "dynamic:topk=2,depth=3,tokens=6",
                                  "dynamic:topk=2,depth=2,tokens=6", "chain:3"],
                          policies=["greedy", "sample"], n_boot=50, by_category=False, cost="c=0.1")
    assert df.height == 8
    dyn = df.filter(df["tree"].str.starts_with("dynamic"))
    assert set(dyn["estimate"]) == {"exact"} and not dyn["approximate"].any()
    assert dyn["multi_draft"].is_null().all()
    g = {r["tree"]: r for r in df.filter(df["policy"] == "greedy").iter_rows(named=True)}
    # more verified tokens at the same beam never accept less
    assert g["dynamic:topk=2,depth=3,tokens=6"]["tokens_per_call"] >= g["dynamic:topk=2,depth=3,tokens=2"][
        "tokens_per_call"] - 1e-12
    assert g["dynamic:topk=2,depth=3,tokens=6"]["budget"] == 6 and g["dynamic:topk=2,depth=3,tokens=6"]["depth"] == 3
    assert "speedup_assumed" in df.columns


def test_report_compares_dynamic_optimal_and_chain_at_equal_budgets(tmp_path, pair):
    """The report's section: the same numbers as the simulated rows, per budget, greedy and sampling."""
    from specsim.report.findings import equal_budget, findings
    from specsim.report.html import write_report
    from specsim.report.study import StudyConfig, run_study, study_tables

    target, draft = pair
    prompts = random_prompts(VOCAB, 1, 8, seed=2)
    cache = record_dynamic_cache(tmp_path / "d.h5", target, draft, prompts, 16, topk=2, depth=3)
    config = StudyConfig(budgets=(1, 2, 4), families=("chain", "optimal"), model_free=(), draw_budgets=(),
                         sample_draw_budgets=(), n_boot=50, cost="c=0.1")
    study = run_study([cache], config, progress=False)
    table = equal_budget(study.results)
    assert set(table["setting"]) == {"T=0 greedy", "T=1 sample"} and set(table["budget"]) == {1, 2, 4}
    rows = study.results.filter(pl.col("category") == "all")
    for r in table.iter_rows(named=True):
        for fam in ("chain", "optimal", "dynamic"):
            same = rows.filter((pl.col("family") == fam) & (pl.col("budget") == r["budget"])
                               & (pl.col("temperature") == (0.0 if r["setting"].startswith("T=0 ") else 1.0)))
            assert same.height == 1 and r[f"{fam}_tokens_per_call"] == same["tokens_per_call"][0]
            assert r[f"{fam}_speedup_assumed"] == same["speedup_assumed"][0]
    said = [f for f in findings(study.results, study.theory, study.cost_basis) if f.startswith("Dynamic vs static")]
    assert len(said) == 2 and "4 verified: chain" in said[0] and "dynamic" in said[0]
    assert "trees_at_equal_budget" in study_tables(study)
    page = write_report(study, tmp_path / "report", progress=False).read_text()
    assert "Chain vs data-optimal static vs dynamic trees at equal budgets" in page


def _path_logits(root: int, path: tuple, V: int = 40) -> np.ndarray:
    """A law that depends on everything a node sees: its root and the exact tokens above it, in order."""
    seed = [root, len(path), *path]
    return np.random.default_rng(seed).standard_normal(V)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 5), st.booleans())
def test_beam_expand_feeds_every_node_its_ancestors_and_nothing_else(topk, depth, roots, per_row):
    """`beam_expand`, the rule every draft expands with (model drafts, heads, recording and live), equals EAGLE-2's
    plain reference when each beam node's law is computed only from what its attention mask shows it (the tokens of
    the nodes it attends to, in feeding order, then its own): a node shown a sibling, a cousin or one ancestor too few
    gets another law. Both layouts: every root's beam in one group (recording) and one group per root (live)."""
    import torch

    from specsim.record.expand import beam_expand

    fed: list[list[int]] = [[] for _ in range(roots if per_row else 1)]  # per group: tokens in feeding order

    def children(d, beam_tok, parent, attend):
        tok = beam_tok.numpy()
        out = np.zeros((roots, topk, 40))
        for r in range(roots):
            for k in range(topk):
                g, i = (r, k) if per_row else (0, r * topk + k)
                before = len(fed[g])
                seen = [fed[g][j] for j in range(before) if attend[g, i, j]]
                assert attend[g, i, before + i] and attend[g, i, before:].sum() == 1  # itself, no other new node
                out[r, k] = _path_logits(r, (*seen, int(tok[r, k])))
        for g in range(len(fed)):  # this level's nodes join the fed entries, in feeding order
            rows = range(g, g + 1) if per_row else range(roots)
            fed[g] += [int(tok[r, k]) for r in rows for k in range(topk)]
        return torch.as_tensor(out)

    root_logits = torch.as_tensor(np.stack([_path_logits(r, ()) for r in range(roots)]))
    got = beam_expand(root_logits, children, topk=topk, depth=depth, per_row=per_row)
    for r in range(roots):
        logq = lambda path, r=r: np.log(np.exp(z := _path_logits(r, tuple(path))) / np.exp(z).sum())  # noqa: E731
        tok, par, score = expand_reference(logq, topk, depth)
        np.testing.assert_array_equal(got["expand_token"][r].numpy(), tok)
        np.testing.assert_array_equal(got["expand_parent"][r].numpy(), par)
        np.testing.assert_allclose(got["expand_score"][r].numpy(), score, atol=1e-5)

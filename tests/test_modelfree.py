"""Model-free drafts: candidate order (SGLang n-gram, HF prompt lookup), the trie, exact replay."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.errors import SpecError
from specsim.sim.features import load_features
from specsim.sim.modelfree import (
    ModelFreeDraft,
    accepted_length,
    continuations,
    modelfree_table,
    parse_modelfree,
    tree_tokens,
)
from specsim.sim.policies import run_policy
from specsim.specs import parse_policy
from specsim.specs import parse_tree
from tests.strategies import trees
from specsim.cache.layout import CacheSpec, PromptRecord
from specsim.cache.writer import CacheWriter

CTX = np.array([1, 2, 3, 9, 1, 2, 4, 5, 1, 2])


def test_ngram_continuations_most_recent_first():
    conts = continuations(CTX, parse_modelfree("ngram:2"), 3)
    assert [c.tolist() for c in conts] == [[4, 5, 1], [3, 9, 1]]
    assert continuations(CTX, parse_modelfree("ngram:3"), 3) == []  # (5, 1, 2) never occurred before


def test_prompt_lookup_longest_match_first_then_earliest():
    conts = continuations(CTX, parse_modelfree("prompt-lookup:3"), 2)
    # no earlier (5,1,2); (1,2) at 0 and 4; then (2,) at 1 and 5
    assert [c.tolist() for c in conts] == [[3, 9], [4, 5], [3, 9], [4, 5]]
    # HF keeps the first hit only: it is the head of our list
    assert continuations(np.array([7, 7]), parse_modelfree("prompt-lookup:2"), 3)[0].tolist() == [7]


def test_tree_tokens_follow_the_trie_ranks():
    tree = parse_tree("kary:2,2")  # paths (0,), (1,), (0,0), (0,1), (1,0), (1,1)
    tokens = tree_tokens(CTX, parse_modelfree("ngram:2"), tree)
    assert tokens.tolist() == [-1, 4, 3, 5, -1, 9, -1]
    assert accepted_length(tree, tokens, np.array([3, 9, 7])) == 2
    assert accepted_length(tree, tokens, np.array([4, 9])) == 1
    assert accepted_length(tree, tokens, np.array([8])) == 0


@given(st.lists(st.integers(0, 3), min_size=1, max_size=30), trees(max_nodes=10, max_rank=2, max_depth=3),
       st.sampled_from(["ngram:1", "ngram:2", "prompt-lookup:2"]))
@settings(max_examples=120, deadline=None)
def test_trie_properties(context, tree, spec):
    context = np.array(context)
    draft = parse_modelfree(spec)
    conts = [c.tolist() for c in continuations(context, draft, tree.max_depth)]
    tokens = tree_tokens(context, draft, tree)
    paths = tree.rank_paths()
    for v in range(1, tree.n_nodes):
        if tokens[v] < 0:
            continue
        parent = int(tree.parents[v])
        assert parent == 0 or tokens[parent] >= 0  # a proposal's parent proposes too
        chain = []
        u = v
        while u:
            chain.append(int(tokens[u]))
            u = int(tree.parents[u])
        chain = chain[::-1]
        assert any(c[: len(chain)] == chain for c in conts)  # every node's path is a candidate prefix
        # rank r = the r-th distinct next token, in priority order, among candidates with this prefix
        prefix = chain[:-1]
        order = []
        for c in conts:
            if c[: len(prefix)] == prefix and len(c) > len(prefix) and c[len(prefix)] not in order:
                order.append(c[len(prefix)])
        assert order.index(chain[-1]) == paths[v][-1]
    for v in range(1, tree.n_nodes):  # siblings propose distinct tokens
        kids = tree.children(v)
        live = tokens[kids][tokens[kids] >= 0]
        assert len(set(live.tolist())) == live.size


@pytest.mark.parametrize("text, message", [("ngram", "N must be at least 1"), ("ngram:x", "integer"),
                                           ("suffix:3", "not an n-gram or prompt-lookup draft"), ("bigram:3", "not an n-gram"), ("prompt-lookup:0", "at least 1")])
def test_parse_errors(text, message):
    with pytest.raises(SpecError, match=message):
        parse_modelfree(text)


@pytest.fixture(scope="module")
def periodic_cache(tmp_path_factory):
    """Trajectories that repeat a 4-token period begun in the prompt: n-gram drafts are perfect."""
    V, n = 8, 14
    path = tmp_path_factory.mktemp("mf") / "periodic.h5"
    prompts = [PromptRecord(i, "c", f"p{i}", (np.array([1, 2]) + i).astype(np.int32)) for i in range(2)]
    spec = CacheSpec(vocab_size=V, drafts=("d",), temperatures=(0.0, 1.0))
    with CacheWriter.create(path, spec, prompts) as writer:
        for T in (0.0, 1.0):
            for i in range(2):
                period = np.array([1, 2, 3, 4]) + i
                tokens = np.tile(period, 5)[2 : 2 + n].astype(np.int32)  # continues the prompt (1, 2) + i
                logits = np.zeros((n, V), dtype=np.float32)
                writer.append_trajectory(prompt_index=i, temperature=T, seed=0, tokens=tokens, target_logits=logits,
                                         draft_logits={"d": logits}, stop_reason="max_new_tokens")
    return path


def test_periodic_text_is_drafted_perfectly_for_greedy_and_sampling(periodic_cache):
    tree = parse_tree("chain:3")
    tables = []
    for T, policy in ((0.0, "greedy"), (1.0, "sample")):
        features = load_features(periodic_cache, "ngram:2", T, progress=False)
        assert features.model_free
        table = run_policy(features, tree, parse_policy(policy), np.random.default_rng(0))
        assert table.exact
        length = table.p_len.argmax(axis=1)
        remaining = features.remaining()
        # once a full period is in the context (position >= 4), the last two tokens occurred one
        # period earlier: every draft is right until the end cap; before that nothing matches
        for t in range(features.n_positions):
            pos = t - int(features.traj_start[np.searchsorted(features.traj_start, t, side="right") - 1])
            expect = min(3, int(remaining[t])) if pos >= 4 else 0
            assert length[t] == expect, (t, pos)
        tables.append(table)
    np.testing.assert_array_equal(tables[0].p_len, tables[1].p_len)
    assert np.all(tables[0].drafted <= 3)


def test_model_free_refuses_lossy_rules(periodic_cache):
    features = load_features(periodic_cache, "ngram:2", 1.0, progress=False)
    with pytest.raises(SpecError, match="has no q"):
        run_policy(features, parse_tree("chain:2"), parse_policy("p>=q"), np.random.default_rng(0))


def test_modelfree_table_direct_call_counts_drafted_candidates(periodic_cache):
    features = load_features(periodic_cache, "prompt-lookup:2", 0.0, progress=False)
    table = modelfree_table(features, parse_tree("kary:2,2"), parse_policy("greedy"), None)
    assert table.drafted.max() <= 6 and table.drafted.min() >= 0
    assert isinstance(parse_modelfree("ngram:3"), ModelFreeDraft)


def test_model_free_calls_are_priced_by_the_nodes_they_proposed(periodic_cache):
    """Live verification sends the target only the proposed nodes: a call that matched nothing costs a
    plain step, not a full tree."""
    from specsim.sim.pricing import Pricing

    class PerToken:  # verifying N tokens costs N seconds
        measured = True

        def verify_s(self, batch, tokens, context):
            return np.broadcast_to(np.asarray(tokens, dtype=float), np.shape(context)).copy()

        def plain_s(self, batch, context):
            return self.verify_s(batch, 1, context)

    features = load_features(periodic_cache, "ngram:2", 0.0, progress=False)
    tree = parse_tree("chain:3")
    table = run_policy(features, tree, parse_policy("greedy"), np.random.default_rng(0))
    pricing = Pricing(PerToken(), None, "per token")
    call, plain, _ = pricing.priced(features, tree, drafted=table.drafted)
    np.testing.assert_array_equal(call, 1 + table.drafted)
    np.testing.assert_array_equal(plain, 1.0)
    assert (table.drafted == 0).any() and (table.drafted == 3).any()  # both kinds of calls occur

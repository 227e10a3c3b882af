"""SuffixDecoding (`suffix:`): counts, the speculation rule against a plain reference, exact replay."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.errors import SpecError
from specsim.sim.sweep import SweepConfig, sweep
from specsim.sim.suffix import SuffixDraft, SuffixSpeculator, SuffixTrie, parse_suffix, speculate_in
from specsim.specs import parse_tree
from specsim.trees import Tree
from tests.strategies import trees
from tests.toy_markov import MarkovLM, point_mass_call, random_prompts, record_cache

# -- the reference: counts by brute force, the rule written as a sort ------------------------------


def occurrences(w: tuple[int, ...], seqs: list[list[int]], depth: int) -> int:
    if len(w) > depth:
        return 0
    return sum(s[j : j + len(w)] == list(w) for s in seqs for j in range(len(s) - len(w) + 1))


def reference_speculate(seqs, pattern, tree: Tree, draft: SuffixDraft, trie: SuffixTrie) -> tuple[list[int], float, int]:
    """ArcticInference's speculate (match lengths 1, 2, ... below the pattern's; a longer match wins an equal
    score) on brute-force counts, with the growth as 'the `limit` most probable qualifying nodes'. Equal counts
    take the trie's sibling order, itself checked against ArcticInference's proposals (test_arctic_...)."""
    F = np.float32
    best = ([-1] * tree.n_nodes, 0.0, 0)
    paths = tree.rank_paths()
    n = len(pattern)
    chain = tree.n_nodes == tree.max_depth + 1
    for m in range(1, n):
        w = tuple(pattern[n - m :])
        if occurrences(w, seqs, draft.depth) == 0:
            break
        limit = min(tree.budget, max(0, int(float(F(m) * F(draft.factor) + F(draft.offset)) + 1e-6)))
        token, prob = [-1] * tree.n_nodes, [F(0)] * tree.n_nodes
        ok = [True] + [False] * (tree.n_nodes - 1)
        strings = {0: w}
        prob[0] = F(1)
        for v in range(1, tree.n_nodes):  # breadth-first: parents first
            u = int(tree.parents[v])
            if not ok[u]:
                continue
            base = strings[u]
            order = [trie.token[k] for k in trie.ranked(trie.match(base))]
            kids = [(occurrences(base + (x,), seqs, draft.depth), x) for x in range(64)]
            kids = sorted(((-c, order.index(x), x) for c, x in kids if c > 0))
            assert [x for *_, x in kids] == order  # the trie's order: counts falling
            r = paths[v][-1]
            if r < len(kids):
                c, x, total = F(-kids[r][0]), kids[r][2], F(occurrences(base, seqs, draft.depth))
                prob[v] = prob[u] * (c / total) if chain else (prob[u] * c) / total
                if prob[v] >= F(draft.prob):
                    ok[v], token[v], strings[v] = True, x, base + (x,)
        chosen = sorted((v for v in range(1, tree.n_nodes) if ok[v]), key=lambda v: (-prob[v], v))[:limit]
        tokens = [-1] * tree.n_nodes
        for v in chosen:
            tokens[v] = token[v]
        score = F(0)
        for v in sorted(chosen, key=lambda v: (-prob[v], v)):
            score = score + prob[v]
        if float(score) >= best[1]:
            best = (tokens, float(score), m)
    return best


def build(seqs, depth: int) -> SuffixTrie:
    trie = SuffixTrie(depth)
    for i, s in enumerate(seqs):  # in two pieces: open suffixes carry over
        trie.extend(i, s[: len(s) // 2])
    for i, s in enumerate(seqs):
        trie.extend(i, s[len(s) // 2 :])
    return trie


@given(st.lists(st.lists(st.integers(0, 2), max_size=25), min_size=1, max_size=4), st.integers(1, 5),
       st.data())
@settings(max_examples=60, deadline=None)
def test_counts_are_occurrences_of_strings_up_to_depth(seqs, depth, data):
    def check(trie, held):
        for L in range(1, 5):
            for w in itertools.product(range(3), repeat=L):
                node = trie.match(w)
                assert (trie.count[node] if node >= 0 else 0) == occurrences(w, held, depth), w
        assert trie.count[0] == sum(map(len, held))

    trie = build(seqs, depth)
    check(trie, seqs)
    gone = data.draw(st.integers(0, len(seqs) - 1))
    trie.remove(gone)
    check(trie, [s for i, s in enumerate(seqs) if i != gone])


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=1, max_size=3),
       st.lists(st.integers(0, 3), min_size=1, max_size=8), trees(max_nodes=10, max_rank=2, max_depth=4),
       st.integers(2, 6), st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([0.0, 0.1, 0.34]))
@settings(max_examples=150, deadline=None)
def test_speculation_equals_the_reference(seqs, pattern, tree, depth, factor, prob):
    draft = SuffixDraft(depth=depth, factor=factor, prob=prob)
    trie = build(seqs, depth)
    got = speculate_in(trie, np.array(pattern[-depth:]), tree, draft)
    tokens, score, m = reference_speculate(seqs, pattern[-depth:], tree, draft, trie)
    assert got.match_len == m
    assert got.score == score
    if m:
        assert got.tokens.tolist() == tokens
        grown = got.tokens >= 0
        assert all(grown[tree.parents[v]] or tree.parents[v] == 0 for v in np.flatnonzero(grown))


def test_a_worked_example():
    """Prompt 1 2 3 4 1 2 3 5 1 2: '1 2' occurred 3 times (twice followed by 3), '1 2 3' twice (4, then 5)."""
    context = np.array([1, 2, 3, 4, 1, 2, 3, 5, 1, 2])
    s = SuffixSpeculator(parse_suffix("suffix:factor=2"))
    s.start(context)
    tokens = s.propose(context, parse_tree("kary:2,3"))
    # match '1 2' (m = 2, limit 4): 3 (2/3); then 4 and 5 (1/3 each, ids break the tie); then 4's child 1 (1/3)
    assert tokens.tolist() == [-1, 3, -1, 4, 5, -1, -1, 1, -1, -1, -1, -1, -1, -1, -1]
    chain = parse_tree("chain:5")
    assert s.propose(context, chain).tolist() == [-1, 3, 4, 1, 2, -1]  # path mode: the most frequent child
    strict = SuffixSpeculator(parse_suffix("suffix:factor=2,prob=0.5"))
    strict.start(context)
    assert strict.propose(context, chain).tolist() == [-1, 3, -1, -1, -1, -1]  # 4 has only 1/3


def test_the_global_tree_holds_the_last_outputs_fifo():
    """requests=R: the global tree holds R outputs, the current request's included (its slot is taken at start)."""
    tree = parse_tree("chain:3")
    s = SuffixSpeculator(parse_suffix("suffix:requests=2,factor=3"))
    s.start([9])
    s.finish(np.array([9, 5, 6, 7, 8]))  # output 5 6 7 8
    s.start([9])
    assert s.propose(np.array([9, 5]), tree).tolist() == [-1, 6, 7, 8]  # '5' learnt from the first request
    s.finish(np.array([9, 5, 1]))
    s.start([9])  # the third request's slot evicts the first output; the second (5 1) is held
    assert s.propose(np.array([9, 5]), tree).tolist() == [-1, 1, -1, -1]
    alone = SuffixSpeculator(parse_suffix("suffix:requests=1,factor=3"))  # its own output only: nothing carries
    alone.start([9])
    alone.finish(np.array([9, 5, 6, 7, 8]))
    alone.start([9])
    assert alone.propose(np.array([9, 5]), tree).tolist() == [-1, -1, -1, -1]


def test_equal_counts_keep_arctics_sibling_order():
    """Ties are not broken by token id but by ArcticInference's sibling lists (each case checked with arctic_inference:
    the children of '0', best first, in its tree mode)."""
    def order(seqs, removed=()):
        trie = SuffixTrie(2)
        for i, seq in enumerate(seqs):
            trie.extend(i, seq)
        for i in removed:
            trie.remove(i)
        return [trie.token[k] for k in trie.ranked(trie.match([0]))]

    assert order([[0, 7, 0, 3, 0, 3]]) == [3, 7]  # counts decide
    assert order([[0, 7, 0, 3, 0, 3, 0, 7]]) == [7, 3]  # 7 was first among the 1s, so first among the 2s
    assert order([[0, 5, 0, 5, 0, 6, 0, 4, 0, 4]]) == [5, 4, 6]  # 4 was behind 6 among the 1s: last among the 2s
    assert order([[0, 3], [0, 3, 0, 7, 0, 7]], removed=[0]) == [7, 3]  # 3 falls to 1 behind 7
    assert order([[0, 3, 0, 3], [0, 7, 0, 3, 0, 7]], removed=[0]) == [7, 3]


ARCTIC = Path(__file__).parent / "data" / "arctic_suffix.json"


def test_proposals_equal_arctic_inferences_own():
    """Every proposal of ArcticInference's SuffixDecodingCache (vLLM's suffix method) in 300 recorded runs:
    small vocabularies (ties everywhere), FIFO eviction, truncated depths, factors, offsets, thresholds
    (tests/data/make_arctic_suffix.py wrote them with arctic_inference itself)."""
    data = json.loads(ARCTIC.read_text())
    proposals = differ = 0
    for case in data["cases"]:
        speculator = SuffixSpeculator(SuffixDraft(depth=case["depth"], factor=case["factor"], offset=case["offset"],
                                                  prob=case["prob"], requests=case["requests"]))
        tree = parse_tree(f"chain:{case['k']}")
        for run in case["requests_run"]:
            speculator.start(run["prompt"])
            for t, draft, _ in run["steps"]:
                got = speculator.propose(np.array(run["prompt"] + run["output"][:t]), tree)[1:]
                proposals += 1
                differ += [int(x) for x in got if x >= 0] != draft
            speculator.finish(np.array(run["prompt"] + run["output"]))
    assert proposals > 5000 and differ == 0, f"{differ} of {proposals} proposals differ from ArcticInference's"


@pytest.mark.parametrize("text, message", [
    ("suffix:depth=0", "depth must be at least 1"), ("suffix:prob=2", "above 1"),
    ("suffix:factor=x", "not a non-negative number"), ("suffix:depth=2.5", "not a non-negative integer"),
    ("suffix:width=3", "not one of depth, factor, offset, prob, requests"), ("suffix:depth=3,depth=4", "twice")])
def test_parse_errors(text, message):
    with pytest.raises(SpecError, match=message):
        parse_suffix(text)


def test_names_round_trip():
    assert parse_suffix("suffix").name == "suffix"
    assert parse_suffix("SUFFIX:prob=0.1,factor=2").name == "suffix:factor=2"
    assert parse_suffix(parse_suffix("suffix:depth=8,offset=1").name) == SuffixDraft(depth=8, offset=1.0)


# -- replay against real decoding on a toy model ---------------------------------------------------


def suffix_decode(target: MarkovLM, prompts, n: int, tree: Tree, spec: str, rng, *, greedy: bool) -> list[int]:
    """Real speculative decoding of the prompts one after another with one SuffixDecoding state:
    point-mass candidates verified with specsim.verify; target calls per prompt."""
    speculator = SuffixSpeculator(parse_suffix(spec))
    calls = []
    for prompt in prompts:
        seq = [int(x) for x in prompt]
        speculator.start(np.array(seq))
        out: list[int] = []
        count = 0
        while len(out) < n:
            tokens = speculator.propose(np.array(seq + out), tree)
            emitted, _ = point_mass_call(
                target, seq + out, lambda node: [(int(c), int(tokens[c])) for c in tree.children(node) if tokens[c] >= 0],
                0, n - 1 - len(out), rng, greedy=greedy)
            out.extend(emitted)
            count += 1
        speculator.finish(np.array(seq + out[:n]))
        calls.append(count)
    return calls


def repetitive(vocab: int = 5, order: int = 2, seed: int = 0) -> MarkovLM:
    """A chain that mostly repeats a few phrases: suffix matches within and across requests."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(vocab, 0.3), size=vocab**order) + 1e-3
    return MarkovLM.from_probs(probs / probs.sum(1, keepdims=True), order)


N_TOKENS = 24


def test_greedy_replay_equals_real_decoding_per_trajectory(tmp_path):
    target = repetitive()
    prompts = random_prompts(5, 2, 10, seed=4)
    cache = record_cache(tmp_path / "g.h5", target, target, prompts, N_TOKENS, temperatures=(0.0,))
    for spec, tree in (("suffix:factor=2", "chain:4"), ("suffix:prob=0.05", "widths:2,2,1")):
        real = suffix_decode(target, prompts, N_TOKENS, parse_tree(tree), spec, None, greedy=True)
        req = sweep(cache, SweepConfig(trees=[tree], drafts=[spec], policies=["greedy"], n_boot=0, by_category=False)).requests.sort("prompt_index")
        assert req["target_calls"].to_list() == [float(c) for c in real], spec
        assert sum(real) < len(prompts) * N_TOKENS  # something was accepted: the check has teeth
    # A replay without the other requests' outputs (requests=0) differs: the order-dependent state matters.
    real = suffix_decode(target, prompts, N_TOKENS, parse_tree("chain:4"), "suffix:factor=2", None, greedy=True)
    alone = sweep(cache, SweepConfig(trees=["chain:4"], drafts=["suffix:factor=2,requests=0"], policies=["greedy"], n_boot=0, by_category=False)).requests.sort("prompt_index")
    assert alone["target_calls"].to_list() != [float(c) for c in real]


def test_sampling_replay_matches_real_decoding_in_distribution(tmp_path):
    target = repetitive(seed=1)
    prompts = random_prompts(5, 2, 150, seed=8)
    tree, spec = parse_tree("widths:2,1,1"), "suffix:factor=2"
    cache = record_cache(tmp_path / "s.h5", target, target, prompts, N_TOKENS, temperatures=(1.0,), seed=3)
    sim = sweep(cache, SweepConfig(trees=["widths:2,1,1"], drafts=[spec], policies=["sample"], n_boot=0, by_category=False)).requests["target_calls"].to_numpy()
    real = np.array(suffix_decode(target, prompts, N_TOKENS, tree, spec, np.random.default_rng(5), greedy=False))
    se = np.sqrt(sim.var(ddof=1) / sim.size + real.var(ddof=1) / real.size)
    z = (sim.mean() - real.mean()) / se
    assert abs(z) < 4, f"replay {sim.mean():.3f} vs real {real.mean():.3f} calls per trajectory (z={z:.2f})"
    assert real.mean() < N_TOKENS - 2  # drafts were accepted


def test_suffix_refuses_what_it_cannot_replay(tmp_path):
    target = repetitive()
    cache = record_cache(tmp_path / "r.h5", target, target, random_prompts(5, 2, 2, seed=4), 8,
                         temperatures=(1.0,))
    with pytest.raises(SpecError, match="model-free draft suffix has no q"):
        sweep(cache, SweepConfig(trees=["chain:2"], drafts=["suffix"], policies=["p>=q"], n_boot=0))
    with pytest.raises(SpecError, match="depth must be at least 1"):
        sweep(cache, SweepConfig(trees=["chain:2"], drafts=["suffix:depth=0"], policies=["sample"], n_boot=0))


def test_live_engine_equals_the_replay_call_for_call(tiny_model_dir, tmp_path):
    """The live engine (tiny Llama, tree verification over its KV cache) drafts with the same state as the
    replay: a repeated request is drafted from the first one's output, call for call as replayed."""
    import torch

    from specsim.cache.layout import CacheSpec, PromptRecord
    from specsim.cache.writer import CacheWriter
    from specsim.live.drafting import SuffixDrafter
    from specsim.live.decoder import LiveConfig, Target, decode, plain_decode
    from specsim.record.models import eos_token_ids, load_model
    from specsim.sim.features import load_features
    from specsim.sim.policies import run_policy
    from specsim.specs import parse_policy

    torch.set_num_threads(1)
    loaded = load_model(str(tiny_model_dir))
    target = Target(loaded.model, eos_token_ids(loaded))
    prompts = [np.array([11, 12, 13, 14]), np.array([11, 12, 13, 14]), np.array([40, 41, 11, 12])]
    n, spec, tree = 14, "suffix:prob=0,factor=2", parse_tree("widths:2,1,1")
    plain = [plain_decode(target, p, temperature=0.0, max_new_tokens=n, rng=np.random.default_rng(0)).tokens
             for p in prompts]
    run = decode(target, SuffixDrafter(spec), prompts, [np.random.default_rng(i) for i in range(3)],
                 LiveConfig(tree=tree, max_new_tokens=n))
    V = loaded.model.config.vocab_size
    records = [PromptRecord(i, "c", f"p{i}", p.astype(np.int32)) for i, p in enumerate(prompts)]
    with CacheWriter.create(tmp_path / "c.h5", CacheSpec(vocab_size=V, drafts=("d",), temperatures=(0.0,)),
                            records) as writer:
        for i, out in enumerate(plain):
            zeros = np.zeros((len(out), V), dtype=np.float32)
            writer.append_trajectory(prompt_index=i, temperature=0.0, seed=0, tokens=out.astype(np.int32),
                                     target_logits=zeros, draft_logits={"d": zeros}, stop_reason="max_new_tokens")
    features = load_features(tmp_path / "c.h5", spec, 0.0, progress=False)
    length = run_policy(features, tree, parse_policy("greedy"), np.random.default_rng(0)).length
    for i, decoded in enumerate(run.decoded):
        assert decoded.tokens.tolist() == plain[i].tolist()
        start = int(features.traj_start[i])
        assert [s.accepted for s in decoded.steps] == [int(length[start + s.start]) for s in decoded.steps]
    assert sum(s.accepted for s in run.decoded[1].steps) >= n // 2  # the repeat is drafted from the first output


def test_cli_keeps_key_value_parameters_with_their_draft():
    from specsim.cli._common import _split

    assert _split(["suffix:factor=2,prob=0.1,ngram:3", "int8"]) == ["suffix:factor=2,prob=0.1", "ngram:3", "int8"]
    assert _split(["typical:0.09,0.3"], specs=True) == ["typical:0.09,0.3"]


def test_live_refuses_a_suffix_batch_before_loading_any_model(tiny_model_dir):
    from click.testing import CliRunner

    from specsim.cli import main

    result = CliRunner().invoke(main, ["live", "--target", str(tiny_model_dir), "--draft", "suffix", "--tree",
                                       "chain:2", "--batch", "2", "--quiet"])
    assert result.exit_code != 0
    assert "one request at a time (--batch 1)" in result.output and "loading target" not in result.output

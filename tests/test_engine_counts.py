"""vLLM's spec-decode counters from the replay: checked against a brute force of vLLM's own loop.

vLLM's walk (docs/design.md §6): the prompt pass emits the first token; each later step drafts
(k tokens for a draft model, what the n-gram match gives for `vllm-ngram`), verifies, and counts
every accepted draft, also past the end of the output (the cache's overhang holds what the target
says there). The brute forces below follow a trajectory step by step, with the trajectory and its
overhang as one token sequence, and share no code with `specsim.sim.engine`.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import specsim
from specsim.cache.reader import CacheReader
from tests.synthetic import random_cache


def vllm_ngram_reference(context: list[int], lo: int, hi: int, k: int) -> list[int]:
    """vLLM's rule as its docstring states it, by direct comparison: the longest suffix of length <= hi that
    occurred earlier (ending before the last token), the earliest such occurrence, none below lo; the up to
    k tokens after it."""
    n = len(context)
    if n < lo:
        return []
    best, start = 0, None
    for s in range(n - 1):  # v: the longest suffix (at most hi) that occurs starting at s, ending before the end
        v = max((m for m in range(1, hi + 1) if s + m <= n - 1 and context[s : s + m] == context[n - m :]),
                default=0)
        if v > best:
            best, start = v, s
    if best < lo:
        return []
    return context[start + best : start + best + k]


def _trajectories(cache, T):
    """[(prompt ids, trajectory + overhang tokens, n, per-position draft rank incl. overhang)] at T."""
    out = []
    with CacheReader(cache) as r:
        for row in r.iter_trajectories(T):
            tokens = r.tokens(row.start, row.end).tolist()
            rank = r.stats("small", "rank", row.start, row.end) if "small" in r.spec.drafts else None
            logp = r.stats("target", "logprob", row.start, row.end)
            logq = r.stats("small", "logprob", row.start, row.end) if "small" in r.spec.drafts else None
            out.append((r.prompt_token_ids(row.prompt_index).tolist(), tokens, row.length, rank, logp, logq))
    return out


def brute_force(trajectories, propose, verify, k, *, begin=None, end=None):
    """vLLM's counters over `trajectories`, step by step: propose(context, i, t) -> drafts, verify(i, t, d) -> bool;
    begin(i) before trajectory i's first step and end(i, t) after its last (t: where its walk stopped), if given."""
    drafts = drafted = 0
    per_pos = [0] * k
    for i, (prompt, seq, n, *_rest) in enumerate(trajectories):
        if begin is not None:
            begin(i)
        t = 1  # the prompt pass emitted y_0
        while t < n:
            d = propose(prompt + seq[:t], i, t)
            a = 0
            while a < len(d) and verify(i, t + a, d[a]):
                a += 1
            if d:
                drafts, drafted = drafts + 1, drafted + len(d)
                for j in range(a):
                    per_pos[j] += 1
            t += a + 1
        if end is not None:
            end(i, t)
    return {"vllm_num_drafts": drafts, "vllm_num_draft_tokens": drafted,
            "vllm_num_accepted_tokens": sum(per_pos), "vllm_num_accepted_tokens_per_pos": per_pos}


COUNTERS = ("vllm_num_drafts", "vllm_num_draft_tokens", "vllm_num_accepted_tokens", "vllm_num_accepted_tokens_per_pos")


def _row(cache, **kw):
    return specsim.simulate(cache, by_category=False, n_boot=0, **kw).row(0, named=True)


@pytest.fixture(scope="module")
def over_cache(tmp_path_factory):
    return random_cache(tmp_path_factory.mktemp("eng") / "o.h5", n_prompts=8, length=30, vocab=5, noise=1.2,
                        temperatures=(0.0, 1.0), overhang=5, seed=4)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_model_chain_counters_equal_vllms_loop(over_cache, k):
    trajs = _trajectories(over_cache, 0.0)
    want = brute_force(trajs, lambda ctx, i, t: [0] * k, lambda i, pos, _: trajs[i][3][pos] == 0, k)
    row = _row(over_cache, trees=[f"chain:{k}"], drafts=["small"], policies=["greedy"])
    assert {c: row[c] for c in COUNTERS} == want and row["vllm_counts"] == "exact"
    assert row["vllm_mean_acceptance_length"] == pytest.approx(1 + want["vllm_num_accepted_tokens"] /
                                                               want["vllm_num_drafts"])


@pytest.mark.parametrize("lo,hi,k", [(1, 1, 3), (2, 3, 4), (1, 4, 2), (3, 3, 5)])
def test_vllm_ngram_counters_equal_vllms_loop(over_cache, lo, hi, k):
    trajs = _trajectories(over_cache, 0.0)
    want = brute_force(trajs, lambda ctx, i, t: vllm_ngram_reference(ctx, lo, hi, k),
                       lambda i, pos, x: trajs[i][1][pos] == x, k)
    row = _row(over_cache, trees=[f"chain:{k}"], drafts=[f"vllm-ngram:min={lo},max={hi}"], policies=["greedy"])
    assert {c: row[c] for c in COUNTERS} == want and row["vllm_counts"] == "exact"
    assert want["vllm_num_drafts"] > 5  # the small vocabulary repeats: matches happen


def test_sampled_chain_counters_are_vllms_expectation(over_cache):
    """T > 0: the exact expectation of vLLM's counters, by a recursion over start positions that knows only
    β_t = min(1, q/p) along the trajectory and its overhang."""
    k = 3
    expected = np.zeros(3 + k)  # drafts, drafted, accepted, per position
    for _, seq, n, _, logp, logq in _trajectories(over_cache, 1.0):
        beta = np.minimum(1.0, np.exp(logq - logp))
        memo = {}

        def from_(t):  # expected counters of the calls from output position t on
            if t >= n:
                return np.zeros(3 + k)
            if t not in memo:
                total = np.array([1.0, k, 0.0] + [0.0] * k)
                survive = 1.0
                for a in range(k + 1):  # P(A = a) = Π_{j<a} β · (1 - β_a), A = k: all accepted
                    p_a = survive * (1.0 - beta[t + a]) if a < k else survive
                    total[2] += p_a * a
                    total[3 : 3 + a] += p_a
                    total += p_a * from_(t + min(a, n - 1 - t) + 1)
                    if a < k:
                        survive *= beta[t + a]
                memo[t] = total
            return memo[t]

        expected += from_(1)
    row = _row(over_cache, trees=[f"chain:{k}"], drafts=["small"], policies=["sample"], temperatures=[1.0])
    got = [row["vllm_num_drafts"], row["vllm_num_draft_tokens"], row["vllm_num_accepted_tokens"],
           *row["vllm_num_accepted_tokens_per_pos"]]
    np.testing.assert_allclose(got, expected, rtol=1e-9)
    assert row["vllm_counts"].startswith("expected")


def test_greedy_draft_at_t1_accepts_the_draft_argmax_where_it_is_the_sampled_token(over_cache):
    """vLLM's default draft_sample_method: the draft proposes its argmax, verified as a point mass, so a
    draft is accepted iff it equals the token the target sampled: rank 0 on the T=1 trajectory."""
    trajs = _trajectories(over_cache, 1.0)
    want = brute_force(trajs, lambda ctx, i, t: [0] * 4, lambda i, pos, _: trajs[i][3][pos] == 0, 4)
    row = _row(over_cache, trees=["chain:4"], drafts=["small"], policies=["greedy-draft"], temperatures=[1.0])
    assert {c: row[c] for c in COUNTERS} == want and row["vllm_counts"] == "exact"


def test_without_an_overhang_the_counts_are_a_lower_bound_and_say_so(tmp_path, over_cache):
    from dataclasses import replace

    from specsim.cache.writer import CacheWriter

    bare = tmp_path / "bare.h5"  # the same trajectories, their overhang rows left behind
    with CacheReader(over_cache) as r, CacheWriter.create(bare, r.spec, r._prompts) as w:
        for traj in r.iter_trajectories():
            w.append_copy(r, replace(traj, overhang=0))
    with_tail = _row(over_cache, trees=["chain:5"], drafts=["small"], policies=["greedy"])
    row = _row(bare, trees=["chain:5"], drafts=["small"], policies=["greedy"])
    assert row["vllm_counts"].startswith("a lower bound at each request's last call")
    assert "--overhang" in row["vllm_counts"]
    # the same trajectories minus their overhang rows: the walk is the same, only the last calls count less
    assert row["vllm_num_drafts"] == with_tail["vllm_num_drafts"]
    assert row["vllm_num_accepted_tokens"] <= with_tail["vllm_num_accepted_tokens"]
    short = _row(over_cache, trees=["chain:6"], drafts=["small"], policies=["greedy"])
    assert short["vllm_counts"].startswith("a lower bound") and "5 positions past" in short["vllm_counts"]


def test_the_brute_force_rejects_a_replay_that_starts_at_the_first_token(over_cache, monkeypatch):
    """The check can fail: a replay whose engine walk starts where specsim's does (output position 0, no
    prompt-pass token) counts other drafts."""
    import specsim.sim.engine as engine

    trajs = _trajectories(over_cache, 0.0)
    want = brute_force(trajs, lambda ctx, i, t: [0] * 3, lambda i, pos, _: trajs[i][3][pos] == 0, 3)
    real, real_point = engine.occupancy, engine.deterministic_occupancy
    monkeypatch.setattr(engine, "occupancy", lambda table, features, first=0: real(table, features, 0))
    monkeypatch.setattr(engine, "deterministic_occupancy", lambda length, features, first=0: real_point(length,
                                                                                                         features, 0))
    row = _row(over_cache, trees=["chain:3"], drafts=["small"], policies=["greedy"])
    assert {c: row[c] for c in COUNTERS} != want


def test_request_rows_carry_each_requests_counters(over_cache):
    from specsim.sim.sweep import SweepConfig, sweep

    result = sweep(over_cache, SweepConfig(trees=["chain:3"], drafts=["small"], policies=["greedy"], n_boot=0))
    row, requests = result.rows.row(0, named=True), result.requests
    assert requests["vllm_num_drafts"].sum() == row["vllm_num_drafts"]
    assert requests["vllm_num_accepted_tokens"].sum() == row["vllm_num_accepted_tokens"]


def test_every_row_has_the_counters_and_adaptive_rules_leave_them_empty(over_cache):
    rows = specsim.simulate(over_cache, trees=["chain:3", "kary:2,2"], drafts=["small"],
                            policies=["greedy", "adaptive-hf"], temperatures=[0.0], by_category=False, n_boot=0)
    fixed = rows.filter(rows["policy"] == "greedy")
    assert fixed["vllm_num_drafts"].null_count() == 0 and (fixed["vllm_counts"] == "exact").all()
    adaptive = rows.filter(rows["policy"] == "adaptive-hf")
    assert adaptive["vllm_num_drafts"].null_count() == adaptive.height
    assert adaptive["vllm_mean_acceptance_length"].null_count() == adaptive.height


# -- the n-gram rule itself ---------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(context=st.lists(st.integers(0, 3), max_size=40), lo=st.integers(1, 4), extra=st.integers(0, 3),
       k=st.integers(1, 6))
def test_vllm_ngram_equals_its_rule_on_any_context(context, lo, extra, k):
    from specsim.sim.modelfree import vllm_ngram

    got = vllm_ngram(np.array(context, dtype=np.int64), lo, lo + extra, k).tolist()
    assert got == vllm_ngram_reference(context, lo, lo + extra, k)


def test_vllm_ngram_edge_cases():
    from specsim.sim.modelfree import vllm_ngram

    f = lambda ctx, lo, hi, k: vllm_ngram(np.array(ctx), lo, hi, k).tolist()  # noqa: E731
    assert f([1, 2], 3, 3, 4) == []  # shorter than min
    assert f([5, 6, 7, 5, 6], 2, 2, 3) == [7, 5, 6]  # a match at the very start, continuation up to the end
    assert f([5, 6, 9, 5, 6, 8, 5, 6], 2, 2, 1) == [9]  # two matches of equal length: the earliest
    assert f([5, 6, 9, 4, 6, 8, 5, 6], 1, 2, 1) == [9]  # longer beats later: (5, 6) at 0, not (6) at 4
    assert f([7, 7, 7, 7], 1, 3, 4) == [7]  # overlapping occurrence: (7,7,7) at 0, one token follows it
    assert f([1, 2, 3], 1, 2, 4) == []  # no earlier occurrence


def test_vllm_ngram_specs():
    from specsim.errors import SpecError
    from specsim.sim.modelfree import parse_modelfree

    assert parse_modelfree("vllm-ngram:min=2,max=3").name == "vllm-ngram:min=2,max=3"
    assert parse_modelfree("vllm-ngram:max=4").name == "vllm-ngram:min=4,max=4"  # vLLM: a missing bound copies
    for bad, why in [("vllm-ngram", "give the match lengths"), ("vllm-ngram:min=3,max=2", "above max"),
                     ("vllm-ngram:n=3", "is not min=A or max=B"), ("vllm-ngram:min=0", "integer >= 1"),
                     ("vllm-ngram:min=2,min=3", "given twice")]:
        with pytest.raises(SpecError, match=why):
            parse_modelfree(bad)


def test_suffix_counters_follow_vllms_history(over_cache):
    """vLLM caches each request's sampled tokens before trimming them, so the global suffix tree of later
    requests also holds what a request's last step accepted past its end: the brute force keeps that history."""
    from specsim.sim.suffix import SuffixSpeculator, parse_suffix
    from specsim.specs import parse_tree

    k = 3
    tree = parse_tree(f"chain:{k}")
    spec = SuffixSpeculator(parse_suffix("suffix"))
    trajectories = list(_trajectories(over_cache, 0.0))
    expected = brute_force(
        trajectories, lambda context, i, t: [int(x) for x in spec.propose(np.array(context), tree)[1:] if x >= 0],
        lambda i, t, d: d == trajectories[i][1][t], k, begin=lambda i: spec.start(trajectories[i][0]),
        end=lambda i, t: spec.finish(trajectories[i][0] + trajectories[i][1][: max(trajectories[i][2], t)]))
    row = _row(over_cache, trees=[f"chain:{k}"], drafts=["suffix"], policies=["greedy"])
    assert {c: row[c] for c in COUNTERS} == expected
    assert expected["vllm_num_drafts"] > 20

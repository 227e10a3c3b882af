"""Live engine pieces (tree forward, KV keep, the verification walk, drafters) and the `specsim live` CLI."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner

from specsim.cli import main
from specsim.live.drafting import ModelDrafter, ModelFreeDrafter, top_ranked
from specsim.live.decoder import LiveConfig, Target, decode, plain_decode, speculative_decode, verify_tree
from specsim.record.kv import SlotKV
from specsim.record.models import eos_token_ids, load_draft, load_model
from specsim.specs import parse_tree
from tests.cli_helpers import one_line_error


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    torch.set_num_threads(1)
    return load_model(str(tiny_model_dir))


def _chain_logits(model, tokens) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.as_tensor(np.asarray(tokens))[None]).logits[0, -1].float()


def _path(tree, node):
    path = [node]
    while path[-1] != 0:
        path.append(int(tree.parents[path[-1]]))
    return path[::-1]


def test_tree_forward_of_a_batch_equals_each_branch_run_as_a_chain(tiny):
    """One masked forward over a tree, two rows of different lengths: every node gets its own chain's logits."""
    tree = parse_tree("widths:3,2,1")
    contexts = [np.arange(20, 32), np.arange(40, 47)]
    tokens = np.stack([np.arange(100, 100 + tree.n_nodes), np.arange(150, 150 + tree.n_nodes)])
    kv = SlotKV(tiny.model)
    kv.start(contexts)
    logits = kv.forward(tokens, tree.depths, tree.ancestor_mask())  # (2, n_nodes, V)
    for r, context in enumerate(contexts):
        for node in range(tree.n_nodes):
            expected = _chain_logits(tiny.model, np.concatenate([context, tokens[r, _path(tree, node)]]))
            torch.testing.assert_close(logits[r, node], expected, atol=1e-4, rtol=1e-4)


def test_commit_leaves_each_row_the_cache_of_its_accepted_path(tiny):
    """After commit(), the next token's logits equal those of a cache fed the accepted path plainly."""
    tree = parse_tree("kary:2,2")
    contexts = [np.arange(40, 50), np.arange(60, 66)]
    tokens = np.stack([np.arange(200, 200 + tree.n_nodes), np.arange(230, 230 + tree.n_nodes)])
    kv = SlotKV(tiny.model)
    kv.start(contexts)
    kv.forward(tokens, tree.depths, tree.ancestor_mask())
    paths = [np.array([0, 2, 6]), np.array([0, 1])]  # root, second child, its second child | root, first child
    kv.commit(paths)
    assert kv.lengths.tolist() == [13, 8]
    after = kv.feed_chains([np.array([7]), np.array([8, 9])])
    for r, (context, path, tail) in enumerate(zip(contexts, paths, ([7], [8, 9]))):
        expected = _chain_logits(tiny.model, np.concatenate([context, tokens[r, path], tail]))
        torch.testing.assert_close(after[r], expected, atol=1e-4, rtol=1e-4)


def test_rows_leave_and_join_between_steps(tiny):
    kv = SlotKV(tiny.model)
    kv.start([np.arange(10, 20), np.arange(30, 34)])
    kv.drop(np.array([1]))
    late = SlotKV(tiny.model)
    late.start([np.arange(50, 75)])
    kv.append(late)
    out = kv.feed_chains([np.array([5]), np.array([6])])
    torch.testing.assert_close(out[0], _chain_logits(tiny.model, [*range(30, 34), 5]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[1], _chain_logits(tiny.model, [*range(50, 75), 6]), atol=1e-4, rtol=1e-4)


def test_a_request_joins_a_batch_whose_cache_is_wider_than_its_own(tiny):
    """Continuous batching admits a short prompt into a batch holding a long one: the newcomer's cache grows to the
    batch's width exactly (growing by doubling overshot it, and the join failed with a size mismatch)."""
    kv = SlotKV(tiny.model)
    kv.start([np.arange(1, 101) % 300])  # 100 slots
    late = SlotKV(tiny.model)
    late.start([np.arange(200, 260)])  # 64 slots; doubling them would give 128
    kv.append(late)
    out = kv.feed_chains([np.array([5]), np.array([6])])
    torch.testing.assert_close(out[0], _chain_logits(tiny.model, [*(np.arange(1, 101) % 300), 5]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[1], _chain_logits(tiny.model, [*range(200, 260), 6]), atol=1e-4, rtol=1e-4)


def test_top_ranked_breaks_ties_by_the_lower_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0] + [0.0] * 20, [0.0] * 24 + [9.0]])
    np.testing.assert_array_equal(top_ranked(logits, 3), [[1, 2, 4], [24, 0, 1]])
    np.testing.assert_array_equal(top_ranked(logits, 1), [[1], [24]])
    ties = torch.zeros((1, 40))  # a tie run longer than the top-k slack: the full sort decides
    np.testing.assert_array_equal(top_ranked(ties, 4), [[0, 1, 2, 3]])


def test_greedy_walk_follows_the_argmax_and_emits_the_bonus():
    tree = parse_tree("widths:2,1")  # root -> nodes 1, 2; node 1 -> node 3
    tokens = np.array([9, 4, 5, 6])
    top = {0: 5, 1: 0, 2: 7, 3: 1}  # root picks 5 (node 2, a leaf); bonus at node 2 is 7
    verdict = verify_tree(tree, tokens, np.ones(4, bool), policy="greedy", multi_draft="iid",
                          rng=np.random.default_rng(0), top_of=top.__getitem__)
    assert verdict.path == (2,) and verdict.token == 7


def test_batched_greedy_live_equals_plain_greedy_per_prompt(tiny):
    """Lockstep and continuous batches of 3 (5 prompts of different lengths): each output is plain greedy's."""
    target = Target(tiny.model, eos_token_ids(tiny))
    prompts = [np.arange(20, 20 + k) * 3 % 300 for k in (5, 9, 14, 6, 11)]
    plain = [plain_decode(target, p, temperature=0.0, max_new_tokens=15, rng=np.random.default_rng(0)).tokens
             for p in prompts]
    drafter = ModelDrafter(load_draft("layers:2", tiny).model, "layers:2")
    rngs = [np.random.default_rng(i) for i in range(5)]
    for batching in ("lockstep", "continuous"):
        for tree in ("chain:3", "kary:2,2"):
            config = LiveConfig(tree=parse_tree(tree), max_new_tokens=15, batch=3, batching=batching)
            run = decode(target, drafter, prompts, rngs, config)
            assert [d.tokens.tolist() for d in run.decoded] == [p.tolist() for p in plain], (batching, tree)
            assert max(s.batch for s in run.steps) == 3
            assert sum(s.emitted for s in run.steps) == sum(len(p) for p in plain)
            if batching == "continuous":  # a finished request's place is refilled while prompts wait
                sizes = [s.batch for s in run.steps]
                assert sizes[: sizes.index(min(sizes))].count(3) > 0


def test_a_request_drafts_only_what_it_can_still_accept(tiny):
    """Near the output limit the tree is cut to the remaining room: no call drafts past it."""
    target = Target(tiny.model, eos_token_ids(tiny))
    drafter = ModelDrafter(load_draft("layers:2", tiny).model, "layers:2")
    out = speculative_decode(target, drafter, np.arange(30, 40), LiveConfig(tree=parse_tree("chain:4"),
                                                                            max_new_tokens=10),
                             np.random.default_rng(0))
    for s in out.steps:
        assert s.drafted == min(4, 10 - 1 - s.start)


def test_model_free_live_equals_plain_greedy(tiny):
    target = Target(tiny.model, eos_token_ids(tiny))
    prompt = np.array([50, 60, 70, 50, 60, 70, 50, 60])
    plain = plain_decode(target, prompt, temperature=0.0, max_new_tokens=20, rng=np.random.default_rng(0))
    for spec, tree in (("ngram:2", "chain:3"), ("prompt-lookup:3", "widths:2,1,1")):
        live = speculative_decode(target, ModelFreeDrafter(spec), prompt,
                                  LiveConfig(tree=parse_tree(tree), max_new_tokens=20), np.random.default_rng(0))
        assert live.tokens.tolist() == plain.tokens.tolist()
        assert all(s.drafted <= parse_tree(tree).budget for s in live.steps)


def test_config_errors_say_what_to_do():
    from specsim.errors import SpecError

    with pytest.raises(SpecError, match="use policy sample"):
        LiveConfig(tree=parse_tree("chain:2"), policy="greedy", temperature=0.7)
    with pytest.raises(SpecError, match="temperature > 0"):
        LiveConfig(tree=parse_tree("chain:2"), policy="sample", temperature=0.0)


def test_live_cli_writes_simulate_columns_and_steps(tiny_model_dir, tiny_prompts_file, tiny_cache, tmp_path):
    out, steps = tmp_path / "live.parquet", tmp_path / "steps.parquet"
    result = CliRunner().invoke(main, [
        "live", "--target", str(tiny_model_dir), "--draft", "layers:2", "--prompts", str(tiny_prompts_file),
        "--per-category", "1", "--tree", "widths:2,1", "--max-new-tokens", "10", "--threads", "1",
        "--out", str(out), "--steps-out", str(steps), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "greedy output identical to plain greedy decoding: 100% of decodes" in result.output
    assert "2 prompts x 1 repeat(s), max 10 new tokens" in result.output
    rows = pl.read_parquet(out)
    assert rows["category"].to_list() == ["all", "math", "writing"]
    from specsim.sim.sweep import simulate

    sim = simulate(tiny_cache, trees=["widths:2,1"], drafts=["layers:2"], policies=["greedy"], n_boot=10)
    shared = {"tree", "budget", "depth", "draft", "policy", "temperature", "multi_draft", "category",
              "accept_rate", "tokens_per_call", "calls_per_100_tokens", "n_prompts", "n_positions"}
    assert shared <= set(rows.columns) & set(sim.columns)
    assert {"depth_1", "depth_2"} <= set(rows.columns)  # per-depth acceptance, flattened as every writer does
    every = pl.read_parquet(steps)
    assert every["accepted"].sum() + len(every) == rows.filter(pl.col("category") == "all")["n_positions"][0]
    assert rows["tokens_per_call"][0] == pytest.approx(rows["n_positions"][0] / len(every))


def test_live_cli_decodes_a_batch_against_plain_batched_decoding(tiny_model_dir, tiny_prompts_file, tmp_path):
    out = tmp_path / "live.csv"
    result = CliRunner().invoke(main, [
        "live", "--target", str(tiny_model_dir), "--draft", "int8", "--prompts", str(tiny_prompts_file),
        "--tree", "chain:3", "--max-new-tokens", "8", "--batch", "2", "--batching", "continuous", "--threads", "1",
        "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "batch 2 (continuous)" in result.output
    assert "greedy output identical to plain greedy decoding: 100% of decodes" in result.output
    row = pl.read_csv(out).filter(pl.col("category") == "all").row(0, named=True)
    assert row["batch"] == 2 and row["batching"] == "continuous" and row["n_decodes"] == 4
    assert row["latency_per_token_ms"] > 0


def test_batched_throughput_is_a_ratio_of_engine_timelines():
    """At batch > 1 requests share engine steps: the 'all' row's tokens/s is the run's tokens over the
    engine's step time (not over the requests' summed times, which count a shared step once per request),
    and its speedup the ratio of the two timelines. Figures worked by hand from a made-up run."""
    from specsim.live.decoder import DecodeRun, Decoded, EngineStep, StepRecord
    from specsim.live.runs import LivePrompt, LiveRun, LiveTrajectory, summary_rows

    def step(seconds, batch=2):
        return EngineStep(batch=batch, verified=3, draft_levels=(1, 1, 1), emitted=3, draft_s=seconds / 2,
                          verify_s=seconds / 2, seconds=seconds)

    def record(start, accepted):
        return StepRecord(start=start, accepted=accepted, path=tuple(range(1, accepted + 1)), drafted=3,
                          draft_s=0.1, verify_s=0.2, batch=2)

    live = [Decoded(np.arange(4), (record(0, 1), record(2, 1)), seconds=1.5, stop_reason="max_new_tokens"),
            Decoded(np.arange(2), (record(0, 1),), seconds=1.0, stop_reason="eos")]
    plain = [Decoded(np.arange(4), (), seconds=4.0, stop_reason="max_new_tokens"),
             Decoded(np.arange(2), (), seconds=2.0, stop_reason="eos")]
    prompts = [LivePrompt(0, "a", np.arange(3)), LivePrompt(1, "b", np.arange(3))]
    run = LiveRun(config=LiveConfig(tree=parse_tree("chain:3"), batch=2), target="t", draft="int8",
                  trajectories=[LiveTrajectory(p, 0, 0, s, q) for p, s, q in zip(prompts, live, plain)],
                  spec_run=DecodeRun(live, steps=[step(1.0), step(0.5, batch=1)]),
                  plain_run=DecodeRun(plain, steps=[step(1.0)] * 4))
    rows = {r["category"]: r for r in summary_rows(run, n_boot=10)}
    assert rows["all"]["live_tokens_per_s"] == pytest.approx(6 / 1.5)
    assert rows["all"]["plain_tokens_per_s"] == pytest.approx(6 / 4.0)
    assert rows["all"]["speedup"] == pytest.approx((6 / 1.5) / (6 / 4.0))
    assert rows["all"]["latency_per_token_ms"] == pytest.approx(1000 * (1.5 / 4 + 1.0 / 2) / 2)
    assert rows["a"]["live_tokens_per_s"] is None  # a category has no timeline of its own in a shared batch
    assert rows["all"]["tokens_per_call"] == pytest.approx(6 / 3)


def test_live_intervals_resample_prompts_with_their_repeats_summed():
    """A prompt decoded three times is one draw of a prompt, not three: the row's interval is the bootstrap of the
    per-prompt sums (the same resampling counts as `ratio_estimates` over 3 rows), not of the 9 decodes, and the
    point values are unchanged. The speedup has its interval too, from the engine times of both decodes of each
    request. Figures from a made-up run whose repeats are copies of each other."""
    from specsim.live.decoder import Decoded, StepRecord
    from specsim.live.runs import LivePrompt, LiveRun, LiveTrajectory, summary_rows, trajectory_stats
    from specsim.sim.metrics import ratio_estimates

    def decoded(accepted):
        steps = tuple(StepRecord(start=0, accepted=a, path=tuple(range(1, a + 1)), drafted=3, draft_s=0.1,
                                 verify_s=0.2, batch=1) for a in accepted)
        return Decoded(np.arange(sum(a + 1 for a in accepted)), steps, seconds=0.3 * len(steps),
                       stop_reason="max_new_tokens")

    per_prompt = {0: [0, 1, 0], 1: [3, 3, 2], 2: [1, 2, 3, 0]}  # accepted per call
    prompts = [LivePrompt(i, "c", np.arange(3)) for i in per_prompt]
    def plain(i):  # the plain decode of the same request: as many tokens, 0.25 s per step more for later prompts
        tokens = len(decoded(per_prompt[i]).tokens)
        return Decoded(np.arange(tokens), (), seconds=(0.25 + 0.05 * i) * tokens, stop_reason="max_new_tokens")

    trajectories = [LiveTrajectory(p, r, r, decoded(per_prompt[p.prompt_index]), plain(p.prompt_index))
                    for p in prompts for r in range(3)]
    run = LiveRun(config=LiveConfig(tree=parse_tree("chain:3")), target="t", draft="int8",
                  trajectories=trajectories)
    decodes, _ = trajectory_stats(run)
    summed, groups = trajectory_stats(run, by_prompt=True)
    assert list(groups.traj_prompt) == [0, 1, 2] and summed.tokens.sum() == decodes.tokens.sum()
    assert np.allclose(summed.reach, 3 * np.array([[1, 0, 0], [3, 3, 2], [3, 2, 1]]))
    row = summary_rows(run, by_category=False, n_boot=200, seed=3)[0]
    want = ratio_estimates(summed.tokens, summed.calls, n_boot=200, seed=3)[0]
    assert (row["tokens_per_call"], row["tokens_per_call_lo"], row["tokens_per_call_hi"]) == pytest.approx(
        (want.value, want.lo, want.hi))
    assert row["tokens_per_call"] == pytest.approx(decodes.tokens.sum() / decodes.calls.sum())
    speed = ratio_estimates(summed.plain, summed.cost, n_boot=200, seed=3)[0]  # the speedup's CI: engine times
    assert (row["speedup_lo"], row["speedup_hi"]) == pytest.approx((speed.lo, speed.hi))
    assert row["speedup_lo"] < row["speedup"] < row["speedup_hi"]
    assert row["speedup"] == pytest.approx(row["live_tokens_per_s"] / row["plain_tokens_per_s"])
    over_decodes = ratio_estimates(decodes.tokens, decodes.calls, n_boot=200, seed=3)[0]
    assert over_decodes.hi - over_decodes.lo < want.hi - want.lo  # copies resampled apart look like evidence


def test_live_cli_errors_are_one_line(tiny_model_dir, tmp_path):
    runner = CliRunner()
    bad_out = runner.invoke(main, ["live", "--target", str(tiny_model_dir), "--draft", "int8", "--out",
                                   str(tmp_path / "x.txt")])
    assert bad_out.exit_code == 2 and "unknown format .txt" in bad_out.output and bad_out.exception is not None
    assert len(bad_out.output.strip().splitlines()) == 1
    bad_tree = runner.invoke(main, ["live", "--target", str(tiny_model_dir), "--draft", "int8", "--tree", "chain:x"])
    one_line_error(bad_tree, "chain:x", code=2)
    greedy_hot = runner.invoke(main, ["live", "--target", str(tiny_model_dir), "--draft", "int8",
                                      "--temperature", "0.5"])
    one_line_error(greedy_hot, "use --policy sample", code=2)
    unrun = runner.invoke(main, ["live", "--target", str(tiny_model_dir), "--draft", "int8", "--policy", "greedy-draft"])
    one_line_error(unrun, "live policy 'greedy-draft' is not one of greedy, sample, block, p>=q, p>=lq, typical, "
                          "adaptive-hf, adaptive-history", code=2)
    cold = runner.invoke(main, ["live", "--target", str(tiny_model_dir), "--draft", "int8", "--policy", "typical",
                                "--temperature", "0"])
    one_line_error(cold, "--policy typical needs --temperature > 0", code=2)


def test_ctrl_c_keeps_the_decodes_that_finished(tiny):
    from specsim.live.runs import LivePrompt, run_live, summary_rows

    class StopsOnSecondPrompt(ModelFreeDrafter):
        def start(self, prompts):
            if prompts[0][0] == 80:
                raise KeyboardInterrupt

    prompts = [LivePrompt(0, "a", np.arange(50, 60)), LivePrompt(1, "b", np.arange(80, 90))]
    run = run_live(Target(tiny.model, eos_token_ids(tiny)), StopsOnSecondPrompt("ngram:2"), prompts,
                   LiveConfig(tree=parse_tree("chain:2"), max_new_tokens=6), target_name="tiny", progress=False)
    assert run.interrupted and [t.prompt.prompt_index for t in run.trajectories] == [0]
    rows = summary_rows(run, n_boot=0)
    assert rows[0]["interrupted"] and rows[0]["n_positions"] == 6


def test_lockstep_runs_alternate_plain_and_speculative_batches(tiny, monkeypatch):
    """Timing: plain and speculative decodes alternate over four segments of whole batches (ABBA), so a machine whose
    speed drifts during the run moves both sides of the speedup; the outputs are those of one plain and one
    speculative run."""
    import specsim.live.runs as runs

    calls = []

    def spy(target, drafter, prompts, rngs, config, **kw):
        calls.append(("spec" if drafter is not None else "plain", [int(p[0]) for p in prompts]))
        return decode(target, drafter, prompts, rngs, config, **kw)

    monkeypatch.setattr(runs, "decode", spy)
    prompts = [runs.LivePrompt(i, "a", np.arange(20 + 7 * i, 30 + 7 * i)) for i in range(5)]
    target, draft = Target(tiny.model, eos_token_ids(tiny)), load_draft("layers:2", tiny)
    config = LiveConfig(tree=parse_tree("chain:2"), max_new_tokens=6, batch=2)
    run = runs.run_live(target, ModelDrafter(draft.model, "layers:2"), prompts, config, target_name="tiny",
                        progress=False)
    assert calls == [("plain", [20, 27]), ("spec", [20, 27]), ("spec", [34, 41]), ("plain", [34, 41]),
                     ("plain", [48]), ("spec", [48])]  # three batches: three segments
    together = decode(target, None, [p.token_ids for p in prompts], [np.random.default_rng(0)] * 5, config.plain())
    for t, alone in zip(run.trajectories, together.decoded):
        np.testing.assert_array_equal(t.plain.tokens, alone.tokens)
        np.testing.assert_array_equal(t.live.tokens, alone.tokens)  # greedy: speculative output = plain output
    assert len(run.spec_run.decoded) == len(run.plain_run.decoded) == 5
    assert sum(s.batch for s in run.spec_run.steps) >= 5 and run.plain_run.prefill_s > 0
    calls.clear()
    runs.run_live(target, ModelDrafter(draft.model, "layers:2"), prompts * 2,
                  LiveConfig(tree=parse_tree("chain:2"), max_new_tokens=6, batch=1), target_name="tiny", progress=False)
    firsts = [20, 27, 34, 41, 48] * 2
    assert calls == [("plain", firsts[:3]), ("spec", firsts[:3]), ("spec", firsts[3:6]), ("plain", firsts[3:6]),
                     ("plain", firsts[6:8]), ("spec", firsts[6:8]), ("spec", firsts[8:]), ("plain", firsts[8:])]
    calls.clear()
    runs.run_live(target, ModelDrafter(draft.model, "layers:2"), prompts,
                  LiveConfig(tree=parse_tree("chain:2"), max_new_tokens=6, batch=2, batching="continuous"),
                  target_name="tiny", progress=False)
    assert [name for name, _ in calls] == ["plain", "spec"]  # continuous batching: one run each

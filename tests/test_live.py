"""Live engine pieces (tree forward, KV keep, the verification walk, drafters) and the `specsim live` CLI."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner

from specsim.cli import main
from specsim.live.drafting import ModelFreeDrafter, Proposal
from specsim.live.engine import LiveConfig, Target, plain_decode, speculative_decode, verify_tree
from specsim.live.tree_forward import KVModel, chain_parents, tree_attend
from specsim.record.models import eos_token_ids, load_model
from specsim.trees import parse_tree


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    torch.set_num_threads(1)
    return load_model(str(tiny_model_dir))


def test_tree_forward_equals_each_branch_run_as_a_chain(tiny):
    """One masked forward over a tree gives every node the logits of its root-to-node chain."""
    tree = parse_tree("widths:3,2,1")
    context = np.arange(20, 32)
    tokens = np.arange(100, 100 + tree.n_nodes)
    kv = KVModel(tiny.model)
    kv.start(context)
    attend = np.concatenate([np.ones((tree.n_nodes, len(context)), bool), tree.ancestor_mask()], axis=1)
    logits = kv.forward(tokens, len(context) + tree.depths, attend)
    for node in range(tree.n_nodes):
        path = [node]
        while path[-1] != 0:
            path.append(int(tree.parents[path[-1]]))
        chain = KVModel(tiny.model)
        expected = chain.feed_chain(np.concatenate([context, tokens[path[::-1]]]))[-1]
        torch.testing.assert_close(logits[node], expected, atol=1e-4, rtol=1e-4)


def test_keep_leaves_the_cache_of_the_accepted_path(tiny):
    """After keep(), the next token's logits equal those of a cache fed the accepted path plainly."""
    tree = parse_tree("kary:2,2")
    context, tokens = np.arange(40, 50), np.arange(200, 200 + tree.n_nodes)
    kv = KVModel(tiny.model)
    kv.start(context)
    attend = np.concatenate([np.ones((tree.n_nodes, len(context)), bool), tree.ancestor_mask()], axis=1)
    kv.forward(tokens, len(context) + tree.depths, attend)
    path = np.array([0, 2, 6])  # root, its second child, that child's second child
    kv.keep(len(context), path)
    assert kv.length == len(context) + 3
    after = kv.feed_chain(np.array([7]))[-1]
    plain = KVModel(tiny.model).feed_chain(np.concatenate([context, tokens[path], [7]]))[-1]
    torch.testing.assert_close(after, plain, atol=1e-4, rtol=1e-4)


def test_tree_attend_is_ancestors_and_self():
    np.testing.assert_array_equal(tree_attend(chain_parents(3)), np.tril(np.ones((3, 3), bool)))
    np.testing.assert_array_equal(tree_attend(np.array([-1, 0, 0, 1])),
                                  [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]])


def test_greedy_walk_follows_the_argmax_and_emits_the_bonus():
    tree = parse_tree("widths:2,1")  # root -> nodes 1, 2; node 1 -> node 3
    tokens = np.array([9, 4, 5, 6])
    logits = np.full((4, 8), -1.0)
    logits[0, 5] = logits[2, 7] = logits[1, 0] = 3.0  # root picks 5 (node 2, a leaf); bonus at node 2 is 7
    proposal = Proposal(tokens=tokens, valid=np.ones(4, bool), q_draft=None)
    verdict = verify_tree(tree, proposal, logits, policy="greedy", multi_draft="iid", rng=np.random.default_rng(0))
    assert verdict.path == (2,) and verdict.token == 7


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

    with pytest.raises(SpecError, match="use --policy sample"):
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
    from specsim.sim.api import simulate

    sim = simulate(tiny_cache, trees=["widths:2,1"], drafts=["layers:2"], policies=["greedy"], n_boot=10)
    shared = {"tree", "budget", "depth", "draft", "policy", "temperature", "multi_draft", "category",
              "accept_rate", "tokens_per_call", "calls_per_100_tokens", "depth_accept", "n_prompts", "n_positions"}
    assert shared <= set(rows.columns) & set(sim.columns)
    every = pl.read_parquet(steps)
    assert every["accepted"].sum() + len(every) == rows.filter(pl.col("category") == "all")["n_positions"][0]
    assert rows["tokens_per_call"][0] == pytest.approx(rows["n_positions"][0] / len(every))


def test_live_cli_errors_are_one_line(tiny_model_dir, tmp_path):
    runner = CliRunner()
    bad_out = runner.invoke(main, ["live", "--target", str(tiny_model_dir), "--draft", "int8", "--out",
                                   str(tmp_path / "x.txt")])
    assert bad_out.exit_code == 1 and "unknown format .txt" in bad_out.output and "Traceback" not in bad_out.output
    bad_tree = runner.invoke(main, ["live", "--target", str(tiny_model_dir), "--draft", "int8", "--tree", "chain:x"])
    assert bad_tree.exit_code == 1 and "Error:" in bad_tree.output and "Traceback" not in bad_tree.output
    greedy_hot = runner.invoke(main, ["live", "--target", str(tiny_model_dir), "--draft", "int8",
                                      "--temperature", "0.5"])
    assert greedy_hot.exit_code == 1 and "use --policy sample" in greedy_hot.output


def test_ctrl_c_keeps_the_decodes_that_finished(tiny):
    from specsim.live.runs import LivePrompt, run_live, summary_rows

    class StopsOnSecondPrompt(ModelFreeDrafter):
        def reset(self, prompt_ids):
            if prompt_ids[0] == 80:
                raise KeyboardInterrupt

    prompts = [LivePrompt(0, "a", np.arange(50, 60)), LivePrompt(1, "b", np.arange(80, 90))]
    run = run_live(Target(tiny.model, eos_token_ids(tiny)), StopsOnSecondPrompt("ngram:2"), prompts,
                   LiveConfig(tree=parse_tree("chain:2"), max_new_tokens=6), target_name="tiny", progress=False)
    assert run.interrupted and [t.prompt.prompt_index for t in run.trajectories] == [0]
    rows = summary_rows(run, n_boot=0)
    assert rows[0]["interrupted"] and rows[0]["n_positions"] == 6

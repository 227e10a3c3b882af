"""Back into the engine: optimize --emit and simulate --emit-acceptance write the engines' own terms."""

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from specsim.cli import main
from specsim.engines import emit
from specsim.errors import EngineError
from specsim.specs import parse_tree


def test_the_batch_schedule_is_vllms_inclusive_ranges_from_one():
    assert emit.batch_schedule({4: 2, 1: 3, 16: 0}) == [[1, 1, 3], [2, 4, 2], [5, 16, 0]]
    base = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 3, "num_speculative_tokens": 9}
    one = emit.vllm_config(base, {1: 3})
    assert one == {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 3, "num_speculative_tokens": 3}
    many = emit.vllm_config(base, {1: 4, 8: 2})
    assert many["num_speculative_tokens"] == 4 and many["num_speculative_tokens_per_batch_size"] == [[1, 1, 4],
                                                                                                    [2, 8, 2]]
    with pytest.raises(EngineError, match="plain decoding is faster at every batch size"):
        emit.vllm_config(base, {1: 0, 4: 0})


def test_synthetic_rates_are_vllms_per_position_rates_and_never_increase():
    config = emit.vllm_synthetic({"method": "ngram"}, [40, 20, 20.0000001, 5], 80)
    assert config["rejection_sample_method"] == "synthetic"
    assert config["synthetic_acceptance_rates"] == [0.5, 0.25, 0.25, 0.0625]
    with pytest.raises(EngineError, match="no drafting step"):
        emit.vllm_synthetic({}, [0], 0)


def test_sglang_flags_for_chains_and_dynamic_trees():
    flags = emit.sglang_flags("layers:20", parse_tree("chain:3"), draft_dir="/m/d")
    assert flags == ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/m/d",
                     "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", "4"]
    dyn = emit.sglang_flags("layers:20", parse_tree("dynamic:topk=4,depth=3,tokens=8"), draft_dir="/m/d")
    assert dyn[-6:] == ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                        "--speculative-num-draft-tokens", "9"]
    for draft, tree, why in [("vllm-ngram:min=2,max=3", "chain:3", "draft models"),
                             ("layers:20", "kary:2,2", "not a fixed static tree")]:
        with pytest.raises(EngineError, match=why):
            emit.sglang_flags(draft, parse_tree(tree), draft_dir="/m/d")


def test_optimize_emits_a_length_per_batch_size_chosen_by_speed(tmp_path):
    from tests.synthetic import random_cache
    from tests.test_cost import profile_body, write

    cache = random_cache(tmp_path / "c.h5", vocab=4, temperatures=(0.0,), overhang=4, max_new_tokens=30)
    profile = write(tmp_path / "p.json", profile_body())
    out = tmp_path / "spec.json"
    args = ["optimize", str(cache), "--draft", "vllm-ngram:min=1,max=2", "--budget", "4", "--cost-profile",
            str(profile)]
    res = CliRunner().invoke(main, [*args, "--batch", "1,4", "--emit", "vllm", str(out)])
    assert res.exit_code == 0, res.output
    config = json.loads(out.read_text())
    chosen = {int(line.split()[1].rstrip(":")): line for line in res.output.splitlines() if "  batch " in line}
    assert set(chosen) == {1, 4}
    ks = [0 if "plain decoding" in chosen[b] else int(chosen[b].split("k = ")[1].split(";")[0]) for b in (1, 4)]
    assert ks[0] >= 1  # verifying is cheap in this profile: speculation pays at batch 1
    assert config == {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 2,
                      "num_speculative_tokens": max(ks), "num_speculative_tokens_per_batch_size": [[1, 1, ks[0]],
                                                                                                  [2, 4, ks[1]]]}
    again = CliRunner().invoke(main, [*args, "--emit", "vllm", str(out)])
    assert again.exit_code == 2 and "exists; pass --overwrite" in again.output
    no_cost = CliRunner().invoke(main, ["optimize", str(cache), "--budget", "3", "--draft", "vllm-ngram:min=1,max=2",
                                        "--emit", "vllm", str(tmp_path / "x.json")])
    assert no_cost.exit_code == 2 and "give --cost-profile" in no_cost.output


def test_optimize_emits_sglang_flags_for_a_draft_model(tiny_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))  # layers:2 is written out there
    sglang = tmp_path / "flags.txt"
    res = CliRunner().invoke(main, ["optimize", str(tiny_cache), "--draft", "layers:2", "--budget", "3", "--cost",
                                    "c=0.01", "--emit", "sglang", str(sglang)])
    assert res.exit_code == 0, res.output
    assert "speedup ASSUMED" in res.output  # an assumed cost is labelled as one
    flags = shlex.split(sglang.read_text())
    assert flags[:2] == ["--speculative-algorithm", "STANDALONE"]
    steps = int(flags[flags.index("--speculative-num-steps") + 1])
    assert flags[flags.index("--speculative-num-draft-tokens") + 1] == str(steps + 1)
    assert str(tmp_path / "home") in flags[flags.index("--speculative-draft-model-path") + 1]
    two = CliRunner().invoke(main, ["optimize", str(tiny_cache), "--budget", "3", "--cost", "c=0.01", "--emit",
                                    "sglang", str(tmp_path / "f2.txt"), "--batch", "1,2"])
    assert two.exit_code == 2


def test_simulate_emits_the_acceptance_it_measured(tmp_path):
    from tests.synthetic import random_cache

    cache = random_cache(tmp_path / "c.h5", vocab=4, temperatures=(0.0,), overhang=4, max_new_tokens=30)
    args = ["simulate", str(cache), "--tree", "chain:3", "--draft", "vllm-ngram:min=1,max=2", "-q"]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "rows.parquet"), "--emit-acceptance",
                                    str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    import polars as pl

    row = pl.read_parquet(tmp_path / "rows.parquet").filter(pl.col("category") == "all").row(0, named=True)
    config = json.loads((tmp_path / "a.json").read_text())
    per_pos = [row[f"vllm_num_accepted_tokens_per_pos_{i}"] for i in (1, 2, 3)]
    assert config == {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 2, "num_speculative_tokens": 3,
                      "rejection_sample_method": "synthetic",
                      "synthetic_acceptance_rates": [x / row["vllm_num_drafts"] for x in per_pos]}
    res = CliRunner().invoke(main, [*args, "--emit-acceptance", str(tmp_path / "a.env")])
    assert res.exit_code == 0, res.output
    env = dict(line.split("=", 1) for line in (tmp_path / "a.env").read_text().splitlines())
    assert float(env["SGLANG_SIMULATE_ACC_LEN"]) == pytest.approx(row["vllm_mean_acceptance_length"], rel=1e-5)
    assert env["SGLANG_SIMULATE_ACC_METHOD"] == "match-expected"
    for extra, why in [(["--emit-acceptance", str(tmp_path / "a.txt")], "name a .json file"),
                       (["--tree", "chain:2", "--emit-acceptance", str(tmp_path / "b.json")], "this sweep has 2")]:
        res = CliRunner().invoke(main, [*args, *extra])
        assert res.exit_code != 0 and why in res.output


@pytest.fixture(scope="module")
def eagle3_expanded(tiny_model_dir, tiny_prompts_file, tmp_path_factory):
    """An EAGLE-3 head on the tiny target's default layers (random weights) recorded at T = 0 and 1 with --expand
    topk=3,depth=3."""
    from specsim.cache.stats import StatsSpec
    from specsim.record.models import load_model
    from specsim.record.run import RecordRequest, record_cache
    from tests.test_eagle3 import _random_eagle3

    folder = tmp_path_factory.mktemp("eagle3-emit")
    head = _random_eagle3(load_model(str(tiny_model_dir)), folder / "head", draft_vocab=150, seed=3)
    draft = f"eagle3:{head}"
    cache = folder / "e.h5"
    record_cache(cache, RecordRequest(target=str(tiny_model_dir), drafts=(draft,), prompts=str(tiny_prompts_file),
                                      max_new_tokens=10, temperatures=(0.0, 1.0), device="cpu", head_depth=3,
                                      stats=StatsSpec(expand=(3, 3))), progress=False)
    return cache, head, draft


def test_simulate_emits_the_configuration_it_replayed_an_eagle3_head_for_sglang_and_vllm(eagle3_expanded, tmp_path,
                                                                                           monkeypatch):
    """`simulate --emit`: a dynamic tree over an EAGLE-3 head as SGLang's EAGLE3 flags, the head written out in the
    reference layout SGLang loads (steps D, topk K, num_draft_tokens N + 1); a chain as vLLM's eagle3
    speculative_config on the head as train-draft wrote it; refused with one line: a tree vLLM does not draft, two
    configurations, a file that exists."""
    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))  # the SGLang layout is written out there
    cache, head, draft = eagle3_expanded
    dynamic = ["simulate", str(cache), "--draft", draft, "--tree", "dynamic:topk=3,depth=3,tokens=5", "-q"]
    res = CliRunner().invoke(main, [*dynamic, "--emit", "sglang", str(tmp_path / "flags.txt")])
    assert res.exit_code == 0, res.output
    assert "wrote SGLang's flags" in res.output and "replayed" in res.output
    flags = shlex.split((tmp_path / "flags.txt").read_text())
    assert flags[:2] == ["--speculative-algorithm", "EAGLE3"]
    assert flags[4:] == ["--speculative-num-steps", "3", "--speculative-eagle-topk", "3",
                         "--speculative-num-draft-tokens", "6"]
    written = Path(flags[flags.index("--speculative-draft-model-path") + 1])
    assert str(tmp_path / "home") in str(written)
    assert json.loads((written / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]

    chain = ["simulate", str(cache), "--draft", draft, "--tree", "chain:3", "-q"]
    res = CliRunner().invoke(main, [*chain, "--emit", "vllm", str(tmp_path / "spec.json")])
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "spec.json").read_text())
    assert config["method"] == "eagle3" and config["num_speculative_tokens"] == 3
    assert Path(config["model"]) == head.resolve()  # vLLM loads train-draft's speculators layout as it is
    for args, why in [([*dynamic, "--emit", "vllm", str(tmp_path / "d.json")], "vLLM drafts chains"),
                      ([*chain, "--tree", "chain:2", "--emit", "sglang", str(tmp_path / "two.txt")],
                       "this sweep has 2"),
                      ([*chain, "--emit", "sglang", str(tmp_path / "flags.txt")], "exists; pass --overwrite")]:
        res = CliRunner().invoke(main, args)
        assert res.exit_code != 0 and why in res.output, res.output


def test_optimize_chooses_sglang_s_dynamic_tree_by_speed_among_those_the_recording_replays(eagle3_expanded, tmp_path,
                                                                                          monkeypatch):
    """`optimize --emit sglang` on a head recorded with --expand compares the chains and every dynamic tree at the
    recorded top-k (depth 1..D, tokens 1..--budget): the flags written are the printed best tree's, whose speedup is
    what `simulate` gives that tree at the same cost and at least the best chain's (vLLM's choice, chains only)."""
    import re

    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))
    cache, _, draft = eagle3_expanded
    args = ["optimize", str(cache), "--draft", draft, "--budget", "6", "--cost", "c=0.001"]  # a head of random weights
    res = CliRunner().invoke(main, [*args, "--emit", "sglang", str(tmp_path / "flags.txt")])
    assert res.exit_code == 0, res.output
    assert "and dynamic trees topk=3, depth 1..3, tokens 1..6" in res.output
    best = re.search(r"best tree (\S+): [0-9.]+ tokens/call, speedup ASSUMED ([0-9.]+)", res.output)
    tree, speedup = best.group(1), float(best.group(2))
    flags = shlex.split((tmp_path / "flags.txt").read_text())
    assert flags[4:] == emit.sglang_flags(draft, parse_tree(tree), draft_dir="d")[4:]
    chains = CliRunner().invoke(main, [*args, "--emit", "vllm", str(tmp_path / "spec.json")])
    chain_speedup = float(re.search(r"best chain \S+: [0-9.]+ tokens/call, speedup ASSUMED ([0-9.]+)",
                                    chains.output).group(1))
    assert speedup >= chain_speedup
    replayed = CliRunner().invoke(main, ["simulate", str(cache), "--draft", draft, "--tree", tree, "--cost", "c=0.001",
                                         "-q", "--out", str(tmp_path / "rows.csv")])
    assert replayed.exit_code == 0, replayed.output
    import polars as pl

    row = pl.read_csv(tmp_path / "rows.csv").filter(pl.col("category") == "all").row(0, named=True)
    assert row["speedup_assumed"] == pytest.approx(speedup, abs=6e-4)
    refused = CliRunner().invoke(main, ["optimize", str(cache), "--draft", "suffix", "--budget", "3", "--cost", "c=0.1",
                                        "--emit", "sglang", str(tmp_path / "suffix.txt")])
    assert refused.exit_code != 0 and "not reproduced exactly" in refused.output
    assert "chains of" not in refused.output  # refused before the replay, not after it


def test_a_head_recorded_by_a_relative_path_is_found_from_another_folder(tmp_path, monkeypatch):
    """A cache recorded with eagle3:head in its folder and read from another: the head is the directory the cache
    recorded (its absolute path), not the hub id "head"; a directory found from here, a hub id and a model draft
    are as given."""
    from specsim.engines.export import recorded_head

    head = tmp_path / "run" / "head"
    head.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    info = {"path": str(head)}
    assert recorded_head("eagle3:head", info) == f"eagle3:{head}"
    assert recorded_head("mtp:head", info) == f"mtp:{head}"
    assert recorded_head("eagle3:run/head", info) == "eagle3:run/head"
    assert recorded_head("eagle3:org/published-head", {}) == "eagle3:org/published-head"
    assert recorded_head("eagle3:head", {"path": str(tmp_path / "gone")}) == "eagle3:head"
    assert recorded_head("layers:2", info) == "layers:2"


def test_sglang_is_handed_only_the_rule_it_runs(eagle3_expanded, tmp_path, monkeypatch):
    """SGLang verifies drafts as point masses by default (greedy, greedy-draft) and, for EAGLE/EAGLE-3 chains only,
    samples them from q and verifies them token by token (sample: --speculative-use-rejection-sampling) or as a block
    (block: and --speculative-use-block-verification); anything else is refused in one line, before optimize's
    replay. simulate --emit writes the sampled rule's flags for a chain replayed at T = 1."""
    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))
    cache, _, draft = eagle3_expanded
    chain, dynamic = parse_tree("chain:3"), parse_tree("dynamic:topk=3,depth=2,tokens=4")
    assert emit.sglang_flags(draft, chain, draft_dir="d", policy="sample")[-1] == "--speculative-use-rejection-sampling"
    assert emit.sglang_flags(draft, chain, draft_dir="d", policy="block")[-2:] == [
        "--speculative-use-rejection-sampling", "--speculative-use-block-verification"]
    assert "--speculative-use-rejection-sampling" not in emit.sglang_flags(draft, dynamic, draft_dir="d",
                                                                           policy="greedy-draft")
    for policy, d, tree, why in [("sample", "layers:2", chain, "only for EAGLE/EAGLE-3 heads"),
                                 ("block", draft, dynamic, "verifies chains only"),
                                 ("typical", draft, chain, "not this one")]:
        with pytest.raises(EngineError, match=why):
            emit.check_sglang_policy(policy, d, tree)
    res = CliRunner().invoke(main, ["optimize", str(cache), "--draft", "layers:2", "--budget", "3", "--cost",
                                    "c=0.001", "--policy", "sample", "--emit", "sglang", str(tmp_path / "f.txt")])
    assert res.exit_code != 0 and "only for EAGLE/EAGLE-3 heads" in res.output
    assert "chains of" not in res.output and not (tmp_path / "f.txt").exists()
    res = CliRunner().invoke(main, ["simulate", str(cache), "--draft", draft, "--tree", "chain:2", "--policy",
                                    "sample", "--temperature", "1", "-q", "--emit", "sglang", str(tmp_path / "s.txt")])
    assert res.exit_code == 0, res.output
    flags = shlex.split((tmp_path / "s.txt").read_text())
    assert flags[:2] == ["--speculative-algorithm", "EAGLE3"] and flags[-1] == "--speculative-use-rejection-sampling"

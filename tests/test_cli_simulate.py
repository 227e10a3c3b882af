"""`specsim simulate` through CliRunner on a recorded tiny cache and on synthetic ones."""

from __future__ import annotations

import subprocess
import sys

import polars as pl
import pytest
from click.testing import CliRunner

import specsim
from specsim.cli import main
from tests.synthetic import random_cache


def run(*args):
    """`specsim simulate` in a 200-column terminal (the table drops columns to fit a narrower one)."""
    return CliRunner().invoke(main, ["simulate", *map(str, args)], env={"COLUMNS": "200"})


def test_table_rows_with_cis_and_a_footer(tiny_cache):
    res = run(tiny_cache, "--tree", "chain:2", "--tree", "kary:2,2", "--draft", "int8", "--by-category", "-q")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:5] == ["tree", "draft", "policy", "T", "category"]
    rows = [ln for ln in lines if ln.startswith(("chain:2 ", "kary:2,2 "))]
    assert len(rows) == 2 * 3  # two trees x (all, math, writing)
    assert [r.split()[4] for r in rows] == ["all", "math", "writing"] * 2
    df = specsim.simulate(tiny_cache, trees=["chain:2"], drafts=["int8"], n_boot=1000)
    all_row = df.row(0, named=True)
    expected = (f"{all_row['tokens_per_call']:.3f} [{all_row['tokens_per_call_lo']:.3f}, "
                f"{all_row['tokens_per_call_hi']:.3f}]")
    assert expected in rows[0] and rows[0].split()[-3:] == ["exact", "4/48", "2"]
    assert all_row["n_prompts"] == 4 and all_row["n_positions"] == 48  # 4 prompts x 12 tokens at T=0
    assert f"computed from {tiny_cache}" in res.output
    assert "T=0: 4 prompts, 48 positions; storage full" in res.output
    assert "speed: no speedup without costs" in res.output and "speedup" not in lines[0]
    assert "95% bootstrap over prompts, its percentiles expanded for each row's prompt count (1000 resamples, seed 0)" in res.output


def test_the_footer_says_when_rows_rest_on_too_few_prompts_for_their_level(tiny_cache, tmp_path):
    few = run(tiny_cache, "--tree", "chain:2", "--draft", "int8", "--by-category", "-q")
    assert few.exit_code == 0, few.output
    assert "CIs over fewer than 8 prompts (here 2-4) cover about 85-90%, not 95%" in few.output  # all 4, categories 2
    many = run(random_cache(tmp_path / "c.h5", n_prompts=16, length=8, vocab=8, categories=("one",)),
               "--tree", "chain:2", "--by-category", "-q")
    assert many.exit_code == 0, many.output
    assert "16/" in many.output and "fewer than 8 prompts" not in many.output


def test_the_all_row_by_default_and_a_table_that_fits_the_terminal(tiny_cache):
    res = CliRunner().invoke(main, ["simulate", str(tiny_cache), "--tree", "chain:2", "--draft", "int8", "-q"],
                             env={"COLUMNS": "70"})
    assert res.exit_code == 0, res.output
    table = [ln for ln in res.output.splitlines() if ln.startswith(("tree", "chain:2", "-"))]
    assert len([ln for ln in table if ln.startswith("chain:2")]) == 1  # categories only with --by-category
    assert all(len(ln) <= 70 for ln in table)
    assert "column(s) not shown to fit 70 characters" in res.output


def test_an_assumed_cost_is_labelled_as_one_in_the_table_and_footer(tiny_cache):
    res = run(tiny_cache, "--tree", "chain:2", "--draft", "int8", "--cost", "c=0.2", "-q")
    assert res.exit_code == 0, res.output
    assert "speedup ASSUMED [95% CI]" in res.output.splitlines()[0]
    assert "ASSUMED c=0.2" in res.output and "is an ASSUMPTION, not measured" in res.output


def test_repeatable_options_take_commas_and_a_single_option_twice_is_refused(tiny_cache):
    a = specsim.simulate(tiny_cache, trees=["chain"], budgets=[1, 3], drafts=["int8", "layers:2"], n_boot=0)
    res = run(tiny_cache, "--tree", "chain", "--budget", "1,3", "--draft", "int8,layers:2", "--n-boot", "0",
              "--out", "-", "--format", "json", "-q")
    assert res.exit_code == 0, res.output
    assert pl.read_json(res.stdout.encode())["tree"].to_list() == a["tree"].to_list()
    twice = run(tiny_cache, "--tree", "chain:2", "--seed", "1", "--seed", "2")
    assert twice.exit_code == 2 and "--seed was given 2 times" in twice.output
    policies = run(tiny_cache, "--tree", "chain:2", "--policy", "greedy,adaptive-history:0.8,0.4", "-q",
                   "--temperature", "0")
    assert policies.exit_code == 0 and "adaptive-history:0.8,0.4" in policies.output


def test_out_to_stdout_is_data_only_and_one_schema_in_every_format(tiny_cache, tmp_path):
    res = run(tiny_cache, "--tree", "chain:2", "--draft", "int8", "--out", "-", "--format", "ndjson", "-q")
    assert res.exit_code == 0, res.output
    rows = pl.read_ndjson(res.stdout.encode())
    assert rows.height == 3 and "depth_1" in rows.columns and "depth_accept" not in rows.columns
    assert {"vllm_mean_acceptance_length", "vllm_num_accepted_tokens_per_pos_1", "num_speculative_tokens"} <= set(
        rows.columns)
    assert "mean_acceptance_length" not in rows.columns  # vLLM's meaning only, under its own name
    assert res.stderr.startswith("tree")  # the human table goes to stderr
    frames = {}
    for suffix in ("parquet", "csv", "json", "ndjson"):
        out = tmp_path / f"r.{suffix}"
        assert run(tiny_cache, "--tree", "chain:2", "--draft", "int8", "--out", out, "-q").exit_code == 0
        frames[suffix] = {"parquet": pl.read_parquet, "csv": pl.read_csv, "json": pl.read_json,
                          "ndjson": pl.read_ndjson}[suffix](out)
    assert len({tuple(sorted(f.columns)) for f in frames.values()}) == 1  # the same columns everywhere
    assert frames["csv"]["mc_se_accept_rate"].null_count() == 3  # null, not NaN
    again = run(tiny_cache, "--tree", "chain:2", "--out", tmp_path / "r.csv", "-q")
    assert again.exit_code == 2 and "exists; pass --overwrite" in again.output
    assert run(tiny_cache, "--tree", "chain:2", "--out", "-").exit_code == 2


def test_out_into_a_folder_not_yet_made_makes_it(tiny_cache, tmp_path):
    out = tmp_path / "results" / "2026" / "rows.csv"
    res = run(tiny_cache, "--tree", "chain:2", "--draft", "int8", "--out", out, "-q")
    assert res.exit_code == 0, res.output
    rows = pl.read_csv(out)
    assert set(rows["tree"]) == {"chain:2"} and rows["category"][0] == "all"


def test_per_request_rows_carry_the_histogram_of_accepted_lengths(tiny_cache, tmp_path):
    out = tmp_path / "requests.parquet"
    res = run(tiny_cache, "--tree", "chain:3", "--draft", "int8", "--per-request", out, "-q")
    assert res.exit_code == 0, res.output
    req = pl.read_parquet(out)
    assert req.height == 4 and {"prompt_index", "accepted_length_histogram_1", "accepted_length_histogram_4"} <= set(
        req.columns)
    hist = req.select(pl.col("^accepted_length_histogram_.*$")).to_numpy()
    assert hist.sum(axis=1) == pytest.approx(req["target_calls"].to_numpy())  # every call counted once
    assert (hist * [0, 1, 2, 3]).sum(axis=1) == pytest.approx(req["accepted"].to_numpy())


def test_sampling_at_a_recorded_temperature(tiny_cache):
    res = run(tiny_cache, "--tree", "chain", "--budget", "1", "--budget", "3", "--policy", "sample", "-q")
    assert res.exit_code == 0, res.output
    rows = [ln.split() for ln in res.output.splitlines() if ln.startswith("chain:")]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("chain:1", "layers:2", "sample", "1"), ("chain:3", "layers:2", "sample", "1"),
        ("chain:1", "int8", "sample", "1"), ("chain:3", "int8", "sample", "1")]


def test_unrecorded_temperature_is_refused_with_the_recorded_ones(tiny_cache):
    res = run(tiny_cache, "--tree", "chain:2", "--policy", "sample", "--temperature", "0.7")
    assert res.exit_code == 1
    assert res.output == f"Error: {tiny_cache}: temperature 0.7 was not recorded; recorded: 0, 1\n"


def test_greedy_needs_greedy_trajectories(tiny_cache):
    res = run(tiny_cache, "--tree", "chain:2", "--temperature", "1")
    assert res.exit_code == 2
    assert "policy greedy needs the greedy (T=0) trajectories, not T=1" in res.output


def test_bad_inputs_are_one_line_errors(tmp_path):
    cache = random_cache(tmp_path / "c.h5", n_prompts=2, length=6, vocab=8)
    cases = [
        (["--tree", "chain"], "tree family 'chain' needs a budget: --budget N"),
        (["--tree", "chain:2", "--out", tmp_path / "x.txt"], "unknown format .txt; use .parquet, .csv, .json or "
                                                             ".ndjson (or --format)"),
        (["--tree", "chain:2", "--per-request", tmp_path / "x.txt"], "unknown format .txt; use .parquet, .csv, "
                                                                     ".json or .ndjson\n"),  # --format is --out's
        (["--tree", "chain:2", "--out", tmp_path], "is a directory"),
        (["--tree", "chain:2", "--cost", ""], "expected c=RATIO"),
        (["--tree", "chain:2", "--cost", "c=0.1", "--cost-profile", cache], "or an assumed --cost, not both"),
        (["--tree", "chain:2", "--batch", "4"], "--batch: batch sizes need measured costs: give --cost-profile"),
        (["--tree", "chain:2", "--policy", "sometimes"], "'sometimes' is not a policy"),

        (["--tree", "bush:3"], "'bush:3' is not a tree spec"),
        (["--tree", "chain:2", "--cost", "c=fast"], "'fast' is not a number"),
    ]
    for args, message in cases:
        res = run(cache, *args)
        assert res.exit_code == 2 and message in res.output, (args, res.output)  # usage errors
        assert len(res.output.strip().splitlines()) == 1, (args, res.output)  # one line ...
        assert res.exception is None or type(res.exception) is SystemExit, (args, res.exception)  # ... no traceback
    res = run(cache, "--tree", "chain:2", "--draft", "huge")  # a fact about the cache: a runtime error, exit 1
    assert res.exit_code == 1 and "no draft named 'huge'; recorded drafts: small" in res.output
    res = run(tmp_path / "missing.h5", "--tree", "chain:2")
    assert res.exit_code == 1 and res.output.strip().endswith("missing.h5: no such file")


def test_one_error_names_the_argument_in_the_library_and_the_flag_on_the_command_line(tmp_path):
    """The library's errors speak of its arguments; the CLI renders the same error with its flags."""
    from specsim.errors import SpecError

    cache = random_cache(tmp_path / "c.h5", n_prompts=2, length=6, vocab=8)
    cases = [({"cost": "c=0.1", "batches": [2]}, ["--cost", "c=0.1", "--batch", "2"],
              "batches: batch sizes need measured costs: give cost_profile",
              "--batch: batch sizes need measured costs: give --cost-profile"),
             ({"cost": "c=x"}, ["--cost", "c=x"], "cost 'c=x': 'x' is not a number", "--cost 'c=x': 'x' is not"),
             ({"trees": ["chain"]}, [], "needs a budget: budgets N", "needs a budget: --budget N")]
    for kwargs, flags, library, command_line in cases:
        with pytest.raises(SpecError) as raised:
            specsim.simulate(cache, **{"trees": ["chain:2"], **kwargs})
        assert library in str(raised.value), raised.value
        assert "--" not in str(raised.value), raised.value
        res = run(cache, "--tree", "chain" if "trees" in kwargs else "chain:2", *flags)
        assert res.exit_code == 2 and command_line in res.output, res.output


def test_help_has_examples():
    res = CliRunner().invoke(main, ["simulate", "--help"])
    assert res.exit_code == 0 and "Examples:" in res.output and "--multi-draft [iid|swor]" in res.output


def test_simulate_imports_no_torch():
    code = ("import specsim.cli.simulate_cmd, specsim.sim.sweep, specsim.sim.features, sys; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_invalid_combinations_are_skipped_with_one_line_each(tiny_cache):
    res = CliRunner().invoke(main, ["simulate", str(tiny_cache), "--tree", "chain:2", "--tree", "kary:2,2",
                                    "--draft", "int8", "--draft", "ngram:2", "--policy", "greedy",
                                    "--policy", "adaptive-hf", "--temperature", "0", "-q"])
    assert res.exit_code == 0, res.output
    skipped = res.stderr.splitlines()
    assert sorted(skipped) == sorted([
        "skipped kary:2,2 x int8 x adaptive-hf at T=0: adaptive speculation lengths apply to chains, "
        "not to the tree kary:2,2",
        "skipped chain:2 x ngram:2 x adaptive-hf at T=0: adaptive rules need a model draft; 'ngram:2' is model-free",
        "skipped kary:2,2 x ngram:2 x adaptive-hf at T=0: adaptive speculation lengths apply to chains, "
        "not to the tree kary:2,2",
    ])
    rows = [ln.split()[:3] for ln in res.stdout.splitlines() if ln.startswith(("chain:", "kary:"))]
    assert rows == [["chain:2", "int8", "greedy"], ["kary:2,2", "int8", "greedy"],
                    ["chain:2", "int8", "adaptive-hf"], ["chain:2", "ngram:2", "greedy"],
                    ["kary:2,2", "ngram:2", "greedy"]]


def test_nothing_left_to_run_is_one_clear_error(tiny_cache):
    res = run(tiny_cache, "--tree", "kary:2,2", "--draft", "int8", "--policy", "adaptive-hf", "--temperature", "0")
    assert res.exit_code == 2
    assert res.output.splitlines()[-1] == (
        "Error: no configuration of the sweep can run: kary:2,2 x int8 x adaptive-hf at T=0: adaptive speculation "
        "lengths apply to chains, not to the tree kary:2,2")


def test_model_free_drafts_that_propose_nothing_print_no_warnings(tiny_cache):
    """ngram:8 on 12-token trajectories never matches: accept rate '-' (NaN), tokens/call 1, no numpy warnings."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = specsim.simulate(tiny_cache, trees=["chain:3"], drafts=["ngram:8"], n_boot=200)
    assert df["drafted_per_call"].to_list() == [0.0] * df.height
    assert all(x != x for x in df["accept_rate"].to_list())  # NaN
    assert df["tokens_per_call"].to_list() == [1.0] * df.height
    res = run(tiny_cache, "--tree", "chain:3", "--draft", "ngram:8", "-q")
    assert res.exit_code == 0 and res.stderr == ""
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("chain:3"))
    assert row.split()[4:8] == ["1.000", "[1.000,", "1.000]", "-"]  # tokens/call exactly 1; accept rate undefined


def test_the_cli_and_the_library_build_one_sweep_config(tmp_path, monkeypatch):
    """`specsim simulate` and `specsim.simulate` both hand `sweep` a SweepConfig: the flags map onto its fields,
    and the library's options are exactly its fields."""
    import dataclasses

    import specsim.sim.sweep as sweep_mod
    from specsim.errors import SpecError

    path = random_cache(tmp_path / "c.h5", temperatures=(0.0, 1.0), drafts=("d",))
    seen = []

    def capture(cache, config, **kwargs):
        seen.append(config)
        raise SpecError("captured")

    monkeypatch.setattr(sweep_mod, "sweep", capture)
    result = run(str(path), "--tree", "chain:4", "--tree", "kary:2,2", "--draft", "d", "--policy",
                 "sample", "--temperature", "1", "--multi-draft", "swor", "--n-boot", "50", "--seed", "3")
    assert result.exit_code != 0 and "captured" in result.output
    with pytest.raises(SpecError, match="captured"):
        specsim.simulate(path, trees=["chain:4", "kary:2,2"], drafts=["d"], policies=["sample"], temperatures=[1.0],
                         multi_draft="swor", n_boot=50, seed=3)
    cli, library = seen
    assert cli == library == specsim.SweepConfig(trees=("chain:4", "kary:2,2"), drafts=("d",), policies=("sample",),
                                                 temperatures=(1.0,), multi_draft="swor", n_boot=50, seed=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_bootstrap'"):
        specsim.simulate(path, trees=["chain:4"], n_bootstrap=5)
    assert {f.name for f in dataclasses.fields(specsim.SweepConfig)} >= {"trees", "drafts", "top_k", "workers"}

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
    return CliRunner().invoke(main, ["simulate", *map(str, args)])


def test_table_rows_with_cis_and_a_footer(tiny_cache):
    res = run(tiny_cache, "--tree", "chain:2", "--tree", "kary:2,2", "--draft", "int8", "-q")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:6] == ["tree", "budget", "draft", "policy", "T", "category"]
    rows = [ln for ln in lines if ln.startswith(("chain:2 ", "kary:2,2 "))]
    assert len(rows) == 2 * 3  # two trees x (all, math, writing)
    assert [r.split()[5] for r in rows] == ["all", "math", "writing"] * 2
    df = specsim.simulate(tiny_cache, trees=["chain:2"], drafts=["int8"], n_boot=1000)
    all_row = df.row(0, named=True)
    expected = (f"{all_row['accept_rate']:.3f} [{all_row['accept_rate_lo']:.3f}, "
                f"{all_row['accept_rate_hi']:.3f}]")
    assert expected in rows[0] and rows[0].split()[-2:] == ["exact", "4/48"]
    assert all_row["n_prompts"] == 4 and all_row["n_positions"] == 48  # 4 prompts x 12 tokens at T=0
    assert f"computed from {tiny_cache}" in res.output
    assert "T=0: 4 prompts, 48 positions; storage full" in res.output
    assert "speed: no speedup without costs" in res.output and "speedup" not in lines[0]
    assert "95% bootstrap over prompts (1000 resamples, seed 0)" in res.output


def test_an_assumed_cost_is_labelled_as_one_in_the_table_and_footer(tiny_cache):
    res = run(tiny_cache, "--tree", "chain:2", "--draft", "int8", "--cost", "c=0.2", "--no-by-category", "-q")
    assert res.exit_code == 0, res.output
    assert "speedup ASSUMED [95% CI]" in res.output.splitlines()[0]
    assert "ASSUMED c=0.2" in res.output and "is an ASSUMPTION, not measured" in res.output


def test_sampling_at_a_recorded_temperature(tiny_cache):
    res = run(tiny_cache, "--tree", "chain", "--budget", "1", "--budget", "3", "--policy", "sample",
              "--no-by-category", "-q")
    assert res.exit_code == 0, res.output
    rows = [ln.split() for ln in res.output.splitlines() if ln.startswith("chain:")]
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [
        ("chain:1", "layers:2", "sample", "1"), ("chain:3", "layers:2", "sample", "1"),
        ("chain:1", "int8", "sample", "1"), ("chain:3", "int8", "sample", "1")]


def test_unrecorded_temperature_is_refused_with_the_recorded_ones(tiny_cache):
    res = run(tiny_cache, "--tree", "chain:2", "--policy", "sample", "--temperature", "0.7")
    assert res.exit_code == 1
    assert res.output == f"Error: {tiny_cache}: temperature 0.7 was not recorded; recorded: 0, 1\n"


def test_greedy_needs_greedy_trajectories(tiny_cache):
    res = run(tiny_cache, "--tree", "chain:2", "--temperature", "1")
    assert res.exit_code == 1
    assert "policy greedy needs the greedy (T=0) trajectories, not T=1" in res.output


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json"])
def test_out_round_trips(tmp_path, suffix):
    cache = random_cache(tmp_path / "c.h5", n_prompts=6, length=16, vocab=12)
    out = tmp_path / f"results{suffix}"
    res = run(cache, "--tree", "chain:3", "--tree", "kary:2@3", "--out", out, "-q", "--n-boot", "200",
              "--cost", "c=0.1")
    assert res.exit_code == 0, res.output
    assert f"wrote 6 rows x" in res.output
    expected = specsim.simulate(cache, trees=["chain:3", "kary:2@3"], n_boot=200, cost="c=0.1")
    back = {".parquet": pl.read_parquet, ".csv": pl.read_csv, ".json": pl.read_json}[suffix](out)
    if suffix == ".csv":  # lists become depth_d columns
        depth = expected["depth"].max()
        assert [c for c in back.columns if c.startswith("depth_")] == [f"depth_{d}" for d in range(1, depth + 1)]
        assert back["depth_1"].to_list() == pytest.approx([x[0] for x in expected["depth_accept"]])
        back = back.drop([c for c in back.columns if c.startswith("depth_")])
        expected = expected.drop("depth_accept")
    if suffix == ".json":  # rows of objects: polars reads the keys back in its own order
        back = back.select(expected.columns)
    assert back.columns == expected.columns
    for col in ("tree", "category", "accept_rate", "accept_rate_lo", "tokens_per_call_hi", "speedup_assumed",
                "n_positions"):
        a, b = back[col].to_list(), expected[col].to_list()
        assert a == (pytest.approx(b) if isinstance(b[0], float) else b)


def test_bad_inputs_are_one_line_errors(tmp_path):
    cache = random_cache(tmp_path / "c.h5", n_prompts=2, length=6, vocab=8)
    cases = [
        (["--tree", "chain"], "tree family 'chain' needs --budget N"),
        (["--tree", "chain:2", "--out", tmp_path / "x.txt"], "unknown format .txt"),
        (["--tree", "chain:2", "--cost", "c=0.1", "--cost-profile", cache], "or an assumed --cost, not both"),
        (["--tree", "chain:2", "--batch", "4"], "--batch needs measured costs"),
        (["--tree", "chain:2", "--policy", "sometimes"], "'sometimes' is not a policy"),
        (["--tree", "chain:2", "--draft", "huge"], "no draft named 'huge'; recorded drafts: small"),
        (["--tree", "bush:3"], "'bush:3' is not a tree spec"),
        (["--tree", "chain:2", "--cost", "c=fast"], "'fast' is not a number"),
    ]
    for args, message in cases:
        res = run(cache, *args)
        assert res.exit_code != 0 and message in res.output, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    res = run(tmp_path / "missing.h5", "--tree", "chain:2")
    assert res.exit_code == 1 and res.output.strip().endswith("missing.h5: no such file")


def test_help_has_examples():
    res = CliRunner().invoke(main, ["simulate", "--help"])
    assert res.exit_code == 0 and "Examples:" in res.output and "--multi-draft [iid|swor]" in res.output


def test_simulate_imports_no_torch():
    code = ("import specsim.cli.simulate_cmd, specsim.sim.api, specsim.sim.features, sys; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_invalid_combinations_are_skipped_with_one_line_each(tiny_cache):
    res = CliRunner().invoke(main, ["simulate", str(tiny_cache), "--tree", "chain:2", "--tree", "kary:2,2",
                                    "--draft", "int8", "--draft", "ngram:2", "--policy", "greedy",
                                    "--policy", "adaptive-hf", "--temperature", "0", "--no-by-category", "-q"])
    assert res.exit_code == 0, res.output
    skipped = res.stderr.splitlines()
    assert sorted(skipped) == sorted([
        "skipped kary:2,2 x int8 x adaptive-hf at T=0: adaptive speculation lengths apply to chains, "
        "not to the tree kary:2,2",
        "skipped chain:2 x ngram:2 x adaptive-hf at T=0: adaptive rules need a model draft; 'ngram:2' is model-free",
        "skipped kary:2,2 x ngram:2 x adaptive-hf at T=0: adaptive speculation lengths apply to chains, "
        "not to the tree kary:2,2",
    ])
    rows = [ln.split()[:4] for ln in res.stdout.splitlines() if ln.startswith(("chain:", "kary:"))]
    assert rows == [["chain:2", "2", "int8", "greedy"], ["kary:2,2", "6", "int8", "greedy"],
                    ["chain:2", "2", "int8", "adaptive-hf"], ["chain:2", "2", "ngram:2", "greedy"],
                    ["kary:2,2", "6", "ngram:2", "greedy"]]


def test_nothing_left_to_run_is_one_clear_error(tiny_cache):
    res = run(tiny_cache, "--tree", "kary:2,2", "--draft", "int8", "--policy", "adaptive-hf", "--temperature", "0")
    assert res.exit_code == 1
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
    res = run(tiny_cache, "--tree", "chain:3", "--draft", "ngram:8", "--no-by-category", "-q")
    assert res.exit_code == 0 and res.stderr == ""
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("chain:3"))
    assert row.split()[5:7] == ["-", "1.000"]

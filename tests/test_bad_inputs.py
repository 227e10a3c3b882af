"""A battery of bad inputs: every command answers with a clean error (or a result), never a traceback.

CliRunner captures an uncaught exception instead of printing it, so "no traceback" is checked as:
the run ended in SystemExit (click's own exit) or normally, and a failure's last line is the error.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsim.cli import main
from tests.synthetic import random_cache

SPEC_CHARS = string.ascii_letters + string.digits + ":,@[]()-=._/ \t" + "é∞"


def clean(result) -> None:
    """Ended normally or by SystemExit; a failure says what was wrong in its last line."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {type(result.exception).__name__}: {result.exception!r}\n{result.output}")
    if result.exit_code != 0:
        last = result.output.strip().splitlines()[-1] if result.output.strip() else ""
        assert last.startswith("Error:"), result.output


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return random_cache(tmp_path_factory.mktemp("bad") / "c.h5", n_prompts=4, length=10, vocab=12)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("files")
    binary = base / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    text = base / "notes.txt"
    text.write_text("just some text\n")
    empty = base / "empty.json"
    empty.write_text("")
    wrong_json = base / "list.json"
    wrong_json.write_text(json.dumps({"format": "something else"}))
    return {"binary": binary, "text": text, "empty": empty, "json": wrong_json, "dir": base}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.text(SPEC_CHARS, max_size=24))
def test_garbage_tree_specs(spec):
    clean(run("trees", spec))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(["--tree", "--policy", "--draft", "--cost", "--budget", "--temperature", "--batch",
                               "--n-boot", "--seed", "--samples", "--multi-draft", "--batching", "--format"]),
       value=st.text(SPEC_CHARS, max_size=16))
def test_garbage_simulate_options(cache, option, value):
    args = ["simulate", cache, "-q"] + ([] if option == "--tree" else ["--tree", "chain:2"]) + [option, value]
    clean(run(*args))


@pytest.mark.parametrize("args", [
    ["--n-boot", "1000000000"], ["--seed", "-1"], ["--budget", "0"], ["--temperature", "nan"],
    ["--temperature", "-1"], ["--batch", "4"], ["--cost", ""], ["--cost", "c=inf"], ["--cost", "c=1e400"],
    ["--policy", "typical:nan,1"], ["--policy", "p>=lq:inf"], ["--out", "-"], ["--format", "csv"],
    ["--samples", "1"], ["--per-request", "x.txt"],
])
def test_bad_simulate_values(cache, args):
    clean(run("simulate", cache, "--tree", "chain:2", "-q", *args))


@pytest.mark.parametrize("kind", ["binary", "text", "empty", "json", "dir"])
def test_bad_files_everywhere_a_file_is_read(cache, files, kind):
    path = files[kind]
    for args in (["simulate", path, "--tree", "chain:2"],
                 ["inspect", path],
                 ["simulate", cache, "--tree", f"file:{path}"],
                 ["simulate", cache, "--tree", "chain:2", "--cost-profile", path],
                 ["optimize", "--acceptance-vector", path, "--budget", "3"],
                 ["optimize", path, "--budget", "2"],
                 ["trees", f"file:{path}"],
                 ["report", path, "--out", files["dir"] / f"r-{kind}"],
                 ["validate", path],
                 ["live", "--target", "x", "--draft", "int8", "--prompts", path, "--max-new-tokens", "2"],
                 ["cache", "--target", "x", "--prompts", path, "--out", files["dir"] / f"c-{kind}.h5"]):
        clean(run(*args))


def test_empty_paths_and_directories_are_one_sentence(cache, files):
    for args in (["simulate", "", "--tree", "chain:2"], ["inspect", ""], ["inspect", files["dir"]],
                 ["simulate", files["dir"], "--tree", "chain:2"], ["cache", "--target", "x", "--out", ""]):
        result = run(*args)
        clean(result)
        assert result.exit_code != 0 and len(result.output.strip().splitlines()) <= 4, result.output


def test_unwritable_report_output_fails_before_simulating(cache):
    result = run("report", cache, "--out", "/proc/specsim-report")
    clean(result)
    assert result.exit_code != 0 and "--out /proc/specsim-report" in result.output
    assert "simulating" not in result.output


def _unwritable(cache, files, where):
    """Every output a command writes after minutes of work, at `where` (a path it cannot write); the model named
    does not exist, so the answer shows that the check ran before anything was loaded."""
    return [("--out", ["profile", "--target", "no-such-model", "--out", where / "p.json"]),
            ("--out", ["write-prompts", "--model", "no-such-model", "--count", "1", "--out", where / "w.jsonl"]),
            ("--out", ["train-draft", "--kind", "eagle3", "--target", "no-such-model", "--from", cache,
                       "--out", where / "heads"]),
            ("--charts", ["bench-attention", "--contexts", "16", "--tree-sizes", "2", "--charts", where / "c"]),
            ("--engine-log", ["validate", cache, "--engine", "vllm", "--engine-log", where / "logs"]),
            ("--emit", ["simulate", cache, "--tree", "chain:2", "--emit", "vllm", where / "spec.json"]),
            ("--emit-acceptance", ["simulate", cache, "--tree", "chain:2", "--emit-acceptance", where / "a.json"]),
            ("--out", ["optimize", cache, "--budget", "2", "--out", where / "tree.json"]),
            ("--out", ["report", cache, "--out", where / "r"]),
            ("--out", ["simulate", cache, "--tree", "chain:2", "--out", where / "rows.csv"]),
            ("--per-request", ["simulate", cache, "--tree", "chain:2", "--per-request", where / "requests.csv"]),
            ("--out", ["live", "--target", "no-such-model", "--draft", "int8", "--out", where / "live.csv"]),
            ("--steps-out", ["live", "--target", "no-such-model", "--draft", "int8", "--steps-out",
                             where / "steps.parquet"]),
            ("--out", ["validate", cache, "--out", where / "checks.csv"]),
            ("--steps-out", ["validate", cache, "--steps-out", where / "steps.parquet"]),
            ("--out", ["bench-attention", "--contexts", "16", "--tree-sizes", "2", "--out", where / "a.csv"])]


@pytest.mark.parametrize("where", ["a file", "/proc"])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(cache, files, where):
    """A folder on the way that is a file (which even root cannot write under), or /proc (where nothing new can
    be made): one line naming the flag, before any model loads or any replay runs."""
    place = files["text"] / "sub" if where == "a file" else Path("/proc/specsim-test")
    for flag, args in _unwritable(cache, files, place):
        result = run(*args)
        clean(result)
        assert result.exit_code != 0 and flag in result.output, (args, result.output)
        assert ("is a file, not a folder" if where == "a file" else "cannot create /proc/specsim-test") in result.output, \
            (args, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(SPEC_CHARS, max_size=12))
def test_garbage_profile_and_optimize_arguments(cache, value):
    clean(run("optimize", cache, "--budget", "2", "--batch", value))
    clean(run("profile", "--target", value, "--batch", value, "--out", "p.txt"))


def test_an_attention_context_no_memory_holds_is_one_line_before_any_allocation():
    result = CliRunner().invoke(main, ["bench-attention", "--contexts", "100000000", "--tree-sizes", "4"])
    clean(result)
    assert result.exit_code != 0 and "GiB for q, k, v and the attention scores" in result.output
    assert "lower --contexts" in result.output

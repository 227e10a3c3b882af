"""`specsim cache`, `specsim inspect` and `specsim models` through the CLI: output, bad input, kill -9 + resume."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from specsim.cache.reader import CacheReader
from specsim.cli import main
from tests.conftest import build_tiny_model, write_prompts

RESUME_PROMPTS = [{"question_id": i, "category": ["a", "b"][i % 2], "prompt": f"Question number {i}: what is {i} + {i}?"}
                  for i in range(8)]


def _cache_args(model, prompts, out, *extra, max_new_tokens=8):
    return ["cache", "--target", str(model), "--draft", "layers:2", "--draft", "int8", "--prompts", str(prompts),
            "--max-new-tokens", str(max_new_tokens), "--temperature", "0", "--temperature", "1", "--out", str(out),
            "--quiet", *extra]


def _run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _one_line_error(result, pattern):
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and [i for i, ln in enumerate(lines) if ln.startswith("Error: ")] == [len(lines) - 1], \
        result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    assert re.search(pattern, lines[0]), lines[0]


def _contents(path):
    """Everything a simulation reads, per (prompt, temperature)."""
    with CacheReader(path) as r:
        out = {}
        for row in r.iter_trajectories():
            out[row.prompt_index, row.temperature] = (
                row.seed, row.stop_reason, r.tokens(row.start, row.stop),
                *(r.logits(c, row.start, row.stop) for c in r.spec.columns),
            )
        return out


def _assert_same_contents(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key][:2] == b[key][:2], key
        for x, y in zip(a[key][2:], b[key][2:]):
            np.testing.assert_array_equal(x, y)


def test_cache_records_every_prompt_and_temperature_and_says_so(tiny_model_dir, tiny_prompts_file, tmp_path):
    out = tmp_path / "c.h5"
    result = _run(*_cache_args(tiny_model_dir, tiny_prompts_file, out))
    assert result.exit_code == 0, result.output
    assert re.search(r"recorded 8 trajectories \(\d+ positions\) in [\d.]+ s \([\d.]+ positions/s, target \+ 2 draft\(s\)\); "
                     r"0 already present", result.output)
    timing = next(line for line in result.output.splitlines() if line.startswith("time: "))
    assert {"generation", "drafts", "statistics", "writing"} <= {p.rsplit(" ", 3)[0] for p in timing[6:].split(", ")}
    assert f"wrote {out}: 8 trajectories" in result.output
    with CacheReader(out) as r:
        assert r.spec.drafts == ("layers:2", "int8") and r.spec.temperatures == (0.0, 1.0)
        assert r.trajectories.height == 8 and r.prompts["category"].to_list() == ["writing", "writing", "math", "math"]
        settings = r.meta["settings"]
        assert settings["max_new_tokens"] == 8 and settings["temperatures"] == [0.0, 1.0] and settings["seed"] == 0
        assert r.meta["versions"]["torch"] and r.meta["tokenizer_sha256"] and r.meta["target"]["source"] == "local"


def test_topk_storage_and_category_selection(tiny_model_dir, tiny_prompts_file, tmp_path):
    out = tmp_path / "k.h5"
    result = _run(*_cache_args(tiny_model_dir, tiny_prompts_file, out, "--top-k", "16", "--categories", "math",
                               "--per-category", "1"))
    assert result.exit_code == 0, result.output
    with CacheReader(out) as r:
        assert r.spec.storage == "topk" and r.spec.top_k == 16
        assert r.prompts["question_id"].to_list() == [3]
    inspect = _run("inspect", str(out), "--quiet")
    assert "storage top-16 logits + tail log-sum-exp" in inspect.output
    assert "top-16 storage: α treats the non-top-K mass as spread evenly (approximate)" in inspect.output


def test_inspect_reports_agreement_for_both_drafts(tiny_cache):
    result = _run("inspect", str(tiny_cache), "--quiet")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "prompts    4 from" in out and "writing 2, math 2" in out
    assert re.search(r"T=0 +4 trajectories of 4 prompts, +\d+ positions", out)
    with CacheReader(tiny_cache) as r:
        n0 = int(r.trajectories.filter(r.trajectories["temperature"] == 0.0)["length"].sum())
        rows = list(r.iter_trajectories(temperature=0.0))
        p_top = np.concatenate([r.logits("target", x.start, x.stop).argmax(-1) for x in rows])
        q_top = np.concatenate([r.logits("layers:2", x.start, x.stop).argmax(-1) for x in rows])
    agree = (p_top == q_top).mean()
    line = next(line for line in out.splitlines() if line.strip().startswith("layers:2") and re.search(r"\s0\s", line))
    assert f"{agree:.3f}" in line and re.search(rf"\s{n0}\s+4$", line)  # figure, positions, prompts
    for draft in ("layers:2", "int8"):
        assert sum(1 for line in out.splitlines() if line.strip().startswith(draft + " ")) == 2  # T=0 and T=1
    assert "at T=0 (greedy) α is computed from the T=1 distributions" in out


@pytest.mark.parametrize(
    "make_args, pattern",
    [
        (lambda d, p, o: ["--target", "no-such-model"], r"unknown model 'no-such-model'"),
        (lambda d, p, o: ["--target", str(d), "--draft", "layers:9"], r"K must be between 1 and 3"),
        (lambda d, p, o: ["--target", str(d), "--prompts", str(o.parent / "none.jsonl")], r"prompt file not found"),
        (lambda d, p, o: ["--target", str(d), "--categories", "poetry", "--prompts", str(p)],
         r"no prompts in category poetry; available: writing, math"),
        (lambda d, p, o: ["--target", str(d), "--prompts", str(p), "--hidden-states", "last,4,5,99"],
         r"--hidden-states 5,99: .* has 4 decoder layers, so a layer number is 0..4"),
    ],
)
def test_bad_model_and_prompt_arguments(tiny_model_dir, tiny_prompts_file, tmp_path, make_args, pattern):
    out = tmp_path / "x.h5"
    result = _run("cache", *make_args(tiny_model_dir, tiny_prompts_file, out), "--out", str(out), "--quiet")
    _one_line_error(result, pattern)
    assert not out.exists()  # refused before a cache was begun


def test_empty_and_malformed_prompt_files(tiny_model_dir, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    _one_line_error(_run(*_cache_args(tiny_model_dir, empty, tmp_path / "o.h5")), r"empty\.jsonl: no prompts")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "broken"\n')
    _one_line_error(_run(*_cache_args(tiny_model_dir, bad, tmp_path / "o.h5")), r"bad\.jsonl:2: not valid JSON")
    assert not (tmp_path / "o.h5").exists()


def test_tokenizer_mismatch_is_refused(tiny_model_dir, tiny_prompts_file, tmp_path):
    other = build_tiny_model(tmp_path / "other", seed=2)
    vocab = json.loads((other / "tokenizer.json").read_text())
    model = vocab["model"]["vocab"]
    a, b = sorted(model)[:2]
    model[a], model[b] = model[b], model[a]  # two tokens swap ids: same size, different tokenizer
    (other / "tokenizer.json").write_text(json.dumps(vocab))
    result = _run("cache", "--target", str(tiny_model_dir), "--draft", str(other), "--prompts", str(tiny_prompts_file),
                  "--out", str(tmp_path / "o.h5"), "--quiet")
    _one_line_error(result, rf"draft '{re.escape(str(other))}' uses a different tokenizer than target "
                            rf"'{re.escape(str(tiny_model_dir))}'")


def test_unsupported_gguf_is_refused(tiny_prompts_file, tmp_path, monkeypatch):
    from tests.synthetic import write_gguf

    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))
    path = tmp_path / "exotic.gguf"
    write_gguf(path, "exotic-arch")
    result = _run("cache", "--target", str(path), "--prompts", str(tiny_prompts_file), "--out", str(tmp_path / "o.h5"))
    _one_line_error(result, r"exotic\.gguf: GGUF architecture 'exotic-arch' is not supported")


def test_output_errors_leave_existing_files_untouched(tiny_model_dir, tiny_prompts_file, tiny_cache, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _one_line_error(_run(*_cache_args(tiny_model_dir, tiny_prompts_file, blocker / "o.h5")), r"cannot create directory")
    _one_line_error(_run(*_cache_args(tiny_model_dir, tiny_prompts_file, tmp_path)), r"is a directory")
    existing = tmp_path / "existing.h5"
    existing.write_bytes(tiny_cache.read_bytes())
    before = existing.read_bytes()
    _one_line_error(_run(*_cache_args(tiny_model_dir, tiny_prompts_file, existing)),
                    r"existing\.h5 exists; pass --resume to continue it or --overwrite to replace it")
    _one_line_error(_run(*_cache_args(tiny_model_dir, tiny_prompts_file, existing, "--resume", max_new_tokens=9)),
                    r"cannot --resume, setting 'max_new_tokens' differs: file has 12, now 9")
    assert existing.read_bytes() == before
    _one_line_error(_run(*_cache_args(tiny_model_dir, tiny_prompts_file, tmp_path / "new.h5", "--resume")),
                    r"no such file to --resume")


def test_inspect_refuses_truncated_and_corrupt_files(tiny_cache, tmp_path):
    data = tiny_cache.read_bytes()
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(data[: len(data) // 2])
    _one_line_error(_run("inspect", str(truncated)), r"truncated\.h5: truncated cache")
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"\x89HDF\r\n\x1a\n" + os.urandom(4096))
    _one_line_error(_run("inspect", str(garbage)), r"garbage\.h5: cannot open as a cache")
    _one_line_error(_run("inspect", str(tmp_path / "missing.h5")), r"missing\.h5: no such file")


def test_models_lists_short_names_and_fetch_refuses_unknown_names():
    result = _run("models")
    assert result.exit_code == 0
    for name, vocab in (("smollm2-135m", "49,152"), ("qwen2.5-coder-0.5b", "151,936"), ("qwen2.5-coder-1.5b", "151,936")):
        line = next(line for line in result.output.splitlines() if line.startswith(name))
        assert vocab in line and re.search(r"\s(yes|no)\s", line)
    _one_line_error(_run("models", "fetch", "gpt-17"), r"unknown packaged model 'gpt-17'")


# -- interruption ----------------------------------------------------------------------


def _spawn(args, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    code = "from specsim.cli import main; main()"
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_commits(out, proc, n=1, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"recording ended before it could be interrupted: {proc.communicate()}"
        if out.exists():
            try:
                with CacheReader(out) as r:
                    if r.trajectories.height >= n:
                        return r.trajectories.height
            except Exception:
                pass  # file being created
        time.sleep(0.02)
    raise AssertionError("no trajectory committed in time")


@pytest.fixture(scope="module")
def resume_setup(tiny_model_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("resume")
    prompts = write_prompts(base / "p.jsonl", RESUME_PROMPTS)

    def args(out):
        return ["cache", "--target", str(tiny_model_dir), "--draft", "layers:2", "--draft", "int8",
                "--prompts", str(prompts), "--max-new-tokens", "40", "--temperature", "0", "--temperature", "1",
                "--seed", "5", "--out", str(out), "--quiet"]

    reference = base / "reference.h5"
    import torch

    torch.set_num_threads(1)  # as the spawned recordings (OMP_NUM_THREADS=1): same reduction order, same bits
    assert _run(*args(reference)).exit_code == 0
    return base, args, _contents(reference)


def test_inspect_while_recording_then_kill_9_then_resume_loses_nothing(resume_setup):
    base, args, reference = resume_setup
    out = base / "killed.h5"
    proc = _spawn(args(out))
    _wait_for_commits(out, proc)
    live = _run("inspect", str(out), "--quiet")  # SWMR: readable while the recording runs
    assert live.exit_code == 0, live.output
    assert re.search(r"trajectories \(\d+ committed", live.output)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with CacheReader(out) as r:
        kept = r.trajectories.height
    assert 1 <= kept < len(reference)
    result = _run(*args(out), "--resume")
    assert result.exit_code == 0, result.output
    assert f"{kept} already present" in result.output
    _assert_same_contents(_contents(out), reference)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_keeps_committed_trajectories_and_says_how_to_resume(resume_setup, signum):
    base, args, reference = resume_setup
    out = base / f"interrupted-{int(signum)}.h5"
    proc = _spawn(args(out))
    _wait_for_commits(out, proc)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "rerun the same command with --resume to continue" in stderr and "Traceback" not in stderr
    # what the stopped run did, and where its time went (a capped run on a lent machine has no other record)
    assert re.search(r"this run: [1-9]\d* trajectories \(\d+ positions\) in [\d.]+ s; time: .*generation \d+%", stderr)
    assert _run(*args(out), "--resume").exit_code == 0
    _assert_same_contents(_contents(out), reference)


def test_a_second_writer_refuses_at_once_naming_the_first(resume_setup):
    """--resume or --overwrite while another process records would swap the file away from it."""
    from specsim.cache.lock import CacheLock

    base, args, _ = resume_setup
    out = base / "busy.h5"
    assert _run(*args(out)).exit_code == 0
    with CacheLock(out):  # another process recording it (flock conflicts across open file descriptions)
        started = time.monotonic()
        for extra in ("--resume", "--overwrite"):
            result = CliRunner().invoke(main, [*args(out), extra])
            line = result.output.strip().splitlines()[-1]
            assert result.exit_code == 1 and "is being recorded by process" in line and "one writer per cache" in line
        assert time.monotonic() - started < 5  # refused before loading any model
    assert _run(*args(out), "--overwrite").exit_code == 0  # free again


def test_a_prompt_longer_than_the_context_is_refused(tiny_model_dir, tmp_path):
    prompts = write_prompts(tmp_path / "long.jsonl", [{"question_id": 7, "category": "x",
                                                       "turns": ["speculative decoding " * 300]}])
    result = CliRunner().invoke(main, ["cache", "--target", str(tiny_model_dir), "--prompts", str(prompts),
                                       "--max-new-tokens", "8", "--out", str(tmp_path / "c.h5"), "--quiet"])
    _one_line_error(result, r"prompt 0 \(question 7, x\) has \d+ tokens; with --max-new-tokens 8 and --overhang 8 it exceeds "
                            r"the target's context of 1024 positions")
    assert not (tmp_path / "c.h5").exists()

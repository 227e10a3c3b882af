"""Sharded recording: two shards merged equal one unsharded recording bit for bit; bad merges are refused."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner

from specsim.cli import main
from specsim.record.run import parse_shard, shard_path
from tests.cli_helpers import one_line_error, record


def _record(model, prompts, out, *extra):
    return record("--target", model, "--draft", "layers:2", "--prompts", prompts, "--max-new-tokens", "6",
                  "--temperature", "0", "--temperature", "1", "--store", "stats", "--swor-samples", "32", "--out", out,
                  *extra)


@pytest.fixture(scope="module")
def run(tiny_model_dir, tiny_prompts_file, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    _record(tiny_model_dir, tiny_prompts_file, root / "whole.h5")
    for i in range(2):
        _record(tiny_model_dir, tiny_prompts_file, root / "part-{i}-of-{n}.h5", "--shard", f"{i}/2")
    return root


def _datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_two_shards_merged_equal_the_unsharded_recording(run):
    assert (run / "part-0-of-2.h5").exists() and (run / "part-1-of-2.h5").exists()
    result = CliRunner().invoke(main, ["merge", str(run / "merged.h5"), str(run / "part-1-of-2.h5"),
                                       str(run / "part-0-of-2.h5"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "merged 2 shard(s): 8 trajectories" in result.output
    whole, merged = _datasets(run / "whole.h5"), _datasets(run / "merged.h5")
    assert whole.keys() == merged.keys()
    for name in whole:
        if name.startswith("prompts/"):
            continue
        a, b = whole[name], merged[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name  # rows (with their chained digests) and every statistic
    with h5py.File(run / "part-0-of-2.h5", "r") as f:
        assert len(f["trajectories"]) == 4  # prompts 0 and 2, two temperatures each


def test_bad_merges_are_refused(run, tiny_model_dir, tiny_prompts_file):
    runner = CliRunner()
    part0, part1 = str(run / "part-0-of-2.h5"), str(run / "part-1-of-2.h5")
    missing = runner.invoke(main, ["merge", str(run / "m1.h5"), part0])
    one_line_error(missing, code=1)
    assert "shards 1/2 are missing" in missing.output and not (run / "m1.h5").exists()
    partial = runner.invoke(main, ["merge", str(run / "m1.h5"), part0, "--allow-partial", "--quiet"])
    assert partial.exit_code == 0 and "partial merge" in partial.output
    twice = runner.invoke(main, ["merge", str(run / "m2.h5"), part0, part0])
    one_line_error(twice, code=1)
    exists = runner.invoke(main, ["merge", str(run / "m1.h5"), part0, part1])
    one_line_error(exists, code=1)
    assert "exists; pass --overwrite" in exists.output
    other = run / "other-{i}-of-{n}.h5"
    _record(tiny_model_dir, tiny_prompts_file, other, "--shard", "1/2", "--seed", "5")
    mixed = runner.invoke(main, ["merge", str(run / "m3.h5"), part0, str(run / "other-1-of-2.h5")])
    one_line_error(mixed, code=1)
    assert "seed = 5" in mixed.output
    whole = runner.invoke(main, ["merge", str(run / "m4.h5"), str(run / "whole.h5"), part0])
    one_line_error(whole, code=1)


def test_shard_arguments(tmp_path):
    assert parse_shard("1/4") == (1, 4) and parse_shard(None) is None
    assert parse_shard("auto", {"RANK": "3", "WORLD_SIZE": "8"}) == (3, 8)
    assert parse_shard("auto", {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4",
                                "SLURM_ARRAY_TASK_MIN": "1"}) == (1, 4)
    for text, message in [("4/4", "I must be in 0..N-1"), ("x", "write I/N"), ("auto", "no RANK/WORLD_SIZE")]:
        with pytest.raises(Exception, match=message):
            parse_shard(text, {})
    assert shard_path(tmp_path / "r-{i}-of-{n}.h5", (2, 4)).name == "r-2-of-4.h5"
    with pytest.raises(Exception, match="put \\{i\\} in the name"):
        shard_path(tmp_path / "r.h5", (0, 2))
    with pytest.raises(Exception, match="add --shard"):
        shard_path(tmp_path / "r-{i}.h5", None)


def test_merge_runs_where_polars_is_not_installed_and_still_compares_the_prompts(run, tiny_model_dir,
                                                                                 tiny_prompts_file, tmp_path):
    """Shards recorded on a GPU image without polars are merged there too: `merge` imports none (a stub that fails
    every polars import stands in), gives the unsharded recording's data, and still refuses a shard holding other
    prompts (the prompts file rewritten between the shards: its settings' prompts digest differs)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['polars'] = None\n"  # `import polars` now raises ImportError
            "from specsim.cli import main\n"
            "main(sys.argv[1:], standalone_mode=False)\n")
    merged = tmp_path / "merged.h5"
    subprocess.run([sys.executable, "-c", code, "merge", str(merged), str(run / "part-0-of-2.h5"),
                    str(run / "part-1-of-2.h5"), "--quiet"], check=True)
    whole, ours = _datasets(run / "whole.h5"), _datasets(merged)
    assert all(whole[k].tobytes() == ours[k].tobytes() for k in whole if not k.startswith("prompts/"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(Path(tiny_prompts_file).read_text())
    _record(tiny_model_dir, prompts, tmp_path / "a-{i}-of-{n}.h5", "--shard", "0/2")
    prompts.write_text(Path(tiny_prompts_file).read_text().replace("a", "b"))
    _record(tiny_model_dir, prompts, tmp_path / "a-{i}-of-{n}.h5", "--shard", "1/2")
    other = subprocess.run([sys.executable, "-c", code, "merge", str(tmp_path / "m.h5"), str(tmp_path / "a-0-of-2.h5"),
                            str(tmp_path / "a-1-of-2.h5")], capture_output=True, text=True)
    assert other.returncode != 0 and "prompts_sha256" in other.stderr and not (tmp_path / "m.h5").exists()

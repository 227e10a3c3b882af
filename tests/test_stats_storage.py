"""`--store stats`: a cache of per-position statistics only replays every exact policy as the full cache does."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from specsim.cache.reader import CacheReader
from specsim.cli import main
from specsim.sim.sweep import simulate
from tests.cli_helpers import one_line_error, record

# (trees, policies, temperature): greedy trees, sampling chains and trees (iid exact, swor Monte-Carlo from the
# recorded replicates), adaptive chains, and a recorded lossy rule
SWEEPS = [
    (["chain:3", "kary:2,2", "widths:3,1", "optimal:4"], ["greedy", "adaptive-hf"], 0.0),
    (["chain:3", "kary:2,2", "widths:3,2", "optimal:4"], ["sample", "adaptive-history"], 1.0),
    (["kary:3,2", "kary:2,2"], ["sample"], 1.0),
    (["chain:2", "kary:2,1"], ["p>=q"], 1.0),
]


def _record(model, prompts, out, store):
    record("--target", model, "--draft", "layers:2", "--draft", "int8", "--prompts", prompts, "--max-new-tokens", "10",
           "--temperature", "0", "--temperature", "1", "--candidates", "4", "--swor-samples", "64", "--store", store,
           "--out", out)
    return out


@pytest.fixture(scope="module")
def pair(tiny_model_dir, tiny_prompts_file, tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    return (_record(tiny_model_dir, tiny_prompts_file, root / "full.h5", "full"),
            _record(tiny_model_dir, tiny_prompts_file, root / "stats.h5", "stats"))


def test_the_stats_cache_keeps_no_distributions_and_the_same_statistics(pair):
    full, stats = pair
    with CacheReader(full) as a, CacheReader(stats) as b:
        assert a.spec.storage == "full" and b.spec.storage == "stats" and not b.has_distributions
        assert a.fingerprint is not None and b.fingerprint is not None
        assert a.trajectories.drop("traj_index").equals(b.trajectories.drop("traj_index"))
        n = a.n_positions
        np.testing.assert_array_equal(a.tokens(0, n), b.tokens(0, n))
        for column in a.spec.columns:
            names = ["logprob", "top_id"] if column == "target" else \
                ["rank", "logprob", "top_ids", "overlap", "pi_iid", "pi_swor", "pi_swor_groups", "lossy_alpha",
                 "lossy_tv"]
            for name in names:  # computed on the same device from the same logits: bit for bit
                np.testing.assert_array_equal(a.stats(column, name, 0, n), b.stats(column, name, 0, n))
        with pytest.raises(Exception, match="stats-only cache"):
            b.logits("target", 0, 1)
    assert stats.stat().st_size < full.stat().st_size


@pytest.mark.parametrize("trees,policies,temperature", SWEEPS)
def test_simulate_gives_the_same_rows_on_both(pair, trees, policies, temperature):
    full, stats = pair
    kw = dict(trees=trees, policies=policies, temperatures=[temperature], multi_draft="iid", n_boot=50,
              on_skip=lambda line: None)
    for multi_draft in (["iid", "swor"] if "sample" in policies else ["iid"]):
        kw["multi_draft"] = multi_draft
        a = simulate(full, **kw).drop("cache")
        b = simulate(stats, **kw).drop("cache")
        assert a.height > 0 and a.columns == b.columns
        numeric = [c for c, t in a.schema.items() if t in (pl.Float64, pl.Float32)]
        for c in numeric:
            np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), atol=1e-9, equal_nan=True, err_msg=c)
        other = [c for c in a.columns if c not in numeric and c != "storage"]
        assert a.select(other).equals(b.select(other))


def test_what_was_not_recorded_is_refused_saying_what_to_record(pair):
    _, stats = pair
    runner = CliRunner()
    lossy = runner.invoke(main, ["simulate", str(stats), "--tree", "chain:2", "--policy", "p>=lq:0.3",
                                 "--temperature", "1", "--quiet"])
    one_line_error(lossy, code=2)
    assert "was not recorded in this stats-only cache" in lossy.output and "--lossy p>=lq:0.3" in lossy.output
    wide = runner.invoke(main, ["simulate", str(stats), "--tree", "kary:6,1", "--policy", "sample",
                                "--multi-draft", "swor", "--temperature", "1", "--quiet"])
    one_line_error(wide, code=2)
    assert "--candidates 6" in wide.output
    inspected = runner.invoke(main, ["inspect", str(stats)])  # agreement and α come from the statistics
    assert inspected.exit_code == 0, inspected.output
    assert "layers:2" in inspected.output and "int8" in inspected.output


def test_optimize_says_when_the_recorded_candidates_cap_a_sampling_tree(pair):
    """The stats cache recorded π for 4 candidates: a budget-8 sampling tree may not fan out wider, and says so."""
    _, stats = pair
    out = CliRunner().invoke(main, ["optimize", str(stats), "--budget", "8", "--policy", "sample",
                                    "--multi-draft", "swor", "--temperature", "1", "--draft", "layers:2", "--samples", "8"])
    assert out.exit_code == 0, out.output
    assert "fan-out capped at the 4 candidates per node this cache recorded" in out.output
    assert "Monte-Carlo, 64 samples/position" in out.output  # the recording's 64 swor samples, not --samples 8

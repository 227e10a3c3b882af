"""Tree attention: every implementation equals the reference; the bench refuses wrong ones."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.attention import bench, timing_charts
from specsim.attention.tree_attention import (
    IMPLEMENTATIONS,
    DenseMask,
    ancestor_mask,
    leaf_paths,
    max_violation,
    random_qkv,
    reference_tree_attention,
    validate_parents,
)
from specsim.cli import main
from specsim.errors import ModelError, SpecError
from specsim.trees import Tree
from specsim.specs import parse_tree
from tests.strategies import trees
from tests.cli_helpers import one_line_error

torch.set_num_threads(1)


def _check_all(parents, batch, heads, kv_heads, context_len, head_dim, seed=0):
    q, k, v = random_qkv(batch, heads, kv_heads, context_len, len(parents), head_dim, seed=seed)
    ref = reference_tree_attention(q, k, v, parents)
    checked = []
    for name, cls in IMPLEMENTATIONS.items():
        if not cls.supports(parents):
            continue
        out = cls(parents, context_len)(q, k, v)
        assert out.shape == q.shape
        err, ok = max_violation(out, ref)
        assert ok, f"{name} differs from the reference by {err} on parents {list(parents)}, L={context_len}"
        checked.append(name)
    return checked


@settings(max_examples=25, deadline=None)
@given(
    tree=trees(max_nodes=14),
    context_len=st.sampled_from([0, 1, 5, 33]),
    heads_kv=st.sampled_from([(2, 2), (4, 2), (6, 3), (4, 1)]),
    batch=st.integers(1, 2),
)
def test_every_implementation_equals_the_reference_on_random_trees(tree, context_len, heads_kv, batch):
    heads, kv_heads = heads_kv
    checked = _check_all(tree.parents, batch, heads, kv_heads, context_len, head_dim=8)
    assert {"per_branch", "dense", "flex", "lse_merge"} <= set(checked)


@pytest.mark.parametrize("spec", ["chain:5", "kary:2,3", "widths:4,2,1", "medusa:[[0],[1],[0,0],[0,1],[1,0]]"])
def test_named_trees_with_gqa_and_a_context_longer_than_a_flex_block(spec):
    parents = parse_tree(spec).parents
    checked = _check_all(parents, batch=2, heads=9, kv_heads=3, context_len=150, head_dim=16, seed=3)
    assert ("causal" in checked) == spec.startswith("chain")


def test_reference_matches_a_hand_computed_sibling():
    # root 0 with children 1 and 2, no context: node 2 attends to {0, 2} only, never to its sibling 1
    q, k, v = random_qkv(1, 1, 1, 0, 3, 4, seed=1)
    out = reference_tree_attention(q, k, v, np.array([-1, 0, 0]))
    qd, kd, vd = (t[0, 0].double().numpy() for t in (q, k, v))
    s = np.array([qd[2] @ kd[0], qd[2] @ kd[2]]) / math.sqrt(4)
    w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    np.testing.assert_allclose(out[0, 0, 2].numpy(), w[0] * vd[0] + w[1] * vd[2], rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(tree=trees(max_nodes=20))
def test_mask_helpers_agree_with_the_tree_module(tree):
    np.testing.assert_array_equal(ancestor_mask(tree.parents), tree.ancestor_mask())
    assert [p.tolist() for p in leaf_paths(tree.parents)] == [p.tolist() for p in tree.leaf_paths()]


@pytest.mark.parametrize("parents, message", [
    ([0, 0], "root"),
    ([-1, 5], "not another node"),
    ([-1, 2, 1], "cycle"),
    ([], "non-empty"),
])
def test_invalid_parent_arrays_are_spec_errors(parents, message):
    with pytest.raises(SpecError, match=message):
        validate_parents(np.array(parents, dtype=np.int64))


def test_causal_refuses_branching_trees():
    with pytest.raises(SpecError, match="chains only"):
        IMPLEMENTATIONS["causal"](np.array([-1, 0, 0]), 4)


@pytest.mark.parametrize("shape", bench.SHAPES)
@pytest.mark.parametrize("n", [2, 5, 16])
def test_family_trees_have_exactly_n_nodes(shape, n):
    tree = bench.family_tree(shape, n)
    assert tree.n_nodes == n
    if shape == "chain":
        assert tree.max_depth == n - 1
    if shape == "star":
        assert tree.max_depth == 1


def _tiny(**overrides):
    fields = dict(batch_sizes=(1, 2), context_lens=(16,), tree_sizes=(4, 8), shapes=("chain", "kary2"),
                  heads=4, kv_heads=2, head_dim=8, warmup=1, repeats=3)
    fields.update(overrides)
    return bench.SweepConfig(**fields)


def test_sweep_checks_then_times_every_implementation():
    table = bench.run_sweep(_tiny(), progress=False)
    # 2 batch x 2 sizes x (chain: 5 impls, kary2: 4 impls without causal)
    assert table.height == 2 * 2 * 9
    assert table["check_passed"].all() and table["median_ms"].is_not_null().all()
    assert (table["p10_ms"] <= table["median_ms"]).all() and (table["median_ms"] <= table["p90_ms"]).all()
    assert table["device"].str.starts_with("cpu").all() and set(table["timer"]) == {"perf_counter"}
    per_branch = table.filter((pl.col("impl") == "per_branch") & (pl.col("shape") == "kary2") & (pl.col("N") == 8))
    assert set(per_branch["calls"]) == {4}  # a binary tree cut to 8 nodes has 4 leaves
    speedups = timing_charts.with_speedups(table).filter(pl.col("impl") == "per_branch")
    assert (speedups["speedup_vs_per_branch"] == 1.0).all()


class _WrongForBranches(DenseMask):
    """Causal mask over the tree tokens: right for chains, wrong for any branching tree."""

    name = "dense"

    def __init__(self, parents, context_len, device="cpu", *, compile=False):
        super().__init__(np.arange(-1, len(parents) - 1), context_len, device)


def test_sweep_refuses_to_time_an_implementation_that_fails_the_check(monkeypatch):
    monkeypatch.setitem(IMPLEMENTATIONS, "dense", _WrongForBranches)
    table = bench.run_sweep(_tiny(batch_sizes=(1,), tree_sizes=(6,), impls=("dense", "lse_merge")), progress=False)
    dense = {r["shape"]: r for r in table.filter(pl.col("impl") == "dense").iter_rows(named=True)}
    assert dense["chain"]["check_passed"] and dense["chain"]["median_ms"] is not None
    assert not dense["kary2"]["check_passed"] and dense["kary2"]["median_ms"] is None
    assert dense["kary2"]["note"].startswith("not timed")
    assert table.filter(pl.col("impl") == "lse_merge")["check_passed"].all()


def test_sweep_with_explicit_tree_specs_replaces_the_families(tmp_path):
    saved = tmp_path / "tree.json"
    saved.write_text(Tree.from_paths([(0,), (1,), (0, 0)], name="mine").to_json())
    config = _tiny(trees=("kary:2,2", f"file:{saved}"), impls=("per_branch", "flex"), batch_sizes=(1,))
    table = bench.run_sweep(config, progress=False)
    assert set(zip(table["shape"], table["N"])) == {("kary:2,2", 7), (f"file:{saved}", 4)}


def test_attention_shape_from_a_local_config(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=96, num_attention_heads=6, num_key_value_heads=2).save_pretrained(tmp_path)
    shape = bench.attention_shape(str(tmp_path))
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (6, 2, 16)
    with pytest.raises(ModelError, match="neither a local model directory"):
        bench.attention_shape(str(tmp_path / "missing"))


def test_cli_writes_table_and_charts(tmp_path):
    out, charts = tmp_path / "bench.csv", tmp_path / "charts"
    result = CliRunner().invoke(main, [
        "bench-attention", "--device", "cpu", "--batch-sizes", "1,2", "--contexts", "16,64", "--tree-sizes", "4,8",
        "--shapes", "chain,widths", "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--repeats", "2",
        "--warmup", "0", "--quiet", "--out", str(out), "--charts", str(charts),
    ])
    assert result.exit_code == 0, result.output
    assert "device: cpu" in result.output and "dtype: float32" in result.output
    table = pl.read_csv(out)
    assert f"equality check vs reference: {table.height}/{table.height} passed" in result.output
    assert set(table["impl"]) == {"per_branch", "dense", "flex", "lse_merge", "causal"}
    assert {"device", "dtype", "impl", "B", "L", "N", "shape", "heads", "head_dim", "median_ms", "p10_ms",
            "p90_ms", "repeats", "check_passed"} <= set(table.columns)
    for name in ("time_vs_context", "speedup_vs_tree_size", "speedup_heatmap"):
        assert (charts / f"{name}.png").stat().st_size > 1000
        assert (charts / f"{name}.svg").read_text().lstrip().startswith("<svg")


@pytest.mark.parametrize("args, message", [
    (["--impl", "fastest"], "unknown attention implementation 'fastest'"),
    (["--tree", "kary:2"], "kary:2"),
    (["--heads", "9", "--kv-heads", "2"], "multiple of kv_heads"),
    (["--contexts", "1,x"], "comma-separated integers"),
    (["--out", "table.txt"], "unknown format .txt"),
])
def test_cli_rejects_bad_input_in_one_line(args, message):
    result = CliRunner().invoke(main, ["bench-attention", "--device", "cpu", "--quiet", *args])
    if result.exit_code == 2 and result.output.startswith("Usage:"):  # click's own usage error: its format
        assert message in result.output and isinstance(result.exception, SystemExit)
    else:
        one_line_error(result, message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cli_says_when_cuda_is_missing():
    result = CliRunner().invoke(main, ["bench-attention", "--device", "cuda"])
    assert result.exit_code == 1 and "sees no GPU" in result.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_sweep_passes_the_check_with_compiled_flex(dtype):
    config = _tiny(device="cuda", dtype=dtype, compile_flex=True, context_lens=(100, 1000), heads=8, kv_heads=2,
                   head_dim=64)
    table = bench.run_sweep(config, progress=False)
    assert table["check_passed"].all(), table.filter(~pl.col("check_passed"))["note"].to_list()
    assert set(table["timer"]) == {"cuda-events"}
    assert table.filter(pl.col("impl") == "flex")["compiled"].all()

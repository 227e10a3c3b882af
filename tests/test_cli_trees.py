"""`specsim trees` through click's CliRunner."""

from __future__ import annotations

import json

from click.testing import CliRunner

from specsim.cli import main
from specsim.specs import DRAFT_KINDS, POLICY_KINDS, TREE_KINDS, parse_tree
from specsim.trees import Tree
from tests.cli_helpers import one_line_error


def run(*args):
    return CliRunner().invoke(main, ["trees", *args])


def test_lists_the_whole_vocabulary_from_the_registry():
    result = run()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "Tree families (pass a SPEC to draw it):"
    for name, line in zip(TREE_KINDS, lines[1:]):
        assert line.strip().startswith(f"{name}:")
    assert "kary:W,D | kary:W@N" in result.output and "[needs a cache" in result.output
    for kind in (*DRAFT_KINDS.values(), *POLICY_KINDS.values()):
        assert kind.summary in result.output
    assert "LOSSY" in result.output and "Monte-Carlo" in result.output


def test_draws_each_spec_with_budget_and_depth():
    result = run("chain:2", "widths:2,1")
    assert result.exit_code == 0, result.output
    assert result.output == (
        "chain:2: budget 2, depth 2, nodes per depth [1,1]\n"
        "root\n"
        "└─ r0\n"
        "   └─ r0\n"
        "\n"
        "widths:2,1: budget 3, depth 2, nodes per depth [2,1]\n"
        "root\n"
        "├─ r0\n"
        "│  └─ r0\n"
        "└─ r1\n"
    )


def test_long_drawings_are_cut():
    result = run("kary:3,5", "--max-lines", "4")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "... (360 more nodes)"


def test_json_output_loads_back_as_the_same_tree(tmp_path):
    result = run("kary:2,3", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["name"] == "kary:2,3"
    assert Tree.from_json(result.output) == parse_tree("kary:2,3")
    (tmp_path / "t.json").write_text(result.output)
    drawn = run(f"file:{tmp_path / 't.json'}")
    assert drawn.exit_code == 0 and "budget 14, depth 3" in drawn.output


def test_bad_spec_is_a_one_line_error():
    result = run("chain:2", "medusa:[[0],[1,0]]")
    assert one_line_error(result, code=2) == (
        "Error: medusa:[[0],[1,0]]: path [1, 0] at index 1 has no parent [1]; "
        "rank paths must be prefix-closed"
    )


def test_optimal_needs_a_cache():
    result = run("optimal:16")
    assert result.exit_code == 2
    assert result.output.startswith("Error: optimal:16: needs a cache")


def test_help_has_examples():
    result = run("--help")
    assert result.exit_code == 0
    assert "specsim trees chain:4 kary:2,3 widths:4,2,2,1" in result.output

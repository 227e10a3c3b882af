"""Draft trees: construction, invariants, spec round-trips and spec errors."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings

from specsim.errors import SpecError
from specsim.trees import Tree, draw_tree
from specsim.specs import TREE_KINDS, parse_tree
from tests.strategies import rank_path_sets, tree_specs, trees


@settings(max_examples=150, deadline=None)
@given(tree=trees())
def test_spec_and_json_round_trip(tree):
    assert parse_tree(tree.to_spec()) == tree
    named = Tree(tree.parents, tree.ranks, name="mine")
    back = Tree.from_json(named.to_json())
    assert back == tree and back.name == "mine"


@settings(max_examples=150, deadline=None)
@given(paths=rank_path_sets())
def test_from_paths_is_order_independent_and_keeps_the_paths(paths):
    tree = Tree.from_paths(paths)
    shuffled = list(paths)
    random.Random(0).shuffle(shuffled)
    assert Tree.from_paths(shuffled) == tree
    assert set(tree.rank_paths()[1:]) == set(paths)
    assert tree.budget == len(paths)


@settings(max_examples=150, deadline=None)
@given(tree=trees())
def test_structure_is_consistent(tree):
    paths = tree.rank_paths()
    assert all(p[:-1] in set(paths) for p in paths[1:])  # prefix-closed
    assert paths == sorted(paths, key=lambda p: (len(p), p))  # canonical: breadth-first, by rank
    np.testing.assert_array_equal(tree.depths, [len(p) for p in paths])
    assert tree.max_depth == max(len(p) for p in paths)
    assert tree.level_sizes().sum() == tree.budget
    for i in range(tree.n_nodes):
        kids = tree.children(i)
        assert len(kids) == tree.n_children[i]
        assert (tree.parents[kids] == i).all()
        assert list(tree.ranks[kids]) == sorted(tree.ranks[kids])


@settings(max_examples=150, deadline=None)
@given(tree=trees())
def test_ancestor_mask_matches_rank_paths(tree):
    paths = tree.rank_paths()
    mask = tree.ancestor_mask()
    expected = [[paths[i][: len(paths[j])] == paths[j] for j in range(tree.n_nodes)] for i in range(tree.n_nodes)]
    np.testing.assert_array_equal(mask, expected)


@settings(max_examples=100, deadline=None)
@given(tree=trees())
def test_leaf_paths_cover_every_leaf_from_the_root(tree):
    leaves = tree.leaf_paths()
    assert [int(p[-1]) for p in leaves] == np.flatnonzero(tree.n_children == 0).tolist()
    for path in leaves:
        assert path[0] == 0
        assert (tree.parents[path[1:]] == path[:-1]).all()
    assert set().union(*(set(p.tolist()) for p in leaves)) == set(range(tree.n_nodes))


@settings(max_examples=100, deadline=None)
@given(spec=tree_specs())
def test_parsed_trees_are_named_by_their_spec(spec):
    tree = parse_tree(spec)
    assert tree.name == spec
    assert parse_tree(tree.to_spec()) == tree


@pytest.mark.parametrize("g", [1, 2, 7])
def test_chain_budget_and_depth(g):
    tree = parse_tree(f"chain:{g}")
    assert (tree.budget, tree.max_depth) == (g, g)
    assert tree.rank_paths()[-1] == (0,) * g


@pytest.mark.parametrize("w, d", [(1, 3), (2, 3), (3, 2), (4, 1)])
def test_kary_budget_and_levels(w, d):
    tree = parse_tree(f"kary:{w},{d}")
    assert tree.budget == sum(w**i for i in range(1, d + 1))
    assert tree.max_depth == d
    assert tree.level_sizes().tolist() == [w**i for i in range(1, d + 1)]
    assert (tree.n_children[tree.depths < d] == w).all()


def test_widths_branch_along_the_top_path():
    tree = parse_tree("widths:4,2,2,1")
    assert (tree.budget, tree.max_depth) == (9, 4)
    assert tree.level_sizes().tolist() == [4, 2, 2, 1]
    parents_paths = {p[:-1] for p in tree.rank_paths()[1:]}
    assert parents_paths == {(), (0,), (0, 0), (0, 0, 0)}


def test_large_trees_are_fine():
    tree = parse_tree("kary:4,6")  # 5461 nodes
    mask = tree.ancestor_mask()
    np.testing.assert_array_equal(mask.sum(axis=1), tree.depths + 1)
    assert parse_tree("chain:3000").max_depth == 3000


def test_trees_are_immutable():
    tree = parse_tree("kary:2,2")
    with pytest.raises(ValueError):
        tree.parents[1] = 0
    with pytest.raises(ValueError):
        tree.ancestor_mask()[0, 1] = True


def test_optimal_uses_the_fit_callback_and_names_the_tree():
    tree = parse_tree("optimal:3", fit=lambda family, n: parse_tree(f"widths:{n}"))
    assert (tree.name, tree.budget, tree.n_children[0]) == ("optimal:3", 3, 3)


def test_kary_prefix_specs_parse_everywhere_rows_name_them():
    """simulate names rows kary:2@8; the same spec parses anywhere (it failed before the registry)."""
    tree = parse_tree("kary:2@8")
    assert (tree.name, tree.budget, tree.level_sizes().tolist()) == ("kary:2@8", 8, [2, 4, 2])
    from specsim.specs import expand_trees, tree_family

    assert expand_trees(["kary:2", "chain", "optimal"], [3]) == ["kary:2@3", "chain:3", "optimal:3"]
    assert [tree_family(s) for s in ("kary:2@8", "kary:2,3", "chain:4", "widths:2,1")] == [
        "kary:2", "kary", "chain", "widths"]
    with pytest.raises(SpecError, match="kary:x@3: kary:W@N width 'x' is not an integer"):
        parse_tree("kary:x@3")


def test_file_trees(tmp_path):
    saved = tmp_path / "t.json"
    saved.write_text(parse_tree("kary:2,2").to_json())
    assert parse_tree(f"file:{saved}") == parse_tree("kary:2,2")
    assert parse_tree(f"file:{saved}").name == f"file:{saved}"
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([[0], [0, 0], [1]]))
    assert parse_tree(f"file:{bare}").rank_paths() == [(), (0,), (1,), (0, 0)]


def test_draw_tree():
    assert draw_tree(parse_tree("widths:2,2")) == "\n".join(
        ["root", "├─ r0", "│  ├─ r0", "│  └─ r1", "└─ r1"]
    )


@pytest.mark.parametrize(
    "spec, message",
    [
        ("medusa:[[0],[1,0]]", "medusa:[[0],[1,0]]: path [1, 0] at index 1 has no parent [1]"),
        ("medusa:[[0],[0,0],[0]]", "path [0] at index 2 repeats the path at index 0"),
        ("medusa:[[0],[0,-1]]", "path [0, -1] at index 1 has an invalid rank -1"),
        ("medusa:[[0],[]]", "path [] at index 1 is the root"),
        ("medusa:[[0],[0.5]]", "non-integer rank 0.5"),
        ("medusa:[[0]", "expected a list of rank paths"),
        ("chain:0", "chain:0: chain length 0"),
        ("chain:x", "chain:x: argument #1 is 'x', not an integer"),
        ("kary:2", "expected 2 integers (kary:W,D), got 1"),
        ("kary:10,6", "over the limit"),
        ("widths:4,0,1", "width #2 is 0"),
        ("widths:4,,1", "width #2 is '', not an integer"),
        ("beam:4", "'beam:4' is not a tree spec; use one of chain:4"),
        ("chain", "'chain' is not a tree spec"),
        ("optimal:8", "optimal:8: needs a cache"),
        ("file:/does/not/exist.json", "cannot read /does/not/exist.json"),
    ],
)
def test_malformed_specs_say_where(spec, message):
    with pytest.raises(SpecError) as info:
        parse_tree(spec)
    assert message in str(info.value)


def test_bad_json_files(tmp_path):
    for text, message in [
        ("{", "not JSON"),
        ('{"format": "other"}', "specsim-tree"),
        ('{"format": "specsim-tree", "version": 9, "paths": []}', "version 9"),
        ('{"format": "specsim-tree", "version": 1, "paths": [[1]]}', None),
    ]:
        (tmp_path / "t.json").write_text(text)
        if message is None:  # a valid file: a tree whose only draft is rank 1
            assert parse_tree(f"file:{tmp_path / 't.json'}").rank_paths() == [(), (1,)]
        else:
            with pytest.raises(SpecError, match=message):
                parse_tree(f"file:{tmp_path / 't.json'}")


@pytest.mark.parametrize(
    "parents, ranks, message",
    [
        ([0, 0], [-1, 0], "node 0 is the root"),
        ([-1, 1], [-1, 0], "node 1 has parent 1"),
        ([-1, 0, 0], [-1, 0, 0], "node 2 repeats rank 0"),
        ([-1, 0, 0], [-1, 1, 0], "out of canonical order"),
        ([-1, 0, 1, 0], [-1, 0, 0, 1], "out of canonical order"),
        ([-1, 0], [-1, -3], "negative rank"),
        ([-1, 0], [-1], "has 2 nodes but Tree.ranks has 1"),
    ],
)
def test_invalid_arrays_name_the_node(parents, ranks, message):
    with pytest.raises(SpecError, match=message):
        Tree(np.array(parents), np.array(ranks))


def test_every_family_is_registered_with_a_docstring():
    assert set(TREE_KINDS) == {"chain", "kary", "widths", "medusa", "file", "optimal", "dynamic"}
    assert all(k.summary and parse_tree(k.example, fit=lambda f, a: parse_tree("chain:1")).name == k.example
               for k in TREE_KINDS.values() if k.name != "file")

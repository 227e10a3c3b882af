"""Static draft trees as prefix-closed sets of rank paths.

A draft tree (SpecInfer, Miao et al. 2024; Medusa, Cai et al. 2024; Sequoia,
Chen et al. 2024) is verified in one target forward pass. Its shape is fixed
before decoding: each node is named by its *rank path* (r_1, ..., r_d), and the
node's token is the draft's r_d-th most likely token given the tokens on the path
to it (rank 0 = the draft's top choice; in sampling trees, the r-th candidate
drawn). Node 0 is the root: the last verified token, which is not drafted.

A `Tree` is an immutable parent-index array plus the rank of each node among its
siblings, in one canonical order (breadth-first, siblings by rank), so that the
node ids every other module uses (KV slots, attention masks, simulator tables)
are the same for the same shape. Everything else (depths, masks, rank paths) is
computed from those two arrays.

The family builders here (chain, kary, widths, medusa, file) turn a spec's argument into
a tree; `specsim.specs` is the table of tree families that parses whole specs
("kary:2@8", "optimal:16") for every command.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from specsim.errors import SpecError

MAX_NODES = 100_000  # above this a tree is surely a typo (kary:10,6 is 1.1M nodes)
JSON_FORMAT = "specsim-tree"
JSON_VERSION = 1


@dataclass(frozen=True, eq=False)
class Tree:
    """A static draft tree: node 0 is the root (the last verified token)."""

    parents: np.ndarray  # (n_nodes,) int32; parents[0] == -1, parents[i] < i, breadth-first
    ranks: np.ndarray  # (n_nodes,) int32; rank among the parent's draft candidates; root -1
    name: str = ""  # the spec it was built from; the row label in tables

    def __post_init__(self) -> None:
        parents = _int32_vector(self.parents, "parents")
        ranks = _int32_vector(self.ranks, "ranks")
        _validate(parents, ranks)
        parents.flags.writeable = False
        ranks.flags.writeable = False
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "ranks", ranks)

    # Equality is by shape; the name is only a label.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        return np.array_equal(self.parents, other.parents) and np.array_equal(self.ranks, other.ranks)

    def __hash__(self) -> int:
        return hash((self.parents.tobytes(), self.ranks.tobytes()))

    def __repr__(self) -> str:
        return f"Tree({self.name or self.to_spec()!s}, budget={self.budget}, depth={self.max_depth})"

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]], name: str = "") -> "Tree":
        """Build a tree from rank paths such as [(0,), (0, 0), (1,)]; the root is implicit.

        The paths must be prefix-closed: every path's parent path is also listed.
        Any order is accepted; nodes are numbered in canonical order.
        """
        tuples: list[tuple[int, ...]] = []
        seen: dict[tuple[int, ...], int] = {}
        for index, raw in enumerate(paths):
            path = _as_rank_path(raw, index)
            if path in seen:
                raise SpecError(
                    f"path {list(path)} at index {index} repeats the path at index {seen[path]}"
                )
            seen[path] = index
            tuples.append(path)
        if len(tuples) + 1 > MAX_NODES:
            raise SpecError(f"{len(tuples)} paths: a tree is limited to {MAX_NODES - 1} drafts")
        for index, path in enumerate(tuples):
            if len(path) > 1 and path[:-1] not in seen:
                raise SpecError(
                    f"path {list(path)} at index {index} has no parent {list(path[:-1])}; "
                    "rank paths must be prefix-closed"
                )
        # Sorting by (depth, path) is breadth-first with siblings by rank, because the
        # parents at each depth are themselves in lexicographic order.
        tuples.sort(key=lambda t: (len(t), t))
        node_of: dict[tuple[int, ...], int] = {(): 0}
        parents = np.empty(len(tuples) + 1, dtype=np.int32)
        ranks = np.empty(len(tuples) + 1, dtype=np.int32)
        parents[0] = ranks[0] = -1
        for node, path in enumerate(tuples, start=1):
            node_of[path] = node
            parents[node] = node_of[path[:-1]]
            ranks[node] = path[-1]
        return cls(parents, ranks, name)

    @property
    def n_nodes(self) -> int:
        return int(self.parents.shape[0])

    @property
    def budget(self) -> int:
        """Draft tokens per step: every node but the root."""
        return self.n_nodes - 1

    @cached_property
    def depths(self) -> np.ndarray:
        """(n_nodes,) int32 depth of each node; the root has depth 0."""
        depths = np.zeros(self.n_nodes, dtype=np.int32)
        # Breadth-first order: every parent's depth is final before its children are read.
        for start, stop in self._level_bounds:
            depths[start:stop] = depths[self.parents[start:stop]] + 1
        depths.flags.writeable = False
        return depths

    @property
    def max_depth(self) -> int:
        return int(self.depths[-1])

    @property
    def is_chain(self) -> bool:
        """At least one draft, each node's only child its parent's top-ranked candidate: chain:k, what an engine's
        num_speculative_tokens drafts."""
        return self.budget >= 1 and int(self.n_children.max()) == 1 and not self.ranks[1:].any()

    @cached_property
    def n_children(self) -> np.ndarray:
        """(n_nodes,) int32 number of children of each node."""
        counts = np.bincount(self.parents[1:], minlength=self.n_nodes).astype(np.int32)
        counts.flags.writeable = False
        return counts

    def children(self, i: int) -> np.ndarray:
        """Node ids of node i's children, sorted by rank."""
        if not 0 <= i < self.n_nodes:
            raise IndexError(f"node {i} is not in a tree of {self.n_nodes} nodes")
        # Breadth-first order makes `parents` non-decreasing and each sibling run contiguous.
        start = int(np.searchsorted(self.parents, i, side="left"))
        return np.arange(start, start + int(self.n_children[i]), dtype=np.int64)

    def rank_paths(self) -> list[tuple[int, ...]]:
        """The rank path of every node; the root's is ()."""
        paths: list[tuple[int, ...]] = [()]
        for node in range(1, self.n_nodes):
            paths.append(paths[self.parents[node]] + (int(self.ranks[node]),))
        return paths

    def ancestor_mask(self) -> np.ndarray:
        """(n_nodes, n_nodes) bool: [i, j] is True when j is an ancestor of i or i itself.

        This is the tree-attention mask: tree token i may attend to tree token j.
        """
        return self._ancestor_mask

    @cached_property
    def _ancestor_mask(self) -> np.ndarray:
        n = self.n_nodes
        mask = np.zeros((n, n), dtype=bool)  # (n_nodes, n_nodes)
        mask[0, 0] = True
        for start, stop in self._level_bounds:
            nodes = np.arange(start, stop)
            mask[start:stop] = mask[self.parents[start:stop]]
            mask[nodes, nodes] = True
        mask.flags.writeable = False
        return mask

    def leaf_paths(self) -> list[np.ndarray]:
        """Root-to-leaf node-id paths, one per leaf in node order (for per-branch attention)."""
        paths = []
        for leaf in np.flatnonzero(self.n_children == 0):
            path = [int(leaf)]
            while path[-1] != 0:
                path.append(int(self.parents[path[-1]]))
            paths.append(np.array(path[::-1], dtype=np.int64))
        return paths

    def level_sizes(self) -> np.ndarray:
        """Nodes at each depth 1..max_depth: the draft batch of each drafting step."""
        return np.bincount(self.depths, minlength=self.max_depth + 1)[1:].astype(np.int64)

    def to_spec(self) -> str:
        """A `medusa:` spec that `parse_tree` turns back into this tree."""
        return "medusa:" + json.dumps([list(p) for p in self.rank_paths()[1:]], separators=(",", ":"))

    def to_json(self) -> str:
        """The `file:` format: {"format": "specsim-tree", "version": 1, "name": ..., "paths": [...]}."""
        paths = [list(p) for p in self.rank_paths()[1:]]
        return json.dumps(
            {"format": JSON_FORMAT, "version": JSON_VERSION, "name": self.name, "paths": paths}
        )

    @classmethod
    def from_json(cls, text: str) -> "Tree":
        """Read `to_json` output, or a bare JSON list of rank paths."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        if isinstance(data, list):
            return cls.from_paths(data)
        if not isinstance(data, dict) or data.get("format") != JSON_FORMAT:
            raise SpecError(
                f'expected {{"format": "{JSON_FORMAT}", ...}} (as written by Tree.to_json) '
                "or a JSON list of rank paths"
            )
        if data.get("version") != JSON_VERSION:
            raise SpecError(
                f"tree file version {data.get('version')!r} is not supported (this specsim reads "
                f"version {JSON_VERSION})"
            )
        if not isinstance(data.get("paths"), list):
            raise SpecError('the "paths" field must be a list of rank paths')
        return cls.from_paths(data["paths"], name=str(data.get("name", "")))

    @cached_property
    def _level_bounds(self) -> list[tuple[int, int]]:
        """[start, stop) node ranges of depths 1, 2, ...: contiguous in breadth-first order."""
        bounds = []
        start, prev_stop = 1, 1  # the root alone is level 0: [0, 1)
        while start < self.n_nodes:
            # Level d+1 is the run of nodes whose parents lie in level d, i.e. before prev_stop.
            stop = int(np.searchsorted(self.parents, prev_stop, side="left"))
            bounds.append((start, stop))
            start = prev_stop = stop
        return bounds


def _int32_vector(values: object, field: str) -> np.ndarray:
    array = np.array(values, copy=True)
    if array.ndim != 1 or array.shape[0] == 0:
        raise SpecError(f"Tree.{field} must be a non-empty 1-D array, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise SpecError(f"Tree.{field} must hold integers, got dtype {array.dtype}")
    if np.any(np.abs(array.astype(np.int64)) >= 2**31):
        raise SpecError(f"Tree.{field} has values outside int32")
    return array.astype(np.int32)


def _validate(parents: np.ndarray, ranks: np.ndarray) -> None:
    n = parents.shape[0]
    if ranks.shape[0] != n:
        raise SpecError(f"Tree.parents has {n} nodes but Tree.ranks has {ranks.shape[0]}")
    if n > MAX_NODES:
        raise SpecError(f"a tree of {n} nodes exceeds the limit of {MAX_NODES}")
    if parents[0] != -1 or ranks[0] != -1:
        raise SpecError(
            f"node 0 is the root and needs parent -1 and rank -1, got {parents[0]} and {ranks[0]}"
        )
    if n == 1:
        return
    ids = np.arange(1, n)
    bad = np.flatnonzero((parents[1:] < 0) | (parents[1:] >= ids))
    if bad.size:
        i = int(bad[0]) + 1
        raise SpecError(f"node {i} has parent {parents[i]}; parents must satisfy 0 <= parents[i] < i")
    bad = np.flatnonzero(ranks[1:] < 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise SpecError(f"node {i} has negative rank {ranks[i]}")
    # Canonical order: (depth, parent, rank) strictly increasing. With parents[i] < i,
    # non-decreasing parents already imply non-decreasing depths.
    p, r = parents[1:].astype(np.int64), ranks[1:].astype(np.int64)
    dp, dr = np.diff(p), np.diff(r)
    dup = np.flatnonzero((dp == 0) & (dr == 0))
    if dup.size:
        i = int(dup[0]) + 2
        raise SpecError(f"node {i} repeats rank {ranks[i]} of its sibling node {i - 1}")
    out_of_order = np.flatnonzero((dp < 0) | ((dp == 0) & (dr < 0)))
    if out_of_order.size:
        i = int(out_of_order[0]) + 2
        raise SpecError(
            f"node {i} (parent {parents[i]}, rank {ranks[i]}) is out of canonical order "
            "(breadth-first, siblings by rank); build the tree with Tree.from_paths"
        )


def _as_rank_path(raw: object, index: int) -> tuple[int, ...]:
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        if isinstance(raw, np.ndarray):
            raw = raw.tolist()
        else:
            raise SpecError(f"path {raw!r} at index {index} is not a list of ranks")
    if len(raw) == 0:
        raise SpecError(f"path [] at index {index} is the root, which is implicit; leave it out")
    path = []
    for rank in raw:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise SpecError(f"path {list(raw)!r} at index {index} holds a non-integer rank {rank!r}")
        if rank < 0 or rank >= 2**31:
            raise SpecError(f"path {list(raw)} at index {index} has an invalid rank {rank}")
        path.append(int(rank))
    return tuple(path)


# ---------------------------------------------------------------------------- spec families


def _ints(arg: str, what: str) -> list[int]:
    parts = [s.strip() for s in arg.split(",")]
    values = []
    for position, part in enumerate(parts, start=1):
        try:
            values.append(int(part))
        except ValueError:
            raise SpecError(f"{what} #{position} is {part!r}, not an integer") from None
    return values


def chain(arg: str) -> Tree:
    """G draft tokens in a line (the draft's top choice each time)."""
    (g,) = _exactly(_ints(arg, "argument"), 1, "chain:G")
    if not 1 <= g < MAX_NODES:
        raise SpecError(f"chain length {g} must be between 1 and {MAX_NODES - 1}")
    parents = np.arange(-1, g, dtype=np.int32)
    ranks = np.zeros(g + 1, dtype=np.int32)
    ranks[0] = -1
    return Tree(parents, ranks)


def kary(arg: str) -> Tree:
    """Full W-ary tree of depth D (budget W + W^2 + ... + W^D)."""
    w, d = _exactly(_ints(arg, "argument"), 2, "kary:W,D")
    if w < 1 or d < 1:
        raise SpecError(f"width {w} and depth {d} must both be at least 1")
    budget = sum(w**level for level in range(1, d + 1)) if w > 1 else d
    if budget >= MAX_NODES:
        raise SpecError(f"kary:{w},{d} has {budget} drafts, over the limit of {MAX_NODES - 1}")
    parents, ranks = [-1], [-1]
    level = [0]
    for _ in range(d):
        next_level = []
        for parent in level:
            for rank in range(w):
                next_level.append(len(parents))
                parents.append(parent)
                ranks.append(rank)
        level = next_level
    return Tree(np.array(parents), np.array(ranks))


def widths(arg: str) -> Tree:
    """Depth d holds w_d children of the rank-0 node at depth d-1 (the top path branches)."""
    ws = _ints(arg, "width")
    for position, w in enumerate(ws, start=1):
        if w < 1:
            raise SpecError(f"width #{position} is {w}; every width must be at least 1")
    if sum(ws) >= MAX_NODES:
        raise SpecError(f"{sum(ws)} drafts is over the limit of {MAX_NODES - 1}")
    paths = []
    for depth, w in enumerate(ws):
        paths.extend((0,) * depth + (r,) for r in range(w))
    return Tree.from_paths(paths)


def medusa(arg: str) -> Tree:
    """Medusa's rank-path lists, e.g. [[0],[0,0],[1]] (tuples also accepted)."""
    try:
        value = ast.literal_eval(arg.strip()) if arg.strip() else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = None
    if not isinstance(value, (list, tuple)):
        raise SpecError("expected a list of rank paths such as [[0],[0,0],[1]]")
    return Tree.from_paths(value)


def file(arg: str) -> Tree:
    """A JSON file written by `Tree.to_json`, or holding a bare list of rank paths."""
    path = Path(arg.strip()).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path} is not a text file (expected a JSON tree written by `specsim optimize --out`)") from None
    try:
        return Tree.from_json(text)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def kary_prefix(width: int, n: int) -> Tree:
    """The first n drafts of the `width`-ary tree in breadth-first order (spec kary:W@N)."""
    if width < 1 or n < 1:
        raise SpecError(f"kary:{width}@{n}: width and budget must both be at least 1")
    if n >= MAX_NODES:
        raise SpecError(f"kary:{width}@{n} has {n} drafts, over the limit of {MAX_NODES - 1}")
    depth, total = 0, 0
    while total < n:
        depth += 1
        total += width**depth if width > 1 else 1
    full = kary(f"{width},{depth}")
    return Tree(full.parents[: n + 1], full.ranks[: n + 1])


def _exactly(values: list[int], n: int, form: str) -> list[int]:
    if len(values) != n:
        raise SpecError(f"expected {n} integer{'s' if n > 1 else ''} ({form}), got {len(values)}")
    return values


def draw_tree(tree: Tree, *, max_lines: int | None = None) -> str:
    """A text drawing like `tree`: one node a line, labelled by rank (r0 = draft's top choice)."""
    lines = ["root"]
    # Iterative depth-first walk (deep chains would overflow recursion).
    roots = tree.children(0)
    stack = [(int(c), "", i == len(roots) - 1) for i, c in enumerate(roots)][::-1]
    while stack:
        if max_lines is not None and len(lines) >= max_lines:
            lines.append(f"... ({tree.n_nodes - len(lines)} more nodes)")
            break
        node, prefix, last = stack.pop()
        lines.append(f"{prefix}{'└─ ' if last else '├─ '}r{tree.ranks[node]}")
        kids = tree.children(node)
        child_prefix = prefix + ("   " if last else "│  ")
        for i in range(len(kids) - 1, -1, -1):
            stack.append((int(kids[i]), child_prefix, i == len(kids) - 1))
    return "\n".join(lines)

"""Dynamic draft trees as specs: what a recording expands (`Expansion`, `--expand topk=K,depth=D`)
and what a `dynamic:topk=K,depth=D,tokens=N` tree asks of it (`DynamicShape`).

The bottom layer, beside `specsim.trees`: the cache format (`specsim.cache.stats`), the
registry (`specsim.specs`) and the replay (`specsim.sim.dynamic`, which documents the rule)
all read these, so none of them imports another for them. numpy-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from specsim.errors import SpecError

EXPAND_NAMES = ("expand_token", "expand_parent", "expand_score")  # per-position draft statistics


@dataclass(frozen=True)
class Expansion:
    """What an expansion records: the beam width K and the depth D."""

    topk: int
    depth: int

    def __post_init__(self) -> None:
        if self.topk < 1 or self.depth < 1:
            raise SpecError(f"an expansion needs topk >= 1 and depth >= 1, got topk={self.topk}, depth={self.depth}")
        if self.candidates > 32_767:
            raise SpecError(f"topk={self.topk}, depth={self.depth} expands {self.candidates} candidates per position; "
                            "the cache holds at most 32767")

    @property
    def candidates(self) -> int:
        """K + (D−1)·K²: candidates recorded per position."""
        return candidates(self.topk, self.depth)

    @property
    def label(self) -> str:
        return f"topk={self.topk},depth={self.depth}"


@dataclass(frozen=True)
class DynamicShape:
    """A dynamic tree spec: dynamic:topk=K,depth=D,tokens=N."""

    topk: int
    depth: int
    tokens: int

    @property
    def candidates(self) -> int:
        return candidates(self.topk, self.depth)

    def check_recorded(self, recorded: Expansion | None, where: str) -> None:
        """SpecError (the configuration is skipped) unless the recording can replay this tree (same K, depth and tokens within it)."""
        spec = f"dynamic:topk={self.topk},depth={self.depth},tokens={self.tokens}"
        if recorded is None:
            raise SpecError(f"{where}: {spec} needs the draft's expansion; record the cache with "
                             f"--expand topk={self.topk},depth={self.depth}")
        if recorded.topk != self.topk:
            raise SpecError(f"{where}: {spec}: the cache expanded topk={recorded.topk} (depth {recorded.depth}); "
                             "another top_k changes the beam, so record it with --expand")
        if self.depth > recorded.depth:
            raise SpecError(f"{where}: {spec}: the cache expanded to depth {recorded.depth} only")


def candidates(topk: int, depth: int) -> int:
    return topk + (depth - 1) * topk * topk


_KEYS = {"topk", "depth", "tokens"}


def _key_values(text: str, allowed: set[str], example: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in allowed:
            raise SpecError(f"{part!r} is not one of {', '.join(sorted(allowed))}=INTEGER (e.g. {example})")
        if not re.fullmatch(r"\s*\d+\s*", value):
            raise SpecError(f"{key}={value.strip()!r} is not a non-negative integer (e.g. {example})")
        if key in out:
            raise SpecError(f"{key} is given twice (e.g. {example})")
        out[key] = int(value)
    missing = sorted(allowed - set(out))
    if missing:
        raise SpecError(f"missing {', '.join(missing)} (e.g. {example})")
    return out


def parse_expansion(text: str) -> Expansion:
    """'topk=4,depth=4' -> Expansion(4, 4) (the cache's --expand)."""
    kv = _key_values(str(text), {"topk", "depth"}, "topk=4,depth=4")
    return Expansion(kv["topk"], kv["depth"])


def parse_dynamic(arg: str) -> DynamicShape:
    """The argument of dynamic:topk=K,depth=D,tokens=N."""
    kv = _key_values(arg, _KEYS, "dynamic:topk=4,depth=4,tokens=16")
    shape = DynamicShape(kv["topk"], kv["depth"], kv["tokens"])
    Expansion(shape.topk, shape.depth)  # the same bounds as a recording
    if shape.tokens < 1:
        raise SpecError("tokens must be at least 1: the draft tokens verified per call")
    if shape.tokens > shape.candidates:
        raise SpecError(f"tokens={shape.tokens} exceeds the {shape.candidates} candidates of topk={shape.topk}, "
                        f"depth={shape.depth} (K + (D-1)K²)")
    return shape


def envelope(shape: DynamicShape):
    """The static stand-in of a dynamic tree in tables: N nodes, depth min(D, N) (the deepest it can be).

    Only its budget and depth are read (row columns, the width of per-depth tables); the
    nodes of each call come from the recording, and its cost from `dynamic_step_shape`.
    """
    from specsim.trees import Tree

    depth = min(shape.depth, shape.tokens)
    paths = [(0,) * d for d in range(1, depth + 1)] + [(r,) for r in range(1, shape.tokens - depth + 1)]
    return Tree.from_paths(paths)

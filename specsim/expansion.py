"""Dynamic draft trees as specs: what a recording expands (`Expansion`, `--expand topk=K,depth=D`),
what a `dynamic:topk=K,depth=D,tokens=N` tree asks of it (`DynamicShape`), and the tree a sweep
carries (`DynamicTree`: its own type, never a static `specsim.trees.Tree`).

The bottom layer, beside `specsim.trees`: the cache format (`specsim.cache.stats`), the
registry (`specsim.specs`) and the replay (`specsim.sim.dynamic`, which documents the rule)
all read these, so none of them imports another for them. numpy-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class DynamicTree:
    """A dynamic draft tree: each call verifies the N best of the draft's recorded beam.

    Which nodes those are changes call by call (the replay reads them from the recording, the
    live engine from its own beam), so it has no fixed nodes: it has a budget (N drafts per
    call), a deepest possible depth, a name and its shape. Its cost per call is
    `specsim.sim.cost.step_shape`'s dynamic branch.
    """

    shape: DynamicShape
    name: str = field(default="", compare=False)  # the spec it was built from; the row label in tables

    @property
    def budget(self) -> int:
        """Drafts verified per call (N)."""
        return self.shape.tokens

    @property
    def max_depth(self) -> int:
        """The deepest a call's nodes can be: min(D, N)."""
        return min(self.shape.depth, self.shape.tokens)

    @property
    def is_chain(self) -> bool:
        """Never: its nodes change call by call (`Tree.is_chain`)."""
        return False

    def to_spec(self) -> str:
        return f"dynamic:topk={self.shape.topk},depth={self.shape.depth},tokens={self.shape.tokens}"

    def __repr__(self) -> str:
        return f"DynamicTree({self.name or self.to_spec()}, budget={self.budget}, depth={self.max_depth})"

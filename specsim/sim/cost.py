"""Cost of one speculative call, in units of one plain target decode step.

DESIGN.md §3. A call drafts the tree level by level (one draft step per level, its
batch the level's width) and verifies all of its tokens in one target pass. With
tokens per call τ and call cost κ (plain-step units) the speedup over plain decoding
is τ / κ. Two models:

* ``c=0.05`` — Leviathan et al. (2023): a draft step costs c target steps,
  verification costs one step whatever the tree size; κ = 1 + c · depth
  (model-free drafts cost nothing to draft). Their improvement factor
  (1 − α^{γ+1}) / ((1 − α)(γc + 1)) follows for chains.
* a measured profile (``specsim profile``'s JSON): verifying N tree tokens at
  context L costs target_verify_s[L][N] / target_verify_s[L][1]; each draft level
  of width w costs draft_step_s[L][w] in the same unit. Values are linearly
  interpolated in N, w and L; beyond the measured sizes they are extrapolated
  linearly from the last two points, and beyond the measured contexts clamped
  to the nearest one (`describe` says which).
numpy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from specsim.errors import SpecError
from specsim.trees import Tree

PROFILE_FORMAT = "specsim-cost-profile"
PROFILE_VERSION = 1


class CostModel(Protocol):
    def call_cost(self, tree: Tree, *, context: float, model_draft: bool) -> float:
        """Cost of one call drafting and verifying `tree`, in plain-target-step units."""

    def describe(self) -> str:
        """One line for table rows and footers."""


@dataclass(frozen=True)
class RatioCost:
    """Leviathan's model: draft step = c target steps, verification flat at 1."""

    c: float  # draft-step / target-step cost ratio

    def call_cost(self, tree: Tree, *, context: float, model_draft: bool) -> float:
        return 1.0 + (self.c * tree.max_depth if model_draft else 0.0)

    def describe(self) -> str:
        return f"c={self.c:g} (draft step = {self.c:g} target steps per tree level, verification flat)"


def parse_cost(text: str) -> RatioCost:
    """'c=0.05' → RatioCost(0.05)."""
    key, sep, value = str(text).strip().partition("=")
    if key.strip().lower() != "c" or not sep:
        raise SpecError(f"cost {text!r}: expected c=RATIO (draft step / target step), e.g. c=0.05")
    try:
        c = float(value)
    except ValueError:
        raise SpecError(f"cost {text!r}: {value.strip()!r} is not a number (e.g. c=0.05)") from None
    if not 0 <= c < 1e6 or c != c:
        raise SpecError(f"cost {text!r}: the ratio must be a number >= 0")
    return RatioCost(c)


def _interp(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Linear interpolation, extrapolated linearly from the two nearest points outside [xs[0], xs[-1]]."""
    if len(xs) == 1:
        return float(ys[0])
    if x <= xs[-1] and x >= xs[0]:
        return float(np.interp(x, xs, ys))
    i = (0, 1) if x < xs[0] else (-2, -1)
    slope = (ys[i[1]] - ys[i[0]]) / (xs[i[1]] - xs[i[0]])
    return float(max(ys[i[0]] + slope * (x - xs[i[0]]), 0.0))


@dataclass(frozen=True)
class ProfileCost:
    """Costs measured by `specsim profile` on real hardware."""

    path: Path  # the profile JSON it came from
    contexts: tuple[int, ...]  # measured context lengths, ascending
    verify: dict  # context -> (sizes ndarray, seconds ndarray): target pass over N tokens
    draft: dict  # context -> (widths ndarray, seconds ndarray): one draft step over w tokens
    label: str  # "device, target, draft, dtype" from the profile

    def _at(self, table: dict, context: float, x: float) -> float:
        cs = self.contexts
        if context <= cs[0] or len(cs) == 1:
            return _interp(x, *table[cs[0]])
        if context >= cs[-1]:
            return _interp(x, *table[cs[-1]])
        j = int(np.searchsorted(cs, context))
        lo, hi = cs[j - 1], cs[j]
        w = (context - lo) / (hi - lo)
        return (1 - w) * _interp(x, *table[lo]) + w * _interp(x, *table[hi])

    def call_cost(self, tree: Tree, *, context: float, model_draft: bool) -> float:
        unit = self._at(self.verify, context, 1)
        cost = self._at(self.verify, context, tree.n_nodes) / unit
        if model_draft:
            cost += sum(self._at(self.draft, context, int(w)) for w in tree.level_sizes()) / unit
        return float(cost)

    def describe(self) -> str:
        ctx = "/".join(str(c) for c in self.contexts)
        return f"profile {self.path.name} ({self.label}; contexts {ctx}, interpolated)"


def load_cost_profile(path) -> ProfileCost:
    """Read a specsim-cost-profile JSON (v1); SpecError naming the file and field when malformed."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise SpecError(f"cost profile {path}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"cost profile {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise SpecError(f"cost profile {path}: not a {PROFILE_FORMAT} file (write one with `specsim profile`)")
    if data.get("version") != PROFILE_VERSION:
        raise SpecError(f"cost profile {path}: version {data.get('version')!r}, this specsim reads {PROFILE_VERSION}")

    def table(field: str) -> dict:
        raw = data.get(field)
        if not isinstance(raw, dict) or not raw:
            raise SpecError(f"cost profile {path}: field {field!r} must map context -> {{size: seconds}}")
        out = {}
        for ctx, row in raw.items():
            try:
                pairs = sorted((int(k), float(v)) for k, v in row.items())
                context = int(ctx)
            except (AttributeError, TypeError, ValueError):
                raise SpecError(f"cost profile {path}: {field}[{ctx!r}] must map integer sizes to seconds") from None
            if not pairs or any(v <= 0 for _, v in pairs):
                raise SpecError(f"cost profile {path}: {field}[{ctx!r}] needs positive timings")
            out[context] = (np.array([k for k, _ in pairs], dtype=np.float64), np.array([v for _, v in pairs]))
        return out

    verify, draft = table("target_verify_s"), table("draft_step_s")
    if set(verify) != set(draft):
        raise SpecError(f"cost profile {path}: target_verify_s and draft_step_s cover different contexts")
    for ctx, (sizes, _) in verify.items():
        if sizes[0] != 1:
            raise SpecError(f"cost profile {path}: target_verify_s[{ctx}] lacks N=1, the plain decode step (the unit)")
    label = ", ".join(str(data.get(k)) for k in ("device", "target", "draft", "dtype") if data.get(k))
    return ProfileCost(path=path, contexts=tuple(sorted(verify)), verify=verify, draft=draft, label=label or "?")

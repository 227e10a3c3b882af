"""What a speculative decoding step costs, in seconds measured on real hardware (or an assumed ratio).

docs/design.md §3. One engine step of B requests runs the draft forwards (the root feed, then
one forward per tree level that has children, each of width w per request) and ONE target
forward over N tree tokens per request (root included), at context L. `specsim profile`
times exactly those forwards with the live engine's own code, for a grid of batch sizes
B, contexts L, token counts N and draft widths w, and writes a cost profile (JSON, v2).

`ProfileCost` reads it and answers the time of any (B, N, w, L) by multilinear
interpolation between the medians of the measured grid points. The grid is dense where
the time is not smooth (every N up to 17 and every B up to 8: small GEMMs on CPUs are not
monotone in N or B, measured on SmolLM2), so the shapes trees ask for are measured points,
not fitted ones; what a model could add there is smoothing of measured wiggles, which are
real: fitted alternatives (a line in context per N, a context slope shared across N, monotone fits)
predicted the live speedups of seven bench runs no better, the structural and monotone ones worse
(`analyses/results/cost-fit-cpu-2026-11-29/`). Past the grid a query is refused, naming the
measured range, unless the profile was loaded with `extrapolate=True` (`--cost-extrapolate`):
then a time is the grid edge's plus a straight line whose slope is least-squares fitted to the
upper half of that axis's measured points, never negative (a larger B, N, w or L never costs
less, and one noisy last point does not set the slope), up to `EXTRAPOLATION` (2x) past the
largest, refused further. `extrapolates` says whether a query left the grid, so rows flag it
(`cost_extrapolated`). Below the smallest measured context it uses that context's time
(attention only gets cheaper).

Its error. A profile that kept every timed run of every entry (`runs`, measured in rounds:
each round times every entry of a (B, L) once, in random order, so a slow moment of the
machine lands on all of them alike) is resampled by rounds, jointly over all entries
(`replicas`: `REPLICAS` profiles, each the medians of R rounds drawn with replacement; where
`profile --max-repeats` gave the uncertain entries further rounds, those are drawn apart from
the rounds every entry has).
Pricing a configuration with each replica gives the spread of its time that the
measurement leaves; `sim.metrics` pairs replica r with prompt resample b (r = b mod
REPLICAS), so speedup CIs cover which prompts were cached *and* how the profile's timings
scattered. Drift between profiling and use (another load, another boost clock) is not in
one profile's repeats; profiles measured at several moments and pooled (`pool_profiles`,
`--cost-profile` given more than once) carry the drift between those moments, each replica one
of them drawn at random. The leave-one-out interpolation error (`fit_error`) bounds
what a query between grid points adds.

`AssumedCost` is Leviathan et al.'s (2023) flat model — a draft step costs c target
steps, verification costs one step whatever the tree — kept for what-if questions. Its
numbers are assumptions, never measurements, and every table and chart says so.

A step also does work outside the forwards: each request's verification walk and, at T > 0,
drawing the candidates from the draft's law. A profile that measured it (`step_overhead_s`, per
(B, N)) adds it to every target step once bound to a temperature (`for_temperature`: the
greedy walk at T = 0, the sampling walk and the draws at T > 0, the walk alone for model-free
candidates; `for_rule("block")`: block verification's walk in place of the token-wise one, since
it computes the target's and the draft's laws and a residual at every drafted position); its
medians are used, not resampled.

A profile belongs to models: `check_profile` refuses one measured for another target or
for another draft (by architecture fingerprint: what a forward's cost depends on), with
a message naming both. Model-free drafts cost no draft forwards.
numpy only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from specsim.errors import ArgumentError, SpecError
from specsim.expansion import DynamicShape, DynamicTree, candidates
from specsim.trees import Tree

PROFILE_FORMAT = "specsim-cost-profile"
PROFILE_VERSION = 2
EXTRAPOLATION = 2.0  # furthest extrapolation allowed, as a factor of the largest measured value per axis
REPLICAS = 64  # profile replicas resampled from the stored rounds; prompt resample b is priced by replica b % REPLICAS
OVERHEAD_KINDS = ("walk_greedy", "walk_sample", "walk_block", "draft_sample")  # a profile's `step_overhead_s` tables
OVERHEAD_LATER = {"walk_block"}  # kinds older profiles lack (they still load; `for_rule` says what stands in)
OUTLIER = 5.0  # a timed run this many times its entry's median is a stall (counted and reported, still resampled)
DENSE_BATCH = 8  # a profile measures every batch size up to here (`batch_grid`)


def batch_grid(batches) -> list[int]:
    """The batch sizes a profile measures for `batches`: every B up to DENSE_BATCH (a lockstep batch shrinks through
    each as requests finish, and small-batch steps are not monotonic in B on a CPU: on SmolLM2, B = 2 cost more
    than B = 4 in specsim's engine, and in vLLM's a plain step at B = 2, L = 817 took 270 ms against 83 ms at
    B = 4; interpolating B = 2 and 3 put vLLM's layers:20 prediction at B = 4 18% low, measuring them 15% high,
    analyses/results/vllm-speed-cpu-2026-11-29), then the batch sizes asked for."""
    top = max(batches)
    return sorted(set(batches) | set(range(1, min(top, DENSE_BATCH) + 1)))


@dataclass(frozen=True)
class StepShape:
    """What one engine step runs, per request."""

    verify_tokens: int  # N: tree nodes in the target forward, root included (1 = a plain decode step)
    draft_levels: tuple[int, ...]  # width of each draft forward, root feed first; () for model-free drafts


def step_shape(tree: Tree | DynamicTree, *, room: int | None = None, model_draft: bool = True, root_feed: int = 1,
               one_pass: bool = False) -> StepShape:
    """The forwards of one call drafting `tree` cut to depth <= room (what the live engine runs).

    The draft feeds the tokens it has not seen (`root_feed`: 1, or 2 after a call that
    accepted a leaf it never fed), then every node of depths 1 .. D'-1 that has children,
    one forward per depth (D' = the cut depth). A call that can accept nothing drafts nothing.
    A one-pass draft (Medusa heads) drafts any tree with one forward (its entry at w = 1).
    """
    if isinstance(tree, DynamicTree):
        return dynamic_step_shape(tree.shape, room, model_draft=model_draft, one_pass=one_pass)
    depth = tree.max_depth if room is None else min(tree.max_depth, max(int(room), 0))
    if depth == 0 or not tree.budget:
        return StepShape(verify_tokens=1, draft_levels=())
    n = int((tree.depths <= depth).sum())
    if not model_draft:
        return StepShape(verify_tokens=n, draft_levels=())
    if one_pass:
        return StepShape(verify_tokens=n, draft_levels=(1,))
    inner = (tree.n_children > 0) & (tree.depths >= 1) & (tree.depths < depth)
    widths = np.bincount(tree.depths[inner], minlength=depth)[1:depth]
    return StepShape(verify_tokens=n, draft_levels=(int(root_feed), *[int(w) for w in widths]))


def dynamic_step_shape(shape: DynamicShape, room: int | None, *, model_draft: bool = True,
                       one_pass: bool = False) -> StepShape:
    """The forwards of one dynamic call: the root feed, then D−1 beam forwards of width K; N + 1 verified
    (a one-pass draft, Medusa's heads: its one pass gives every level's law).

    A call with room to accept anything expands the whole depth D, as the live engine does (its
    N best are chosen among every depth, then those deeper than the room are not verified: the
    replay's selection is the recording's, so the expansion cannot stop earlier); it verifies at
    most the nodes of depth <= min(D, room) (counted as min(N, their number), an upper bound the
    last calls of a request may not reach). The root feed is priced at 1 here; the accepted
    tokens it also feeds are the next call's extra (`feeds_accepted`).
    """
    depth = shape.depth if room is None else min(shape.depth, max(int(room), 0))
    if depth == 0:
        return StepShape(verify_tokens=1, draft_levels=())
    verify = 1 + min(shape.tokens, candidates(shape.topk, depth))
    if not model_draft:
        return StepShape(verify_tokens=verify, draft_levels=())
    if one_pass:
        return StepShape(verify_tokens=verify, draft_levels=(1,))
    return StepShape(verify_tokens=verify, draft_levels=(1, *[shape.topk] * (shape.depth - 1)))


def tree_by_room(tree: Tree, *, model_draft: bool = True, one_pass: bool = False) -> list[StepShape]:
    """step_shape for room 0, 1, ..., max_depth (a deeper room is the full tree)."""
    return [step_shape(tree, room=m, model_draft=model_draft, one_pass=one_pass) for m in range(tree.max_depth + 1)]


@dataclass(frozen=True)
class AssumedCost:
    """Leviathan et al.'s flat model: a draft step costs c target steps, verification flat. An assumption."""

    c: float  # draft-step / target-step cost ratio
    measured: bool = False
    unit: str = "plain target steps"

    def verify_s(self, batch, tokens, context) -> np.ndarray:
        return np.ones(np.broadcast(np.asarray(batch), np.asarray(tokens), np.asarray(context)).shape)

    def draft_s(self, draft: str, batch, width, context) -> np.ndarray:
        return self.c * np.ones(np.broadcast(np.asarray(batch), np.asarray(width), np.asarray(context)).shape)

    def plain_s(self, batch, context) -> np.ndarray:
        return self.verify_s(batch, 1, context)

    def describe(self) -> str:
        return (f"ASSUMED c={self.c:g} (draft step = {self.c:g} target steps per tree level, verification flat; "
                "not measured)")


def parse_cost(text: str) -> AssumedCost:
    """'c=0.1' → AssumedCost(0.1)."""
    key, sep, value = str(text).strip().partition("=")
    if key.strip().lower() != "c" or not sep:
        raise ArgumentError("{cost} {text!r}: expected c=RATIO (draft step / target step), e.g. c=0.1", text=text)
    try:
        c = float(value)
    except ValueError:
        raise ArgumentError("{cost} {text!r}: {value!r} is not a number (e.g. c=0.1)", text=text,
                            value=value.strip()) from None
    if not 0 <= c < 1e6 or c != c:
        raise ArgumentError("{cost} {text!r}: the ratio must be a number >= 0", text=text)
    return AssumedCost(c)


@dataclass(frozen=True)
class ModelId:
    """A model as a profile or a cache names it."""

    name: str  # the spec it was loaded from ("smollm2-135m", "int8", "layers:20", a hub id)
    architecture_sha256: str | None  # what its cost depends on (specsim.record.models.architecture)
    architecture: Mapping | None = None  # the readable fields behind the fingerprint

    def describe(self) -> str:
        arch = self.architecture or {}
        shape = ", ".join(f"{k}={arch[k]}" for k in ("model_type", "hidden_size", "num_hidden_layers",
                                                     "layers", "quantization") if k in arch)
        return f"{self.name}" + (f" ({shape})" if shape else "")

    def same_as(self, other: "ModelId") -> bool:
        if self.architecture_sha256 and other.architecture_sha256:
            if self.architecture_sha256 == other.architecture_sha256:
                return True
            return (self.architecture is not None and other.architecture is not None
                    and not self.differences(other))  # one side wrote a field the other predates, left off
        return self.name == other.name  # a side without a fingerprint (older files): names must agree

    def differences(self, other: "ModelId") -> list[str]:
        """The architecture fields on which the two differ, as "key=mine/theirs". A field one side does not
        have counts as off (False, 0, "", none): a field added to specsim later, at its default, describes
        the same model as a file written before it (a head config's qk_norm=False)."""
        mine, theirs = _stated(self.architecture), _stated(other.architecture)
        return [f"{k}={mine.get(k, '-')}/{theirs.get(k, '-')}" for k in sorted(mine.keys() | theirs.keys())
                if mine.get(k) != theirs.get(k)]

    @classmethod
    def from_info(cls, name: str, info: Mapping | None) -> "ModelId":
        info = info if isinstance(info, Mapping) else {}
        return cls(name=str(info.get("spec") or name), architecture_sha256=info.get("architecture_sha256"),
                   architecture=info.get("architecture"))


@dataclass(frozen=True)
class ProfileCost:
    """Seconds measured by `specsim profile`, interpolated in (B, N, w, L)."""

    path: Path  # the profile JSON it came from
    device: str  # e.g. "cpu (2 threads)", "cuda (NVIDIA H100 80GB HBM3)"
    dtype: str  # model dtype measured
    target: ModelId  # the target measured
    drafts: dict[str, ModelId]  # the drafts measured, by name
    batches: np.ndarray  # (nb,) measured batch sizes, ascending, starting at 1
    contexts: np.ndarray  # (nl,) measured contexts L, ascending
    sizes: np.ndarray  # (nn,) measured target token counts N, ascending, starting at 1
    widths: np.ndarray  # (nw,) measured draft widths w, ascending, starting at 1
    verify: np.ndarray  # (nb, nl, nn) seconds of one target forward over N tokens per request
    draft: dict[str, np.ndarray]  # name -> (nb, nl, nw) seconds of one draft forward over w tokens per request
    fit_error: float | None = None  # leave-one-out interpolation error (max relative), from the profile
    measured: bool = True
    unit: str = "seconds"
    notes: tuple[str, ...] = field(default=())
    engine: str = "specsim"  # whose steps were timed: "specsim" (its live engine) or e.g. "vllm 0.32.0"
    verify_runs: np.ndarray | None = None  # (R, nb, nl, nn) every round's time; None when the file kept none
    draft_runs: dict[str, np.ndarray] | None = None  # name -> (R, nb, nl, nw)
    seed: int = 0  # of the rounds' resampling
    extrapolate: bool = False  # price up to EXTRAPOLATION x past the largest measured value (else refuse past it)
    overhead: dict[str, np.ndarray] | None = None  # kind -> (nb, nn) seconds of a step's work outside the forwards
    #                                         (`step_overhead_s`: walk_greedy, walk_sample, walk_block, draft_sample)
    charges: tuple[str, ...] = ()  # the overhead kinds `verify_s` adds (`for_temperature`); () forwards only
    rule: str = ""  # the verification rule charged for, where it is not the token-wise one (`for_rule`)
    pooled: tuple["ProfileCost", ...] = ()  # the profiles `pool_profiles` averaged (() for one profile)

    @property
    def limit(self) -> float:
        return EXTRAPOLATION if self.extrapolate else 1.0

    @property
    def rounds(self) -> int:
        """Timed rounds every entry kept (0: the profile stored medians only, its uncertainty is not known)."""
        if self.pooled:
            return min(p.rounds for p in self.pooled)
        if self.verify_runs is None:
            return 0
        return min(int(np.isfinite(t).all(axis=tuple(range(1, t.ndim))).sum())
                   for t in (self.verify_runs, *self.draft_runs.values()))

    @property
    def max_rounds(self) -> int:
        """Timed rounds of the entries timed most (above `rounds` where `profile --max-repeats` spent further
        passes on the uncertain entries only; the missing rounds are NaN in `verify_runs`/`draft_runs`)."""
        if self.pooled:
            return max(p.max_rounds for p in self.pooled)
        return 0 if self.verify_runs is None else int(self.verify_runs.shape[0])

    def rounds_text(self) -> str:
        R0, R = self.rounds, self.max_rounds
        return f"{R0}" if R == R0 else f"{R0}-{R}"

    @cached_property
    def replicas(self) -> tuple["ProfileCost", ...]:
        """REPLICAS profiles whose tables are the medians of rounds resampled with replacement, the same rounds
        for every entry (a slow round slows every entry it timed); () without stored rounds. Where some entries
        have further rounds (`max_rounds` > `rounds`), the rounds every entry has are resampled as above and the
        further ones separately, again the same for every entry that has them (round r of two entries came from
        the same pass): an entry with R_e rounds then gets on average R_e of them, never fewer than `rounds`."""
        if self.pooled:  # replica r: profile s drawn at random, then its own replica r (its rounds resampled; its
            #              medians where it kept no rounds)
            pick = np.random.default_rng([self.seed, len(self.pooled)]).integers(0, len(self.pooled), size=REPLICAS)
            return tuple(replace(self.pooled[s].replicas[r] if self.pooled[s].replicas else self.pooled[s],
                                 path=self.path, extrapolate=self.extrapolate, verify_runs=None, draft_runs=None)
                         for r, s in enumerate(pick))
        R0, R = self.rounds, self.max_rounds
        if R0 < 2:
            return ()
        rng, further = np.random.default_rng([self.seed, R0]), np.random.default_rng([self.seed, R0, R])
        out = []
        for _ in range(REPLICAS):
            pick = rng.integers(0, R0, size=R0)
            if R > R0:
                pick = np.concatenate([pick, further.integers(R0, R, size=R - R0)])
            median = np.median if R == R0 else np.nanmedian
            out.append(replace(self, verify=median(self.verify_runs[pick], axis=0),
                               draft={k: median(v[pick], axis=0) for k, v in self.draft_runs.items()},
                               verify_runs=None, draft_runs=None))
        return tuple(out)

    @cached_property
    def stacks(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(1 + REPLICAS, ...) tables: this profile's, then each replica's (`by_row` reads them)."""
        tables = (self, *self.replicas)
        return (np.stack([t.verify for t in tables]),
                {k: np.stack([t.draft[k] for t in tables]) for k in self.draft})

    def by_row(self, which: np.ndarray) -> "ByRow":
        """A cost model whose row r (of a batch timeline's replicates) is priced by replica which[r] (-1: this
        profile itself)."""
        return ByRow(self, np.asarray(which, dtype=np.int64))

    @cached_property
    def stalls(self) -> tuple[int, int]:
        """(timed runs more than OUTLIER x their entry's median, timed runs in all) over the stored rounds."""
        if self.rounds < 2:
            return 0, 0
        if self.pooled:
            counts = [p.stalls for p in self.pooled]
            return sum(c[0] for c in counts), sum(c[1] for c in counts)
        tables = [self.verify_runs, *self.draft_runs.values()]
        out = sum(int((t > OUTLIER * np.nanmedian(t, axis=0)).sum()) for t in tables)  # NaN (not timed) never is
        return out, sum(int(np.isfinite(t).sum()) for t in tables)

    def uncertainty(self) -> str:
        """What the speedup CIs carry of this profile's error, in words."""
        pooled = (f"{len(self.pooled)} profiles (the drift between them: each replica one of them, drawn at random)"
                  if self.pooled else "")
        if self.rounds < 2:
            return (f"profile error carried: {pooled}; their rounds not, some kept medians only" if pooled else
                    "profile error not carried (the profile kept medians only: re-run `specsim profile`)")
        stalled, runs = self.stalls
        return (f"profile error carried: {pooled + ', ' if pooled else ''}{self.rounds_text()} timed rounds per "
                "entry, resampled jointly"
                + (f"; {stalled} of {runs} timed runs stalled (> {OUTLIER:g}x their entry's median: a busy "
                   "machine; with few rounds they can widen the CI, re-profile on a quiet one)" if stalled else ""))

    def for_temperature(self, temperature: float, *, model_draft: bool) -> "ProfileCost":
        """This profile charging, on every target step, the work outside the forwards that decoding at
        `temperature` does (the profile's `step_overhead_s`): the greedy walk at T = 0; at T > 0 the sampling
        walk, and drawing the candidates from the draft's law where there is one (`model_draft`). Itself
        when the profile measured none (an older one, or another engine's whole steps)."""
        if self.overhead is None:
            return self
        charges = ("walk_greedy",) if temperature == 0 else ("walk_sample", "draft_sample") if model_draft else (
            "walk_sample",)
        return replace(self, charges=charges)

    def for_rule(self, rule: str) -> "ProfileCost":
        """This profile charging verification rule `rule`'s own walk: block verification (`rule` "block", at
        T > 0) runs `walk_block` in place of the token-wise `walk_sample`. A profile measured before
        `walk_block` existed keeps `walk_sample` and says so (`overhead_note`)."""
        if rule != "block" or "walk_sample" not in self.charges:
            return self
        if "walk_block" not in self.overhead:
            return replace(self, rule=rule)
        return replace(self, rule=rule, charges=tuple("walk_block" if k == "walk_sample" else k for k in self.charges))

    def verify_s(self, batch, tokens, context, *, replica=None) -> np.ndarray:
        """Seconds of one target forward over `tokens` (N) per request for `batch` requests at `context`, plus
        the step's work outside the forwards this profile charges (`for_temperature`); replica (broadcast
        with the query): read replica r's forward table instead (-1: this profile's own)."""
        table, layer = (self.verify, None) if replica is None else (self.stacks[0], np.asarray(replica) + 1)
        seconds = _interpolate(table, (self.batches, self.contexts, self.sizes), (batch, context, tokens),
                               ("batch", "context", "target tokens N"), self.path, layer=layer, limit=self.limit)
        for kind in self.charges:  # measured per (B, N), at any context
            seconds = seconds + _interpolate(self.overhead[kind][:, None, :], (self.batches, np.zeros(1), self.sizes),
                                             (batch, np.zeros(np.shape(context)), tokens),
                                             ("batch", "context", "target tokens N"), self.path, limit=self.limit)
        return seconds

    def overhead_note(self) -> str:
        """What of a step outside the forwards this profile prices, in words."""
        if self.overhead is None:
            return ("work outside the forwards not priced" + (" (the profile predates its measurement: re-run "
                                                              "`specsim profile`)" if self.engine == "specsim" else
                                                              f" separately ({self.engine} times whole steps)"))
        return "work outside the forwards priced: " + (" + ".join(self.charges) if self.charges else "none") + (
            " (block verification's own walk not measured by this profile: priced as walk_sample; re-run "
            "`specsim profile`)" if self.rule == "block" and "walk_block" not in self.charges else "")

    def draft_s(self, draft: str, batch, width, context, *, replica=None) -> np.ndarray:
        """Seconds of one forward of `draft` (a profile draft name) over `width` tokens per request; replica as
        in `verify_s`."""
        table, layer = (self.draft[draft], None) if replica is None else (self.stacks[1][draft],
                                                                           np.asarray(replica) + 1)
        return _interpolate(table, (self.batches, self.contexts, self.widths), (batch, context, width),
                            ("batch", "context", f"{draft} draft width w"), self.path, layer=layer, limit=self.limit)

    def plain_s(self, batch, context) -> np.ndarray:
        """Seconds of one plain decode step (N = 1) of `batch` requests: the speedup's baseline."""
        return self.verify_s(batch, 1, context)

    def extrapolates(self, *, batch: float = 1, tokens: float = 1, width: float = 1, context: float = 0) -> bool:
        """Whether a time at these (largest) values lies past what the profile measured on some axis."""
        return bool(batch > self.batches[-1] or tokens > self.sizes[-1] or width > self.widths[-1]
                    or context > self.contexts[-1])

    def describe(self) -> str:
        err = f", interpolation error <= {100 * self.fit_error:.0f}%" if self.fit_error is not None else ""
        err += f", {self.rounds_text()} rounds per entry" if self.rounds >= 2 else ""
        err += f", {self.stalls[0]} stalled runs" if self.stalls[0] else ""
        err += "; " + self.overhead_note() if self.charges or self.overhead is None else ""
        engine = "" if self.engine == "specsim" else f"engine {self.engine}: "
        named = (f"profiles {', '.join(p.path.name for p in self.pooled)}, averaged, the CIs carrying the drift "
                 "between them" if self.pooled else f"profile {self.path.name}")
        return (f"MEASURED {named} ({engine}{self.device}, {self.dtype}; target {self.target.name}; "
                f"batch {_span(self.batches)}, context {_span(self.contexts)}{err})")

    def draft_for(self, name: str, info: Mapping | None) -> str:
        """The profile's draft that is the cache's draft `name`; SpecError naming both when none is."""
        wanted = ModelId.from_info(name, info)
        for key, measured in self.drafts.items():
            if measured.same_as(wanted):
                return key
        have = "; ".join(m.describe() + _differing(m, wanted) for m in self.drafts.values()) or "none"
        raise SpecError(f"cost profile {self.path} was not measured for draft {wanted.describe()} (it measured: "
                        f"{have}); run `specsim profile --target {self.target.name} --draft {name} ...`")


def _stated(architecture: Mapping | None) -> dict:
    """An architecture's fields that say something: those not off (False, 0, "", empty, none)."""
    return {k: v for k, v in (architecture or {}).items() if v not in (None, False, 0, "", [], (), {})}


def _differing(measured: ModelId, wanted: ModelId) -> str:
    """" [differs: key=profile/cache, ...]" where a profile's model has the cache's name and both know their
    fields; "" otherwise."""
    if measured.name != wanted.name or measured.architecture is None or wanted.architecture is None:
        return ""
    return f" [differs: {', '.join(measured.differences(wanted))} (profile/cache)]"


@dataclass(frozen=True)
class _Replicated:
    """A profile read from its stacked replica tables, each query point reading the replica `_along` gives it
    (-1: the profile itself)."""

    profile: ProfileCost

    measured = True
    unit = "seconds"

    @property
    def engine(self) -> str:
        return self.profile.engine

    def _replica(self, *query) -> np.ndarray:
        """The replica index of every point of a query, broadcastable against it (`_along` its dimensions)."""
        return self._along(np.broadcast(*[np.asarray(q) for q in query]).ndim)

    def _along(self, ndim: int) -> np.ndarray:
        raise NotImplementedError

    def verify_s(self, batch, tokens, context) -> np.ndarray:
        return self.profile.verify_s(batch, tokens, context, replica=self._replica(batch, tokens, context))

    def draft_s(self, draft: str, batch, width, context) -> np.ndarray:
        return self.profile.draft_s(draft, batch, width, context, replica=self._replica(batch, width, context))

    def plain_s(self, batch, context) -> np.ndarray:
        return self.verify_s(batch, 1, context)

    def describe(self) -> str:
        return self.profile.describe()


@dataclass(frozen=True)
class ByRow(_Replicated):
    """A profile whose replicas price the rows of a batch timeline: row r (the leading axis of every query)
    reads replica which[r], or the profile itself where which[r] = -1 (`sim.batch.simulate_batch`)."""

    which: np.ndarray  # (R,) replica per row

    def _along(self, ndim: int) -> np.ndarray:
        """`which`, shaped to broadcast its rows along a query's leading axis."""
        return self.which.reshape((-1,) + (1,) * max(ndim - 1, 0)) if ndim else self.which


@dataclass(frozen=True)
class AllReplicas(_Replicated):
    """Every replica of a profile at once: each query gains a leading axis, replica r's times at [r], the same
    numbers each replica prices alone (`Pricing.priced_replicas`)."""

    @property
    def lead(self) -> tuple[int]:
        return (len(self.profile.replicas),)

    def _along(self, ndim: int) -> np.ndarray:
        """0..R-1 along a new leading axis of the query's shape."""
        return np.arange(self.lead[0]).reshape((-1,) + (1,) * ndim)


def check_profile(profile: ProfileCost, target_name: str, target_info: Mapping | None) -> None:
    """SpecError unless the profile measured the cache's target (names both)."""
    wanted = ModelId.from_info(target_name, target_info)
    if not profile.target.same_as(wanted):
        raise SpecError(f"cost profile {profile.path} was measured for target {profile.target.describe()}, "
                        f"not for this cache's target {wanted.describe()}; run `specsim profile --target "
                        f"{target_name} ...` on the hardware you are asking about")


def _span(values: np.ndarray) -> str:
    values = [f"{v:g}" for v in values]
    return values[0] if len(values) == 1 else f"{values[0]}-{values[-1]}"


def _check_range(x: np.ndarray, grid: np.ndarray, name: str, path: Path, *, clamp_below: bool,
                 limit: float = 1.0) -> None:
    """SpecError for a query more than `limit` x past the largest measured value (or below the smallest)."""
    if x.size and float(x.max()) > limit * float(grid[-1]):
        how = (f"extrapolating more than {EXTRAPOLATION:g}x past the largest is refused" if limit > 1 else
               f"--cost-extrapolate extrapolates up to {EXTRAPOLATION:g}x, flagging rows cost_extrapolated")
        raise SpecError(f"cost profile {path}: {name} {float(x.max()):g} is beyond what it measured "
                        f"({_span(grid)}; {how}); measure it: `specsim profile --for CACHE --tree ...` covers "
                        "what a cache's trees need")
    if x.size and float(x.min()) < float(grid[0]) and not clamp_below:
        raise SpecError(f"cost profile {path}: {name} {float(x.min()):g} is below what it measured ({_span(grid)})")


def _axis(x: np.ndarray, grid: np.ndarray):
    """(lower index, upper index, fraction) of x (within the grid's range) on a grid."""
    if grid.shape[0] == 1:
        zeros = np.zeros(x.shape, dtype=np.int64)
        return zeros, zeros, np.zeros(x.shape)
    x = np.clip(x, grid[0], grid[-1])
    hi = np.clip(np.searchsorted(grid, x), 1, grid.shape[0] - 1)
    lo = hi - 1
    return lo, hi, (x - grid[lo]) / (grid[hi] - grid[lo])


def _interpolate(table: np.ndarray, grids: Sequence[np.ndarray], points: Sequence, names: Sequence[str],
                 path: Path, layer=None, limit: float = 1.0) -> np.ndarray:
    """Multilinear interpolation of a 3-D table at broadcast points; past the grid, the edge's time plus a
    non-negative least-squares slope over the upper half of each axis the point left (see the module doc).
    layer: with a stack of tables, which one each point reads (broadcast with the points)."""
    arrays = [np.asarray(p, dtype=np.float64) for p in points]
    if layer is not None:
        arrays.append(np.asarray(layer))
    flat = [p.ravel() for p in np.broadcast_arrays(*arrays)]
    shape = np.broadcast(*arrays).shape
    pts, layer = (flat, None) if layer is None else (flat[:-1], flat[-1].astype(np.int64))
    for p, g, n in zip(pts, grids, names):
        _check_range(p, g, n, path, clamp_below=(n == "context"), limit=limit)
    inside = [np.minimum(p, g[-1]) for p, g in zip(pts, grids)]
    out = _corners(table, [_axis(x, g) for x, g in zip(inside, grids)], layer)
    for k, (p, g) in enumerate(zip(pts, grids)):
        past = np.maximum(p - g[-1], 0.0)
        if g.shape[0] > 1 and past.any():
            out = out + past * _edge_slope(table, grids, inside, k, layer)
    return out.reshape(shape)


def _edge_slope(table: np.ndarray, grids: Sequence[np.ndarray], inside: Sequence[np.ndarray], k: int,
                layer: np.ndarray | None = None) -> np.ndarray:
    """Least-squares slope of the time along axis k over its upper half of measured values (at least two), at the
    other axes' coordinates of each point, floored at 0."""
    g = grids[k]
    upper = g[(g.shape[0] - 1) // 2:]  # the upper half, middle point included: at least two
    values = []
    for x in upper:
        at = list(inside)
        at[k] = np.full(inside[k].shape, x)
        values.append(_corners(table, [_axis(a, gg) for a, gg in zip(at, grids)], layer))
    values = np.stack(values)  # (len(upper), Q)
    dx = upper - upper.mean()
    slope = (dx[:, None] * (values - values.mean(axis=0))).sum(axis=0) / float((dx ** 2).sum())
    return np.maximum(slope, 0.0)


def _corners(table: np.ndarray, axes: Sequence, layer: np.ndarray | None = None) -> np.ndarray:
    """The multilinear combination of a 3-D table's corners for (lower index, upper index, fraction) per axis;
    with `layer`, the table is a stack of 3-D tables and each point reads its own layer."""
    out = np.zeros(axes[0][0].shape)
    for corner in range(8):
        weight = np.ones(out.shape)
        index = [] if layer is None else [layer]
        for k, (lo, hi, frac) in enumerate(axes):
            upper = (corner >> k) & 1
            weight = weight * (frac if upper else 1.0 - frac)
            index.append(hi if upper else lo)
        out += weight * table[tuple(index)]
    return out


def pool_profiles(profiles) -> ProfileCost:
    """Several profiles of one machine as one: tables averaged, and the drift between them carried.

    A profile's rounds cover the noise of the minutes it was measured in, not a machine whose speed
    moves between them (a shared CPU measured 10-15% apart two minutes later). Profiles measured at
    different moments sample that drift: each replica (`ProfileCost.replicas`) is one of them drawn
    at random, its rounds resampled as its own, so speedup CIs span the moments measured. They must
    share the machine (device, dtype, engine), the models (fingerprints) and the grid; SpecError
    naming what differs otherwise. One profile is returned as it is."""
    profiles = list(profiles)
    if not profiles:
        raise SpecError("pool_profiles: no profile given")
    if len(profiles) == 1:
        return profiles[0]
    first = profiles[0]
    for p in profiles[1:]:
        for what, mine, theirs in (("device", first.device, p.device), ("dtype", first.dtype, p.dtype),
                                   ("engine", first.engine, p.engine), ("target", first.target, p.target),
                                   ("drafts", first.drafts, p.drafts)):
            if mine != theirs:
                raise SpecError(f"cost profiles {first.path} and {p.path} differ in {what} ({mine} / {theirs}): "
                                "pool profiles of one machine and the same models only")
        for axis in ("batches", "contexts", "sizes", "widths"):
            if not np.array_equal(getattr(first, axis), getattr(p, axis)):
                raise SpecError(f"cost profiles {first.path} and {p.path} measured different {axis} "
                                f"({_span(getattr(first, axis))} / {_span(getattr(p, axis))}): measure them with the "
                                "same settings to pool them")
    overhead = None
    if all(p.overhead is not None for p in profiles):
        kinds = set.intersection(*(set(p.overhead) for p in profiles))
        overhead = {k: np.mean([p.overhead[k] for p in profiles], axis=0) for k in sorted(kinds)}
    errors = [p.fit_error for p in profiles if p.fit_error is not None]
    extrapolate = any(p.extrapolate for p in profiles)
    return replace(first, verify=np.mean([p.verify for p in profiles], axis=0),
                   draft={k: np.mean([p.draft[k] for p in profiles], axis=0) for k in first.draft},
                   fit_error=max(errors) if errors else None, verify_runs=None, draft_runs=None, overhead=overhead,
                   extrapolate=extrapolate, pooled=tuple(replace(p, extrapolate=extrapolate) for p in profiles))


def load_cost_profiles(paths, *, extrapolate: bool = False) -> ProfileCost:
    """`load_cost_profile` of each path, pooled (`pool_profiles`) when there are several."""
    return pool_profiles([load_cost_profile(p, extrapolate=extrapolate) for p in paths])


def load_cost_profile(path, *, extrapolate: bool = False) -> ProfileCost:
    """Read a specsim-cost-profile JSON (v2); SpecError naming the file and field when malformed.

    extrapolate: price past the largest measured batch, N, width or context (up to EXTRAPOLATION x);
    without it such a query is refused."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise SpecError(f"cost profile {path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise SpecError(f"cost profile {path}: not a text file (write one with `specsim profile`)") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"cost profile {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
        raise SpecError(f"cost profile {path}: not a {PROFILE_FORMAT} file (write one with `specsim profile`)")
    if data.get("version") != PROFILE_VERSION:
        raise SpecError(f"cost profile {path}: version {data.get('version')!r}; this specsim reads version "
                        f"{PROFILE_VERSION} (batch sizes and model fingerprints): re-run `specsim profile`")
    try:
        grid = {k: np.array(sorted(float(v) for v in data[k])) for k in ("batches", "contexts", "sizes", "widths")}
        verify = _table(data["target_verify_s"], grid["batches"], grid["contexts"], grid["sizes"])
        drafts_meta = data["drafts"]
        draft = {name: _table(data["draft_step_s"][name], grid["batches"], grid["contexts"], grid["widths"])
                 for name in drafts_meta}
        target = data["target"]
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"cost profile {path}: missing or malformed field ({exc}); re-run `specsim profile`") from None
    for axis in ("batches", "sizes", "widths"):
        if grid[axis].size == 0 or grid[axis][0] != 1:
            raise SpecError(f"cost profile {path}: {axis} must start at 1 (the plain step / one request)")
    runs = _runs(data, grid)
    overhead = None
    if "step_overhead_s" in data:
        try:
            raw = data["step_overhead_s"]
            overhead = {kind: _table({b: {"0": raw[kind][b]} for b in raw[kind]}, grid["batches"], np.zeros(1),
                                     grid["sizes"])[:, 0, :] for kind in OVERHEAD_KINDS
                        if kind in raw or kind not in OVERHEAD_LATER}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SpecError(f"cost profile {path}: malformed step_overhead_s ({exc}); re-run `specsim profile`"
                            ) from None
    fit = data.get("fit", {}).get("max_relative_error")
    return ProfileCost(
        path=path, device=str(data.get("device", "?")), dtype=str(data.get("dtype", "?")),
        target=ModelId.from_info(target.get("name", "?"), target),
        drafts={name: ModelId.from_info(name, meta) for name, meta in drafts_meta.items()},
        batches=grid["batches"], contexts=grid["contexts"], sizes=grid["sizes"], widths=grid["widths"],
        verify=verify, draft=draft, fit_error=float(fit) if fit is not None else None,
        engine=str(data.get("engine", "specsim")),
        verify_runs=None if runs is None else runs[0], draft_runs=None if runs is None else runs[1],
        seed=int(data.get("timing", {}).get("seed", 0) or 0) if isinstance(data.get("timing"), Mapping) else 0,
        extrapolate=bool(extrapolate), overhead=overhead,
    )


def _runs(data: Mapping, grid: Mapping) -> tuple[np.ndarray, dict] | None:
    """((R, nb, nl, nn) target rounds, {draft: (R, nb, nl, nw)}) when every entry kept R0 >= 2 timed rounds
    (`runs`), R the most any entry kept; an entry's rounds past its own count are NaN (`profile --max-repeats`
    timed only the uncertain entries further). None where some entry kept fewer than 2 rounds (profiles of one
    run, and older ones: vLLM profiles before 2026-11-29 kept none for their draft forwards): no uncertainty to
    carry."""
    def table(raw, xs):
        cells = [[[raw[f"{b:g}"][f"{L:g}"][f"{x:g}"] for x in xs] for L in grid["contexts"]] for b in grid["batches"]]
        flat = [c.get("runs") if isinstance(c, Mapping) else None for bl in cells for lx in bl for c in lx]
        if any(not isinstance(r, list) or len(r) < 2 for r in flat):
            return None
        runs = np.full((len(flat), max(len(r) for r in flat)), np.nan)  # (cells, R)
        for i, r in enumerate(flat):
            runs[i, :len(r)] = r
        if not np.all(np.isnan(runs) | (runs > 0)):
            return None
        return runs.T.reshape(runs.shape[1], len(grid["batches"]), len(grid["contexts"]), len(xs))

    try:
        verify = table(data["target_verify_s"], grid["sizes"])
        drafts = {name: table(data["draft_step_s"][name], grid["widths"]) for name in data["drafts"]}
    except (KeyError, TypeError, ValueError):
        return None
    if verify is None or any(v is None for v in drafts.values()):
        return None
    R = max([verify.shape[0], *(v.shape[0] for v in drafts.values())])
    pad = lambda t: np.concatenate([t, np.full((R - t.shape[0], *t.shape[1:]), np.nan)])  # noqa: E731
    return pad(verify), {k: pad(v) for k, v in drafts.items()}


def _table(raw: Mapping, batches: np.ndarray, contexts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """(nb, nl, nn) medians from {B: {L: {N: {"median": s, ...}}}}; every grid point must be present and > 0."""
    out = np.empty((len(batches), len(contexts), len(sizes)))
    for i, b in enumerate(batches):
        for j, L in enumerate(contexts):
            for k, n in enumerate(sizes):
                cell = raw[f"{b:g}"][f"{L:g}"][f"{n:g}"]
                seconds = float(cell["median"] if isinstance(cell, Mapping) else cell)
                if not seconds > 0:
                    raise ValueError(f"non-positive time at B={b:g}, L={L:g}, {n:g}")
                out[i, j, k] = seconds
    return out

"""Per-(draft, temperature) features of a cache: what replaying a tree needs per position.

docs/design.md §1-2. Along a target-sampled trajectory y_1..y_n the simulator needs, at
each position t, only a few numbers derived from the cached logits:

* the rank ρ_t of y_t under the draft q_t (0 = the draft's top choice, ties broken
  by the lower token id) — greedy trees accept a node iff its rank path matches;
* log p_t(y_t) and log q_t(y_t) at the simulated temperature — speculative sampling
  accepts a one-token draft with β_t = min(1, q_t(y_t) / p_t(y_t)) (the coupling);
* the draft's top-K ids (for estimators that need the draft's candidates).

They are read from the statistics the recording computed (or, for caches written
before those existed, derived once per (draft, temperature) from the stored logits,
streaming in bounded memory) and kept beside the cache in ``<cache>.features.h5``,
keyed by the cache's content fingerprint (the chained digest of its committed rows;
size and modification time only for files older than format 3). The sampling
statistics (π of multi-draft candidates, lossy rules' α and TV) are read on demand
with `Features.recorded`; where a cache lacks them and keeps its distributions,
estimators stream those with `Features.iter_distributions`. Model-free drafts (``ngram:3``, ``prompt-lookup:2``)
have no draft column; their Features carry tokens and trajectory bounds only.

Head drafts (Medusa, EAGLE) have one law per (call start, depth): their rank, log q, top
ids and recorded statistics carry a depth axis after the position, (N, D, ...), and row t,
column d - 1 describes y_t under the draft a call starting at t - d + 1 used at depth d
(docs/cache-format.md). Replay reads column d - 1 at depth d (`specsim.sim.engine.at_depth`).
numpy only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np

from specsim.cache.stats import STATS_TOP_K, log_prob as _log_prob, token_rank, top_k_ids
from specsim.cache.layout import TARGET
from specsim.cache.reader import CacheReader
from specsim.errors import CacheError, SpecError
from specsim.specs import is_model_free

FEATURES_FORMAT = "specsim-features"
FEATURES_VERSION = 4  # bump when the stored arrays change meaning (3: float32 ranks from recorded statistics;
#                      4: keyed by content fingerprint)
BLOCK = 256  # positions read at once per column while deriving features
BLOCK_ELEMENTS = 1 << 20  # logits read at once per column when streaming distributions (>= BLOCK rows):
#                           a small vocabulary reads many rows per HDF5 call instead of paying per call
MEMO_BYTES = 512 << 20  # keep streamed distributions in memory when both columns fit in this many bytes
RECORDED_BLOCK = 1 << 16  # positions per read of a recorded statistic


@dataclass(frozen=True)
class Features:
    """Everything the simulator reads per position for one (draft, temperature)."""

    draft: str  # draft column name, or a model-free spec like "ngram:3"
    temperature: float  # trajectories used (0 = greedy)
    cache_path: Path  # the cache these were derived from
    models: dict  # {"target": ..., "draft": ...} names for table rows
    traj_start: np.ndarray  # (n_traj,) int64 offsets into the arrays below (local, contiguous)
    traj_len: np.ndarray  # (n_traj,) int32
    traj_prompt: np.ndarray  # (n_traj,) int32 prompt_index
    traj_category: np.ndarray  # (n_traj,) str (object) category
    cache_start: np.ndarray  # (n_traj,) int64 trajectory start in the cache's positions (for raw reads)
    token: np.ndarray  # (N,) int32 trajectory tokens y
    rank: np.ndarray | None  # (N,) int32 rank of y_t under q_t (None for model-free drafts); (N, D) head drafts
    logp: np.ndarray | None  # (N,) float64 log p_t(y_t) at `temperature` (T=0: at T=1)
    logq: np.ndarray | None  # (N,) float64 log q_t(y_t) at `temperature` (T=0: at T=1); (N, D) head drafts
    top_ids: np.ndarray | None  # (N, K) int32 draft's top-K ids, most likely first; (N, D, K) head drafts
    exact_tail: bool  # False for top-k storage: what falls back to its logits spreads the tail evenly
    prompt_len: np.ndarray | None = None  # (n_traj,) int64 prompt tokens of each trajectory (context = prompt + t)
    max_new_tokens: int | None = None  # the recording's output limit (None: unknown, each trajectory's end is used)
    recorded_stats: object | None = None  # the cache's StatsSpec: sampling statistics recorded per position
    has_distributions: bool = True  # False for stats-only caches: nothing can be derived from logits
    depth: int | None = None  # head drafts: the depths their laws are keyed by (None: one law per position)
    traj_overhang: np.ndarray | None = None  # (n_traj,) int64 positions the cache recorded past each end, right
    #                                          after the trajectory's own (None: none, as before format 4)
    parent: tuple | None = field(default=None, repr=False, compare=False)  # (Features, rows) of a subset
    _memo: dict = field(default_factory=dict, repr=False, compare=False)  # streamed distributions, when small

    @property
    def n_positions(self) -> int:
        return int(self.token.shape[0])

    @property
    def n_traj(self) -> int:
        return int(self.traj_len.shape[0])

    @property
    def model_free(self) -> bool:
        """True for drafts without a draft column (n-gram, prompt lookup): no ranks, no log q."""
        return self.rank is None and self.logq is None

    def check_depth(self, depth: int, what: str) -> None:
        """SpecError when `what` drafts deeper than a head draft's recorded depths."""
        if self.depth is not None and depth > self.depth:
            raise SpecError(f"{what} drafts {depth} deep; head draft {self.draft} was recorded to depth {self.depth} "
                            f"(record deeper with --head-depth, or use a tree of depth <= {self.depth})")

    @property
    def softmax_temperature(self) -> float:
        """Temperature of the probabilities: greedy trajectories use the T=1 softmax."""
        return self.temperature if self.temperature > 0 else 1.0

    def remaining(self) -> np.ndarray:
        """(N,) int64: drafts a call starting at each position may accept (n - 1 - t; DESIGN end cap)."""
        return self._cached("remaining", lambda: np.repeat(self.traj_start + self.traj_len, self.traj_len)
                            - np.arange(self.n_positions) - 1)

    def _cached(self, key: str, compute) -> np.ndarray:
        """A derived per-position array, computed once and kept read-only (replay asks thousands of times)."""
        if key not in self._memo:
            value = compute()
            value.flags.writeable = False
            self._memo[key] = value
        return self._memo[key]

    def _local(self) -> np.ndarray:
        """(N,) int64 each position's index within its trajectory."""
        return self._cached("local", lambda: np.arange(self.n_positions) - np.repeat(self.traj_start, self.traj_len))

    def subset(self, trajectories: np.ndarray) -> "Features":
        """The features of some trajectories (in the given order); `parent` keeps (self, position rows) so
        estimates made on the whole set can be sliced instead of recomputed."""
        traj = np.asarray(trajectories, dtype=np.int64)
        rows = (np.concatenate([np.arange(s, s + n) for s, n in zip(self.traj_start[traj], self.traj_len[traj])])
                if traj.size else np.zeros(0, dtype=np.int64))
        lens = self.traj_len[traj]
        take = lambda x: None if x is None else x[rows]  # noqa: E731
        out = replace(
            self, traj_start=np.concatenate([[0], np.cumsum(lens[:-1], dtype=np.int64)]).astype(np.int64)
            if traj.size else np.zeros(0, dtype=np.int64),
            traj_len=lens, traj_prompt=self.traj_prompt[traj], traj_category=self.traj_category[traj],
            cache_start=self.cache_start[traj], token=self.token[rows], rank=take(self.rank), logp=take(self.logp),
            logq=take(self.logq), top_ids=take(self.top_ids),
            prompt_len=None if self.prompt_len is None else self.prompt_len[traj],
            traj_overhang=None if self.traj_overhang is None else self.traj_overhang[traj], parent=(self, rows),
            _memo={})
        out._memo["parent_trajectories"] = traj  # which of the parent's trajectories, in order
        return out

    def acceptance(self) -> np.ndarray:
        """(N,) β_t: probability that a one-token draft at t is accepted given the trajectory (docs/design.md §2).

        Sampling: min(1, q_t(y_t) / p_t(y_t)); greedy (T = 0): 1[y_t is the draft's top choice].
        """
        if self.model_free:
            raise SpecError(f"{self.draft!r} is model-free: its proposals are point masses, not a draft law")
        if self.temperature <= 0:
            return (self.rank == 0).astype(np.float64)
        logp = self.logp if self.depth is None else self.logp[:, None]
        return np.exp(np.minimum(0.0, self.logq - logp))

    def recorded(self, name: str) -> np.ndarray | None:
        """(N, ...) a sampling statistic the recording computed for this draft, or None if it has none.

        name: "pi_iid", "pi_swor", "pi_swor_groups", "lossy_alpha" or "lossy_tv"
        (`specsim.cache.stats.draft_stat_shapes`). Read once, in position order, and kept.
        """
        if self.model_free or self.recorded_stats is None:
            return None
        key = f"recorded:{name}"
        if key not in self._memo:
            if self.parent is not None:
                base, rows = self.parent
                whole = base.recorded(name)
                self._memo[key] = None if whole is None else whole[rows]
            else:
                self._memo[key] = self._read_recorded(name)
        return self._memo[key]

    def expansion(self):
        """The draft's recorded EAGLE-2 expansion (`specsim.sim.dynamic.Expansion`), or None."""
        if self.model_free or self.recorded_stats is None or getattr(self.recorded_stats, "expand", None) is None:
            return None
        return self.recorded_stats.expansion

    def _read_recorded(self, name: str) -> np.ndarray | None:
        with CacheReader(self.cache_path) as reader:
            if not reader.has_stat(self.draft, name):
                return None
            first = reader.stats(self.draft, name, 0, 0)
            out = np.empty((self.n_positions, *first.shape[1:]), dtype=first.dtype)
            for local, lo, hi, rows in _spans(self, RECORDED_BLOCK):
                out[local : local + rows.shape[0]] = reader.stats(self.draft, name, lo, hi)[rows]
        out.flags.writeable = False
        return out

    def overhang(self) -> np.ndarray:
        """(n_traj,) int64 positions recorded past each trajectory's end (0 where the cache has none)."""
        if self.traj_overhang is None:
            return np.zeros(self.n_traj, dtype=np.int64)
        return self.traj_overhang

    def tail(self, depth: int) -> "Tail | None":
        """Each trajectory's last min(depth, n) positions followed by its overhang, as a Features of its own
        (its trajectories run into the overhang, so its `remaining` counts past the recorded end), read from
        the cache's statistics; None when the cache recorded no overhang (or nothing but the trajectory
        itself would be in it). What an engine that verifies drafts past the end accepts there is a policy
        replayed on it (docs/design.md §6)."""
        key = f"tail:{depth}"
        if key not in self._memo:
            self._memo[key] = _tail(self, depth)
        return self._memo[key]

    def room(self) -> np.ndarray:
        """(N,) int64: drafts a call at each position can still accept before the output limit.

        A real engine knows its max_new_tokens, not where the target will stop, so a call at
        t drafts no deeper than max_new_tokens - 1 - t (Hugging Face's assisted generation
        and serving engines cap the draft there). Without a recorded limit: n - 1 - t.
        """
        if self.max_new_tokens is None:
            return self.remaining()
        return self._cached("room", lambda: np.maximum(self.max_new_tokens - 1 - self._local(), self.remaining()))

    def contexts(self) -> np.ndarray:
        """(N,) float64 context length of a call at each position: prompt tokens + output so far."""
        plen = self.prompt_len if self.prompt_len is not None else np.zeros(self.n_traj, dtype=np.int64)
        return self._cached("contexts", lambda: (np.repeat(plen, self.traj_len) + self._local()).astype(np.float64))

    def prompt_ids(self, i_traj: int) -> np.ndarray:
        """Token ids of trajectory i_traj's prompt (what model-free drafts match against)."""
        with CacheReader(self.cache_path) as reader:
            return reader.prompt_token_ids(int(self.traj_prompt[i_traj]))

    def iter_distributions(self, block: int | None = None) -> Iterator[tuple[int, int, np.ndarray, np.ndarray | None]]:
        """Stream (local_start, local_stop, p_target, q_draft) in bounded memory.

        p_target and q_draft are (n, V) float64 probabilities at the simulated temperature
        (T=0 trajectories: the T=1 softmax); q_draft is None for model-free drafts. block:
        positions per piece (default: BLOCK_ELEMENTS / V, at least BLOCK).
        """
        if "p_target" in self._memo:  # a sweep streams the same small cache many times: keep it
            p_all, q_all = self._memo["p_target"], self._memo["q_draft"]
            block = block or max(BLOCK, BLOCK_ELEMENTS // max(p_all.shape[1], 1))
            for s in range(0, self.n_positions, block):
                e = min(s + block, self.n_positions)
                yield s, e, p_all[s:e], None if q_all is None else q_all[s:e]
            return
        T = self.softmax_temperature
        with CacheReader(self.cache_path) as reader:
            V = reader.spec.vocab_size
            block = block or max(BLOCK, BLOCK_ELEMENTS // max(V, 1))
            keep = self.n_positions * V * 8 * (1 if self.model_free else 2) <= MEMO_BYTES
            if keep:
                p_all = np.empty((self.n_positions, V))  # (N, V)
                q_all = None if self.model_free else np.empty((self.n_positions, V))
            for local, lo, hi, rows in _spans(self, block):
                p_target = _softmax(reader.logits(TARGET, lo, hi)[rows], T)
                q_draft = None if self.model_free else _softmax(reader.logits(self.draft, lo, hi)[rows], T)
                stop = local + rows.shape[0]
                if keep:
                    p_all[local:stop] = p_target
                    if q_all is not None:
                        q_all[local:stop] = q_draft
                yield local, stop, p_target, q_draft
        if keep:  # only a complete pass is kept; read-only, as every later pass shares it
            for x in (p_all, q_all):
                if x is not None:
                    x.flags.writeable = False
            self._memo.update(p_target=p_all, q_draft=q_all)


def load_features(cache, draft: str, temperature: float, *, top_k: int = 16, progress: bool = True) -> Features:
    """Features of `draft` on the trajectories recorded at `temperature`, derived once and kept beside the cache.

    `cache` is a path or an open `CacheReader`. Raises CacheError for an unrecorded
    temperature or draft (the message lists what the cache has).
    """
    return feature_source(cache, draft, temperature, top_k=top_k, progress=progress).whole()


@dataclass(frozen=True)
class FeatureSource:
    """One (draft, temperature)'s features, to be read whole or a block of trajectories at a time.

    The per-trajectory facts are in memory; the per-position arrays stay in the features file
    beside the cache (or in `arrays` where that file could not be written, and for model-free
    drafts, whose only array is the tokens), so a sweep that reads a block at a time holds
    memory bounded by the block, not by the cache.
    """

    # Features' fields that are not per-position arrays (see `Features`: their meaning, shapes and types)
    draft: str
    temperature: float
    cache_path: Path
    models: dict
    traj_start: np.ndarray
    traj_len: np.ndarray
    traj_prompt: np.ndarray
    traj_category: np.ndarray
    cache_start: np.ndarray
    exact_tail: bool
    prompt_len: np.ndarray
    max_new_tokens: int | None
    recorded_stats: object | None
    has_distributions: bool
    depth: int | None
    traj_overhang: np.ndarray
    # where the per-position arrays are
    key: str | None = None  # the group in the features file; None: `arrays` holds the arrays
    arrays: dict | None = None  # token, rank, logp, logq, top_ids in memory (None: in the file)
    model_free: bool = False  # a model-free draft: no draft column, its only array is the tokens

    @property
    def n_traj(self) -> int:
        return int(self.traj_len.shape[0])

    @property
    def n_positions(self) -> int:
        return int(self.traj_len.sum())

    def facts(self) -> dict:
        """The per-trajectory fields, by name, as `Features` takes them."""
        return {name: getattr(self, name) for name in TRAJECTORY_FIELDS}

    def mean_context(self) -> float:
        """Mean context length over positions (prompt + output so far), as `Features.contexts().mean()`."""
        n = self.traj_len.astype(np.float64)
        plen = self.prompt_len.astype(np.float64)
        return float((plen * n + n * (n - 1) / 2).sum() / max(n.sum(), 1.0))

    def context_range(self) -> tuple[float, float]:
        """(least, greatest) context length of a call at any position."""
        n, plen = self.traj_len, self.prompt_len
        some = n > 0
        if not some.any():
            return 0.0, 0.0
        return float(plen[some].min()), float((plen[some] + n[some] - 1).max())

    def whole(self) -> Features:
        """The features of every trajectory."""
        return self.block(0, self.n_traj)

    def block(self, t0: int, t1: int) -> Features:
        """The features of trajectories t0..t1-1 (contiguous in the arrays: one read per array)."""
        b = self.facts()
        lo = int(b["traj_start"][t0]) if t0 < self.n_traj else self.n_positions
        hi = lo + int(b["traj_len"][t0:t1].sum())
        if self.arrays is not None:
            arrays = {k: None if v is None else v[lo:hi] for k, v in self.arrays.items()}
        else:
            with h5py.File(features_path(b["cache_path"]), "r") as f:
                g = f[self.key]
                arrays = {name: g[name][lo:hi] for name in ARRAYS}
        if t0 == 0 and t1 == self.n_traj:
            return Features(**b, **arrays)
        part = {k: b[k][t0:t1] for k in PER_TRAJECTORY}
        part["traj_start"] = b["traj_start"][t0:t1] - lo
        return Features(**{**b, **part}, **arrays)

    def blocks(self, positions: int) -> list[tuple[int, int]]:
        """(t0, t1) runs of whole trajectories holding at most `positions` positions each (at least one)."""
        out, t0, n = [], 0, 0
        for t, length in enumerate(self.traj_len.tolist()):
            if t > t0 and n + length > positions:
                out.append((t0, t))
                t0, n = t, 0
            n += length
        if t0 < self.n_traj:
            out.append((t0, self.n_traj))
        return out

    def sample(self, positions: int, seed: int, block: int) -> Features:
        """Features of trajectories drawn at random (seeded) until they hold `positions` positions, in cache
        order; every trajectory when the cache holds no more. Read a block at a time."""
        if self.n_positions <= positions:
            return self.whole()
        order = np.random.default_rng([seed, 23]).permutation(self.n_traj)
        take = np.sort(order[: int(np.searchsorted(np.cumsum(self.traj_len[order]), positions)) + 1])
        parts = []
        for t0, t1 in self.blocks(block):
            here = take[(take >= t0) & (take < t1)] - t0
            if here.size:
                parts.append(_detach(self.block(t0, t1).subset(here)))
        return _concat(parts)


ARRAYS = ("token", "rank", "logp", "logq", "top_ids")
PER_TRAJECTORY = ("traj_len", "traj_prompt", "traj_category", "cache_start", "prompt_len", "traj_overhang")
TRAJECTORY_FIELDS = ("draft", "temperature", "cache_path", "models", "traj_start", *PER_TRAJECTORY[:4], "exact_tail",
                     "prompt_len", "max_new_tokens", "recorded_stats", "has_distributions", "depth", "traj_overhang")


@dataclass(frozen=True)
class Tail:
    """The ends of some trajectories with what the cache recorded past them (`Features.tail`)."""

    features: "Features"  # one trajectory per segment: its last `kept` positions, then its overhang
    rows: np.ndarray  # (M,) int64 positions of the parent Features the segments' first `kept` rows are
    kept: np.ndarray  # (n_seg,) int64 positions of each segment that belong to the trajectory
    trajectory: np.ndarray  # (n_seg,) int64 the parent's trajectory of each segment

    def own_rows(self) -> np.ndarray:
        """(M,) int64 rows of `features` that are parent positions (each segment's first `kept`), in `rows` order."""
        starts = self.features.traj_start
        return np.concatenate([np.arange(s, s + k) for s, k in zip(starts.tolist(), self.kept.tolist())]) \
            if self.kept.size else np.zeros(0, dtype=np.int64)


def _tail(features: "Features", depth: int) -> Tail | None:
    over = features.overhang()
    which = np.flatnonzero(over > 0)
    if not which.size or depth < 1:
        return None
    n = features.traj_len[which].astype(np.int64)
    kept = np.minimum(depth, n)
    seg_len = kept + over[which]
    seg_cache = features.cache_start[which] + n - kept  # segments are contiguous in the cache: the end, then the rest
    seg_start = np.concatenate([[0], np.cumsum(seg_len[:-1])]).astype(np.int64)
    rows = np.concatenate([features.traj_start[w] + features.traj_len[w] - k + np.arange(k)
                           for w, k in zip(which.tolist(), kept.tolist())]).astype(np.int64)
    base = dict(
        draft=features.draft, temperature=features.temperature, cache_path=features.cache_path,
        models=features.models, traj_start=seg_start, traj_len=seg_len.astype(np.int32),
        traj_prompt=features.traj_prompt[which], traj_category=features.traj_category[which],
        cache_start=seg_cache.astype(np.int64), exact_tail=features.exact_tail,
        prompt_len=None if features.prompt_len is None else features.prompt_len[which] + n - kept,
        max_new_tokens=None, recorded_stats=features.recorded_stats, has_distributions=False,
        depth=features.depth, traj_overhang=None)
    arrays = _read_recorded_arrays(features, base)
    return Tail(features=Features(**base, **arrays), rows=rows, kept=kept, trajectory=which)


def _read_recorded_arrays(features: "Features", base: dict) -> dict:
    """token, rank, logp, logq (and top_ids) of `base`'s positions from the cache's recorded statistics."""
    local = _Base(base)
    N = int(base["traj_len"].sum())
    with CacheReader(features.cache_path) as reader:
        def read(column: str | None, name: str) -> np.ndarray:
            parts = np.empty(0)
            for i, (lo_local, lo, hi, rows) in enumerate(_spans(local, RECORDED_BLOCK)):
                x = reader.tokens(lo, hi) if column is None else reader.stats(column, name, lo, hi)
                if i == 0:
                    parts = np.empty((N, *x.shape[1:]), dtype=x.dtype)
                parts[lo_local : lo_local + rows.shape[0]] = x[rows]
            return parts

        token = read(None, "token")
        if features.model_free:
            return dict(token=token, rank=None, logp=None, logq=None, top_ids=None)
        width = None if features.top_ids is None else features.top_ids.shape[-1]
        return dict(token=token, rank=read(features.draft, "rank"), logp=read(TARGET, "logprob"),
                    logq=read(features.draft, "logprob"), top_ids=read(features.draft, "top_ids")[..., :width])


def _detach(features: Features) -> Features:
    """A subset standing alone: no parent, reading its recorded statistics from the cache itself."""
    return replace(features, parent=None, _memo={})


def _concat(parts: list[Features]) -> Features:
    """One Features of several (same draft and temperature), trajectories in the given order."""
    first = parts[0]
    lens = np.concatenate([p.traj_len for p in parts])
    cat = lambda name: None if getattr(first, name) is None else np.concatenate(  # noqa: E731
        [getattr(p, name) for p in parts])
    return replace(first, traj_start=np.concatenate([[0], np.cumsum(lens[:-1], dtype=np.int64)]).astype(np.int64),
                   traj_len=lens, **{name: cat(name) for name in (*PER_TRAJECTORY[1:], *ARRAYS)},
                   parent=None, _memo={})


def feature_source(cache, draft: str, temperature: float, *, top_k: int = 16, progress: bool = True) -> FeatureSource:
    """Where `draft`'s features on the trajectories at `temperature` are, derived into the features file
    beside the cache first if they are not there yet (`load_features` reads them whole)."""
    reader = cache if isinstance(cache, CacheReader) else CacheReader(cache)
    try:
        return _source(reader, draft, temperature, top_k, progress)
    finally:
        if reader is not cache:
            reader.close()


def _source(reader: CacheReader, draft: str, temperature: float, top_k: int, progress: bool) -> FeatureSource:
    T = reader.check_temperature(float(temperature))
    model_free = draft not in reader.spec.drafts and is_model_free(draft)
    if not model_free:
        reader.check_column(draft)
        if draft == TARGET:
            raise SpecError(f"{TARGET!r} is the target column, not a draft; drafts: {', '.join(reader.spec.drafts)}")
    rows = list(reader.iter_trajectories(T))
    if not rows:
        raise CacheError(f"{reader.path}: no committed trajectories at temperature {T:g} yet")
    lens = np.array([r.length for r in rows], dtype=np.int32)
    categories = reader.prompts["category"].to_list()
    base = dict(
        draft=draft, temperature=T, cache_path=reader.path,
        models={"target": reader.run.target_name, "draft": draft},
        traj_start=np.concatenate([[0], np.cumsum(lens[:-1], dtype=np.int64)]).astype(np.int64),
        traj_len=lens,
        traj_prompt=np.array([r.prompt_index for r in rows], dtype=np.int32),
        traj_category=np.array([categories[r.prompt_index] for r in rows], dtype=object),
        cache_start=np.array([r.start for r in rows], dtype=np.int64),
        exact_tail=reader.spec.storage != "topk",  # top-k: flagged approximate wherever logits could be read
        prompt_len=np.array([len(reader.prompt_token_ids(r.prompt_index)) for r in rows], dtype=np.int64),
        max_new_tokens=reader.run.max_new_tokens,
        recorded_stats=reader.spec.stats,
        has_distributions=reader.has_distributions and (model_free or reader.depth(draft) is None),
        depth=None if model_free else reader.depth(draft),
        traj_overhang=np.array([r.overhang for r in rows], dtype=np.int64),
    )
    if model_free:
        token = np.concatenate([reader.tokens(r.start, r.stop) for r in rows])
        return FeatureSource(**base, arrays=dict(token=token, rank=None, logp=None, logq=None, top_ids=None),
                             model_free=True)
    K = max(1, min(int(top_k), reader.spec.vocab_size))
    key = f"{draft.replace('/', '|')}@T={T:g}@K={K}"
    if _stored(reader, key):
        return FeatureSource(**base, key=key)
    written = _derive_stored(reader, key, base, draft, T, K, progress)
    if written:
        return FeatureSource(**base, key=key)
    arrays = _empty(base, K)  # the features file cannot be written here: derive into memory
    _derive(reader, base, draft, T, K, progress, arrays)
    return FeatureSource(**base, arrays=arrays)


# -- derivation ----------------------------------------------------------------------------


def _runs(features) -> list[tuple[int, int, int]]:
    """(local_start, cache_start, length) of maximal runs contiguous in both numberings."""
    runs: list[list[int]] = []
    for local, cache, n in zip(features.traj_start.tolist(), features.cache_start.tolist(), features.traj_len.tolist()):
        if runs and runs[-1][1] + runs[-1][2] == cache:
            runs[-1][2] += n
        else:
            runs.append([local, cache, n])
    return [tuple(r) for r in runs]


def _spans(features, block: int) -> Iterator[tuple[int, int, int, np.ndarray]]:
    """(local_start, cache_lo, cache_hi, rows): one HDF5 read [lo, hi) per piece, rows = the wanted ones.

    Trajectories of one temperature are interleaved with the others' in the cache, so runs
    are short; consecutive runs are read together while the span stays within `block` rows
    and at most half of it is unwanted (read and dropped), cutting the number of reads.
    """
    pieces: list[tuple[int, int]] = []  # (cache_start, n) of the current span, contiguous in local numbering
    local0 = used = 0  # used: rows of the span wanted so far
    for local, cache, n in _runs(features):
        for s in range(0, n, block):
            c, m = cache + s, min(block, n - s)
            if pieces:
                lo = pieces[0][0]
                span = c + m - lo
                if c < pieces[-1][0] + pieces[-1][1] or span > block or span > 2 * (used + m):
                    yield local0, lo, pieces[-1][0] + pieces[-1][1], _rows(pieces)
                    pieces, used = [], 0
            if not pieces:
                local0 = local + s
            pieces.append((c, m))
            used += m
    if pieces:
        yield local0, pieces[0][0], pieces[-1][0] + pieces[-1][1], _rows(pieces)


def _rows(pieces: list[tuple[int, int]]) -> np.ndarray:
    lo = pieces[0][0]
    return np.concatenate([np.arange(c - lo, c - lo + m) for c, m in pieces])


class _Base:  # what _runs needs, before the Features exist
    def __init__(self, base: dict) -> None:
        self.traj_start, self.cache_start, self.traj_len = base["traj_start"], base["cache_start"], base["traj_len"]


def _layout(base: dict, K: int) -> dict[str, tuple[tuple, type]]:
    """Each feature array's (shape, dtype) for `base`'s positions."""
    N = int(base["traj_len"].sum())
    axis = () if base["depth"] is None else (base["depth"],)  # head drafts: one entry per depth
    return dict(token=((N,), np.int32), rank=((N, *axis), np.int32), logp=((N,), np.float64),
                logq=((N, *axis), np.float64), top_ids=((N, *axis, K), np.int32))


def _empty(base: dict, K: int) -> dict:
    """The feature arrays of `base`'s positions, unfilled."""
    return {name: np.empty(shape, dtype=dtype) for name, (shape, dtype) in _layout(base, K).items()}


def _derive(reader: CacheReader, base: dict, draft: str, T: float, K: int, progress: bool, out: dict) -> None:
    """Fill `out` (numpy arrays or HDF5 datasets of `_empty`'s shapes) with the features, BLOCK positions a time."""
    from tqdm.auto import tqdm

    N = int(base["traj_len"].sum())
    token, rank, logp, logq, top_ids = (out[name] for name in ARRAYS)
    Ts = T if T > 0 else 1.0
    recorded = reader.has_stats() and K <= STATS_TOP_K  # float32 statistics from the recording: no logits read
    bar = tqdm(total=N, unit="pos", desc=f"features {draft} T={T:g}", disable=not progress, dynamic_ncols=True)
    try:
        for local, cache, n in _runs(_Base(base)):
            for s in range(0, n, BLOCK):
                e = min(s + BLOCK, n)
                a, b = local + s, local + e
                y = reader.tokens(cache + s, cache + e)  # (n,)
                if recorded:
                    token[a:b] = y
                    rank[a:b] = reader.stats(draft, "rank", cache + s, cache + e)
                    logp[a:b] = reader.stats(TARGET, "logprob", cache + s, cache + e)
                    logq[a:b] = reader.stats(draft, "logprob", cache + s, cache + e)
                    top_ids[a:b] = reader.stats(draft, "top_ids", cache + s, cache + e)[..., :K]
                    bar.update(e - s)
                    continue
                if base["depth"] is not None:
                    raise CacheError(f"{reader.path}: head draft {draft} needs its recorded statistics (K <= "
                                     f"{STATS_TOP_K})")
                p_logits = reader.logits(TARGET, cache + s, cache + e)  # (n, V)
                q_logits = reader.logits(draft, cache + s, cache + e)  # (n, V)
                token[a:b] = y
                rank[a:b] = token_rank(q_logits, y)
                logp[a:b] = _log_prob(p_logits, y, Ts)
                logq[a:b] = _log_prob(q_logits, y, Ts)
                top_ids[a:b] = top_k_ids(q_logits, K)
                bar.update(e - s)
    except OSError as exc:
        raise CacheError(f"{reader.path}: corrupt data while reading logits ({exc})") from None
    finally:
        bar.close()


def _softmax(logits: np.ndarray, T: float) -> np.ndarray:
    z = logits.astype(np.float64) / T  # (n, V)
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


# -- the file beside the cache --------------------------------------------------------------


def features_path(cache_path: Path) -> Path:
    return Path(str(cache_path) + ".features.h5")


def _fingerprint(reader: CacheReader) -> dict:
    """What ties the features file to the cache: its content digest (format 3), else size and mtime."""
    content = reader.fingerprint
    if content is not None:
        return {"cache_content": content, "format": FEATURES_FORMAT, "version": FEATURES_VERSION}
    st = reader.path.stat()
    return {"cache_n_positions": int(reader.n_positions), "cache_size": int(st.st_size),
            "cache_mtime_ns": int(st.st_mtime_ns), "format": FEATURES_FORMAT, "version": FEATURES_VERSION}


def _valid(f: h5py.File, fp: dict) -> bool:
    return set(f.attrs) == set(fp) and all(f.attrs.get(k) == v for k, v in fp.items())


FILLING = "filling"  # attribute of a group still being derived (a crash leaves it; it is derived again)


def _stored(reader: CacheReader, key: str) -> bool:
    """True when the features file holds `key`, complete, for this cache's content."""
    try:
        with h5py.File(features_path(reader.path), "r") as f:
            return _valid(f, _fingerprint(reader)) and key in f and FILLING not in f[key].attrs
    except (OSError, KeyError):
        return False  # missing, stale or unreadable: derive again


def _derive_stored(reader: CacheReader, key: str, base: dict, draft: str, T: float, K: int, progress: bool) -> bool:
    """Derive the features straight into the features file; False when it cannot be written here (a
    read-only directory, or another process holding it), so the caller derives into memory."""
    path = features_path(reader.path)
    fp = _fingerprint(reader)
    try:
        try:
            f = h5py.File(path, "a")
        except OSError:
            if path.exists() and not _is_hdf5(path):
                path.unlink()  # not HDF5 (a crashed write): start over
            f = h5py.File(path, "a")
    except OSError:
        try:
            if path.exists() and path.stat().st_size == 0:
                os.remove(path)
        except OSError:
            pass
        return False
    with f:
        if not _valid(f, fp):
            for name in list(f):
                del f[name]
            for name in list(f.attrs):
                del f.attrs[name]
            f.attrs.update(fp)
        if key in f:
            del f[key]
        g = f.create_group(key)
        g.attrs[FILLING] = True
        out = {name: _Buffered(g.create_dataset(name, shape=shape, dtype=dtype))
               for name, (shape, dtype) in _layout(base, K).items()}
        _derive(reader, base, draft, T, K, progress, out)
        for x in out.values():
            x.flush()
        del g.attrs[FILLING]
    return True


class _Buffered:
    """An HDF5 dataset written in order, RECORDED_BLOCK rows per write instead of one write per slice."""

    def __init__(self, ds: h5py.Dataset) -> None:
        self.ds, self.lo = ds, 0
        self.buf = np.empty((min(RECORDED_BLOCK, ds.shape[0]), *ds.shape[1:]), dtype=ds.dtype)

    def __setitem__(self, rows: slice, value) -> None:
        a, b = rows.start or 0, rows.stop
        if a < self.lo or b > self.lo + self.buf.shape[0]:
            self.flush(a)
        self.buf[a - self.lo : b - self.lo] = value

    def flush(self, lo: int | None = None) -> None:
        """Write the rows buffered so far (up to the next start `lo`) and start buffering at `lo`."""
        stop = min(self.lo + self.buf.shape[0], self.ds.shape[0]) if lo is None else lo
        if stop > self.lo:
            self.ds[self.lo : stop] = self.buf[: stop - self.lo]
        if lo is not None:
            self.lo = lo


def _is_hdf5(path: Path) -> bool:
    try:
        return h5py.is_hdf5(path)
    except OSError:
        return False

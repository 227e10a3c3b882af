"""The HDF5 cache: one file of target-sampled trajectories with full next-token logits.

docs/design.md §1. A file holds, for every prompt × temperature, the trajectory the
target sampled and, at every generated position, the target's and each draft's
next-token logits on the on-path prefix. Layout (see docs/cache-format.md):

    /                      attrs: format, format_version, vocab_size, storage, top_k,
                                  drafts (JSON), temperatures (JSON), meta (JSON),
                                  statistics (JSON: which per-position statistics, v3)
    /prompts/{question_id, category, text, token_ids}     fixed at creation
    /trajectories          compound rows (prompt_index, temperature, seed, start,
                           length, stop_reason, digest); a row with length > 0 is committed
    /positions/token       (N,) int32 trajectory tokens, chunked by positions
    /columns/<c>/stats/*   per-position statistics (`specsim.cache.stats`)     (always)
                           a head draft's (attrs: draft_depths) carry a depth axis: (N, D, ...)
    /columns/target/hidden/<layer>  (N, H) float16 target hidden states   (--hidden-states)
    /columns/<c>/logits    (N, V) float16 for c = "target" and every draft   (full)
    /columns/<c>/topk_ids, topk_logits, tail_lse                             (topk)
                                                         (stats: no distributions at all)

Each committed row carries a digest chaining the previous row's with the trajectory's
content (tokens, statistics and any stored logits): the last committed digest
fingerprints everything a reader may derive from the file (`CacheReader.fingerprint`).

Crash safety: the writer runs in HDF5 SWMR mode and commits a trajectory by
writing its positions first, flushing, then appending its row to
/trajectories and flushing again. A reader (also SWMR, so `inspect` works
during a recording) trusts only positions covered by committed rows. After a
kill -9 the file is readable; `CacheWriter.resume` copies the committed part
into a fresh file (HDF5 refuses to reopen a crashed SWMR file for writing) and
carries on.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import h5py
import numpy as np

from specsim.cache.stats import (
    TARGET_STAT_SHAPES,
    StatsSpec,
    expansion_shapes,
    proposal_shapes,
    draft_stat_shapes,
    draft_stats,
    target_stats,
)
from specsim.cache.meta import RunMeta
from specsim.errors import CacheError

if TYPE_CHECKING:
    import polars as pl

FORMAT = "specsim-cache"
FORMAT_VERSION = 4  # 2: per-position float32 statistics (/columns/<c>/stats); 3: sampling statistics,
#                     stats-only storage and content digests; 4: each trajectory's overhang
READS = (1, 2, 3, 4)  # versions this specsim reads
STORAGES = ("full", "topk", "stats")
TARGET = "target"  # column name of the target's logits
ROW_CHUNK = 16  # positions per HDF5 chunk: bounded-memory streaming, ~1.5 MB at V=49k
STATS_CHUNK_BYTES = (8192, 1 << 18)  # bytes per chunk of a statistic, least and most: small files stay small
STATS_CHUNKS = 256  # a statistic's expected size over this many chunks, within STATS_CHUNK_BYTES: a large
#                     recording reads in few large chunks (a 131k-position block of 16 x 8 float16 swor
#                     replicates: 0.13 s in 16 KB chunks against 0.05 s in 256 KB ones, checksums included)

STOP_REASONS = ("max_new_tokens", "eos")
_TRAJ_DTYPE = np.dtype(
    [
        ("prompt_index", "<i4"),
        ("temperature", "<f4"),
        ("seed", "<i8"),
        ("start", "<i8"),
        ("length", "<i4"),
        ("stop_reason", "<i1"),
        ("digest", "S16"),  # blake2b-128 of the previous row's digest and this trajectory's content
        ("overhang", "<i2"),  # v4: positions recorded past the trajectory's end (rows start+length ..)
    ]
)


def _overhang(rows: np.ndarray) -> np.ndarray:
    """Each row's overhang (0 for files written before version 4)."""
    return rows["overhang"].astype(np.int64) if "overhang" in rows.dtype.names else np.zeros(len(rows), np.int64)


def _rows_end(rows: np.ndarray) -> int:
    """One past the last position row the committed rows use, overhangs included."""
    return int((rows["start"] + rows["length"] + _overhang(rows)).max()) if len(rows) else 0


@dataclass(frozen=True)
class PromptRecord:
    question_id: int  # id in the prompt source (Spec-Bench question_id, or line number)
    category: str  # prompt category ("" when the source has none)
    text: str  # the user turn as given
    token_ids: np.ndarray  # (n,) int32 chat-templated prompt ids the target saw


@dataclass(frozen=True)
class CacheSpec:
    vocab_size: int  # logits width (may exceed the tokenizer's length)
    drafts: tuple[str, ...]  # draft column names, e.g. ("int8", "layers:20")
    temperatures: tuple[float, ...]  # sampling temperatures; 0.0 = greedy
    storage: str = "full"  # "full" logits, "topk" (top-K + log-sum-exp of the rest) or "stats" (statistics only)
    top_k: int = 0  # K when storage == "topk"
    meta: Mapping = field(default_factory=dict)  # JSON-able run metadata; meta["settings"] checked on resume
    stats: StatsSpec | None = field(default_factory=StatsSpec)  # statistics recorded per position (None: a
    #                                                             version-1/2 file, rank/logprob/top_ids at most)
    depths: Mapping[str, int] = field(default_factory=dict)  # depth-keyed draft columns (head drafts) -> depths D
    hidden: tuple[str, ...] = ()  # target hidden states stored per position ("last", or decoder layer numbers)
    hidden_size: int = 0  # their width

    def __post_init__(self) -> None:
        if self.storage not in STORAGES:
            raise CacheError(f"storage must be one of {', '.join(STORAGES)}, got {self.storage!r}")
        if self.storage == "stats" and self.stats is None:
            raise CacheError("stats storage needs a StatsSpec: it keeps nothing else")
        if self.storage == "topk" and not 0 < self.top_k < self.vocab_size:
            raise CacheError(f"top_k must be in 1..{self.vocab_size - 1} for topk storage, got {self.top_k}")
        if TARGET in self.drafts:
            raise CacheError(f"a draft cannot be named {TARGET!r}")
        if len(set(self.drafts)) != len(self.drafts):
            raise CacheError(f"duplicate draft names in {list(self.drafts)}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise CacheError(f"temperatures must be a non-empty list of values >= 0, got {list(self.temperatures)}")
        for c, d in self.depths.items():
            if c not in self.drafts or not isinstance(d, int) or d < 1:
                raise CacheError(f"depth-keyed column {c!r}: must be a draft with a depth >= 1, got {d!r}")
        if self.hidden and self.hidden_size < 1:
            raise CacheError("hidden states need their width (hidden_size)")

    def stat_shapes(self, column: str) -> dict:
        """A column's statistics: name -> (dtype, trailing shape); a head draft's lead with its depth axis."""
        if column == TARGET:
            return TARGET_STAT_SHAPES
        if column in self.depths:
            D = self.depths[column]
            return {name: (dtype, (D, *tail)) for name, (dtype, tail) in draft_stat_shapes(self.stats).items()
                    if name not in recorder_only(self.stats)}
        return draft_stat_shapes(self.stats)

    def keeps_logits(self, column: str) -> bool:
        """Whether the storage keeps this column's logits (never a head draft's: it has one law per depth)."""
        return self.storage != "stats" and column not in self.depths

    @property
    def columns(self) -> tuple[str, ...]:
        return (TARGET, *self.drafts)


@dataclass(frozen=True)
class TrajectoryRow:
    traj_index: int  # row in /trajectories
    prompt_index: int  # row in /prompts
    temperature: float  # 0.0 = greedy
    seed: int  # seed of the target's sampler for this trajectory
    start: int  # first position (row of /positions)
    length: int  # generated tokens
    stop_reason: str  # "max_new_tokens" | "eos"
    overhang: int = 0  # positions recorded past the end (rows stop .. end): what an engine verifying drafts
    #                    past max_new_tokens or EOS sees there (the target went on decoding)

    @property
    def stop(self) -> int:
        return self.start + self.length

    @property
    def end(self) -> int:
        """One past the trajectory's last position row, its overhang included."""
        return self.start + self.length + self.overhang


def dataset_names(spec: CacheSpec) -> list[str]:
    """Every per-position dataset of a layout, in the order a row's digest covers them."""
    names = ["positions/token"]
    for c in spec.columns:
        g = f"columns/{_group_name(c)}"
        if c == TARGET:
            names += [f"{g}/hidden/{layer}" for layer in spec.hidden]
        if spec.keeps_logits(c):
            names += {"full": [f"{g}/logits"], "topk": [f"{g}/topk_ids", f"{g}/topk_logits", f"{g}/tail_lse"],
                      "stats": []}[spec.storage]
        names += [f"{g}/stats/{name}" for name in spec.stat_shapes(c)]
    return names


def row_digest(previous: bytes, prompt_index: int, n: int, temperature: float, overhang: int, version: int,
               arrays) -> bytes:
    """A committed row's chained digest (version >= 3) from the previous row's and its arrays, in
    `dataset_names` order: what `_commit` writes and `CacheReader.verify` recomputes."""
    digest = hashlib.blake2b(previous, digest_size=16)
    head = [prompt_index, n, overhang] if version >= 4 else [prompt_index, n]
    digest.update(np.array(head, dtype=np.int64).tobytes() + np.float32(temperature).tobytes())
    for values in arrays:
        digest.update(values.tobytes())
    return digest.digest()


HEADER_DIGEST = "header_sha256"  # the file's attributes (format, spec, run metadata) as written


def header_digest(attrs: Mapping) -> str:
    """sha256 of a cache's header attributes, every one but this digest, in name order: a byte changed in the run
    metadata or the spec is found by `CacheReader.verify`."""
    h = hashlib.sha256()
    for name in sorted(k for k in attrs.keys() if k != HEADER_DIGEST):
        value = attrs[name]
        h.update(name.encode() + b"\0" + (value.encode() if isinstance(value, str) else np.asarray(value).tobytes())
                 + b"\0")
    return h.hexdigest()


def prompts_digest(prompts: Sequence[PromptRecord]) -> str:
    """sha256 of every stored prompt field (ids, categories, texts, token ids), kept in the header (version 4)."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([int(p.question_id), p.category, p.text], ensure_ascii=False).encode())
        h.update(np.asarray(p.token_ids, dtype=np.int32).tobytes())
    return h.hexdigest()


def _group_name(column: str) -> str:
    # HDF5 names cannot contain '/'; keep everything else readable ("layers:20").
    return column.replace("/", "|")


def _same_temperature(a: float, b: float) -> bool:
    return abs(float(a) - float(b)) < 1e-6


def _why(exc: BaseException) -> str:
    """One short reason from HDF5's multi-line error text."""
    text = " ".join(str(exc).split())
    for needle, reason in (("file signature not found", "not an HDF5 file"), ("truncated", "truncated"),
                           ("Is a directory", "a directory"), ("Permission denied", "permission denied")):
        if needle in text:
            return reason
    return text[:120] + ("..." if len(text) > 120 else "")


def _open_h5(path: Path, mode: str) -> h5py.File:
    if not str(path).strip() or str(path) == ".":
        raise CacheError("no cache file given (an empty path)")
    if path.is_dir():
        raise CacheError(f"{path} is a directory, not a cache file")
    try:
        if mode == "r":
            try:  # a plain open checks the file's length; SWMR reads skip that check and
                return h5py.File(path, "r")  # retry forever on truncated metadata
            except OSError as exc:
                if "truncated" in str(exc):
                    raise CacheError(
                        f"{path}: truncated cache ({path.stat().st_size:,} bytes on disk, HDF5 says: {exc}); "
                        "copy it again or re-record it (specsim cache ... --resume keeps what a readable file holds)"
                    ) from None
                if not path.exists():
                    raise
            # open for writing by a recorder, or left by a killed one: read it the SWMR way
            return h5py.File(path, "r", libver="latest", swmr=True)
        return h5py.File(path, mode, libver="latest")
    except FileNotFoundError:
        raise CacheError(f"{path}: no such file") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: h5py on a garbled superblock
        raise CacheError(f"{path}: cannot open as a cache ({_why(exc)}); is it a specsim cache, complete and "
                         "not corrupted?") from None


def _read_spec(f: h5py.File, path: Path) -> CacheSpec:
    if f.attrs.get("format") != FORMAT:
        raise CacheError(f"{path}: not a specsim cache (no format={FORMAT!r} attribute)")
    version = int(f.attrs.get("format_version", -1))
    if version not in READS:
        raise CacheError(f"{path}: cache format version {version}, this specsim reads "
                         + ", ".join(map(str, READS)))
    try:
        return CacheSpec(
            vocab_size=int(f.attrs["vocab_size"]),
            drafts=tuple(json.loads(f.attrs["drafts"])),
            temperatures=tuple(float(t) for t in json.loads(f.attrs["temperatures"])),
            storage=str(f.attrs["storage"]),
            top_k=int(f.attrs["top_k"]),
            meta=json.loads(f.attrs["meta"]),
            stats=StatsSpec.from_json(f.attrs["statistics"]) if "statistics" in f.attrs else None,
            depths={str(c): int(d) for c, d in json.loads(f.attrs.get("draft_depths", "{}")).items()},
            hidden=tuple(json.loads(f.attrs.get("hidden_states", "[]"))),
            hidden_size=int(f.attrs.get("hidden_size", 0)),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise CacheError(f"{path}: corrupt cache header ({exc})") from None


def _read_prompts(f: h5py.File) -> list[PromptRecord]:
    g = f["prompts"]
    return [
        PromptRecord(int(qid), cat.decode() if isinstance(cat, bytes) else str(cat),
                     text.decode() if isinstance(text, bytes) else str(text), np.asarray(ids, dtype=np.int32))
        for qid, cat, text, ids in zip(g["question_id"][()], g["category"][()], g["text"][()], g["token_ids"][()])
    ]


def _committed_rows(f: h5py.File) -> np.ndarray:
    ds = f["trajectories"]
    if f.swmr_mode and f.mode == "r":
        ds.refresh()
    rows = ds[()]
    return rows[rows["length"] > 0]


def _expected_positions(spec: CacheSpec, prompts: Sequence[PromptRecord]) -> int:
    """Positions the recording will hold at most (prompts x temperatures x max_new_tokens); 0 when the
    settings do not say. Only sizes the statistics' chunks."""
    limit = RunMeta.parse(spec.meta).max_new_tokens or 0
    return len(prompts) * len(spec.temperatures) * limit


class CacheWriter:
    """Appends trajectories to a cache file, one committed trajectory at a time."""

    def __init__(self, path: Path, f: h5py.File, spec: CacheSpec, prompts: list[PromptRecord]) -> None:
        self.path = path
        self._f = f
        self.spec = spec
        self.prompts = prompts
        rows = _committed_rows(f)
        self._n_rows = len(rows)
        self._n_positions = _rows_end(rows)
        self._done = {(int(r["prompt_index"]), float(r["temperature"])) for r in rows}
        self._last_digest = bytes(rows["digest"][-1]) if len(rows) and "digest" in rows.dtype.names else b""
        self._datasets = {name: f[name] for name in [*self.dataset_names(), "trajectories"]}  # looked up once

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def create(cls, path, spec: CacheSpec, prompts: Sequence[PromptRecord], *, overwrite: bool = False) -> "CacheWriter":
        path = Path(path)
        if path.exists() and not overwrite:
            raise CacheError(f"{path} exists; pass --resume to continue it or --overwrite to replace it")
        if not prompts:
            raise CacheError("no prompts to record")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".creating")
            f = h5py.File(tmp, "w", libver="latest")
        except OSError as exc:
            raise CacheError(f"{path}: cannot write here ({exc.strerror or exc})") from None
        cls._layout(f, spec, prompts)
        f.flush()
        f.close()
        # reopened for appending in SWMR mode before it appears under its name: a reader that opens it at once
        # (`inspect` while recording) then reads beside the writer instead of holding the lock the writer's
        # reopening needs ("unable to lock file")
        f = h5py.File(tmp, "r+", libver="latest")
        f.swmr_mode = True
        os.replace(tmp, path)
        return cls(path, f, spec, list(prompts))

    @classmethod
    def resume(cls, path) -> "CacheWriter":
        """Reopen a cache to append to it, keeping every committed trajectory."""
        path = Path(path)
        if not path.exists():
            raise CacheError(f"{path}: no such file to resume")
        with _open_h5(path, "r") as f:  # SWMR read works on a crashed file too
            spec = _read_spec(f, path)
            version = int(f.attrs.get("format_version", -1))
            if version != FORMAT_VERSION:
                raise CacheError(f"{path}: written in cache format {version}; --resume continues format "
                                 f"{FORMAT_VERSION} files only: record a new file")
            prompts = _read_prompts(f)
            rows = _committed_rows(f)
        # Rebuild into a fresh file: a crashed SWMR writer leaves flags that forbid r+,
        # and positions past the last committed row are garbage to drop anyway.
        tmp = path.with_name(path.name + ".resuming")
        with h5py.File(tmp, "w", libver="latest") as out:
            cls._layout(out, spec, prompts)
            with _open_h5(path, "r") as src:
                n = _rows_end(rows)
                cls._copy_positions(src, out, spec, n)
                out["trajectories"].resize((len(rows),))
                out["trajectories"][:] = rows
        os.replace(tmp, path)
        f = h5py.File(path, "r+", libver="latest")
        f.swmr_mode = True
        return cls(path, f, spec, prompts)

    @staticmethod
    def _layout(f: h5py.File, spec: CacheSpec, prompts: Sequence[PromptRecord]) -> None:
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["vocab_size"] = spec.vocab_size
        f.attrs["storage"] = spec.storage
        f.attrs["top_k"] = spec.top_k
        f.attrs["drafts"] = json.dumps(list(spec.drafts))
        f.attrs["temperatures"] = json.dumps([float(t) for t in spec.temperatures])
        f.attrs["meta"] = json.dumps(dict(spec.meta), default=str)
        if spec.stats is None:
            raise CacheError("a new cache needs a StatsSpec (version-1/2 layouts are read, not written)")
        f.attrs["statistics"] = spec.stats.to_json()
        if spec.depths:
            f.attrs["draft_depths"] = json.dumps(dict(spec.depths))
        if spec.hidden:
            f.attrs["hidden_states"] = json.dumps(list(spec.hidden))
            f.attrs["hidden_size"] = spec.hidden_size
        g = f.create_group("prompts")
        g["question_id"] = np.array([p.question_id for p in prompts], dtype=np.int64)
        g["category"] = np.array([p.category for p in prompts], dtype=h5py.string_dtype())
        g["text"] = np.array([p.text for p in prompts], dtype=h5py.string_dtype())
        ids = g.create_dataset("token_ids", (len(prompts),), dtype=h5py.vlen_dtype(np.int32))
        for i, p in enumerate(prompts):
            ids[i] = np.asarray(p.token_ids, dtype=np.int32)
        f.attrs["prompts_sha256"] = prompts_digest(prompts)
        f.attrs[HEADER_DIGEST] = header_digest(f.attrs)
        fill = np.zeros((), dtype=_TRAJ_DTYPE)
        f.create_dataset("trajectories", (0,), maxshape=(None,), dtype=_TRAJ_DTYPE, chunks=(256,), fillvalue=fill,
                         fletcher32=True)
        pos = f.create_group("positions")
        pos.create_dataset("token", (0,), maxshape=(None,), dtype=np.int32, chunks=(1024,), fletcher32=True)
        cols = f.create_group("columns")
        V, K = spec.vocab_size, spec.top_k
        expected = _expected_positions(spec, prompts)
        for c in spec.columns:
            g = cols.create_group(_group_name(c))
            g.attrs["name"] = c
            st = g.create_group("stats")
            for name, (dtype, tail) in spec.stat_shapes(c).items():
                row = dtype.itemsize * int(np.prod(tail, dtype=np.int64))
                size = min(max(expected * row // STATS_CHUNKS, STATS_CHUNK_BYTES[0]), STATS_CHUNK_BYTES[1])
                rows = max(64, size // row)
                st.create_dataset(name, (0, *tail), maxshape=(None, *tail), dtype=dtype, chunks=(rows, *tail),
                                  fletcher32=True)
            if c == TARGET and spec.hidden:
                hid = g.create_group("hidden")
                for layer in spec.hidden:
                    hid.create_dataset(layer, (0, spec.hidden_size), maxshape=(None, spec.hidden_size),
                                       dtype=np.float16, chunks=(ROW_CHUNK, spec.hidden_size), fletcher32=True)
            if not spec.keeps_logits(c):
                continue
            if spec.storage == "full":
                g.create_dataset("logits", (0, V), maxshape=(None, V), dtype=np.float16, chunks=(ROW_CHUNK, V),
                                 fletcher32=True)
            elif spec.storage == "topk":
                g.create_dataset("topk_ids", (0, K), maxshape=(None, K), dtype=np.int32, chunks=(256, K),
                                 fletcher32=True)
                g.create_dataset("topk_logits", (0, K), maxshape=(None, K), dtype=np.float16, chunks=(256, K),
                                 fletcher32=True)
                g.create_dataset("tail_lse", (0,), maxshape=(None,), dtype=np.float32, chunks=(1024,),
                                 fletcher32=True)

    @staticmethod
    def _copy_positions(src: h5py.File, out: h5py.File, spec: CacheSpec, n: int) -> None:
        """Copy the first n positions of every per-position dataset (what the layout created)."""
        names: list[str] = []
        out.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset)
                       and (name.startswith("positions/") or name.startswith("columns/")) else None)
        for name in names:
            if name not in src:  # a version-1/2 file lacks the newer statistics
                raise CacheError(f"cannot resume a cache written by an older specsim ({name} missing); "
                                 "record a new file")
            s, d = src[name], out[name]
            d.resize((n, *d.shape[1:]))
            step = 1024
            for i in range(0, n, step):
                d[i : i + step] = s[i : min(i + step, n)]

    # -- state ---------------------------------------------------------------------------------
    def done(self) -> set[tuple[int, float]]:
        return set(self._done)

    def is_done(self, prompt_index: int, temperature: float) -> bool:
        return any(p == prompt_index and _same_temperature(t, temperature) for p, t in self._done)

    @property
    def n_positions(self) -> int:
        return self._n_positions

    # -- writing ---------------------------------------------------------------------------------
    def append_trajectory(
        self,
        *,
        prompt_index: int,
        temperature: float,
        seed: int,
        tokens: np.ndarray,
        stop_reason: str,
        target_logits: np.ndarray | None = None,
        draft_logits: Mapping[str, np.ndarray] | None = None,
        stats: Mapping[str, Mapping[str, np.ndarray]] | None = None,
        hidden: Mapping[str, np.ndarray] | None = None,
        overhang: int = 0,
    ) -> None:
        """Write one trajectory's positions, then commit it by appending its row.

        overhang: the last `overhang` of the given positions lie past the trajectory's end (the
        target decoding on after max_new_tokens or EOS); every array covers them too, and the
        trajectory's length is len(tokens) - overhang.

        stats: column -> statistic -> (n, ...) array, as the recorder computes them on its device
        (`specsim.record.statistics`); without it they are computed here from the logits with
        the numpy reference (`specsim.cache.stats`). Logits are required unless the storage is
        "stats" and every statistic is given. A head draft (depth-keyed column) has no logits to
        pass: its statistics are always given. hidden: layer -> (n, H), when the cache stores them.
        """
        tokens = np.asarray(tokens, dtype=np.int32)
        n = len(tokens)
        if not 0 <= int(overhang) < max(n, 1) or int(overhang) > np.iinfo(np.int16).max:
            raise CacheError(f"overhang {overhang} must be in 0..{max(n - 1, 0)} (positions past the end of {n})")
        if n - int(overhang) <= 0:
            raise CacheError("a trajectory needs at least one generated token")
        if not 0 <= prompt_index < len(self.prompts):
            raise CacheError(f"prompt_index {prompt_index} out of range 0..{len(self.prompts) - 1}")
        if not any(_same_temperature(temperature, t) for t in self.spec.temperatures):
            raise CacheError(f"temperature {temperature} is not one of the cache's {list(self.spec.temperatures)}")
        if stop_reason not in STOP_REASONS:
            raise CacheError(f"stop_reason must be one of {STOP_REASONS}, got {stop_reason!r}")
        columns = None
        if target_logits is not None or draft_logits is not None:
            draft_logits = dict(draft_logits or {})
            plain = [d for d in self.spec.drafts if d not in self.spec.depths]
            if set(draft_logits) != set(plain):
                raise CacheError(f"draft logits given for {sorted(draft_logits)}, the cache records them for "
                                 f"{plain}")
            columns = {TARGET: target_logits, **draft_logits}
            for c, x in columns.items():
                if np.shape(x) != (n, self.spec.vocab_size):
                    raise CacheError(f"{c} logits have shape {np.shape(x)}, expected ({n}, {self.spec.vocab_size})")
            columns = {c: np.asarray(x, dtype=np.float32) for c, x in columns.items()}
        elif self.spec.storage != "stats":
            raise CacheError(f"{self.spec.storage} storage keeps the logits: pass target_logits and draft_logits")
        stats = dict(stats or {})
        recorder_names = recorder_only(self.spec.stats)
        for c in self.spec.columns:
            shapes = self.spec.stat_shapes(c)
            given = dict(stats.get(c, {}))
            if any(name not in given for name in shapes if name not in recorder_names):
                if columns is None or c in self.spec.depths:
                    raise CacheError(f"no statistics and no logits for column {c!r}")
                computed = (target_stats(columns[TARGET], tokens, temperature) if c == TARGET else
                            draft_stats(columns[TARGET], columns[c], tokens, temperature, self.spec.stats,
                                        np.random.default_rng([seed & (2**63 - 1), zlib.crc32(c.encode())])))
                given = {**computed, **given}  # what needs the models' own forwards comes from the recorder
            stats[c] = given
            missing = sorted(recorder_names - set(given)) if c != TARGET and c not in self.spec.depths else []
            if missing:
                raise CacheError(f"column {c!r}: the cache records {', '.join(missing)}, which need the models' own "
                                 "forwards (the recorder computes them): pass them")
            for name, (dtype, tail) in shapes.items():
                x = stats[c].get(name)
                if x is None or np.shape(x) != (n, *tail):
                    raise CacheError(f"statistic {c}/{name}: expected shape {(n, *tail)}, got "
                                     f"{None if x is None else np.shape(x)}")

        hidden = dict(hidden or {})
        if set(hidden) != set(self.spec.hidden):
            raise CacheError(f"hidden states given for {sorted(hidden)}, the cache stores {list(self.spec.hidden)}")
        arrays = {"positions/token": tokens}
        for c in self.spec.columns:
            g = f"columns/{_group_name(c)}"
            if c == TARGET:
                for layer in self.spec.hidden:
                    if np.shape(hidden[layer]) != (n, self.spec.hidden_size):
                        raise CacheError(f"hidden states {layer}: expected shape {(n, self.spec.hidden_size)}, got "
                                         f"{np.shape(hidden[layer])}")
                    arrays[f"{g}/hidden/{layer}"] = np.asarray(hidden[layer], dtype=np.float16)
            if columns is not None and self.spec.keeps_logits(c) and self.spec.storage == "full":
                arrays[f"{g}/logits"] = columns[c].astype(np.float16)
            elif columns is not None and self.spec.keeps_logits(c):  # topk
                ids, top, tail = topk_compress(columns[c], self.spec.top_k)
                arrays.update({f"{g}/topk_ids": ids, f"{g}/topk_logits": top.astype(np.float16), f"{g}/tail_lse": tail})
            for name, (dtype, _) in self.spec.stat_shapes(c).items():
                arrays[f"{g}/stats/{name}"] = np.ascontiguousarray(stats[c][name], dtype=dtype)
        self._commit(prompt_index, temperature, seed, stop_reason, n - int(overhang), arrays, overhang=int(overhang))

    def dataset_names(self) -> list[str]:
        """Every per-position dataset, in the order a row's digest covers them."""
        return dataset_names(self.spec)

    def append_copy(self, reader: "CacheReader", row: "TrajectoryRow") -> None:
        """Append a committed trajectory of another cache with the same layout, byte for byte (`specsim merge`)."""
        arrays = {name: reader._read(reader._f[name], row.start, row.end, name) for name in self.dataset_names()}
        self._commit(row.prompt_index, row.temperature, row.seed, row.stop_reason, row.length, arrays,
                     overhang=row.overhang)

    def _commit(self, prompt_index: int, temperature: float, seed: int, stop_reason: str, n: int,
                arrays: Mapping[str, np.ndarray], *, overhang: int = 0) -> None:
        """Write every per-position dataset (n + overhang rows), flush, then append the row that makes them visible."""
        names = self.dataset_names()
        if list(arrays) != names:
            raise CacheError(f"datasets {sorted(set(names) ^ set(arrays))} missing or unexpected for this layout")
        f, start, stop = self._f, self._n_positions, self._n_positions + n + overhang
        written = []
        for name in names:
            ds = self._datasets[name]
            values = np.ascontiguousarray(arrays[name], dtype=ds.dtype)
            ds.resize((stop, *ds.shape[1:]))
            ds[start:stop] = values
            written.append(values)
        digest = row_digest(self._last_digest, prompt_index, n, temperature, overhang, FORMAT_VERSION, written)
        f.flush()  # positions reach the file before the row that makes them visible

        rows = self._datasets["trajectories"]
        rows.resize((self._n_rows + 1,))
        row = np.zeros((), dtype=_TRAJ_DTYPE)
        row["prompt_index"], row["temperature"], row["seed"] = prompt_index, temperature, seed
        row["start"], row["length"], row["stop_reason"] = start, n, STOP_REASONS.index(stop_reason)
        row["digest"], row["overhang"] = digest, overhang
        rows[self._n_rows] = row
        f.flush()
        self._n_rows += 1
        self._n_positions = stop
        self._last_digest = digest
        self._done.add((prompt_index, float(np.float32(temperature))))

    def close(self) -> None:
        if self._f.id.valid:
            self._f.close()

    def __enter__(self) -> "CacheWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class Verification:
    """What `CacheReader.verify` read and found."""

    rows: int  # committed trajectories
    positions: int  # position rows read (overhangs included)
    datasets: int  # per-position datasets read for each
    digests: bool  # rows carry content digests (format 3+) and were recomputed
    prompts_checked: bool  # the prompts were checked against their recorded sha256 (format 4)
    header_checked: bool  # the header attributes were checked against their recorded sha256 (files written since)
    damaged: tuple[str, ...]  # one line per damaged chunk, row or table

    @property
    def ok(self) -> bool:
        return not self.damaged


def topk_compress(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k ids (sorted by logit, descending), their logits, and log-sum-exp of the rest."""
    ids = np.argpartition(-logits, k - 1, axis=1)[:, :k]  # (n, k)
    top = np.take_along_axis(logits, ids, axis=1)
    order = np.argsort(-top, axis=1, kind="stable")
    ids, top = np.take_along_axis(ids, order, axis=1), np.take_along_axis(top, order, axis=1)
    rest = logits.copy()
    np.put_along_axis(rest, ids, -np.inf, axis=1)
    m = rest.max(axis=1, keepdims=True)
    tail = (m[:, 0] + np.log(np.exp(rest - m).sum(axis=1))).astype(np.float32)
    return ids.astype(np.int32), top, tail


def recorder_only(stats) -> set[str]:
    """The draft statistics only the recorder can compute (the models' forwards off the trajectory), never the
    stored logits: the EAGLE-2 expansion and the target along the draft's proposals. Model drafts only."""
    return set(expansion_shapes(stats)) | set(proposal_shapes(stats))


def topk_expand(ids: np.ndarray, top: np.ndarray, tail: np.ndarray, vocab_size: int) -> np.ndarray:
    """Dense logits from top-k storage, the tail's mass spread evenly over the other entries."""
    n, k = ids.shape
    fill = tail - np.log(vocab_size - k)  # (n,)
    dense = np.repeat(fill[:, None], vocab_size, axis=1).astype(np.float32)
    np.put_along_axis(dense, ids.astype(np.int64), top.astype(np.float32), axis=1)
    return dense


class CacheReader:
    """Read-only view of a cache; safe to open while a recording is running (SWMR)."""

    def __init__(self, path, *, probe: bool = True) -> None:
        """probe: read the last committed row of every dataset at once, so that a truncated or damaged file
        fails here, not halfway through a simulation (`verify` opens without it and reads everything)."""
        self.path = Path(path)
        self._f = _open_h5(self.path, "r")
        try:
            # A SWMR read of a truncated file sees missing chunks as zeros instead of failing.
            # (a live SWMR writer never leaves the file shorter than its end of allocation).
            allocated, actual = self._f.id.get_filesize(), self.path.stat().st_size
            if actual < allocated:
                raise CacheError(
                    f"{self.path}: truncated cache ({actual:,} of {allocated:,} bytes); copy it again or "
                    "re-record it (specsim cache ... --resume keeps what a readable file holds)"
                )
            self.spec = _read_spec(self._f, self.path)
            self.meta: dict = dict(self.spec.meta)  # the JSON as stored (merge and resume copy it whole)
            self.run = RunMeta.parse(self.meta)  # the same, read once into fields
            rows = _committed_rows(self._f)
            if probe:
                self._probe(rows)
        except CacheError:
            self._f.close()
            raise
        except (KeyError, OSError, ValueError) as exc:
            self._f.close()
            raise CacheError(f"{self.path}: corrupt or truncated cache ({exc})") from None
        self._rows = rows
        self.n_positions = _rows_end(rows)  # position rows in use (overhangs included)
        self.n_trajectory_positions = int(rows["length"].sum())  # generated positions of committed trajectories

    # The prompts table is decoded on first use: opening a cache to read statistics (a sweep does,
    # block by block) then costs no pass over every prompt's text and token ids.
    @cached_property
    def _prompts(self) -> list[PromptRecord]:
        try:
            return _read_prompts(self._f)
        except (KeyError, OSError, ValueError) as exc:
            raise CacheError(f"{self.path}: corrupt or truncated cache ({exc})") from None

    @cached_property
    def prompts(self) -> pl.DataFrame:
        import polars as pl  # the tables alone need polars: recording and training run without it

        prompts = self._prompts
        return pl.DataFrame(
            {
                "prompt_index": np.arange(len(prompts), dtype=np.int32),
                "question_id": [p.question_id for p in prompts],
                "category": [p.category for p in prompts],
                "text": [p.text for p in prompts],
                "n_prompt_tokens": [len(p.token_ids) for p in prompts],
            }
        )

    @cached_property
    def trajectories(self) -> pl.DataFrame:
        import polars as pl

        rows, prompts = self._rows, self._prompts
        categories = [prompts[int(i)].category for i in rows["prompt_index"]]
        return pl.DataFrame(
            {
                "traj_index": np.arange(len(rows), dtype=np.int32),
                "prompt_index": rows["prompt_index"].astype(np.int32),
                "category": categories,
                "temperature": rows["temperature"].astype(np.float64).round(6),
                "seed": rows["seed"].astype(np.int64),
                "start": rows["start"].astype(np.int64),
                "length": rows["length"].astype(np.int32),
                "stop_reason": [STOP_REASONS[int(s)] for s in rows["stop_reason"]],
                "overhang": _overhang(rows).astype(np.int32),
            },
            schema_overrides={"category": pl.String, "stop_reason": pl.String},
        )

    def _probe(self, rows: np.ndarray) -> None:
        # SWMR readers skip HDF5's end-of-file check, so read the last committed row of
        # every dataset: a truncated file fails here, not halfway through a simulation.
        n = _rows_end(rows)
        if n == 0:
            return
        for c in self.spec.columns:
            g = self._f["columns"][_group_name(c)]
            datasets = [ds for ds in g.values() if isinstance(ds, h5py.Dataset)]
            datasets += [ds for ds in g["stats"].values()] if "stats" in g else []
            for ds in datasets:
                if ds.shape[0] < n:
                    raise CacheError(f"{self.path}: column {c!r} has {ds.shape[0]} positions, trajectories need {n}")
                try:
                    ds[n - 1]
                except OSError as exc:
                    raise CacheError(f"{self.path}: damaged data in {ds.name.lstrip('/')} ({_why(exc)}); "
                                     f"`specsim inspect {self.path} --verify` lists every damaged part") from None
        try:
            self._f["positions/token"][n - 1]
        except OSError as exc:
            raise CacheError(f"{self.path}: damaged data in positions/token ({_why(exc)}); `specsim inspect "
                             f"{self.path} --verify` lists every damaged part") from None

    # -- metadata ------------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size

    @property
    def n_trajectories(self) -> int:
        """Committed trajectories (what `trajectories.height` counts, without building the table)."""
        return len(self._rows)

    def prompt_token_ids(self, prompt_index: int) -> np.ndarray:
        return self._prompts[prompt_index].token_ids

    def prompt_question_id(self, prompt_index: int) -> int:
        return int(self._prompts[prompt_index].question_id)

    def iter_trajectories(self, temperature: float | None = None) -> Iterator[TrajectoryRow]:
        overhang = _overhang(self._rows)
        for i, r in enumerate(self._rows):
            if temperature is not None and not _same_temperature(r["temperature"], temperature):
                continue
            yield TrajectoryRow(
                traj_index=i,
                prompt_index=int(r["prompt_index"]),
                temperature=round(float(r["temperature"]), 6),
                seed=int(r["seed"]),
                start=int(r["start"]),
                length=int(r["length"]),
                stop_reason=STOP_REASONS[int(r["stop_reason"])],
                overhang=int(overhang[i]),
            )

    def check_temperature(self, temperature: float) -> float:
        """The recorded temperature equal to `temperature`, or a CacheError listing the recorded ones."""
        for t in self.spec.temperatures:
            if _same_temperature(t, temperature):
                return t
        raise CacheError(
            f"{self.path}: temperature {temperature:g} was not recorded; recorded: "
            + ", ".join(f"{t:g}" for t in self.spec.temperatures)
        )

    def check_column(self, column: str) -> str:
        if column not in self.spec.columns:
            raise CacheError(f"{self.path}: no draft named {column!r}; recorded drafts: {', '.join(self.spec.drafts)}")
        return column

    # -- data ------------------------------------------------------------------------------------
    def _check_range(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.n_positions:
            raise CacheError(f"positions {start}:{stop} outside the committed 0:{self.n_positions}")

    def tokens(self, start: int, stop: int) -> np.ndarray:
        self._check_range(start, stop)
        return self._read(self._f["positions/token"], start, stop, "tokens").astype(np.int32)

    def _read(self, dataset: h5py.Dataset, start: int, stop: int, what: str) -> np.ndarray:
        """dataset[start:stop]; a chunk whose checksum fails is a CacheError naming the trajectory."""
        try:
            return dataset[start:stop]
        except OSError as exc:
            ends = self._rows["start"] + self._rows["length"] + _overhang(self._rows)
            rows = self._rows[(self._rows["start"] < stop) & (ends > start)]
            where = ", ".join(f"prompt {int(r['prompt_index'])} at T={float(r['temperature']):g}" for r in rows[:3])
            raise CacheError(f"{self.path}: damaged data in {what} at positions {start}:{stop} ({where or 'no trajectory'}"
                             f"; {exc}); the file was changed after it was written: copy or record it again") from None

    def has_stats(self) -> bool:
        """Whether the file records float32 per-position statistics (format version 2 or later)."""
        return "stats" in self._f["columns"][_group_name(TARGET)]

    def has_stat(self, column: str, name: str) -> bool:
        """Whether `column` records the statistic `name` (version 3 adds π, swor groups and lossy α/TV)."""
        return name in self.stat_names(column)

    def stat_names(self, column: str) -> list[str]:
        """The statistics `column` records, sorted (none before format version 2)."""
        g = self._f["columns"][_group_name(self.check_column(column))]
        return sorted(g["stats"]) if "stats" in g else []

    @property
    def has_distributions(self) -> bool:
        """Whether the file keeps the models' distributions (full or top-k logits), not only statistics."""
        return self.spec.storage != "stats"

    def verify(self, on_rows: Callable[[int], None] = lambda n: None) -> "Verification":
        """Read every committed position of every dataset and the prompts, and recompute each row's digest.

        A chunk whose checksum fails, a row whose content no longer hashes to its digest (format 3+), or
        prompts that no longer match their recorded sha256 (format 4) is reported with the trajectory and
        dataset it belongs to; reading goes on past it. Each row is checked against its own predecessor's
        stored digest, so one damaged trajectory does not condemn the ones after it.
        """
        version = int(self._f.attrs.get("format_version", -1))
        names = dataset_names(self.spec)
        damaged: list[str] = []
        positions = 0
        chained = "digest" in self._rows.dtype.names
        previous = b""
        for row in self.iter_trajectories():
            where = f"prompt {row.prompt_index} at T={row.temperature:g} (trajectory {row.traj_index}, positions " \
                    f"{row.start}:{row.end})"
            values, broken = [], False
            for name in names:
                try:
                    values.append(np.ascontiguousarray(self._f[name][row.start : row.end], dtype=self._f[name].dtype))
                except (OSError, KeyError) as exc:
                    damaged.append(f"{name} of {where}: unreadable ({_why(exc)})")
                    broken = True
            stored = bytes(self._rows["digest"][row.traj_index]) if chained else b""
            if chained and not broken and version >= 3:
                got = row_digest(previous, row.prompt_index, row.length, row.temperature, row.overhang, version,
                                 values)
                if got != stored:
                    damaged.append(f"{where}: its data no longer hashes to the digest it was committed with")
            previous = stored
            positions += row.end - row.start
            on_rows(row.end - row.start)
        try:
            prompts = _read_prompts(self._f)
        except (OSError, KeyError, ValueError) as exc:
            damaged.append(f"prompts: unreadable ({_why(exc)})")
        else:
            want = self._f.attrs.get("prompts_sha256")
            if want is not None and prompts_digest(prompts) != want:
                damaged.append("prompts: their ids, categories, texts or token ids no longer match their sha256")
        header = self._f.attrs.get(HEADER_DIGEST)
        if header is not None and header_digest(self._f.attrs) != header:
            damaged.append("header: the file's attributes (format, drafts, temperatures, statistics or run metadata) "
                           "no longer match their sha256")
        return Verification(rows=len(self._rows), positions=positions, datasets=len(names), digests=chained,
                            prompts_checked=self._f.attrs.get("prompts_sha256") is not None,
                            header_checked=header is not None, damaged=tuple(damaged))

    @property
    def fingerprint(self) -> str | None:
        """Content fingerprint of the committed part: the last row's chained digest and the row count.

        None for files written before format 3 (they have no digests).
        """
        if not len(self._rows):
            return "empty"
        if "digest" not in self._rows.dtype.names:
            return None
        return f"{len(self._rows)}:{bytes(self._rows['digest'][-1]).hex()}"

    def stats(self, column: str, name: str, start: int, stop: int) -> np.ndarray:
        """A recorded statistic of `column` over positions [start, stop): logprob, rank or top_ids."""
        self._check_range(start, stop)
        ds = self._f["columns"][_group_name(self.check_column(column))]["stats"][name]
        return self._read(ds, start, stop, f"{column} {name}")

    def logits(self, column: str, start: int, stop: int) -> np.ndarray:
        """(stop - start, V) float32 logits of `column` ("target" or a draft name)."""
        self._check_range(start, stop)
        if self.spec.storage == "stats":
            raise CacheError(f"{self.path}: a stats-only cache (--store stats) keeps no distributions; "
                             "what needs them must be recorded with --store full")
        if column in self.spec.depths:
            raise CacheError(f"{self.path}: {column} is a head draft: the cache keeps its statistics per depth, "
                             "not one distribution per position")
        g = self._f["columns"][_group_name(self.check_column(column))]
        if self.spec.storage == "full":
            return self._read(g["logits"], start, stop, f"{column} logits").astype(np.float32)
        return topk_expand(*(self._read(g[name], start, stop, f"{column} {name}")
                             for name in ("topk_ids", "topk_logits", "tail_lse")), self.spec.vocab_size)

    def depth(self, column: str) -> int | None:
        """The depths a head draft's statistics are keyed by, or None for a draft with one law per position."""
        return self.spec.depths.get(self.check_column(column))

    def hidden(self, layer: str, start: int, stop: int) -> np.ndarray:
        """(stop - start, H) float16 target hidden states at positions [start, stop): row t is the state whose LM
        head output is p_t (`specsim cache --hidden-states`)."""
        self._check_range(start, stop)
        if layer not in self.spec.hidden:
            have = ", ".join(self.spec.hidden) or "none"
            raise CacheError(f"{self.path}: no hidden states {layer!r} (recorded: {have}); record with "
                             f"--hidden-states {layer}")
        return self._read(self._f["columns"][_group_name(TARGET)]["hidden"][layer], start, stop, f"hidden {layer}")

    def close(self) -> None:
        if self._f.id.valid:
            self._f.close()

    def __enter__(self) -> "CacheReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

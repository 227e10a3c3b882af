"""The HDF5 cache's layout: one file of target-sampled trajectories with full next-token logits.

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

The writer is `specsim.cache.writer.CacheWriter`, the reader `specsim.cache.reader.CacheReader`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import h5py
import numpy as np

from specsim.cache.meta import RunMeta
from specsim.cache.stats import (
    TARGET_STAT_SHAPES,
    StatsSpec,
    draft_stat_shapes,
    expansion_shapes,
    proposal_shapes,
)
from specsim.errors import CacheError

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
TRAJ_DTYPE = np.dtype(
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


def overhangs(rows: np.ndarray) -> np.ndarray:
    """Each row's overhang (0 for files written before version 4)."""
    return rows["overhang"].astype(np.int64) if "overhang" in rows.dtype.names else np.zeros(len(rows), np.int64)


def rows_end(rows: np.ndarray) -> int:
    """One past the last position row the committed rows use, overhangs included."""
    return int((rows["start"] + rows["length"] + overhangs(rows)).max()) if len(rows) else 0


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
        if column in self.depths:  # the expansion is per call start, as a model draft's: no depth axis
            D = self.depths[column]
            return {**{name: (dtype, (D, *tail)) for name, (dtype, tail) in draft_stat_shapes(self.stats).items()
                       if name not in recorder_only(self.stats)}, **expansion_shapes(self.stats)}
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
        g = f"columns/{group_name(c)}"
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


def group_name(column: str) -> str:
    # HDF5 names cannot contain '/'; keep everything else readable ("layers:20").
    return column.replace("/", "|")


def same_temperature(a: float, b: float) -> bool:
    return abs(float(a) - float(b)) < 1e-6


def describe_error(exc: BaseException) -> str:
    """One short reason from HDF5's multi-line error text."""
    text = " ".join(str(exc).split())
    for needle, reason in (("file signature not found", "not an HDF5 file"), ("truncated", "truncated"),
                           ("Is a directory", "a directory"), ("Permission denied", "permission denied")):
        if needle in text:
            return reason
    return text[:120] + ("..." if len(text) > 120 else "")


def open_h5(path: Path, mode: str) -> h5py.File:
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
        raise CacheError(f"{path}: cannot open as a cache ({describe_error(exc)}); is it a specsim cache, complete and "
                         "not corrupted?") from None


def read_spec(f: h5py.File, path: Path) -> CacheSpec:
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


def read_prompts(f: h5py.File) -> list[PromptRecord]:
    g = f["prompts"]
    return [
        PromptRecord(int(qid), cat.decode() if isinstance(cat, bytes) else str(cat),
                     text.decode() if isinstance(text, bytes) else str(text), np.asarray(ids, dtype=np.int32))
        for qid, cat, text, ids in zip(g["question_id"][()], g["category"][()], g["text"][()], g["token_ids"][()])
    ]


def committed_rows(f: h5py.File, *, past_checksums: bool = False) -> np.ndarray:
    """The rows with length > 0. past_checksums: read the table's chunks without their checksums
    (`read_past_checksums`), for a reader that then checks each row against its digest."""
    ds = f["trajectories"]
    if f.swmr_mode and f.mode == "r":
        ds.refresh()
    rows = read_past_checksums(ds, 0, ds.shape[0]) if past_checksums else ds[()]
    return rows[rows["length"] > 0]


def read_past_checksums(ds: h5py.Dataset, start: int, stop: int) -> np.ndarray:
    """ds[start:stop] decoded from its chunks' raw bytes, fletcher32 checksums not checked.

    Why: the writer appends a trajectory by rewriting the last chunk of every dataset, which holds committed
    positions beside the new ones. A kill -9 can cut that write short between two pages (Linux stops a write at a
    page boundary when a fatal signal is pending), leaving the chunk's committed bytes as they were, new bytes
    after them and the old checksum at its end: HDF5 then refuses the whole chunk, committed positions included.
    Raw, the committed part is intact. Nothing read this way is trusted until the rows it holds hash to their
    digests (`CacheReader`). Every cache dataset is chunked along its first axis only and filtered by fletcher32
    alone, which stores a chunk as its bytes followed by a 4-byte checksum."""
    if ds.chunks is None or tuple(ds.chunks[1:]) != tuple(ds.shape[1:]) or not ds.fletcher32 or ds.compression \
            or ds.shuffle or ds.scaleoffset is not None:
        raise CacheError(f"{ds.file.filename}: {ds.name.lstrip('/')} is not stored as specsim writes a cache")
    rows_per_chunk, width = ds.chunks[0], int(np.prod(ds.shape[1:], dtype=np.int64))
    size = rows_per_chunk * width * ds.dtype.itemsize
    out = np.empty((stop - start, *ds.shape[1:]), dtype=ds.dtype)
    for first in range(start - start % rows_per_chunk, stop, rows_per_chunk):
        try:
            _, raw = ds.id.read_direct_chunk((first,) + (0,) * (ds.ndim - 1))
        except (OSError, ValueError, KeyError) as exc:  # a chunk never written, or an index that points nowhere
            raise CacheError(f"{ds.file.filename}: {ds.name.lstrip('/')} has no readable chunk at position "
                             f"{first} ({describe_error(exc)})") from None
        if len(raw) not in (size, size + 4):
            raise CacheError(f"{ds.file.filename}: the chunk of {ds.name.lstrip('/')} at position {first} holds "
                             f"{len(raw):,} bytes, not {size:,} and a checksum")
        chunk = np.frombuffer(raw[:size], dtype=ds.dtype).reshape(ds.chunks)
        lo, hi = max(start, first), min(stop, first + rows_per_chunk)
        out[lo - start : hi - start] = chunk[lo - first : hi - first]
    return out


def expected_positions(spec: CacheSpec, prompts: Sequence[PromptRecord]) -> int:
    """Positions the recording will hold at most (prompts x temperatures x max_new_tokens); 0 when the
    settings do not say. Only sizes the statistics' chunks."""
    limit = RunMeta.parse(spec.meta).max_new_tokens or 0
    return len(prompts) * len(spec.temperatures) * limit


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
    stored logits: the EAGLE-2 expansion (model and head drafts) and the target along the draft's proposals (model
    drafts only)."""
    return set(expansion_shapes(stats)) | set(proposal_shapes(stats))


def topk_expand(ids: np.ndarray, top: np.ndarray, tail: np.ndarray, vocab_size: int) -> np.ndarray:
    """Dense logits from top-k storage, the tail's mass spread evenly over the other entries."""
    n, k = ids.shape
    fill = tail - np.log(vocab_size - k)  # (n,)
    dense = np.repeat(fill[:, None], vocab_size, axis=1).astype(np.float32)
    np.put_along_axis(dense, ids.astype(np.int64), top.astype(np.float32), axis=1)
    return dense

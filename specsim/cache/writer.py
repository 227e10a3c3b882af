"""Writing a cache: `CacheWriter` appends target-sampled trajectories, one committed trajectory at a time.

Crash safety: the writer runs in HDF5 SWMR mode and commits a trajectory by
writing its positions first, flushing, then appending its row to
/trajectories and flushing again. A reader (also SWMR, so `inspect` works
during a recording) trusts only positions covered by committed rows. After a
kill -9 the file is readable; `CacheWriter.resume` copies the committed part
into a fresh file (HDF5 refuses to reopen a crashed SWMR file for writing) and
carries on. A kill that cuts short the rewrite of a chunk holding committed
positions leaves it failing its checksum; the reader takes its raw bytes when the
rows it holds hash to their digests (docs/cache-format.md, "Commits, crashes").
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import h5py
import numpy as np

from specsim.cache.layout import (
    FORMAT,
    FORMAT_VERSION,
    HEADER_DIGEST,
    ROW_CHUNK,
    STATS_CHUNK_BYTES,
    STATS_CHUNKS,
    STOP_REASONS,
    TARGET,
    TRAJ_DTYPE,
    CacheSpec,
    PromptRecord,
    TrajectoryRow,
    committed_rows,
    dataset_names,
    expected_positions,
    group_name,
    header_digest,
    prompts_digest,
    recorder_only,
    row_digest,
    rows_end,
    same_temperature,
    topk_compress,
)
from specsim.cache.stats import draft_stats, target_stats
from specsim.errors import CacheError

if TYPE_CHECKING:  # append_copy's argument; the writer itself never reads a cache
    from specsim.cache.reader import CacheReader


class CacheWriter:
    """Appends trajectories to a cache file, one committed trajectory at a time."""

    def __init__(self, path: Path, f: h5py.File, spec: CacheSpec, prompts: list[PromptRecord]) -> None:
        self.path = path
        self._f = f
        self.spec = spec
        self.prompts = prompts
        rows = committed_rows(f)
        self._n_rows = len(rows)
        self._n_positions = rows_end(rows)
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
        from specsim.cache.reader import CacheReader

        # SWMR reads work on a crashed file too; the reader takes a chunk the crash cut short when the rows it
        # holds hash to their digests (`layout.read_past_checksums`)
        with CacheReader(path) as reader:
            spec = reader.spec
            version = reader._version
            if version != FORMAT_VERSION:
                raise CacheError(f"{path}: written in cache format {version}; --resume continues format "
                                 f"{FORMAT_VERSION} files only: record a new file")
            prompts = reader.prompt_records()
            rows = reader._rows
            # Rebuild into a fresh file: a crashed SWMR writer leaves flags that forbid r+,
            # and positions past the last committed row are garbage to drop anyway.
            tmp = path.with_name(path.name + ".resuming")
            with h5py.File(tmp, "w", libver="latest") as out:
                cls._layout(out, spec, prompts)
                cls._copy_positions(reader, out, rows_end(rows))
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
        fill = np.zeros((), dtype=TRAJ_DTYPE)
        f.create_dataset("trajectories", (0,), maxshape=(None,), dtype=TRAJ_DTYPE, chunks=(256,), fillvalue=fill,
                         fletcher32=True)
        pos = f.create_group("positions")
        pos.create_dataset("token", (0,), maxshape=(None,), dtype=np.int32, chunks=(1024,), fletcher32=True)
        cols = f.create_group("columns")
        V, K = spec.vocab_size, spec.top_k
        expected = expected_positions(spec, prompts)
        for c in spec.columns:
            g = cols.create_group(group_name(c))
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
    def _copy_positions(src: "CacheReader", out: h5py.File, n: int) -> None:
        """Copy the first n positions of every per-position dataset (what the layout created)."""
        names: list[str] = []
        out.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset)
                       and (name.startswith("positions/") or name.startswith("columns/")) else None)
        for name in names:
            if name not in src._f:  # a version-1/2 file lacks the newer statistics
                raise CacheError(f"cannot resume a cache written by an older specsim ({name} missing); "
                                 "record a new file")
            d = out[name]
            d.resize((n, *d.shape[1:]))
            step = 1024
            for i in range(0, n, step):
                d[i : i + step] = src._read(src._f[name], i, min(i + step, n), name)

    # -- state ---------------------------------------------------------------------------------
    def done(self) -> set[tuple[int, float]]:
        return set(self._done)

    def is_done(self, prompt_index: int, temperature: float) -> bool:
        return any(p == prompt_index and same_temperature(t, temperature) for p, t in self._done)

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
        if not any(same_temperature(temperature, t) for t in self.spec.temperatures):
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
            missing = sorted((recorder_names & set(shapes)) - set(given)) if c != TARGET else []
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
            g = f"columns/{group_name(c)}"
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
        row = np.zeros((), dtype=TRAJ_DTYPE)
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

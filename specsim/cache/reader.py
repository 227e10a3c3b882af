"""Reading a cache: `CacheReader`, a read-only view, safe to open while a recording runs (SWMR).

It trusts only the positions committed rows cover (`specsim.cache.writer`), checks every chunk and
digest when asked (`verify`), and expands top-k storage to dense logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import h5py
import numpy as np

from specsim.cache.layout import (
    HEADER_DIGEST,
    STOP_REASONS,
    TARGET,
    PromptRecord,
    TrajectoryRow,
    committed_rows,
    dataset_names,
    describe_error,
    group_name,
    header_digest,
    open_h5,
    overhangs,
    prompts_digest,
    read_past_checksums,
    read_prompts,
    read_spec,
    row_digest,
    rows_end,
    same_temperature,
    topk_expand,
)
from specsim.cache.meta import RunMeta
from specsim.errors import CacheError

if TYPE_CHECKING:
    import polars as pl


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


class CacheReader:
    """Read-only view of a cache; safe to open while a recording is running (SWMR)."""

    def __init__(self, path, *, probe: bool = True) -> None:
        """probe: read the last committed row of every dataset at once, so that a truncated or damaged file
        fails here, not halfway through a simulation (`verify` opens without it and reads everything)."""
        self.path = Path(path)
        self._f = open_h5(self.path, "r")
        try:
            # A SWMR read of a truncated file sees missing chunks as zeros instead of failing.
            # (a live SWMR writer never leaves the file shorter than its end of allocation).
            allocated, actual = self._f.id.get_filesize(), self.path.stat().st_size
            if actual < allocated:
                raise CacheError(
                    f"{self.path}: truncated cache ({actual:,} of {allocated:,} bytes); copy it again or "
                    "re-record it (specsim cache ... --resume keeps what a readable file holds)"
                )
            self.spec = read_spec(self._f, self.path)
            self.meta: dict = dict(self.spec.meta)  # the JSON as stored (merge and resume copy it whole)
            self.run = RunMeta.parse(self.meta)  # the same, read once into fields
            self._version = int(self._f.attrs.get("format_version", -1))
            self._intact: set[int] = set()  # rows read past a failed checksum and found to hash to their digests
            self.recovered: list[str] = []  # one line per chunk read past its checksum, its rows intact
            try:
                self._rows = committed_rows(self._f)
            except OSError as exc:
                if not self._f.swmr_mode:  # closed cleanly: no write was cut short, a failed checksum is damage
                    raise
                self._rows = self._rows_past_checksums(exc)
            if probe:
                self._probe(self._rows)
        except CacheError:
            self._f.close()
            raise
        except (KeyError, OSError, ValueError) as exc:
            self._f.close()
            raise CacheError(f"{self.path}: corrupt or truncated cache ({exc})") from None
        rows = self._rows
        self.n_positions = rows_end(rows)  # position rows in use (overhangs included)
        self.n_trajectory_positions = int(rows["length"].sum())  # generated positions of committed trajectories

    # The prompts table is decoded on first use: opening a cache to read statistics (a sweep does,
    # block by block) then costs no pass over every prompt's text and token ids.
    @cached_property
    def _prompts(self) -> list[PromptRecord]:
        try:
            return read_prompts(self._f)
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
                "overhang": overhangs(rows).astype(np.int32),
            },
            schema_overrides={"category": pl.String, "stop_reason": pl.String},
        )

    def _probe(self, rows: np.ndarray) -> None:
        # SWMR readers skip HDF5's end-of-file check, so read the last committed row of
        # every dataset: a truncated file fails here, not halfway through a simulation.
        n = rows_end(rows)
        if n == 0:
            return
        for name in dataset_names(self.spec):
            if name not in self._f:  # older formats lack the newer statistics
                continue
            ds = self._f[name]
            if ds.shape[0] < n:
                raise CacheError(f"{self.path}: {name} has {ds.shape[0]} positions, trajectories need {n}")
            self._read(ds, n - 1, n, name)

    def _rows_past_checksums(self, exc: OSError) -> np.ndarray:
        """The trajectory table when a chunk of it fails its checksum: its raw rows, each checked against its
        digest. A kill -9 while the writer appended a row can cut that write short (`read_past_checksums`): the
        rows before it are as committed, the last may be half written. Every row must hash to its digest, except
        that last one, dropped as never committed; anything else is damage."""
        damaged = CacheError(f"{self.path}: damaged trajectory table ({describe_error(exc)}); `specsim inspect "
                             f"{self.path} --verify` lists every damaged part")
        try:
            rows = committed_rows(self._f, past_checksums=True)
        except CacheError:
            raise damaged from None
        if self._version < 3 or "digest" not in rows.dtype.names:
            raise damaged
        self._rows = rows
        table = self._f["trajectories"]
        per_chunk = table.chunks[0]
        unchecked = []  # rows in chunks that fail their checksum
        for first in range(0, len(rows), per_chunk):
            try:
                table[first : first + per_chunk]
            except OSError:
                unchecked += range(first, min(first + per_chunk, len(rows)))
        bad = [i for i in unchecked if not self._row_intact(i)]
        if bad and bad != [len(rows) - 1]:
            raise damaged
        kept = rows[: len(rows) - len(bad)]
        self.recovered.append(f"trajectory table: a chunk fails its checksum; its {len(unchecked) - len(bad)} "
                              "committed rows hash to their digests"
                              + ("; its last row, half written when the writer stopped, is dropped" if bad else ""))
        return kept

    def _row_intact(self, i: int) -> bool:
        """Whether committed row i's data hashes to its digest (format 3+), read past failed checksums."""
        if i in self._intact:
            return True
        rows = self._rows
        if self._version < 3 or "digest" not in rows.dtype.names:
            return False
        row = rows[i]
        start, n, overhang = int(row["start"]), int(row["length"]), int(overhangs(rows[i : i + 1])[0])
        values = []
        for name in dataset_names(self.spec):
            ds = self._f[name]
            if not 0 <= start <= start + n + overhang <= ds.shape[0]:
                return False
            try:
                values.append(ds[start : start + n + overhang])
            except OSError:
                try:
                    values.append(read_past_checksums(ds, start, start + n + overhang))
                except CacheError:
                    return False
        if self._digest(i, [np.ascontiguousarray(v) for v in values]) != bytes(row["digest"]):
            return False
        self._intact.add(i)
        return True

    def _digest(self, i: int, values) -> bytes:
        """Row i's digest from its datasets' values (`dataset_names` order), chained on row i - 1's stored one."""
        row = self._rows[i]
        previous = bytes(self._rows["digest"][i - 1]) if i else b""
        return row_digest(previous, int(row["prompt_index"]), int(row["length"]), float(row["temperature"]),
                          int(overhangs(self._rows[i : i + 1])[0]), self._version, values)

    # -- metadata ------------------------------------------------------------------------------
    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size

    @property
    def n_trajectories(self) -> int:
        """Committed trajectories (what `trajectories.height` counts, without building the table)."""
        return len(self._rows)

    def prompt_records(self) -> list[PromptRecord]:
        """The prompts as stored (question id, category, text, token ids), without polars (`prompts` is the table)."""
        return list(self._prompts)

    def prompt_token_ids(self, prompt_index: int) -> np.ndarray:
        return self._prompts[prompt_index].token_ids

    def prompt_question_id(self, prompt_index: int) -> int:
        return int(self._prompts[prompt_index].question_id)

    def iter_trajectories(self, temperature: float | None = None) -> Iterator[TrajectoryRow]:
        overhang = overhangs(self._rows)
        for i, r in enumerate(self._rows):
            if temperature is not None and not same_temperature(r["temperature"], temperature):
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
            if same_temperature(t, temperature):
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
        """dataset[start:stop]. In a file a writer has open or left by a killed one (SWMR flags set), a chunk
        whose checksum fails is read raw (`read_past_checksums`) when every committed row the range touches hashes
        to its digest (a write a crash cut short leaves such a chunk, its committed bytes intact). Otherwise, and
        always in a file closed cleanly, it is a CacheError naming the trajectory."""
        try:
            return dataset[start:stop]
        except OSError as exc:
            ends = self._rows["start"] + self._rows["length"] + overhangs(self._rows)
            touched = np.flatnonzero((self._rows["start"] < stop) & (ends > start))
            failed = [int(i) for i in touched if not self._row_intact(int(i))] if self._f.swmr_mode else None
            if failed == []:
                try:
                    values = read_past_checksums(dataset, start, stop)
                except CacheError:
                    pass
                else:
                    note = (f"{dataset.name.lstrip('/')}: a chunk fails its checksum, the committed trajectories "
                            "in it hash to their digests (a write a crash cut short leaves this; `specsim cache ... "
                            "--resume` rewrites the file)")
                    if note not in self.recovered:
                        self.recovered.append(note)
                    return values
            rows = self._rows[failed or touched]  # the rows whose digests fail, when they have digests
            where = ", ".join(f"prompt {int(r['prompt_index'])} at T={float(r['temperature']):g}" for r in rows[:3])
            raise CacheError(f"{self.path}: damaged data in {what} at positions {start}:{stop} ({where or 'no trajectory'}"
                             f"; {exc}); the file was changed after it was written: copy or record it again") from None

    def has_stats(self) -> bool:
        """Whether the file records float32 per-position statistics (format version 2 or later)."""
        return "stats" in self._f["columns"][group_name(TARGET)]

    def has_stat(self, column: str, name: str) -> bool:
        """Whether `column` records the statistic `name` (version 3 adds π, swor groups and lossy α/TV)."""
        return name in self.stat_names(column)

    def stat_names(self, column: str) -> list[str]:
        """The statistics `column` records, sorted (none before format version 2)."""
        g = self._f["columns"][group_name(self.check_column(column))]
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
        version = self._version
        names = dataset_names(self.spec)
        # a trajectory table read past its checksum (`_rows_past_checksums`): its rows verified, its chunk not
        damaged: list[str] = [line for line in self.recovered if line.startswith("trajectory table")]
        positions = 0
        chained = "digest" in self._rows.dtype.names
        for row in self.iter_trajectories():
            where = f"prompt {row.prompt_index} at T={row.temperature:g} (trajectory {row.traj_index}, positions " \
                    f"{row.start}:{row.end})"
            values, broken, unchecked = [], [], {}
            for name in names:
                try:
                    values.append(np.ascontiguousarray(self._f[name][row.start : row.end], dtype=self._f[name].dtype))
                except KeyError as exc:
                    broken.append(f"{name} of {where}: unreadable ({describe_error(exc)})")
                except OSError as exc:  # a crashed writer's file: read raw, a chunk cut short holds the committed bytes
                    unchecked[name] = f"{name} of {where}: unreadable ({describe_error(exc)})"
                    try:
                        if not self._f.swmr_mode:
                            raise CacheError(name)
                        values.append(read_past_checksums(self._f[name], row.start, row.end))
                    except CacheError:
                        broken.append(unchecked.pop(name))
            stored = bytes(self._rows["digest"][row.traj_index]) if chained else b""
            intact = False
            if chained and not broken and version >= 3:
                intact = self._digest(row.traj_index, values) == stored
                if not intact and not unchecked:
                    damaged.append(f"{where}: its data no longer hashes to the digest it was committed with")
            damaged += broken
            damaged += [f"{name} of {where}: its chunk fails its checksum, but the trajectory still hashes to its "
                        "digest: its data is intact (a write a crash cut short leaves this; `specsim cache ... "
                        "--resume` rewrites the file)" for name in unchecked] if intact else list(unchecked.values())
            positions += row.end - row.start
            on_rows(row.end - row.start)
        try:
            prompts = read_prompts(self._f)
        except (OSError, KeyError, ValueError) as exc:
            damaged.append(f"prompts: unreadable ({describe_error(exc)})")
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
        ds = self._f["columns"][group_name(self.check_column(column))]["stats"][name]
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
        g = self._f["columns"][group_name(self.check_column(column))]
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
        return self._read(self._f["columns"][group_name(TARGET)]["hidden"][layer], start, stop, f"hidden {layer}")

    def close(self) -> None:
        if self._f.id.valid:
            self._f.close()

    def __enter__(self) -> "CacheReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Joining the shards of a sharded recording (`specsim cache --shard I/N`) into one cache.

Shards record disjoint prompt sets of one run (prompt i goes to shard i mod N, seeds depend
on the prompt, not the shard), so their union is the unsharded recording. `merge_shards`
checks that every shard is a piece of the same run (identical settings but the shard, the
same prompts and models), that no (prompt, temperature) appears twice, and — unless told
to accept a partial set — that all N shards are there. It writes the trajectories in the
order an unsharded run at batch size 1 commits them (prompt by prompt, temperatures in the
recorded order), copying every per-position dataset byte for byte, so the merged file's
data and digests equal that run's. The output is written beside the target and renamed
into place at the end: an interrupted merge leaves nothing half-written under that name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from specsim.errors import CacheError


@dataclass(frozen=True)
class MergeOutcome:
    shards: int  # files joined
    trajectories: int  # committed rows written
    positions: int  # positions written
    bytes: int  # size of the merged file
    missing: tuple[int, ...]  # shard indices not given (a partial merge)


def merge_shards(out, shards: Sequence, *, overwrite: bool = False, allow_partial: bool = False,
                 progress: bool = True, echo: Callable[[str], None] = lambda line: None) -> MergeOutcome:
    """Merge shard caches into `out` (see the module docstring)."""
    from tqdm.auto import tqdm

    from specsim.cache.lock import CacheLock
    from specsim.cache.layout import prompts_digest
    from specsim.cache.reader import CacheReader
    from specsim.cache.writer import CacheWriter

    out = Path(out)
    paths = [Path(p) for p in shards]
    if not paths:
        raise CacheError("give the shard files to merge (specsim merge OUT SHARD...)")
    if out.exists() and not overwrite:
        raise CacheError(f"{out} exists; pass --overwrite to replace it")
    if any(p.resolve() == out.resolve() for p in paths if p.exists()):
        raise CacheError(f"{out} is one of the shards; write the merged cache to another file")
    if len(set(p.resolve() for p in paths)) != len(paths):
        raise CacheError("a shard is given twice")
    readers = [CacheReader(p) for p in paths]
    try:
        first = readers[0]
        settings0 = _settings(first)
        n_shards = _shard(first)[1]
        seen: dict[tuple[int, float], Path] = {}
        indices = []
        for reader in readers:
            i, n = _shard(reader)
            if n != n_shards:
                raise CacheError(f"{reader.path} is shard {i}/{n}, {first.path} is one of {n_shards}: not one run")
            if i in indices:
                raise CacheError(f"{reader.path} and {paths[indices.index(i)]} are both shard {i}/{n}")
            indices.append(i)
            ours = _settings(reader)
            for key in sorted(set(settings0) | set(ours)):
                if settings0.get(key) != ours.get(key):
                    raise CacheError(f"{reader.path} was recorded with {key} = {ours.get(key)!r}, {first.path} with "
                                     f"{settings0.get(key)!r}: shards of one merge share every setting")
            if replace(reader.spec, meta={}) != replace(first.spec, meta={}):
                raise CacheError(f"{reader.path} has another layout than {first.path} (storage, drafts or vocabulary)")
            if prompts_digest(reader.prompt_records()) != prompts_digest(first.prompt_records()) or \
                    reader.run.tokenizer_sha256 != first.run.tokenizer_sha256:
                raise CacheError(f"{reader.path} holds other prompts (or another tokenizer's ids) than {first.path}")
            if reader.fingerprint is None:
                raise CacheError(f"{reader.path} was written before cache format 3; re-record it to merge")
            for row in reader.iter_trajectories():
                key = (row.prompt_index, round(row.temperature, 6))
                if key in seen:
                    raise CacheError(f"prompt {row.prompt_index} at T={row.temperature:g} is in both {seen[key]} "
                                     f"and {reader.path}")
                seen[key] = reader.path
        missing = tuple(sorted(set(range(n_shards)) - set(indices)))
        if missing and not allow_partial:
            raise CacheError(f"shards {', '.join(f'{i}/{n_shards}' for i in missing)} are missing; give all "
                             f"{n_shards} or pass --allow-partial")
        order = {float(t): k for k, t in enumerate(first.spec.temperatures)}
        rows = sorted(((row.prompt_index, order[min(order, key=lambda t: abs(t - row.temperature))], reader, row)
                       for reader in readers for row in reader.iter_trajectories()), key=lambda x: x[:2])
        prompts = first.prompt_records()
        meta = dict(first.meta)
        meta["settings"] = {**settings0, "shard": None}
        meta["merged_from"] = [{"path": str(r.path), "shard": f"{_shard(r)[0]}/{n_shards}",
                                "device": r.run.device, "created": r.run.created,
                                "fingerprint": r.fingerprint} for r in readers]
        spec = replace(first.spec, meta=meta)  # the same layout: drafts, depths, hidden states, statistics
        tmp = out.with_name(out.name + ".merging")
        with CacheLock(out):
            positions = 0
            bar = tqdm(total=len(rows), unit="trajectory", desc="merging", disable=not progress, dynamic_ncols=True)
            try:
                with CacheWriter.create(tmp, spec, prompts, overwrite=True) as writer:
                    for _, _, reader, row in rows:
                        writer.append_copy(reader, row)
                        positions += row.length
                        bar.update()
                os.replace(tmp, out)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            finally:
                bar.close()
        if missing:
            echo(f"note: partial merge, shards {', '.join(map(str, missing))} of {n_shards} not given")
        return MergeOutcome(shards=len(readers), trajectories=len(rows), positions=positions, bytes=out.stat().st_size,
                            missing=missing)
    finally:
        for reader in readers:
            reader.close()


def _settings(reader) -> dict:
    if reader.run.settings is None:
        raise CacheError(f"{reader.path}: records no settings; it was not written by `specsim cache`")
    return {k: v for k, v in reader.run.settings.items() if k != "shard"}


def _shard(reader) -> tuple[int, int]:
    return reader.run.shard

"""A cache's run metadata, read once into a typed, frozen object.

The file keeps it as one JSON attribute (docs/cache-format.md, "meta"), written by the recorder
(`specsim.record.recorder.build_meta`). Readers used to pick it apart as dicts, each guarding
against a missing or malformed part; `RunMeta.parse` does that once, and everything downstream
reads fields. numpy-free.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from specsim.errors import CacheError


def _frozen(value) -> Mapping:
    """A read-only copy of a JSON object (an empty one for anything else)."""
    return MappingProxyType(copy.deepcopy(value) if isinstance(value, dict) else {})


@dataclass(frozen=True)
class RunMeta:
    """What a recording says about itself. Every field is present; a part the file lacks is empty or None."""

    settings: Mapping | None  # the recording's settings (what `--resume` compares); None: not written by `specsim cache`
    target: Mapping  # the target model's facts (spec, architecture, sizes, sha256)
    drafts: Mapping  # draft name -> its facts
    prompts: Mapping  # where the prompts came from (spec, source, categories, sha256)
    versions: Mapping  # package versions at recording time
    device: str | None = None
    created: str | None = None
    tokenizer_sha256: str | None = None  # the target tokenizer's
    raw: Mapping = field(default_factory=dict, repr=False, compare=False)  # the JSON as stored

    @classmethod
    def parse(cls, meta) -> "RunMeta":
        meta = meta if isinstance(meta, dict) else {}
        settings, target = meta.get("settings"), meta.get("target")
        return cls(settings=_frozen(settings) if isinstance(settings, dict) else None,
                   target=_frozen({"spec": target} if isinstance(target, str) else target), drafts=_frozen(meta.get("drafts")),
                   prompts=_frozen(meta.get("prompts")), versions=_frozen(meta.get("versions")),
                   device=None if meta.get("device") is None else str(meta["device"]),
                   created=None if meta.get("created") is None else str(meta["created"]),
                   tokenizer_sha256=None if meta.get("tokenizer_sha256") is None else str(meta["tokenizer_sha256"]),
                   raw=_frozen(meta))

    def setting(self, key: str, default=None):
        """One recording setting, or `default` where the file does not record it."""
        return (self.settings or {}).get(key, default)

    def require_settings(self, path: str | Path, why: str) -> Mapping:
        """The settings, or CacheError: the file was not written by `specsim cache` (`why` says what needs them)."""
        if self.settings is None or "target" not in self.settings or "max_new_tokens" not in self.settings:
            raise CacheError(f"{path}: records no settings (target, max_new_tokens); {why}")
        return self.settings

    @property
    def target_name(self) -> str:
        """The target model's name as the recorder wrote it (the spec string it was loaded from)."""
        return str(self.setting("target") or self.target.get("spec") or "target")

    @property
    def max_new_tokens(self) -> int | None:
        value = self.setting("max_new_tokens")
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1 else None

    @property
    def shard(self) -> tuple[int, int]:
        """(i, n): this file recorded the prompts with index % n == i; (0, 1) for an unsharded recording."""
        text = self.setting("shard")
        if not text:
            return 0, 1
        i, n = (int(x) for x in str(text).split("/"))
        return i, n

"""Files the tool writes: the destination checked before any work, and text written whole or not at all.

A command that measures, generates or trains for minutes and only then finds that it cannot write its result
loses that work; `check_writable` finds out first, by making the folder (as the write would) and a scratch entry in
it, which, unlike `os.access`, also answers for root and for special file systems.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specsim.errors import SpecError


def check_writable(flag: str, path: str | Path) -> Path:
    """`path` (a file or a folder to be written) as a Path, once its folder exists (made if missing) and takes a
    new entry; otherwise a one-line SpecError naming `flag`."""
    path = Path(path).expanduser()
    if not str(path).strip():
        raise SpecError(f"{flag}: an empty path")
    folder = path.parent
    above = next((a for a in (folder, *folder.parents) if a.exists()), None)
    if above is not None and not above.is_dir():
        raise SpecError(f"{flag} {path}: {above} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"{flag} {path}: cannot create {folder} ({exc.strerror or exc})") from None
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{path.name}.check-", dir=folder))
    except OSError as exc:
        raise SpecError(f"{flag} {path}: cannot write into {folder} ({exc.strerror or exc})") from None
    return path


def write_text(path: str | Path, text: str) -> Path:
    """Written whole or not at all (a temporary file renamed into place); an existing file is the caller's to refuse
    (`--overwrite`)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".writing")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SpecError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return path

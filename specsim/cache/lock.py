"""One writer per cache: an exclusive lock held while a process records (or resumes, or overwrites) a file.

`--resume` and `--overwrite` replace the cache file by rename, so a second writer would swap the
file away under the first one, whose later trajectories would then be lost without a word. The
lock is an `fcntl.flock` on ``<cache>.lock`` beside the file (the cache itself cannot carry it:
its inode changes on every rename), taken before any model is loaded, so a second command
refuses at once and names the process that records. The lock file records that process's id
and command line; it stays after the run (removing it would race with a waiting writer).
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import Callable

from specsim.errors import CacheError


class CacheLock:
    """`with CacheLock(path):` — exclusive, non-blocking; CacheError naming the holder when taken. With
    `wait=callback`, a taken lock is waited for instead, after `callback(holder)` (one process converts a model
    while the others wait for it: `record.packaged.converting`)."""

    def __init__(self, path, *, wait: Callable[[str], None] | None = None) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.wait = wait
        self._fd: int | None = None

    def __enter__(self) -> "CacheLock":
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CacheError(f"{self.path}: cannot create the lock file {self.lock_path} ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            if self.wait is None:
                os.close(fd)
                raise CacheError(f"{self.path} is being recorded by {holder}; wait for it to finish or stop it "
                                 "(one writer per cache)") from None
            self.wait(holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} ({' '.join(sys.argv)[:300]})\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

"""Stopping cleanly: SIGTERM treated like Ctrl-C, and commits that no signal can cut in half.

A scheduler's stop (SIGTERM, `kill`) and Ctrl-C (SIGINT) both end a long run; everything
finished is kept. `sigterm_as_interrupt` makes SIGTERM raise KeyboardInterrupt as Ctrl-C does;
`deferred` holds both signals while a trajectory is committed and delivers them after, so a
file is never left with half a trajectory.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within it, SIGTERM raises KeyboardInterrupt (in the main thread), as Ctrl-C does."""
    if not _main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block is done, then raise KeyboardInterrupt if one came.

    A signal whose handler is SIG_IGN (a background job) stays ignored; outside the main thread
    nothing can be deferred and the block just runs.
    """
    if not _main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    for sig in SIGNALS:
        handler = signal.getsignal(sig)
        if handler not in (signal.SIG_IGN, None) and not (sig == signal.SIGTERM and handler == signal.SIG_DFL):
            previous[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pending:
        raise KeyboardInterrupt

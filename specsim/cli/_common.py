"""Shared CLI plumbing: turning library errors into one-line click errors."""

from __future__ import annotations

import functools
from typing import Any, Callable

import click

from specsim.errors import SpecsimError


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body, printing `SpecsimError`s as one line (exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecsimError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


def human_bytes(n: float) -> str:
    """A byte count for people: 512 B, 1.2 kB, 245.4 MB (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"

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


def comma_ints(value: str, flag: str, *, example: str) -> tuple[int, ...]:
    """Parse a flag like --contexts 128,512 into a tuple of ints (click error otherwise)."""
    try:
        out = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers such as {example}, got {value!r}",
                                 param_hint=flag) from None
    if not out:
        raise click.BadParameter("give at least one value", param_hint=flag)
    return out

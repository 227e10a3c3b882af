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

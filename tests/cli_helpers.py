"""Assertions on CliRunner results shared by the CLI tests."""

from __future__ import annotations


def one_line_error(result, message: str | None = None, code: int | None = None) -> str:
    """The command failed cleanly: a SystemExit (not an uncaught exception, which CliRunner captures
    instead of printing a traceback), the expected status, and the error as exactly one last line
    'Error: ...' (progress notes such as 'loading target ...' may come before it)."""
    assert isinstance(result.exception, SystemExit), f"uncaught {result.exception!r}: {result.output}"
    assert result.exit_code != 0 if code is None else result.exit_code == code, (result.exit_code, result.output)
    lines = result.output.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("Error: ")]
    assert errors == [len(lines) - 1], result.output
    if message is not None:
        assert message in lines[-1], result.output
    return lines[-1]


def record(*args: str):
    """`specsim cache ARGS --quiet` through CliRunner; asserts it succeeded and returns the result."""
    from click.testing import CliRunner

    from specsim.cli import main

    result = CliRunner().invoke(main, ["cache", *map(str, args), "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result

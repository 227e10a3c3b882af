"""Shared CLI plumbing: one error policy, one command class, repeatable options, one table, one writer.

* Library errors print as one line: a malformed spec (`SpecError`) is a usage error and exits
  2, anything else the user can fix exits 1; click's own usage errors keep click's format (2).
* `Command` refuses a single-valued option given twice (click would silently keep the last).
* Repeatable options also take comma-separated values (`--budget 4 --budget 16` = `--budget
  4,16`); tree specs contain commas, so `--tree` is repeatable only.
* `table` renders aligned columns that fit the terminal (COLUMNS), dropping the least
  important columns first and saying so; `write_frame` writes one schema to parquet, csv,
  json or ndjson, to a file (atomically, never silently over an existing one) or to stdout.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import click

from specsim.errors import SpecError, SpecsimError

MAX_BOOT = 100_000  # bootstrap resamples allowed: each is a row of a (resamples x prompts) matrix


class SpecUsageError(click.ClickException):
    """A malformed spec or value given on the command line: one line, exit status 2."""

    exit_code = 2


# Library arguments whose flag is not the argument's name with dashes: a list argument takes its flag once per
# value (`trees=[...]` is `--tree A --tree B`).
FLAGS = {"trees": "--tree", "drafts": "--draft", "policies": "--policy", "temperatures": "--temperature",
         "batches": "--batch", "budgets": "--budget", "hidden": "--hidden-states",
         "hidden_batch_tokens": "--hidden-batch", "caches": "--from"}


def flag(argument: str) -> str:
    """The command-line flag of a library argument: n_boot -> --n-boot, policies -> --policy."""
    return FLAGS.get(argument, "--" + argument.replace("_", "-"))


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body, printing `SpecsimError`s as one line (SpecError: exit 2, others: exit 1), and a file
    system error no check foresaw (`OSError`) as one line too (exit 1).
    Where an error names the library's arguments (`SpecsimError.naming`), here it names their flags."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            raise SpecUsageError(exc.render(flag)) from None
        except SpecsimError as exc:
            raise click.ClickException(exc.render(flag)) from None
        except BrokenPipeError:  # a reader that stopped early (`| head`): Python's own handling
            raise
        except OSError as exc:  # a file the checks before the work could not foresee (a full disk, a vanished folder)
            where = f"{exc.filename}: " if exc.filename else ""
            raise click.ClickException(f"{where}{exc.strerror or exc}") from None

    return wrapper


class Command(click.Command):
    """A specsim command: a single-valued option given twice is a usage error."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        counts: dict[str, int] = {}
        for token in args:
            if token == "--":
                break
            if token.startswith("-"):
                name = token.split("=", 1)[0]
                counts[name] = counts.get(name, 0) + 1
        for param in self.params:
            if isinstance(param, click.Option) and not param.multiple and not param.count:
                given = sum(counts.get(name, 0) for name in (*param.opts, *param.secondary_opts))
                if given > 1:
                    raise click.UsageError(f"{param.opts[-1]} was given {given} times; it takes one value", ctx=ctx)
        return super().parse_args(ctx, args)


def command(name: str | None = None, **kwargs) -> Callable:
    """`click.command` with the specsim `Command` class."""
    return click.command(name, cls=Command, **kwargs)


def quiet_option(fn: Callable) -> Callable:
    return click.option("-q", "--quiet", is_flag=True, help="No progress bars.")(fn)


def device_option(fn: Callable) -> Callable:
    return click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")(fn)


def seed_option(fn: Callable) -> Callable:
    return click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
                        help="Seed (a non-negative integer).")(fn)


def hidden_batch_option(help_text: str) -> Callable:
    """--hidden-batch TOKENS (None: off), with the command's own `help_text`: the target's hidden states in
    right-padded forwards of up to TOKENS tokens (`target_hidden_batched`), for `cache` and `train-draft`."""
    return click.option("--hidden-batch", "hidden_batch", type=click.IntRange(min=1), default=None, metavar="TOKENS",
                        help=help_text)


# -- repeatable options that also take commas ---------------------------------------------------


def _split(values: Sequence[str], *, specs: bool = False) -> list[str]:
    """Items of repeated, comma-separated values; with specs=True numeric fragments stay with their spec
    (typical:0.09,0.3 is one policy). A key=value fragment always stays with its spec
    (suffix:factor=2,prob=0.1 is one draft)."""
    out: list[str] = []
    for value in [values] if isinstance(values, str) else values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            keyed = "=" in part and ":" not in part
            if out and ":" in out[-1] and (keyed or (specs and _numeric(part))):
                out[-1] += "," + part
            else:
                out.append(part)
    return out


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def names(ctx: click.Context, param: click.Parameter, values) -> tuple[str, ...]:
    """Callback: repeated and/or comma-separated names."""
    return tuple(_split(values or ()))


def specs(ctx: click.Context, param: click.Parameter, values) -> tuple[str, ...]:
    """Callback: repeated and/or comma-separated specs whose own numeric parameters may contain commas."""
    return tuple(_split(values or (), specs=True))


def numbers(kind: type, *, minimum: float | None = None) -> Callable:
    """Callback factory: repeated and/or comma-separated ints or floats, each >= minimum."""

    def convert(ctx: click.Context, param: click.Parameter, values) -> tuple:
        out = []
        for part in _split(values or ()):
            try:
                value = kind(part)
            except ValueError:
                noun = "integers" if kind is int else "numbers"
                raise click.BadParameter(f"{part!r} is not one of the comma-separated {noun} expected",
                                         ctx=ctx, param=param) from None
            if kind is float and not math.isfinite(value):
                raise click.BadParameter(f"{part!r} is not a finite number", ctx=ctx, param=param)
            if minimum is not None and value < minimum:
                raise click.BadParameter(f"{part} is below the minimum {minimum:g}", ctx=ctx, param=param)
            out.append(value)
        return tuple(out)

    return convert


def choice(vocab) -> click.Choice:
    """A click choice of a registry vocabulary (`specsim.specs`): the CLI never spells a vocabulary itself."""
    return click.Choice(list(vocab))


def human_bytes(n: float) -> str:
    """A byte count for people: 512 B, 1.2 kB, 245.4 MB (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


# -- the terminal table ---------------------------------------------------------------------------


def ci(value, lo, hi) -> str:
    """'1.234 [1.100, 1.350]', '1.234' without an interval, '-' without a value."""
    if value is None or value != value:
        return "-"
    if lo is None or lo != lo:
        return f"{value:.3f}"
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"



def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, keep: int = 1, width: int | None = None) -> str:
    """Aligned columns that fit the terminal: the rightmost columns beyond the first `keep` are dropped
    (least important last) until the table fits, and a last line says which."""
    width = width or shutil.get_terminal_size((160, 24)).columns
    header, rows = list(header), [list(r) for r in rows]
    dropped: list[str] = []

    def render() -> list[str]:
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
        fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
        return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]

    lines = render()
    while max(len(line) for line in lines) > width and len(header) > keep:
        dropped.insert(0, header.pop())
        rows = [r[:-1] for r in rows]
        lines = render()
    if dropped:
        lines.append(f"({len(dropped)} column(s) not shown to fit {width} characters: {', '.join(dropped)}; "
                     "widen the terminal or write everything with --out)")
    return "\n".join(lines)


# -- one writer -------------------------------------------------------------------------------------

FORMATS = ("parquet", "csv", "json", "ndjson")


def overwrite_option(fn: Callable) -> Callable:
    """--overwrite, for commands that refuse to replace the files they write."""
    return click.option("--overwrite", is_flag=True, help="Replace an existing output file.")(fn)


def out_options(fn: Callable) -> Callable:
    """--out PATH|- with --format and --overwrite, for commands that write a table."""
    fn = click.option("--overwrite", is_flag=True, help="Replace an existing --out file.")(fn)
    fn = click.option("--format", "out_format", type=click.Choice(FORMATS), default=None,
                      help="Output format  [default: from the --out suffix; required with --out -]")(fn)
    return click.option("--out", type=str, default=None, metavar="PATH|-",
                        help="Write every column to a .parquet, .csv, .json or .ndjson file, or to stdout with "
                             "'--out - --format json|csv|ndjson'.")(fn)


def out_target(out: str | None, out_format: str | None, overwrite: bool, flag: str = "--out"):
    """(path or '-', format) checked before any work: format known, file not silently replaced, its folder writable
    (made if missing, as every other output's: `files.check_writable`)."""
    if out is None:
        if out_format is not None:
            raise SpecError(f"--format needs {flag}")
        return None, None
    if out == "-":
        if out_format not in ("csv", "json", "ndjson"):
            raise SpecError(f"{flag} - writes to stdout: add --format csv, json or ndjson")
        return "-", out_format
    if not out.strip():
        raise SpecError(f"{flag}: an empty path")
    path = Path(out).expanduser()
    if path.is_dir():
        raise SpecError(f"{flag} {path} is a directory; give a file name such as {path / 'results.parquet'}")
    fmt = out_format or {".parquet": "parquet", ".csv": "csv", ".json": "json", ".ndjson": "ndjson",
                         ".jsonl": "ndjson"}.get(path.suffix.lower())
    if fmt is None:
        raise SpecError(f"{flag} {path}: unknown format {path.suffix or '(no suffix)'}; use .parquet, .csv, .json or "
                        f".ndjson{' (or --format)' if flag == '--out' else ''}")  # --format is --out's alone
    if path.exists() and not overwrite:
        raise SpecError(f"{flag} {path} exists; pass --overwrite to replace it")
    from specsim.files import check_writable

    return check_writable(flag, path), fmt


def flat(df):
    """One schema for every format: list columns become one column per element (depth_accept -> depth_1, ...),
    NaN becomes null."""
    import polars as pl

    for name, dtype in list(df.schema.items()):
        if isinstance(dtype, pl.List):
            n = int(df[name].list.len().max() or 0)
            base = {"depth_accept": "depth"}.get(name, name)
            df = df.with_columns([pl.col(name).list.get(i, null_on_oob=True).alias(f"{base}_{i + 1}")
                                  for i in range(n)]).drop(name)
    return df.with_columns([pl.col(c).fill_nan(None) for c, t in df.schema.items() if t in (pl.Float64, pl.Float32)])


def write_frame(df, target, fmt: str) -> str:
    """Write `df` (flattened by `flat`) to a path atomically, or to stdout for '-'; returns a description."""
    df = flat(df)
    if target == "-":
        text = {"csv": df.write_csv, "json": df.write_json, "ndjson": df.write_ndjson}[fmt]()
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return "stdout"
    tmp = target.with_name(target.name + ".writing")
    try:
        {"parquet": df.write_parquet, "csv": df.write_csv, "json": df.write_json, "ndjson": df.write_ndjson}[fmt](tmp)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SpecError(f"--out {target}: cannot write ({exc.strerror or exc})") from None
    return str(target)


cost_extrapolate_option = click.option(
    "--cost-extrapolate", is_flag=True,
    help="Price shapes past what --cost-profile measured (batch, tokens, draft width, context), up to 2x its "
         "largest: a straight line from the grid's edge, never below it; rows say so (cost_extrapolated). "
         "Without it they are refused.")


POOLED_PROFILES_HELP = (" Give it again for profiles of the same machine measured at other moments: their times are "
                        "averaged and the speedup CIs carry the drift between them (each bootstrap replicate prices "
                        "with one of them, drawn at random).")


def cost_profile_option(help_text: str):
    """--cost-profile FILE, repeatable: None when not given, the path when given once, a tuple of paths when
    given more than once (`cost_profile_arg` pools them)."""
    return click.option("--cost-profile", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                        multiple=True, callback=lambda ctx, param, value: (None if not value else value[0]
                                                                           if len(value) == 1 else tuple(value)),
                        help=help_text + POOLED_PROFILES_HELP)


def cost_profile_arg(path, extrapolate: bool, *, load: bool = False):
    """--cost-profile with --cost-extrapolate as the library takes them: None without a profile; the path (the
    library loads and checks it, after its other arguments), or the profile loaded when asked to extrapolate or
    `load`; several paths (the option given more than once) loaded and pooled (`sim.cost.pool_profiles`)."""
    if path is None:
        if extrapolate:
            raise SpecError("--cost-extrapolate goes with --cost-profile")
        return None
    if isinstance(path, tuple):
        from specsim.sim.cost import load_cost_profiles

        return load_cost_profiles(path, extrapolate=extrapolate)
    if not (extrapolate or load):
        return path
    from specsim.sim.cost import load_cost_profile

    return load_cost_profile(path, extrapolate=extrapolate)

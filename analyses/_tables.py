"""Shared by the analysis scripts: read a report's tables and save one chart next to the others.

Every script in analyses/ regenerates one chart of `specsim report` from the tables a
report wrote (``reports/NAME/tables``), without re-simulating:

    python -m analyses.tokens_per_call_vs_budget reports/demo/tables --out reports/demo/charts
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import click
import polars as pl


def read(tables: Path, name: str) -> pl.DataFrame:
    """tables/NAME.parquet (or .csv), with a one-line error naming what is missing."""
    for suffix, reader in ((".parquet", pl.read_parquet), (".csv", pl.read_csv)):
        path = tables / f"{name}{suffix}"
        if path.exists():
            return reader(path)
    raise click.ClickException(f"{tables}: no {name}.parquet or {name}.csv; write them with `specsim report ... --out DIR`")


def command(name: str, doc: str, build: Callable[[Path], object]) -> click.Command:
    """A click command TABLES --out DIR that saves `build(tables)` as NAME.png and NAME.svg."""

    @click.command(help=doc)
    @click.argument("tables", type=click.Path(path_type=Path, file_okay=False, exists=True))
    @click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
                  help="Directory for the PNG and SVG (default: TABLES/../charts).")
    def main(tables: Path, out_dir: Path | None) -> None:
        from specsim.report.charts import save

        out_dir = out_dir or tables.parent / "charts"
        for path in save(build(tables), out_dir, name):
            click.echo(f"wrote {path}")

    return main

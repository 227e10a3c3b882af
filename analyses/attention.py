"""Tree-attention timing charts of a `specsim bench-attention` table (report section 6).

Reuses `specsim.attention.timing_charts` (time vs context, speedup over per-branch, batch x tree heatmap).

    python -m analyses.attention reports/study/tables --out reports/study/charts
"""

from pathlib import Path

import click
from analyses._tables import read


@click.command(help=__doc__)
@click.argument("tables", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Directory for the PNG and SVG files (default: TABLES/../charts).")
def main(tables: Path, out_dir: Path | None) -> None:
    from specsim.attention.timing_charts import CHARTS
    from specsim.report.charts import save

    table = read(tables, "attention")
    for name, build in CHARTS.items():
        for path in save(build(table), out_dir or tables.parent / "charts", f"attention_{name}"):
            click.echo(f"wrote {path}")


if __name__ == "__main__":
    main()

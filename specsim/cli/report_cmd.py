"""`specsim report`: the draft-strategy study of one or more caches as a self-contained HTML report."""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from pathlib import Path

import click

from specsim import specs as registry
from specsim.cli import _common as c


@c.command("report")
@click.argument("caches", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Output directory: index.html, charts/*.png|svg, tables/*.parquet|csv.")
@click.option("--attention", type=click.Path(path_type=Path, dir_okay=False),
              help="A `specsim bench-attention` table (.parquet or .csv) to chart in section 6.")
@click.option("--cost-profile", "cost_profiles", multiple=True, type=click.Path(path_type=Path, dir_okay=False),
              help="A `specsim profile` JSON (repeatable: each cache uses the one measured for its target): "
                   "measured speedups, and the best budget per batch size.")
@click.option("--cost", default=None, metavar="c=RATIO",
              help="An ASSUMED draft/target step cost ratio for caches without a profile; every speedup it "
                   "gives is labelled as an assumption. No default: without costs there are no speedups.")
@click.option("--batch", "--batches", "batches", multiple=True, metavar="B", callback=c.numbers(int, minimum=1),
              help="Batch sizes of the batch analysis, repeatable or comma-separated (those within each profile's "
                   "measured range).  [default: 1,4,16]")
@click.option("--budget", "--budgets", "budgets", multiple=True, metavar="N", callback=c.numbers(int, minimum=1),
              help="Draft-token budgets to sweep, repeatable or comma-separated.  [default: 1,2,4,8,16,32]")
@click.option("--families", default="chain,kary:2,widths,optimal", show_default=True, callback=c.specs,
              help="Tree families simulated greedily at T=0.")
@click.option("--sample-families", default="chain,optimal", show_default=True, callback=c.specs,
              help="Tree families simulated with speculative sampling at T>0 (each branching tree streams "
                   "the cache's full distributions once: add kary:2,widths when you can wait).")
@click.option("--model-free", default="ngram:3,prompt-lookup:2,suffix", show_default=True, callback=c.names,
              help="Model-free drafts simulated as chains at T=0 ('' for none).")
@click.option("--multi-draft", type=c.choice(registry.MULTI_DRAFT), default="iid", show_default=True,
              help="How a sampling tree draws a node's k candidates from q. "
                   + registry.vocab_help(registry.MULTI_DRAFT) + ".")
@click.option("--samples", type=click.IntRange(min=2), default=64, show_default=True,
              help="Monte-Carlo samples per position where needed.")
@click.option("--title", default="Draft-strategy study", show_default=True, help="Report title.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out directory.")
@c.quiet_option
@c.friendly_errors
def report(caches, out_dir, attention, cost_profiles, cost, batches, budgets, families, sample_families, model_free,
           multi_draft, samples, title, overwrite, quiet) -> None:
    """Simulate the draft-strategy study on CACHE(s) and write an offline HTML report.

    Sweeps tree families (chain, the first N nodes of the binary tree, halving
    widths, the data-optimal tree, model-free n-gram / prompt-lookup chains) over
    the budgets, at every recorded temperature, for every recorded draft; compares
    chains with Leviathan et al.'s closed form at the measured acceptance; charts
    everything as PNG + SVG; writes the tables as Parquet + CSV; and states the
    findings in words computed from the data. index.html embeds every chart and
    needs no network. The report is written to a temporary directory and moved into
    place at the end, so an interrupted run never leaves half a report.

    \b
    Examples:
      specsim report cache/demo.h5 --out reports/demo
      specsim report cache/study-qwen.h5 cache/study-smollm2.h5 --out reports/study \\
          --attention attention.parquet --cost-profile qwen-profile.json --cost-profile smollm2-profile.json
      specsim report cache/demo.h5 --out reports/quick --budget 1,4,16 --model-free ''
    """
    from specsim.report.html import check_report_out, write_report
    from specsim.report.study import StudyConfig, run_study

    check_report_out(out_dir, overwrite=overwrite)  # before the study runs, not after
    defaults = StudyConfig()
    config = replace(defaults, budgets=tuple(budgets) or defaults.budgets, families=tuple(families),
                     sample_families=tuple(sample_families), model_free=tuple(model_free),
                     multi_draft=multi_draft, samples=samples, cost=cost, batches=tuple(batches) or defaults.batches)
    table = None
    if attention is not None:
        table = _read_attention(attention)
    study = run_study(caches, config, cost_profiles=cost_profiles, attention=table, progress=not quiet)
    command = "specsim report " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else ""
    index = write_report(study, out_dir, title=title, command=command, progress=not quiet, overwrite=overwrite)
    n_configs = study.results.filter(study.results["category"] == "all").height if not study.results.is_empty() else 0
    click.echo(f"wrote {index} ({n_configs} configurations over {len(caches)} cache(s); "
               f"charts in {out_dir / 'charts'}, tables in {out_dir / 'tables'})")
    for note in study.notes:
        click.echo(f"note: {note}")


def _read_attention(path: Path):
    import polars as pl

    from specsim.errors import SpecError

    try:
        table = pl.read_parquet(path) if path.suffix == ".parquet" else pl.read_csv(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise SpecError(f"--attention {path}: cannot read a table ({exc})") from None
    needed = {"impl", "B", "L", "N", "shape", "median_ms", "check_passed", "device", "dtype"}
    missing = sorted(needed - set(table.columns))
    if missing:
        raise SpecError(f"--attention {path}: not a `specsim bench-attention` table (missing {', '.join(missing)})")
    return table

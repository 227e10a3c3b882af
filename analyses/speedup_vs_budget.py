"""Speedup vs draft budget from measured step times (or, labelled, an assumed cost) (report section 6).

    python -m analyses.speedup_vs_budget reports/demo/tables --out reports/demo/charts
"""

import click
from analyses._tables import command, read

from specsim.report.charts import metric_vs_budget


def build(tables):
    results = read(tables, "results")
    metric = next((m for m in ("speedup", "speedup_assumed") if m in results.columns), None)
    if metric is None:
        raise click.ClickException(f"{tables}: the report had no costs (no speedup column); "
                                   "make it with --cost-profile")
    basis = "; ".join(sorted(set(results["cost_basis"].drop_nulls().to_list())))
    return metric_vs_budget(results, metric, cost_basis=basis)


main = command("speedup_vs_budget", __doc__, build)

if __name__ == "__main__":
    main()

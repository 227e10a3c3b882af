"""Estimated speedup vs draft budget under the report's cost model (report section 6).

    python analyses/speedup_vs_budget.py reports/demo/tables --out reports/demo/charts
"""

from _tables import command, read

from specsim.report.charts import metric_vs_budget


def build(tables):
    results = read(tables, "results")
    return metric_vs_budget(results, "speedup", cost_model=results["cost_model"][0])


main = command("speedup_vs_budget", __doc__, build)

if __name__ == "__main__":
    main()

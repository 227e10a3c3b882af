"""Tokens per target call vs draft budget, one line per tree family (report section 3).

    python -m analyses.tokens_per_call_vs_budget reports/demo/tables --out reports/demo/charts
"""

from analyses._tables import command, read

from specsim.report.charts import metric_vs_budget

main = command("tokens_per_call_vs_budget", __doc__, lambda tables: metric_vs_budget(read(tables, "results"), "tokens_per_call"))

if __name__ == "__main__":
    main()

"""Acceptance rate (accepted / drafted) vs draft budget, one line per tree family (report section 3).

    python -m analyses.acceptance_rate_vs_budget reports/demo/tables --out reports/demo/charts
"""

from analyses._tables import command, read

from specsim.report.charts import metric_vs_budget

main = command("acceptance_rate_vs_budget", __doc__, lambda tables: metric_vs_budget(read(tables, "results"), "accept_rate"))

if __name__ == "__main__":
    main()

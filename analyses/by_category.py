"""Tokens per call by prompt category: which tasks speculate well (report section 4).

    python -m analyses.by_category reports/demo/tables --out reports/demo/charts
"""

from analyses._tables import command, read

from specsim.report.charts import by_category

main = command("by_category", __doc__, lambda tables: by_category(read(tables, "results")))

if __name__ == "__main__":
    main()

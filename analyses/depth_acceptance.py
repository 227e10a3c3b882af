"""Per-depth acceptance P(A >= d) of each tree family at one budget (report section 4).

    python -m analyses.depth_acceptance reports/demo/tables --out reports/demo/charts
"""

from analyses._tables import command, read

from specsim.report.charts import depth_acceptance

main = command("depth_acceptance", __doc__, lambda tables: depth_acceptance(read(tables, "depth_acceptance")))

if __name__ == "__main__":
    main()

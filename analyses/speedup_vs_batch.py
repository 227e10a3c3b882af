"""Speedup vs batch size, with the best draft budget chosen at each batch size (report section 6).

    python -m analyses.speedup_vs_batch reports/demo/tables --out reports/demo/charts
"""

from analyses._tables import command, read

from specsim.report.charts import speedup_vs_batch


def build(tables):
    return speedup_vs_batch(read(tables, "batch"))


main = command("speedup_vs_batch", __doc__, build)

if __name__ == "__main__":
    main()

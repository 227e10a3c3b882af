"""Leviathan et al.'s improvement over acceptance x draft cost ratio x draft length (report section 5).

    python -m analyses.speedup_grid reports/demo/tables --out reports/demo/charts
"""

from analyses._tables import command, read

from specsim.report.charts import speedup_grid

main = command("speedup_grid", __doc__, lambda tables: speedup_grid(read(tables, "speedup_grid")))

if __name__ == "__main__":
    main()

"""Simulated chains vs Leviathan et al.'s closed form at the measured acceptance (report section 5).

    python -m analyses.theory_vs_simulated reports/demo/tables --out reports/demo/charts
"""

from analyses._tables import command, read

from specsim.report.charts import theory_vs_simulated

main = command("theory_vs_simulated", __doc__, lambda tables: theory_vs_simulated(read(tables, "theory")))

if __name__ == "__main__":
    main()

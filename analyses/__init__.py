"""The study's charts, one module each, redrawn from a report's tables: `python -m analyses.NAME TABLES`."""

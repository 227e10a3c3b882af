"""Analysis: altair charts and the self-contained HTML report."""

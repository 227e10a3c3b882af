"""Charts of a tree-attention timing sweep (altair, saved as PNG and SVG via vl-convert).

Three views of one `bench-attention` table: how each implementation's time grows
with the context, how much each saves over one-call-per-branch as the tree grows,
and where in batch x tree size those savings hold. Only rows that passed the
equality check and were timed are drawn; titles name the device, dtype and the
slice of the sweep each chart shows.
"""

from __future__ import annotations

from pathlib import Path

import altair as alt
import polars as pl


def with_speedups(table: pl.DataFrame) -> pl.DataFrame:
    """Add `speedup_vs_per_branch`: per-branch median / this median at the same (B, L, N, shape)."""
    keys = ["device", "dtype", "B", "L", "N", "shape"]
    base = table.filter(pl.col("impl") == "per_branch").select(*keys, pl.col("median_ms").alias("_per_branch_ms"))
    return table.join(base, on=keys, how="left").with_columns(
        (pl.col("_per_branch_ms") / pl.col("median_ms")).alias("speedup_vs_per_branch")
    ).drop("_per_branch_ms")


IMPL_ORDER = ["per_branch", "dense", "flex", "lse_merge", "causal"]


def _timed(table: pl.DataFrame) -> pl.DataFrame:
    return table.filter(pl.col("check_passed") & pl.col("median_ms").is_not_null())


def _subtitle(table: pl.DataFrame, bars: bool = False, **fixed) -> str:
    first = table.row(0, named=True)
    parts = [first["device"], first["dtype"], f"heads {first['heads']}/{first['kv_heads']} x {first['head_dim']}"]
    parts += [f"{k}={v}" for k, v in fixed.items()]
    return " | ".join(parts) + f" | median of {first['repeats']} calls" + (" (bars: p10-p90)" if bars else "")


def time_vs_context(table: pl.DataFrame) -> alt.Chart:
    """Median time per call against context length, one line per implementation (largest batch)."""
    data = _timed(table)
    batch = int(data["B"].max())
    data = data.filter(pl.col("B") == batch)
    base = alt.Chart().encode(
        x=alt.X("L:Q", scale=alt.Scale(type="log", base=2), title="context length L (tokens)"),
        color=alt.Color("impl:N", sort=IMPL_ORDER, title="implementation"),
    )
    lines = base.mark_line(point=True).encode(
        y=alt.Y("median_ms:Q", scale=alt.Scale(type="log"), title="median time per call (ms)"),
        tooltip=["impl", "B", "L", "N", "shape", "median_ms", "p10_ms", "p90_ms", "calls"],
    )
    bars = base.mark_rule().encode(y="p10_ms:Q", y2="p90_ms:Q")
    return alt.layer(lines, bars, data=data).properties(width=180, height=140).facet(
        column=alt.Column("N:O", title="tree nodes N"), row=alt.Row("shape:N", title="tree shape")
    ).properties(title=alt.Title("Tree attention time vs context length",
                                 subtitle=_subtitle(table, bars=True, B=batch)))


def speedup_vs_tree_size(table: pl.DataFrame) -> alt.Chart:
    """Speedup over per-branch against tree size (largest batch and context)."""
    data = _timed(with_speedups(table)).filter(pl.col("speedup_vs_per_branch").is_not_null())
    batch, context = int(data["B"].max()), int(data["L"].max())
    data = data.filter((pl.col("B") == batch) & (pl.col("L") == context))
    lines = alt.Chart().mark_line(point=True).encode(
        x=alt.X("N:Q", scale=alt.Scale(type="log", base=2), title="tree nodes N (root included)"),
        y=alt.Y("speedup_vs_per_branch:Q", scale=alt.Scale(type="log"), title="speedup over per-branch (x)"),
        color=alt.Color("impl:N", sort=IMPL_ORDER, title="implementation"),
        tooltip=["impl", "N", "shape", "calls", "median_ms", "speedup_vs_per_branch"],
    )
    one = alt.Chart().mark_rule(strokeDash=[4, 4], color="gray").encode(y=alt.datum(1))
    return alt.layer(lines, one, data=data).properties(width=200, height=160).facet(
        column=alt.Column("shape:N", title="tree shape")
    ).properties(title=alt.Title("Speedup over one call per branch",
                                 subtitle=_subtitle(table, B=batch, L=context)))


def speedup_heatmap(table: pl.DataFrame) -> alt.Chart:
    """Speedup over per-branch over batch x tree size, one panel per implementation."""
    data = _timed(with_speedups(table)).filter(
        pl.col("speedup_vs_per_branch").is_not_null() & (pl.col("impl") != "per_branch")
    )
    context = int(data["L"].max())
    shapes = data["shape"].unique().to_list()
    shape = next((s for s in ("kary2", "widths", "kary4", "star") if s in shapes), shapes[0])
    data = data.filter((pl.col("L") == context) & (pl.col("shape") == shape))
    base = alt.Chart().encode(
        x=alt.X("N:O", title="tree nodes N"), y=alt.Y("B:O", title="batch size B", sort="descending")
    )
    cells = base.mark_rect().encode(
        color=alt.Color("speedup_vs_per_branch:Q", title="speedup (x)",
                        scale=alt.Scale(type="log", scheme="redyellowgreen", domainMid=1)),
        tooltip=["impl", "B", "N", "median_ms", "speedup_vs_per_branch"],
    )
    labels = base.mark_text(fontSize=10).encode(text=alt.Text("speedup_vs_per_branch:Q", format=".1f"))
    return alt.layer(cells, labels, data=data).properties(width=160, height=120).facet(
        column=alt.Column("impl:N", sort=IMPL_ORDER, title="implementation")
    ).properties(title=alt.Title("Speedup over per-branch, batch x tree size",
                                 subtitle=_subtitle(table, L=context, shape=shape)))


CHARTS = {
    "time_vs_context": time_vs_context,
    "speedup_vs_tree_size": speedup_vs_tree_size,
    "speedup_heatmap": speedup_heatmap,
}


def save_charts(table: pl.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write every chart as NAME.png and NAME.svg under `out_dir`; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if _timed(table).is_empty():
        return []
    written = []
    for name, build in CHARTS.items():
        chart = build(table)
        for suffix in (".png", ".svg"):
            path = out_dir / f"{name}{suffix}"
            chart.save(str(path), **({"scale_factor": 2} if suffix == ".png" else {}))
            written.append(path)
    return written

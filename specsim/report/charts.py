"""Charts of the draft-strategy study (altair; saved as PNG and SVG through vl-convert).

One builder per question the report asks, each taking a study table
(`specsim.report.study`) and returning a Vega-Lite chart whose subtitle says what
it was computed from: prompts and positions, models, exact or Monte-Carlo.

* tokens per call / acceptance rate vs budget, one line per tree family, 95% bands;
* per-depth acceptance P(A ≥ d) of each family at one budget;
* tokens per call by prompt category (which tasks speculate well);
* simulated chains against Leviathan et al.'s closed form at the measured α;
* Leviathan's improvement over α × draft cost ratio × draft length;
* speedup vs budget (measured, or labelled ASSUMED) and vs batch size (measured).

Tree-attention timing charts live in `specsim.attention.timing_charts` and are reused as is.
"""

from __future__ import annotations

from pathlib import Path

import altair as alt
import polars as pl

ALL = "all"
FAMILY_ORDER = ["chain", "kary:2", "widths", "optimal", "dynamic", "ngram:3", "prompt-lookup:2", "suffix"]
FAMILY_TITLE = "tree family"
WIDTH, HEIGHT = 230, 160  # one facet panel, in pixels
FACET_COLUMNS = 3  # panels per row
SUBTITLE_CHARS = 110  # subtitle lines wrap here (vl-convert cuts lines wider than the chart)


def _family_sort(table: pl.DataFrame) -> list[str]:
    present = table["family"].unique().to_list()
    return [f for f in FAMILY_ORDER if f in present] + sorted(f for f in present if f not in FAMILY_ORDER)


def with_setting(table: pl.DataFrame) -> pl.DataFrame:
    """Add `setting` = 'T=0 greedy' / 'T=0.7 sample' (a temperature's label) and, with a pair,
    `panel` = 'int8 → smollm2-135m · T=0 greedy' (one facet panel)."""
    table = table.with_columns(
        pl.format("T={} {}", pl.col("temperature").round(3).cast(pl.String).str.replace(r"\.0$", ""),
                  pl.col("policy")).alias("setting")
    )
    if "pair" in table.columns:
        table = table.with_columns(pl.format("{} · {}", pl.col("pair"), pl.col("setting")).alias("panel"))
    return table


def panel_order(table: pl.DataFrame) -> list[str]:
    """Facet panels: model drafts in the order they first appear (the main pair first), model-free last."""
    rows = table.select("pair", "setting", "panel").unique(maintain_order=True)
    pairs = list(dict.fromkeys(rows["pair"].to_list()))
    pairs.sort(key=lambda p: p.startswith("model-free"))  # stable: keeps first-appearance order otherwise
    settings = sorted(set(rows["setting"].to_list()))
    present = set(rows["panel"].to_list())
    return [f"{p} · {s}" for p in pairs for s in settings if f"{p} · {s}" in present]


def estimate_note(table: pl.DataFrame, bands: bool = True, metric: str = "tokens_per_call") -> str:
    """'exact' / 'Monte-Carlo (SE in the tables)' / both, and what the bands are (or that there are none)."""
    kinds = set(table["estimate"].unique().to_list()) if "estimate" in table.columns else {"exact"}
    if kinds == {"exact"}:
        text = "exact expectations on the cached trajectories (no Monte-Carlo noise)"
    elif kinds == {"monte-carlo"}:
        text = "Monte-Carlo estimates (standard errors in the tables)"
    else:
        text = "exact, except sampling trees drawn without replacement (Monte-Carlo, SE in the tables)"
    return text + (f"; {ci_note(table, metric)}" if bands else "")


def provenance(table: pl.DataFrame) -> str:
    """'4 prompts, 96 positions (T=0), int8 → smollm2-135m, …' for a subtitle."""
    rows = table.filter(pl.col("category") == ALL) if "category" in table.columns else table
    pairs = rows["pair"].unique(maintain_order=True).to_list()
    return _counts(rows) + " | " + ", ".join(pairs)


def _title(text: str, *subtitle: str) -> alt.Title:
    import textwrap

    lines = [line for s in subtitle if s for line in textwrap.wrap(s, SUBTITLE_CHARS)]
    return alt.Title(text, subtitle=lines, anchor="start")


def _facet(chart: alt.LayerChart, table: pl.DataFrame, *, width=WIDTH, height=HEIGHT) -> alt.FacetChart:
    """One panel per (pair, setting) that has data, wrapped in rows: no empty panels, the main pair first."""
    order = panel_order(table)
    return chart.properties(width=width, height=height).facet(
        facet=alt.Facet("panel:N", sort=order, title=None,
                        header=alt.Header(labelFontWeight="bold", labelFontSize=11, labelLimit=0)),
        columns=facet_columns(len(order)),
    ).resolve_axis(x="independent")  # each panel its own x axis: no bare axes under the empty cells of the last row


def facet_columns(n: int) -> int:
    """Columns for n panels: FACET_COLUMNS, or a 2 x 2 grid for four (rather than 3 + 1)."""
    return 2 if n == 4 else max(1, min(n, FACET_COLUMNS))


def ci_note(table: pl.DataFrame, metric: str = "tokens_per_call") -> str:
    """What the bands are, or that there are none (a single prompt has no bootstrap interval)."""
    lo = f"{metric}_lo"
    if lo in table.columns and table[lo].drop_nans().drop_nulls().len() == 0:
        return "no CI (n = 1 prompt): no bands"
    return "bands: 95% bootstrap over prompts (expanded percentile)"


METRICS = {
    "tokens_per_call": "tokens per target call",
    "accept_rate": "acceptance rate (accepted / drafted)",
    "speedup": "speedup (measured costs)",
    "speedup_assumed": "speedup (ASSUMED cost)",
}


def metric_vs_budget(results: pl.DataFrame, metric: str = "tokens_per_call", *, cost_basis: str = "") -> alt.FacetChart:
    """One line per tree family of `metric` against the draft budget, with its 95% band."""
    data = with_setting(results.filter((pl.col("category") == ALL) & pl.col(metric).is_not_null())).select(
        "pair", "setting", "panel", "family", "tree", "budget", "n_prompts", "n_positions", "estimate",
        metric, f"{metric}_lo", f"{metric}_hi")
    sort = _family_sort(data)
    x = alt.X("budget:Q", scale=alt.Scale(type="log", base=2), title="draft tokens per call (budget, log scale)",
              axis=alt.Axis(values=sorted(data["budget"].unique().to_list()), format="d"))
    color = alt.Color("family:N", sort=sort, title=FAMILY_TITLE)
    # the band fills by family on its own channel, so the legend shows the lines' colours, not faint swatches
    band = alt.Chart().mark_area(opacity=0.18).encode(
        x=x, y=f"{metric}_lo:Q", y2=f"{metric}_hi:Q", fill=alt.Fill("family:N", sort=sort, legend=None))
    line = alt.Chart().mark_line(point=True).encode(
        x=x, y=alt.Y(f"{metric}:Q", title=METRICS[metric]), color=color,
        tooltip=["pair", "setting", "tree", "budget", alt.Tooltip(f"{metric}:Q", format=".3f"),
                 alt.Tooltip(f"{metric}_lo:Q", format=".3f"), alt.Tooltip(f"{metric}_hi:Q", format=".3f"),
                 "estimate", "n_prompts", "n_positions"])
    layers = [band, line]
    speed = metric.startswith("speedup")
    if speed:
        layers.append(alt.Chart().mark_rule(strokeDash=[4, 4], color="gray").encode(y=alt.datum(1)))
    names = {"tokens_per_call": "Tokens per target call vs draft budget",
             "accept_rate": "Acceptance rate vs draft budget",
             "speedup": "Speedup vs draft budget, from measured step times (batch 1)",
             "speedup_assumed": "Speedup vs draft budget, from an ASSUMED cost — not measured"}
    return _facet(alt.layer(*layers, data=data), data).properties(
        title=_title(names[metric], provenance(results), estimate_note(data, metric=metric),
                     (f"costs: {cost_basis}" if metric == "speedup" else f"ASSUMED, not measured: {cost_basis}")
                     if speed else ""))


def speedup_vs_batch(batch: pl.DataFrame) -> alt.FacetChart:
    """The best speedup at each batch size (the best budget chosen per batch), one line per draft, 95% band."""
    data = with_setting(batch).with_columns(pl.format("{} ({})", pl.col("budget"), pl.col("tree")).alias("choice"))
    x = alt.X("batch:Q", scale=alt.Scale(type="log", base=2), title="batch size (requests per step, log scale)",
              axis=alt.Axis(values=sorted(data["batch"].unique().to_list()), format="d"))
    color = alt.Color("pair:N", title="draft → target")
    band = alt.Chart().mark_area(opacity=0.18).encode(x=x, y="speedup_lo:Q", y2="speedup_hi:Q",
                                                       fill=alt.Fill("pair:N", legend=None))
    line = alt.Chart().mark_line(point=True).encode(
        x=x, y=alt.Y("speedup:Q", title="speedup over plain batched decoding"), color=color,
        tooltip=["pair", "setting", "batch", "choice", alt.Tooltip("speedup:Q", format=".3f"),
                 alt.Tooltip("speedup_lo:Q", format=".3f"), alt.Tooltip("speedup_hi:Q", format=".3f"),
                 alt.Tooltip("tokens_per_s:Q", format=".1f")])
    text = alt.Chart().mark_text(dy=-9, fontSize=9).encode(x=x, y="speedup:Q", text="budget:Q", color=color)
    rule = alt.Chart().mark_rule(strokeDash=[4, 4], color="gray").encode(y=alt.datum(1))
    chart = alt.layer(band, line, text, rule, data=data).properties(width=WIDTH, height=HEIGHT).facet(
        column=alt.Column("setting:N", title="temperature, verification"))
    first = data.row(0, named=True)
    return chart.properties(title=_title(
        "Speedup vs batch size, best draft budget at each (labels: budget)",
        f"measured costs: {first['cost_basis']}",
        f"{first['batching']} batching; bands: 95% bootstrap replicates of the batch schedule"))


def pick_budget(budgets, wanted: int = 8) -> int:
    """The budget closest to `wanted` (on a log scale) among those simulated; ties go to the larger."""
    import math

    return min(budgets, key=lambda b: (abs(math.log2(b) - math.log2(wanted)), -b))


def depth_acceptance(depth: pl.DataFrame, budget: int | None = None) -> alt.FacetChart:
    """P(A ≥ d) per call against depth d, one line per family, at one budget."""
    data = depth.filter(pl.col("category") == ALL)
    budget = budget or pick_budget(data["budget"].unique().to_list())
    data = with_setting(data.filter(pl.col("budget") == budget))
    x = alt.X("d:Q", title="depth d (draft position in the call)", axis=alt.Axis(tickMinStep=1, format="d"))
    chart = alt.Chart(data).mark_line(point=True).encode(
        x=x, y=alt.Y("p_accept_at_least_d:Q", title="P(at least d drafts accepted)", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("family:N", sort=_family_sort(data), title=FAMILY_TITLE),
        tooltip=["pair", "setting", "tree", "d", alt.Tooltip("p_accept_at_least_d:Q", format=".3f")],
    )
    return _facet(chart, data).properties(
        title=_title(f"Per-depth acceptance at a budget of {budget} draft tokens",
                     provenance(depth), estimate_note(data, bands=False)))


def by_category(results: pl.DataFrame, family: str | None = None, budget: int | None = None) -> alt.FacetChart:
    """Tokens per call per prompt category (95% interval), for one family at one budget."""
    families = results["family"].unique().to_list()
    family = family or next((f for f in ("optimal", "chain") if f in families), families[0])
    rows = results.filter(pl.col("family") == family)
    budget = budget or pick_budget(rows["budget"].unique().to_list())
    data = with_setting(rows.filter(pl.col("budget") == budget)).select(
        "pair", "setting", "panel", "category", "tree", "tokens_per_call", "tokens_per_call_lo", "tokens_per_call_hi",
        "n_prompts", "n_positions")
    order = (data.filter(pl.col("category") != ALL).group_by("category").agg(pl.col("tokens_per_call").mean())
             .sort("tokens_per_call", descending=True)["category"].to_list()) + [ALL]
    y = alt.Y("category:N", sort=order, title="prompt category")
    bars = alt.Chart().mark_rule(strokeWidth=2).encode(
        x=alt.X("tokens_per_call_lo:Q", title="tokens per target call", scale=alt.Scale(zero=False)),
        x2="tokens_per_call_hi:Q", y=y, color=alt.Color("pair:N", title="draft → target"))
    points = alt.Chart().mark_point(filled=True, size=50).encode(
        x="tokens_per_call:Q", y=y, color=alt.Color("pair:N", title="draft → target"),
        tooltip=["pair", "setting", "category", "tree", alt.Tooltip("tokens_per_call:Q", format=".3f"),
                 "n_prompts", "n_positions"])
    labels = alt.Chart().mark_text(align="left", dx=8, dy=-7, fontSize=9, color="gray").encode(
        x="tokens_per_call:Q", y=y, text=alt.Text("n_prompts:Q", format="d"))
    return _facet(alt.layer(bars, points, labels, data=data), data, width=WIDTH + 40, height=alt.Step(14)
                  ).properties(title=_title(
        f"Which tasks speculate well: {family} tree, {budget} draft tokens, by prompt category",
        provenance(results), "dots: tokens per call; bars: 95% bootstrap over the category's prompts (none with one prompt); "
        "grey numbers: prompts in the category"))


def theory_vs_simulated(theory: pl.DataFrame) -> alt.FacetChart:
    """Simulated chain tokens per call against Leviathan's closed form at the measured α."""
    data = with_setting(theory)
    sim = data.select("pair", "setting", "panel", "gamma", "alpha", pl.lit("simulated on the cache").alias("source"),
                      pl.col("tokens_per_call").alias("value"), pl.col("tokens_per_call_lo").alias("lo"),
                      pl.col("tokens_per_call_hi").alias("hi"))
    closed = data.select("pair", "setting", "panel", "gamma", "alpha", pl.lit("closed form at measured α").alias("source"),
                         pl.col("closed_form_tokens_per_call").alias("value"), pl.lit(None, pl.Float64).alias("lo"),
                         pl.lit(None, pl.Float64).alias("hi"))
    both = pl.concat([sim, closed])
    x = alt.X("gamma:Q", scale=alt.Scale(type="log", base=2), title="chain length γ (draft tokens, log scale)",
              axis=alt.Axis(values=sorted(data["gamma"].unique().to_list()), format="d"))
    color = alt.Color("source:N", title=None, scale=alt.Scale(range=["#d62728", "#1f77b4"]),
                      legend=alt.Legend(symbolType="stroke", symbolStrokeWidth=3, symbolSize=300))
    band = alt.Chart().mark_area(opacity=0.2, color="#1f77b4").encode(x=x, y="lo:Q", y2="hi:Q")
    line = alt.Chart().mark_line(point=True).encode(
        x=x, y=alt.Y("value:Q", title="tokens per target call"), color=color,
        strokeDash=alt.StrokeDash("source:N", legend=None, scale=alt.Scale(range=[[5, 3], [1, 0]])),
        tooltip=["pair", "setting", "source", "gamma", alt.Tooltip("value:Q", format=".3f"),
                 alt.Tooltip("alpha:Q", format=".3f")])
    label = alt.Chart().mark_text(align="left", x=5, y=8, fontSize=10).encode(
        text=alt.Text("alpha_text:N")).transform_filter(alt.datum.gamma == min(data["gamma"].to_list()))
    both = both.with_columns(pl.format("measured α = {}", pl.col("alpha").round(3)).alias("alpha_text"))
    return _facet(alt.layer(band, line, label.transform_filter(alt.datum.source == "simulated on the cache"),
                            data=both), both).properties(
        title=_title("Simulated chains vs Leviathan et al.'s closed form (1 − α^(γ+1)) / (1 − α)",
                     "α measured per position over every cached position (greedy: draft's top token = target's; "
                     "sampling: mean min(1, q/p))",
                     f"{_counts(data)}; {ci_note(data).replace('bands:', 'band (simulated):')}; simulated curves "
                     "include the end of each trajectory"))


def _counts(table: pl.DataFrame) -> str:
    per_t = table.group_by("temperature").agg(pl.col("n_prompts").max(), pl.col("n_positions").max()).sort("temperature")
    return "; ".join(f"T={T:g}: {a} prompts, {b} positions" for T, a, b in per_t.iter_rows())


def speedup_grid(grid: pl.DataFrame) -> alt.FacetChart:
    """Leviathan's improvement factor over acceptance α × draft length γ, one panel per cost ratio c."""
    base = alt.Chart().encode(
        x=alt.X("gamma:O", title="draft length γ (tokens)"),
        y=alt.Y("alpha:O", title="acceptance rate α", sort="descending"),
    )
    cells = base.mark_rect().encode(
        color=alt.Color("improvement:Q", title="improvement (x)",
                        scale=alt.Scale(type="log", scheme="redyellowgreen", domainMid=1)),
        tooltip=["alpha", "c", "gamma", alt.Tooltip("improvement:Q", format=".2f"),
                 alt.Tooltip("tokens_per_call:Q", format=".2f")])
    best = base.mark_rect(fill=None, stroke="black", strokeWidth=2).transform_filter(alt.datum.best_gamma)
    text = base.mark_text(fontSize=8).encode(text=alt.Text("improvement:Q", format=".1f"))
    return alt.layer(cells, best, text, data=grid).properties(width=170, height=130).facet(
        column=alt.Column("c:O", title="draft step cost / target step cost (c)")
    ).properties(title=_title(
        "Leviathan et al. (2023): improvement = (1 − α^(γ+1)) / ((1 − α)(γc + 1))",
        "closed form (i.i.d. acceptance, verification cost flat); black boxes: the best γ for each α and c"))


def save(chart: alt.TopLevelMixin, out_dir: str | Path, name: str) -> list[Path]:
    """Write NAME.png (2x) and NAME.svg; returns both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    chart = chart.configure_legend(labelLimit=0, titleLimit=0).configure_header(labelLimit=0, titleLimit=0)
    chart.save(str(paths[0]), scale_factor=2)
    chart.save(str(paths[1]))
    return paths

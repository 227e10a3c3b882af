"""A self-contained HTML report of a draft-strategy study.

`write_report` renders every chart of `specsim.report.charts` (and the attention
sweep charts of `specsim.attention.timing_charts` when a timing table is given) to PNG
and SVG, writes the study's tables as Parquet and CSV, and assembles
``index.html``: the PNGs are inlined as base64 data URIs and the page has no
script and no external reference, so it opens offline, from a mail attachment or
a CI artifact. Sections follow the questions of the study: setup, tree shapes,
acceptance vs budget, per-depth and per-category acceptance, theory vs
simulation, attention timing and speedup, and the computed analysis.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import polars as pl

from specsim.checks import few_prompts_caveat
from specsim.errors import SpecError
from specsim.files import check_writable
from specsim.report import charts
from specsim.report.findings import grouped_findings, summary
from specsim.report.study import Study, per_depth, write_tables

SECTIONS = (
    "Summary",
    "1. Setup",
    "2. Acceptance vs draft budget",
    "3. Per-depth acceptance and prompt categories",
    "4. Theory vs simulation",
    "5. Speed: measured costs, batch sizes, tree attention",
    "6. Findings",
    "7. Draft trees",
)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1400px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0 1em}td,th{border:1px solid #ddd;padding:.25em .5em;
text-align:left}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1em 0 2em}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}.trees{display:flex;flex-wrap:wrap;gap:1em}
.trees div{border:1px solid #ddd;padding:.5em}.trees pre{font-size:.8em;line-height:1.15;margin:.3em 0}
.note{color:#555;font-size:.9em}li{margin-bottom:.4em}h3{margin:1.2em 0 .3em;font-size:1.05em}
details{margin:.5em 0}summary{cursor:pointer;color:#333}.scroll{overflow-x:auto;max-width:100%}
"""


@dataclass(frozen=True)
class Figure:
    """A chart written as PNG + SVG, with the caption that says what it shows."""

    name: str  # file stem under charts/
    caption: str  # what it was computed from
    png: Path  # the PNG on disk (inlined into the page)


def _table_html(table: pl.DataFrame, columns: list[str] | None = None, digits: int = 4) -> str:
    table = table.select(columns) if columns else table
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = []
    for row in table.iter_rows():
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append(f'<td class="num">{v:.{digits}g}</td>')
            elif isinstance(v, int) and not isinstance(v, bool):
                cells.append(f'<td class="num">{v}</td>')
            else:
                cells.append(f"<td>{html.escape('' if v is None else str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
            "</div>")


def _figure_html(fig: Figure) -> str:
    data = base64.b64encode(fig.png.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(fig.name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(fig.caption)} — files: charts/{fig.name}.png, charts/{fig.name}.svg"
            "</figcaption></figure>")


def _plan(study: Study) -> list[tuple[int, str, Callable[[], object], str]]:
    """(section index, chart name, builder, caption) of every chart the study supports."""
    res, plan = study.results, []
    if not res.is_empty():
        src = charts.provenance(res)
        plan += [
            (2, "tokens_per_call_vs_budget", lambda: charts.metric_vs_budget(res, "tokens_per_call"),
             f"Tokens per target call (accepted drafts + 1) vs budget; {src}; {charts.estimate_note(res)}."),
            (2, "acceptance_rate_vs_budget", lambda: charts.metric_vs_budget(res, "accept_rate"),
             f"Acceptance rate (accepted / drafted tokens) vs budget; {src}; {charts.estimate_note(res)}."),
            (3, "depth_acceptance", lambda: charts.depth_acceptance(per_depth(res)),
             f"P(A ≥ d) per target call; {src}."),
            (3, "by_category", lambda: charts.by_category(res),
             f"Tokens per call per prompt category; {src}; bars: 95% bootstrap over the category's prompts."),
        ]
    if not study.theory.is_empty():
        plan.append((4, "theory_vs_simulated", lambda: charts.theory_vs_simulated(study.theory),
                     "Simulated chains vs Leviathan et al.'s closed form at the α measured on the same positions."))
    plan.append((4, "speedup_grid", lambda: charts.speedup_grid(study.grid),
                 "Closed-form improvement over α × γ × c (no data: the classic analysis table)."))
    basis = "; ".join(f"{k}: {v}" for k, v in study.cost_basis.items())
    if study.measured:
        plan.append((5, "speedup_vs_budget", lambda: charts.metric_vs_budget(res, "speedup", cost_basis=basis),
                     f"Speedup = plain decoding time / speculative decoding time of the cached trajectories, every "
                     f"call priced by a measured profile; {basis}; {charts.provenance(res)}."))
    if study.assumed:
        plan.append((5, "speedup_assumed_vs_budget",
                     lambda: charts.metric_vs_budget(res, "speedup_assumed", cost_basis=basis),
                     f"Speedup from an ASSUMED cost, not measured; {basis}; {charts.provenance(res)}."))
    if not study.batch.is_empty():
        plan.append((5, "speedup_vs_batch", lambda: charts.speedup_vs_batch(study.batch),
                     "The best speedup at each batch size, choosing the best draft budget per batch; measured "
                     "costs; bands: 95% bootstrap replicates of the batch schedule."))
    if study.attention is not None:
        from specsim.attention import timing_charts as attention_charts

        timed = study.attention.filter(pl.col("check_passed") & pl.col("median_ms").is_not_null())
        if not timed.is_empty():
            first = timed.row(0, named=True)
            where = f"measured on {first['device']}, {first['dtype']}, median of {first['repeats']} calls"
            for name, build in attention_charts.CHARTS.items():
                plan.append((5, f"attention_{name}", lambda build=build: build(study.attention),
                             f"Tree-attention timing sweep ({name.replace('_', ' ')}), {where}."))
    return plan


def check_report_out(out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """SpecError unless out_dir can be written: not a file, not there already (without overwrite), writable."""

    out_dir = Path(out_dir)
    if not str(out_dir).strip():
        raise SpecError("--out: an empty path; give a directory such as reports/demo")
    if out_dir.exists() and not out_dir.is_dir():
        raise SpecError(f"--out {out_dir} is a file; give a directory")
    if out_dir.exists() and not overwrite:
        raise SpecError(f"--out {out_dir} exists; pass --overwrite to replace it")
    return check_writable("--out", out_dir)


def write_report(study: Study, out_dir: str | Path, *, title: str = "Draft-strategy study",
                 command: str = "", progress: bool = True, overwrite: bool = False) -> Path:
    """Write charts/, tables/ and index.html under out_dir; returns the index path.

    Everything is written into a temporary directory beside out_dir and renamed into place at
    the end: an interrupted report leaves nothing half-written (and an old report intact).
    """
    import os
    import shutil
    import tempfile

    final = check_report_out(out_dir, overwrite=overwrite)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.writing-", dir=final.parent))
    try:
        _write(study, work, title=title, command=command, progress=progress)
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(work, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final / "index.html"


def _write(study: Study, out_dir: Path, *, title: str, command: str, progress: bool) -> None:
    from tqdm.auto import tqdm

    chart_dir = out_dir / "charts"
    tables = write_tables(study, out_dir)
    figures: dict[int, list[Figure]] = {}
    plan = _plan(study)
    for section, name, build, caption in tqdm(plan, desc="report: charts", unit="chart", disable=not progress,
                                              dynamic_ncols=True):
        png, _svg = charts.save(build(), chart_dir, name)
        figures.setdefault(section, []).append(Figure(name, caption, png))
    page = _page(study, figures, tables, title=title, command=command)
    (out_dir / "index.html").write_text(page, encoding="utf-8")


def _page(study: Study, figures: dict[int, list[Figure]], tables: list[Path], *, title: str, command: str) -> str:
    body = [f"<h1>{html.escape(title)}</h1>"]
    if command:
        body.append(f'<p class="note">Generated by <code>{html.escape(command)}</code>. '
                    "Tables: " + ", ".join(sorted({f"tables/{p.name}" for p in tables if p.suffix == ".csv"}))
                    + " (and .parquet).</p>")
    sections = [_summary(study), _setup(study), _equal_budget(study) + _heads(study) + _bound(study) + _block(study),
                "", "",
                _attention_text(study), _analysis(study), _trees(study)]
    for i, heading in enumerate(SECTIONS):
        body.append(f"<h2>{html.escape(heading)}</h2>")
        body.append(sections[i])
        body += [_figure_html(f) for f in figures.get(i, [])]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def _setup(study: Study) -> str:
    setup = study.setup
    parts = ["<p>Models, prompts and positions recorded in each cache (from its metadata). Greedy (T=0) "
             "trajectories are verified greedily, sampled ones (T&gt;0) by speculative sampling; "
             "simulations are exact expectations over the cached target trajectories unless marked "
             "Monte-Carlo. The full table is <code>tables/setup.csv</code>.</p>"]
    if not setup.is_empty():
        models = setup.unique("cache", maintain_order=True)
        parts.append("<ul>" + "".join(
            f"<li><b>{html.escape(r['cache'])}</b>: target {html.escape(r['target'])}"
            + (f" ({html.escape(r['target_info'])})" if r["target_info"] else "")
            + f"; drafts: {html.escape(r['drafts'] or 'none recorded')}</li>" for r in models.iter_rows(named=True))
            + "</ul>")
        shown = setup.with_columns(pl.col("created").cast(pl.String).str.slice(0, 10))
        parts.append(_table_html(shown, [c for c in shown.columns if c not in ("target_info", "drafts")]))
    if not study.categories.is_empty():
        parts += ["<p>Prompts and positions by category (positions at each temperature):</p>",
                  _table_html(_categories_wide(study.categories))]
    c = study.config
    parts.append(f'<p class="note">Simulated budgets: {", ".join(map(str, c.budgets))} draft tokens; '
                 f'families at T=0: {", ".join(c.families)}; at T&gt;0: {", ".join(c.sample_families)} '
                 f'(multi-draft: {c.multi_draft}); model-free drafts: {", ".join(c.model_free) or "none"}; '
                 f"bootstrap: {c.n_boot} resamples over prompts, seed {c.seed}, its percentiles expanded for each "
                 "row's prompt count.</p>")
    caveat = None if study.results.is_empty() else few_prompts_caveat(study.results["n_prompts"].to_list())
    if caveat:
        parts.append(f'<p class="note">{html.escape(caveat)}.</p>')
    if study.notes:
        parts.append("<ul>" + "".join(f"<li class=\"note\">{html.escape(n)}</li>" for n in study.notes) + "</ul>")
    return "\n".join(parts)


def _categories_wide(categories: pl.DataFrame) -> pl.DataFrame:
    """One row per cache × category, a positions column per temperature."""
    wide = categories.with_columns(pl.format("positions at T={}", pl.col("temperature").round(3)).alias("at"))
    return (wide.group_by("cache", "category", maintain_order=True).agg(pl.col("prompts").max())
            .join(wide.pivot("at", index=["cache", "category"], values="positions"), on=["cache", "category"]))


def _equal_budget(study: Study) -> str:
    """Chain vs data-optimal static vs dynamic trees at equal verified-token budgets (tables/trees_at_equal_budget)."""
    from specsim.report.findings import EQUAL_BUDGET, equal_budget

    table = equal_budget(study.results) if not study.results.is_empty() else pl.DataFrame()
    if table.is_empty():
        return ""
    dynamic = not table["dynamic_tokens_per_call"].drop_nulls().is_empty()
    shown = table.select(
        "pair", "setting", "budget",
        *[pl.format("{} [{}, {}]", *(pl.col(f"{f}_{c}").round(3) for c in ("tokens_per_call", "lo", "hi")))
          .alias(f"{f} tokens/call") for f in EQUAL_BUDGET if table[f"{f}_tokens_per_call"].drop_nulls().len()],
        *[pl.col(c).round(3) for c in table.columns if c.endswith(("_speedup", "_speedup_assumed"))])
    note = ("" if dynamic else '<p class="note">No cache recorded a draft expansion, so no dynamic tree is compared; '
            "record one with <code>specsim cache --expand topk=K,depth=D</code>.</p>")
    return ("<h3>Chain vs data-optimal static vs dynamic trees at equal budgets</h3><p>Tokens per target call "
            "[95% CI] at the same number of verified draft tokens per call: a chain, the static tree fitted on "
            "the cache (cross-fitted over prompts), and EAGLE-2's dynamic tree grown per call from the recorded "
            "expansion; speedups where costs were given. Table: <code>tables/trees_at_equal_budget.csv</code>."
            "</p>" + note + _table_html(shown))


def _interval(metric: str) -> pl.Expr:
    """'value [lo, hi]' of a metric and its 95% interval columns (`metric`, `metric_lo`, `metric_hi`)."""
    return pl.format("{} [{}, {}]", *(pl.col(f"{metric}{s}").round(3) for s in ("", "_lo", "_hi")))


def _heads(study: Study) -> str:
    """Head drafts beside the other drafts of their cache, chain against chain and dynamic tree against dynamic
    tree (tables/heads_side_by_side)."""
    from specsim.report.findings import heads_side_by_side

    table = heads_side_by_side(study.results, study.heads)
    if table.is_empty():
        return ""
    wide = (table.with_columns(
        _interval("tokens_per_call").alias("cell"),
        pl.col("tree").alias("at"))  # chain:N, dynamic:topk=K,depth=D,tokens=N
        .pivot("at", index=["cache_name", "setting", "kind", "draft"], values="cell", sort_columns=False))
    seen = study.heads.with_columns(
        pl.when(pl.col("prompts_trained_on").is_null()).then(pl.lit("unknown"))
        .when(pl.col("prompts_trained_on") == 0).then(pl.format("none of {}: held out", pl.col("prompts")))
        .otherwise(pl.format("{} of {}: NOT held out", pl.col("prompts_trained_on"), pl.col("prompts")))
        .alias("this cache's prompts it trained on")).select("cache_name", "draft", "trained",
                                                             "this cache's prompts it trained on")
    return ("<h3>Head drafts side by side</h3><p>Each cache that holds head drafts: every draft it holds as a chain "
            "of each budget a head reached, and as the dynamic tree EAGLE-3 is served with where the cache recorded "
            "the drafts' expansion (<code>--expand</code>), tokens per target call [95% CI] at the same number of "
            "verified draft tokens (so a head is compared with a draft model and the model-free drafts at equal "
            "verification work), and how each head was trained. A head evaluated on prompts it was trained on "
            "flatters itself. "
            "Table: <code>tables/heads_side_by_side.csv</code>.</p>" + _table_html(seen) + _table_html(wide))


def _bound(study: Study) -> str:
    """What SpecInfer's rule leaves on the table at nodes with i.i.d. or without-replacement candidates
    (tables/verifier_bound)."""
    if study.bound.is_empty():
        return ('<p class="note">No verifier bound: it needs a cache with full distributions and trajectories at '
                "T&gt;0 (<code>specsim bound</code> computes it for one draft).</p>")
    shown = study.bound.select(
        "cache_name", "draft", "temperature", "candidates_drawn", "candidates",
        *[pl.format("{} ± {}", pl.col(c).round(4), pl.col(f"{se}").round(4)).alias(name) for c, se, name in (
            ("specinfer", "specinfer_se", "SpecInfer's rule"), ("optimal", "optimal_se", "optimal verifier"),
            ("left_on_table", "left_se", "left on the table"))], "estimate", "positions")
    return ("<h3>What the verification rule leaves on the table</h3><p>At a node with j children drawn from the "
            "draft, i.i.d. or without replacement: the probability that SpecInfer's rule (the one simulated here for "
            "sampling trees) accepts one, against the most any valid verifier accepts of the same candidates (the "
            "optimal transport, Hu et al., ICLR 2025; docs/design.md §2e). At every recorded position on the target's "
            "path, averaged; ± 1 SE over trajectories. i.i.d.: exact per position. Without replacement: exact for one "
            "and two candidates, Monte-Carlo estimates beyond (column estimate; the bound's slightly low). A per-node "
            "figure: how it compounds over a tree's depths "
            "depends on which optimal verifier is used. Table: <code>tables/verifier_bound.csv</code>.</p>"
            + _table_html(shown))


def _block(study: Study) -> str:
    """Token-wise verification against block verification of the same chains (tables/block_verification)."""
    from specsim.report.findings import block_side_by_side

    table = block_side_by_side(study.verification)
    if table.is_empty():
        return ('<p class="note">No block verification: it is replayed from a cache that also recorded the target '
                "along the drafts' proposals (<code>specsim cache ... --temperature 0.7 --expand-target 4</code>)."
                "</p>")
    speed = "token_wise_speedup" in table.columns and table["token_wise_speedup"].drop_nulls().len() > 0
    shown = table.select(
        "cache_name", "draft", "temperature", pl.format("chain:{}", pl.col("budget")).alias("tree"),
        _interval("token_wise_tokens_per_call").alias("token-wise tokens/call"),
        pl.format("{} ± {}", _interval("block_tokens_per_call"), pl.col("block_mc_se").round(3)).alias(
            "block tokens/call (± MC SE)"),
        pl.format("{}%", (100 * pl.col("block_gain")).round(1)).alias("block gain"),
        *([_interval("token_wise_speedup").alias("token-wise speedup"),
           _interval("block_speedup").alias("block speedup")] if speed else []),
        "block_chains", "n_prompts", "n_positions")
    return ("<h3>Block verification against token-wise verification</h3><p>The same chains drafted from q, verified "
            "token by token (speculative sampling: exact on the trajectories) or as a block (Sun et al., ICLR 2025; "
            "vLLM's <code>rejection_sample_method=\"block\"</code>), replayed from the target along the drafts' own "
            "proposals (docs/design.md §2f; Monte-Carlo over the chains recorded per position, ± its standard "
            "error). For one drafted chain block verification is the most any valid verifier keeps in expectation, "
            "so its column is also the bound for chains; for trees of i.i.d. candidates the per-node bound is in "
            "the table above. Both rules run the same forwards; a profile measured with block verification's own "
            "walk (every drafted position's laws, thresholds and correction: <code>walk_block</code>) charges it to "
            "block's steps in place of the token-wise walk (the table's <code>block_cost_basis</code> says what was "
            "charged). 95% intervals over prompts. Table: "
            "<code>tables/block_verification.csv</code>.</p>" + _table_html(shown))


def _trees(study: Study) -> str:
    cells = []
    for t in study.trees:
        note = f"<br><span class=\"note\">{html.escape(t.note)}</span>" if t.note else ""
        cells.append(f"<div><b>{html.escape(t.label)}</b> ({t.budget} drafts){note}"
                     f"<pre>{html.escape(t.drawing)}</pre></div>")
    return ("<details><summary>Draw the trees (fixed families at one budget, then the data-optimal static trees "
            "fitted on each cache)</summary><p>Each node is a draft token, labelled by its rank r among its "
            "parent's draft candidates (r0 = the draft's most likely token).</p>"
            f'<div class="trees">{"".join(cells)}</div></details>')


def _attention_text(study: Study) -> str:
    text = ["<p>Speedups rest on: " + "; ".join(f"<b>{html.escape(k)}</b>: {html.escape(v)}"
                                                for k, v in study.cost_basis.items()) + ".</p>"]
    if not study.measured and not study.assumed:
        text.append('<p class="note">No costs were given, so no speedup is shown: measure them with '
                    "<code>specsim profile</code> and pass <code>--cost-profile</code>.</p>")
    if not study.batch.is_empty():
        text += ["<p>Best draft budget per batch size (measured costs):</p>", _table_html(
            study.batch, ["pair", "temperature", "batch", "tree", "budget", "tokens_per_call", "speedup",
                          "speedup_lo", "speedup_hi", "tokens_per_s"])]
    if study.attention is None:
        text.append('<p class="note">No tree-attention timing table was given; run '
                    "<code>specsim bench-attention --out attention.parquet</code> and pass "
                    "<code>--attention attention.parquet</code> to add the timing charts.</p>")
    return "\n".join(text)


def _analysis(study: Study) -> str:
    parts = []
    for title, items in grouped_findings(study.results, study.theory, study.cost_basis, study.batch):
        parts.append(f"<h3>{html.escape(title)}</h3><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in items)
                     + "</ul>")
    return "\n".join(parts)


def _summary(study: Study) -> str:
    if study.results.is_empty():
        return "<p>No configuration could be simulated.</p>"
    basis = "; ".join(f"{k}: {v}" for k, v in study.cost_basis.items())
    return ("<p>For each draft and setting: the configuration with the most tokens per target call, and the "
            f"fastest one with its speedup. Costs: {html.escape(basis)}.</p>" + _table_html(summary(study.results)))

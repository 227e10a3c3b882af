"""`specsim report` end to end on the tiny recorded cache, and the findings it states."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from specsim.cli import main
from specsim.report.findings import findings
from specsim.report.html import SECTIONS
from specsim.report.study import StudyConfig, run_study
from tests.cli_helpers import one_line_error

BUDGETS = "1,2,4"  # small: the report renders every chart, which dominates the run time


class _Page(HTMLParser):
    """Collects headings, image sources, links and scripts of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.headings, self.images, self.refs, self.scripts = [], [], [], 0
        self._in = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("h1", "h2"):
            self._in = tag
            self.headings.append("")
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag == "script":
            self.scripts += 1
        for key in ("href", "src"):
            if key in attrs and tag != "img":
                self.refs.append(attrs[key])

    def handle_endtag(self, tag):
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in:
            self.headings[-1] += data


@pytest.fixture(scope="module")
def report_dir(tiny_cache, tiny_profile, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "demo"
    result = CliRunner().invoke(main, ["report", str(tiny_cache), "--out", str(out), "--budgets", BUDGETS,
                                       "--cost-profile", str(tiny_profile), "--batches", "1,2",
                                       "--quiet", "--title", "Tiny study"])
    assert result.exit_code == 0, result.output
    assert f"wrote {out / 'index.html'}" in result.output
    return out


def test_index_has_every_section_and_embeds_its_images(report_dir):
    text = (report_dir / "index.html").read_text(encoding="utf-8")
    page = _Page()
    page.feed(text)
    assert page.headings[0] == "Tiny study"
    assert page.headings[1:] == list(SECTIONS)
    assert page.scripts == 0
    assert len(page.images) >= 7
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # nothing fetched from the network
    assert "@import" not in text and "url(" not in text


def test_every_chart_is_a_valid_png_and_svg(report_dir):
    pngs = sorted((report_dir / "charts").glob("*.png"))
    names = {p.stem for p in pngs}
    assert {"tokens_per_call_vs_budget", "acceptance_rate_vs_budget", "depth_acceptance", "by_category",
            "theory_vs_simulated", "speedup_grid", "speedup_vs_budget", "speedup_vs_batch"} <= names
    assert "speedup_assumed_vs_budget" not in names  # measured costs: no assumption drawn
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        svg = png.with_suffix(".svg")
        assert ET.fromstring(svg.read_text()).tag.endswith("svg")


def test_tables_are_written_as_parquet_and_csv(report_dir, tiny_cache):
    tables = report_dir / "tables"
    for name in ("setup", "categories", "results", "depth_acceptance", "theory", "speedup_grid", "batch"):
        parquet = pl.read_parquet(tables / f"{name}.parquet")
        csv = pl.read_csv(tables / f"{name}.csv")
        assert parquet.height == csv.height > 0
        assert parquet.columns == csv.columns
    results = pl.read_parquet(tables / "results.parquet")
    # every recorded draft x temperature, every budget, the families of each temperature, all categories
    assert set(results["draft"].unique()) >= {"layers:2", "int8"}
    assert set(results["temperature"].unique()) == {0.0, 1.0}
    assert set(results["budget"].unique()) == {1, 2, 4}
    assert set(results.filter(pl.col("temperature") == 0)["family"].unique()) >= {"chain", "kary:2", "widths",
                                                                                    "optimal"}
    assert set(results["category"].unique()) == {"all", "math", "writing"}
    setup = pl.read_parquet(tables / "setup.parquet")
    assert setup["positions"].sum() == 2 * 4 * 12  # 2 temperatures x 4 prompts x 12 tokens
    assert setup["cache"].unique().to_list() == [tiny_cache.name]


def test_setup_and_findings_appear_in_the_page(report_dir):
    text = (report_dir / "index.html").read_text(encoding="utf-8")
    assert "layers:2" in text and "int8" in text and "writing" in text and "math" in text
    assert "Best tree shape per budget for" in text
    assert "Leviathan&#x27;s closed form at the measured α" in text or "Leviathan's closed form" in text
    assert "optimal:4 for" in text  # a data-optimal tree drawn for a budget
    assert "speedups from measured costs: MEASURED profile tiny-profile.json" in text
    assert "Best draft budget per batch size for" in text
    assert "its percentiles expanded for each row's prompt count" in text
    assert "CIs over fewer than 8 prompts (here 2-4) cover about 85-90%, not 95%" in text  # 4 prompts, 2 a category


def test_findings_quote_numbers_that_are_in_the_tables(report_dir):
    """Every x.xxx number the page's findings quote is in a table the report wrote beside it."""
    import html

    text = (report_dir / "index.html").read_text(encoding="utf-8")
    sentences = [html.unescape(item) for block in re.findall(r"<h3>[^<]*</h3><ul>(.*?)</ul>", text, flags=re.S)
                 for item in re.findall(r"<li>(.*?)</li>", block, flags=re.S)]
    assert len(sentences) >= 4
    quoted = [float(x) for s in sentences for x in re.findall(r"(?<![\d.])-?\d+\.\d{3}(?![\d%])", s)]  # signed
    assert quoted
    known = set()
    for name in ("results", "theory", "batch"):
        table = pl.read_parquet(report_dir / "tables" / f"{name}.parquet")
        for col, dtype in table.schema.items():
            if dtype == pl.Float64:
                known |= {round(v, 3) for v in table[col].drop_nulls().to_list()}
    missing = [x for x in quoted if round(x, 3) not in known]
    assert not missing, f"findings quote numbers not in the tables: {missing}"


def test_findings_name_the_best_shape_per_budget(tiny_cache):
    study = run_study([tiny_cache], StudyConfig(budgets=(2, 4), families=("chain", "optimal"), model_free=(),
                                                sample_families=("chain",), draw_budgets=()), progress=False)
    best = (study.results.filter((pl.col("category") == "all") & (pl.col("temperature") == 0)
                                 & (pl.col("budget") == 4) & (pl.col("draft") == "int8"))
            .sort("tokens_per_call", descending=True).row(0, named=True))
    sentence = next(s for s in findings(study.results, study.theory, study.cost_basis)
                    if s.startswith("Best tree shape per budget for int8") and "T=0 greedy" in s)
    assert f"4 drafts: {best['family']}" in sentence
    assert f"{best['tokens_per_call']:.3f}" in sentence


def test_without_costs_no_speedup_and_an_assumed_cost_is_labelled(tiny_cache):
    plain = run_study([tiny_cache], StudyConfig(budgets=(1, 2), model_free=(), draw_budgets=(),
                                                families=("chain",), sample_families=("chain",)), progress=False)
    assert not plain.measured and not plain.assumed and plain.batch.is_empty()
    assert not [s for s in findings(plain.results, plain.theory, plain.cost_basis) if "speedup" in s]
    assumed = run_study([tiny_cache], StudyConfig(budgets=(1, 2), model_free=(), draw_budgets=(), cost="c=0.2",
                                                  families=("chain",), sample_families=("chain",)), progress=False)
    said = [s for s in findings(assumed.results, assumed.theory, assumed.cost_basis) if "speedup" in s]
    assert said and all("ASSUMED" in s for s in said)


def test_a_speedup_whose_ci_includes_one_is_not_called_a_speedup():
    from specsim.report.findings import _speedup

    def row(value, lo, hi):
        return {"cache_name": "c.h5", "pair": "d → t", "temperature": 0.0, "policy": "greedy", "batch": 1,
                "category": "all", "tree": "chain:4", "tokens_per_call": 2.0, "speedup": value, "speedup_lo": lo,
                "speedup_hi": hi}

    def verdict(value, lo, hi):
        basis, line = _speedup(pl.DataFrame([row(value, lo, hi)]), {"c.h5": "MEASURED profile p.json"})
        assert basis == "c.h5: speedups from measured costs: MEASURED profile p.json."
        return line

    assert "no demonstrated speedup (the 95% CI includes 1.0)" in verdict(1.1, 0.9, 1.3)
    assert "(measured): a speedup;" in verdict(1.2, 1.05, 1.3)
    assert "plain decoding is faster" in verdict(0.8, 0.7, 0.9)


def test_heads_side_by_side_keeps_chains_at_the_budgets_a_head_reached_in_caches_with_heads():
    """Chains and dynamic trees (no other static tree), category "all" only, budgets some head of that cache reached,
    caches without heads left out; heads first, then model drafts, then model-free, a draft's chains before its
    dynamic trees; each head joined with how it was trained."""
    from specsim.report.findings import heads_side_by_side
    from specsim.report.study import HEAD_SCHEMA

    def row(cache, draft, tree, budget, value, category="all"):
        return {"cache_name": cache, "draft": draft, "tree": tree, "budget": budget, "category": category,
                "temperature": 0.0, "policy": "greedy", "tokens_per_call": value, "tokens_per_call_lo": value - 0.1,
                "tokens_per_call_hi": value + 0.1, "n_prompts": 13, "n_positions": 1664}

    results = pl.DataFrame([
        row("a.h5", "suffix", "chain:2", 2, 1.34), row("a.h5", "suffix", "chain:8", 8, 1.40),
        row("a.h5", "layers:20", "chain:2", 2, 1.21), row("a.h5", "layers:20", "kary:2@2", 2, 1.25),
        row("a.h5", "eagle3:h", "chain:2", 2, 1.30), row("a.h5", "eagle3:h", "chain:2", 2, 9.9, category="math"),
        row("a.h5", "mtp:m", "chain:4", 4, 1.28), row("a.h5", "layers:20", "chain:4", 4, 1.22),
        row("b.h5", "int8", "chain:2", 2, 3.1), row("a.h5", "eagle3:h", "dynamic:topk=4,depth=4,tokens=8", 8, 1.48),
        row("a.h5", "layers:20", "dynamic:topk=4,depth=4,tokens=8", 8, 1.31),
        row("a.h5", "layers:20", "dynamic:topk=4,depth=4,tokens=16", 16, 1.36),
        row("a.h5", "eagle3:h", "dynamic:topk=4,depth=4,tokens=2", 2, 1.33)])
    heads = pl.DataFrame([{"cache_name": "a.h5", "draft": "eagle3:h", "trained": "trained by specsim: 60 steps",
                           "prompts_trained_on": 0, "prompts": 13},
                          {"cache_name": "a.h5", "draft": "mtp:m", "trained": "unknown", "prompts_trained_on": None,
                           "prompts": 13}], schema=HEAD_SCHEMA)
    table = heads_side_by_side(results, heads)
    got = [(r["draft"], r["kind"], r["tree"], r["tokens_per_call"]) for r in table.iter_rows(named=True)]
    assert got == [("eagle3:h", "head", "chain:2", 1.30), ("eagle3:h", "head", "dynamic:topk=4,depth=4,tokens=2", 1.33),
                   ("eagle3:h", "head", "dynamic:topk=4,depth=4,tokens=8", 1.48), ("mtp:m", "head", "chain:4", 1.28),
                   ("layers:20", "model", "chain:2", 1.21), ("layers:20", "model", "chain:4", 1.22),
                   ("layers:20", "model", "dynamic:topk=4,depth=4,tokens=8", 1.31),
                   ("suffix", "model-free", "chain:2", 1.34), ("suffix", "model-free", "chain:8", 1.40)]
    assert table.filter(pl.col("draft") == "eagle3:h")["trained"].to_list() == ["trained by specsim: 60 steps"] * 3
    assert table.filter(pl.col("draft") == "mtp:m")["prompts_trained_on"].to_list() == [None]
    assert heads_side_by_side(results.filter(pl.col("cache_name") == "b.h5"), heads).is_empty()


def test_bad_inputs_are_one_line_errors(tiny_cache, tmp_path):
    runner = CliRunner()
    missing = runner.invoke(main, ["report", str(tmp_path / "nope.h5"), "--out", str(tmp_path / "r")])
    one_line_error(missing, code=1)
    bad = runner.invoke(main, ["report", str(tiny_cache), "--out", str(tmp_path / "r"), "--budgets", "1,x"])
    assert bad.exit_code == 2 and "--budgets" in bad.output
    cost = runner.invoke(main, ["report", str(tiny_cache), "--out", str(tmp_path / "r"), "--cost", "fast"])
    assert cost.exit_code == 2 and "c=RATIO" in cost.output
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    att = runner.invoke(main, ["report", str(tiny_cache), "--out", str(tmp_path / "r"), "--attention", str(table)])
    assert att.exit_code == 2 and "not a `specsim bench-attention` table" in att.output


def _browser() -> str | None:
    import shutil

    return next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def test_the_page_fits_a_laptop_window_and_every_chart_decodes(report_dir):
    """Rendered by a real browser at 1400 px: nothing scrolls sideways, no image is broken, no heading is empty.

    `make test` installs Debian's chromium where it may; under CI a missing browser fails the test
    instead of skipping it, so the layout is checked where it counts.
    """
    import json
    import os
    import subprocess

    if _browser() is None:
        message = "no headless Chromium on this machine (`make browser`, or apt install chromium)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + "; CI must run the layout test")
        pytest.skip(message)

    probe = report_dir / "probe.html"
    script = ("<script>window.addEventListener('load', () => {"
              "const broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length;"
              "const wide = [...document.querySelectorAll('body > *')].filter("
              "  e => e.getBoundingClientRect().right > window.innerWidth + 1).map(e => e.tagName);"
              "document.body.setAttribute('data-probe', JSON.stringify({"
              "  overflow: document.documentElement.scrollWidth - window.innerWidth, broken,"
              "  images: document.images.length, wide}));});</script>")
    probe.write_text((report_dir / "index.html").read_text(encoding="utf-8").replace("</body>", script + "</body>"),
                     encoding="utf-8")
    done = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--window-size=1400,900", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    found = re.search(r"data-probe=\"([^\"]*)\"", done.stdout)
    assert found, done.stderr[-2000:]
    probe_result = json.loads(found.group(1).replace("&quot;", '"'))
    assert probe_result["images"] >= 6 and probe_result["broken"] == 0
    assert probe_result["overflow"] <= 0 and not probe_result["wide"], probe_result


def test_the_report_compares_chain_and_optimal_at_equal_budgets_without_an_expansion(report_dir):
    text = (report_dir / "index.html").read_text(encoding="utf-8")
    assert "Chain vs data-optimal static vs dynamic trees at equal budgets" in text
    assert "No cache recorded a draft expansion" in text
    table = pl.read_csv(report_dir / "tables" / "trees_at_equal_budget.csv")
    assert set(table["budget"]) == {1, 2, 4} and table["optimal_tokens_per_call"].is_not_null().all()


@pytest.mark.parametrize("module", sorted(p.stem for p in (Path(__file__).parent.parent / "analyses").glob("[a-z]*.py")))
def test_each_analysis_module_redraws_its_chart_from_the_reports_tables(report_dir, tmp_path, module):
    """`python -m analyses.NAME TABLES --out DIR` from the checkout: a PNG and an SVG, or, where this report has
    no table for it (attention needs --attention), one line naming the missing table."""
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    done = subprocess.run([sys.executable, "-m", f"analyses.{module}", str(report_dir / "tables"), "--out",
                           str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=300)
    if module == "attention":
        assert done.returncode == 1 and "no attention.parquet or attention.csv" in done.stderr, done.stderr
        return
    assert done.returncode == 0, done.stderr[-2000:]
    written = {p.suffix for p in tmp_path.iterdir() if p.stat().st_size > 0}
    assert written == {".png", ".svg"}, (sorted(tmp_path.iterdir()), done.stdout)


def test_the_report_says_what_the_verification_rule_leaves_on_the_table(report_dir, tiny_cache):
    """For each model draft at T > 0 in a full cache: SpecInfer's node acceptance against the optimal verifier's,
    per number of candidates, the same numbers `specsim bound` gives, in the table and on the page."""
    from specsim.sim.bound import node_bound

    every = pl.read_parquet(report_dir / "tables" / "verifier_bound.parquet")
    assert set(every["candidates_drawn"]) == {"iid", "swor"}
    table = every.filter(pl.col("candidates_drawn") == "iid")
    assert set(table["draft"]) == {"layers:2", "int8"} and set(table["temperature"]) == {1.0}
    assert sorted(table["candidates"].unique()) == [1, 2, 3, 4]
    direct = node_bound(tiny_cache, "int8", 1.0, 4, progress=False)
    row = table.filter((pl.col("draft") == "int8") & (pl.col("candidates") == 3)).row(0, named=True)
    assert row["specinfer"] == pytest.approx(direct.rule[2]) and row["optimal"] == pytest.approx(direct.bound[2])
    assert (table["optimal"] >= table["specinfer"] - 1e-12).all()
    swor = every.filter((pl.col("candidates_drawn") == "swor") & (pl.col("draft") == "int8")).sort("candidates")
    direct = node_bound(tiny_cache, "int8", 1.0, 2, sampling="swor", progress=False)  # j <= 2: no Monte-Carlo
    assert swor["optimal"].to_list()[:2] == pytest.approx(list(direct.bound)) and swor["estimate"][0] == "exact"
    assert swor["estimate"][3].startswith("Monte-Carlo")
    text = (report_dir / "index.html").read_text(encoding="utf-8")
    shown = table.filter((pl.col("draft") == "layers:2") & (pl.col("candidates") == 2)).row(0, named=True)
    assert "What the verification rule leaves on the table" in text
    assert f"{round(shown['optimal'], 4)} ± {round(shown['optimal_se'], 4)}" in text

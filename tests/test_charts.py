"""Chart builders on synthetic study tables, and the closed forms they draw."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import numpy as np
import polars as pl
import pytest

from specsim.report import charts
from specsim.report.study import (
    family_of,
    leviathan_improvement,
    leviathan_tokens,
    per_depth,
    speedup_grid,
    widths_spec,
)
from specsim.specs import parse_tree

PAIRS = ("int8 → tiny", "layers:2 → tiny")
FAMILIES = ("chain", "kary:2", "optimal")
BUDGETS = (1, 2, 4, 8)


def synthetic_results() -> pl.DataFrame:
    """Rows shaped like `specsim.simulate` output (+ the study's labels), with made-up but coherent numbers."""
    rows = []
    for (i, pair), (T, policy), fam, b, cat in itertools.product(
            enumerate(PAIRS), ((0.0, "greedy"), (0.7, "sample")), FAMILIES, BUDGETS, ("all", "code", "chat")):
        alpha = 0.5 + 0.2 * i - 0.1 * (T > 0) + 0.03 * FAMILIES.index(fam)
        tpc = float(leviathan_tokens(alpha, b))
        depth = b if fam == "chain" else max(1, int(np.log2(b)) + 1)
        rows.append({
            "tree": f"{fam}:{b}" if fam != "kary:2" else f"kary:2@{b}", "budget": b, "depth": depth,
            "draft": pair.split(" → ")[0], "target": "tiny", "policy": policy, "temperature": T,
            "estimate": "exact", "category": cat, "n_prompts": 4 if cat == "all" else 2,
            "n_positions": 48 if cat == "all" else 24,
            "accept_rate": (tpc - 1) / b, "accept_rate_lo": (tpc - 1) / b - 0.05, "accept_rate_hi": (tpc - 1) / b + 0.05,
            "tokens_per_call": tpc, "tokens_per_call_lo": tpc - 0.1, "tokens_per_call_hi": tpc + 0.1,
            "speedup": tpc / (1 + 0.05 * depth), "speedup_lo": tpc / (1 + 0.05 * depth) - 0.1,
            "speedup_hi": tpc / (1 + 0.05 * depth) + 0.1, "call_cost": 1 + 0.05 * depth,
            "depth_accept": [alpha ** d for d in range(1, depth + 1)],
            "cache_name": "tiny.h5", "pair": pair, "family": fam,
        })
    return pl.DataFrame(rows)


def synthetic_theory(results: pl.DataFrame) -> pl.DataFrame:
    chains = results.filter((pl.col("family") == "chain") & (pl.col("category") == "all"))
    return chains.select("pair", "temperature", "policy", "tokens_per_call", "tokens_per_call_lo",
                         "tokens_per_call_hi", "n_prompts", "n_positions",
                         pl.col("depth").alias("gamma")).with_columns(
        pl.lit(0.6).alias("alpha"),
        pl.Series("closed_form_tokens_per_call", leviathan_tokens(0.6, chains["depth"].to_numpy())))


@pytest.fixture(scope="module")
def results() -> pl.DataFrame:
    return synthetic_results()


def _fields(spec) -> set[str]:
    """Every field name an encoding or facet of a Vega-Lite spec refers to."""
    found = set()
    if isinstance(spec, dict):
        if isinstance(spec.get("field"), str):
            found.add(spec["field"])
        for v in spec.values():
            found |= _fields(v)
    elif isinstance(spec, list):
        for v in spec:
            found |= _fields(v)
    return found


@pytest.mark.parametrize("metric", ["tokens_per_call", "accept_rate", "speedup"])
def test_metric_vs_budget_is_valid_vega_lite_with_bands_and_facets(results, metric):
    spec = charts.metric_vs_budget(results, metric, cost_basis="MEASURED profile p.json").to_dict()  # schema-checked
    fields = _fields(spec)
    assert {metric, f"{metric}_lo", f"{metric}_hi", "budget", "family", "pair", "setting"} <= fields
    title = spec["title"]
    assert "T=0: 4 prompts, 48 positions" in title["subtitle"][0]
    assert "int8 → tiny" in title["subtitle"][0]
    if metric == "speedup":
        assert any("costs: MEASURED profile p.json" in s for s in title["subtitle"])
        assert "measured step times" in title["text"]


def test_an_assumed_speedup_chart_says_so_in_title_and_subtitle(results):
    assumed = results.rename({"speedup": "speedup_assumed", "speedup_lo": "speedup_assumed_lo",
                              "speedup_hi": "speedup_assumed_hi"})
    spec = charts.metric_vs_budget(assumed, "speedup_assumed", cost_basis="ASSUMED c=0.05").to_dict()
    assert "ASSUMED" in spec["title"]["text"] and any("ASSUMED, not measured" in s for s in spec["title"]["subtitle"])


def test_speedup_vs_batch_chart():
    batch = pl.DataFrame({"cache_name": ["c"] * 3, "pair": ["int8 → t"] * 3, "temperature": [0.0] * 3,
                          "policy": ["greedy"] * 3, "batch": [1, 4, 16], "batching": ["lockstep"] * 3,
                          "tree": ["optimal:8", "optimal:4", "optimal:1"], "budget": [8, 4, 1],
                          "speedup": [1.8, 1.3, 0.95], "speedup_lo": [1.6, 1.2, 0.9], "speedup_hi": [2.0, 1.4, 1.0],
                          "tokens_per_s": [40.0, 120.0, 300.0], "cost_basis": ["MEASURED p.json"] * 3})
    spec = charts.speedup_vs_batch(batch).to_dict()
    assert {"batch", "speedup", "speedup_lo", "speedup_hi", "budget"} <= _fields(spec)
    assert "MEASURED p.json" in spec["title"]["subtitle"][0]


def test_setting_labels_name_temperature_and_policy(results):
    labels = set(charts.with_setting(results)["setting"].to_list())
    assert labels == {"T=0 greedy", "T=0.7 sample"}


def test_depth_chart_uses_one_budget_and_exploded_depths(results):
    depth = per_depth(results)
    # one row per depth of every configuration × category
    assert depth.height == sum(len(x) for x in results["depth_accept"].to_list())
    spec = charts.depth_acceptance(depth, budget=4).to_dict()
    assert "budget of 4 draft tokens" in spec["title"]["text"]
    assert {"d", "p_accept_at_least_d"} <= _fields(spec)
    values = next(iter(spec["datasets"].values()))
    assert {row["budget"] for row in values} == {4}


def test_category_chart_orders_categories_and_excludes_other_budgets(results):
    spec = charts.by_category(results, family="chain", budget=2).to_dict()
    assert "chain tree, 2 draft tokens" in spec["title"]["text"]
    values = next(iter(spec["datasets"].values()))
    assert {row["tree"] for row in values} == {"chain:2"}
    assert {row["category"] for row in values} == {"all", "code", "chat"}


def test_pick_budget_is_nearest_on_a_log_scale():
    assert charts.pick_budget([1, 2, 4, 16, 32]) == 16  # 4 and 16 are equally far from 8: the larger wins
    assert charts.pick_budget([1, 2, 4, 8, 16]) == 8
    assert charts.pick_budget([1, 3]) == 3


def test_theory_chart_layers_simulated_and_closed_form(results):
    spec = charts.theory_vs_simulated(synthetic_theory(results)).to_dict()
    values = next(iter(spec["datasets"].values()))
    assert {row["source"] for row in values} == {"simulated on the cache", "closed form at measured α"}
    closed = [r for r in values if r["source"] == "closed form at measured α"]
    for r in closed:
        assert r["value"] == pytest.approx(float(leviathan_tokens(0.6, r["gamma"])))


def test_speedup_grid_chart_marks_best_gamma():
    grid = speedup_grid((0.6, 0.9), (0.05, 0.5), (1, 2, 4, 8))
    spec = charts.speedup_grid(grid).to_dict()
    assert {"alpha", "gamma", "improvement"} <= _fields(spec)
    assert "best_gamma" in str(spec)


def test_save_writes_valid_png_and_svg(results, tmp_path):
    png, svg = charts.save(charts.metric_vs_budget(results), tmp_path, "tokens")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg")
    assert "Tokens per target call vs draft budget" in svg.read_text()


# -- the closed forms and tree families ------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.999])
@pytest.mark.parametrize("gamma", [1, 2, 5, 10])
def test_leviathan_tokens_is_the_geometric_sum(alpha, gamma):
    # E[tokens/call] = Σ_{k=0..γ} α^k: the first k drafts are accepted with probability α^k
    assert float(leviathan_tokens(alpha, gamma)) == pytest.approx(sum(alpha**k for k in range(gamma + 1)))


def test_leviathan_limits_and_improvement():
    assert float(leviathan_tokens(1.0, 4)) == 5.0
    assert float(leviathan_improvement(0.8, 3, 0.0)) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    # Leviathan et al. Table/figure example: α=0.8, γ=3, c=0.1 → (1-0.8^4)/(0.2·1.3)
    assert float(leviathan_improvement(0.8, 3, 0.1)) == pytest.approx((1 - 0.8**4) / (0.2 * 1.3))


def test_speedup_grid_flags_the_argmax_gamma():
    grid = speedup_grid((0.5, 0.8, 0.95), (0.01, 0.2), range(1, 11))
    for (alpha, c), g in grid.group_by("alpha", "c"):
        best = g.filter(pl.col("best_gamma"))
        assert best.height == 1
        assert best["improvement"][0] == pytest.approx(g["improvement"].max())
    # a cheap draft with high acceptance wants long drafts; an expensive one short drafts
    best = grid.filter(pl.col("best_gamma"))
    assert best.filter((pl.col("alpha") == 0.95) & (pl.col("c") == 0.01))["gamma"][0] == 10
    assert best.filter((pl.col("alpha") == 0.5) & (pl.col("c") == 0.2))["gamma"][0] <= 2


@pytest.mark.parametrize("budget", [1, 2, 3, 8, 13, 32])
def test_widths_spec_has_the_budget_and_halving_widths(budget):
    tree = parse_tree(widths_spec(budget))
    assert tree.budget == budget
    widths = [int(w) for w in widths_spec(budget).split(":")[1].split(",")]
    assert widths == sorted(widths, reverse=True)


def test_family_of_tree_names():
    assert family_of("chain:4") == "chain"
    assert family_of("kary:2@8") == "kary:2"
    assert family_of("kary:2,3") == "kary"
    assert family_of("widths:4,2,1,1") == "widths"
    assert family_of("optimal:16") == "optimal"
    assert family_of("chain:4", "ngram:3") == "ngram:3"
    assert family_of("chain:4", "prompt-lookup:2") == "prompt-lookup:2"

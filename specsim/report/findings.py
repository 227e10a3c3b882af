"""The report's analysis, stated in words computed from the study's tables.

Each finding is a sentence that quotes the numbers it rests on (tokens per call to
three decimals, exactly as in the tables, with their 95% intervals where the table
has them): the best tree shape per budget, where returns diminish, which
draft–target pair and which prompt category speculate best, the fastest
configuration (a "speedup" only when its whole 95% interval is above 1, and
always with what the cost rests on: a measured profile or an assumption), the best
budget per batch size, how far Leviathan et al.'s i.i.d. closed form is from the
simulated chains, and which budgets the trajectories are too short to judge.
Nothing here is boilerplate: a finding is skipped when the data cannot support it.
"""

from __future__ import annotations

import polars as pl

from specsim.report.charts import with_setting

ALL = "all"
DIMINISHING = 0.05  # a doubling of the budget that adds less than this share of tokens/call is "diminishing"


def _f(x: float) -> str:
    return f"{x:.3f}"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _ci(row: dict, metric: str = "tokens_per_call") -> str:
    lo, hi = row.get(f"{metric}_lo"), row.get(f"{metric}_hi")
    if lo is None or hi is None or lo != lo or hi != hi:
        return ""
    return f" (95% CI {_f(lo)}–{_f(hi)})"


def best_per_budget(results: pl.DataFrame) -> pl.DataFrame:
    """For each pair × setting × budget, the family with the most tokens per call (category "all")."""
    rows = with_setting(results.filter(pl.col("category") == ALL))
    return (rows.sort("tokens_per_call", descending=True)
            .group_by("pair", "setting", "budget", maintain_order=True).first()
            .sort("pair", "setting", "budget"))


def _shape_findings(results: pl.DataFrame) -> list[str]:
    out = []
    rows = with_setting(results.filter(pl.col("category") == ALL))
    for (pair, setting), group in rows.group_by("pair", "setting", maintain_order=True):
        parts = []
        for (budget,), at in group.sort("budget").group_by("budget", maintain_order=True):
            at = at.sort("tokens_per_call", descending=True)
            top = at["tokens_per_call"][0]
            tied = at.filter(pl.col("tokens_per_call") >= top - 1e-9)["family"].to_list()  # identical trees
            rest = at.filter(pl.col("tokens_per_call") < top - 1e-9)
            gap = f", next {rest['family'][0]} {_f(rest['tokens_per_call'][0])}" if rest.height else ""
            parts.append(f"{budget} draft{'s' if budget > 1 else ''}: {' = '.join(tied)} {_f(top)}{gap}")
        out.append(f"Best tree shape per budget for {pair} at {setting} (tokens per target call): "
                   + "; ".join(parts) + ".")
    return out


EQUAL_BUDGET = ("chain", "optimal", "dynamic")  # the trees compared at equal verified-token budgets


def equal_budget(results: pl.DataFrame) -> pl.DataFrame:
    """Chain vs the data-optimal static tree vs the dynamic (EAGLE-2) tree at each budget (category all).

    One row per cache × pair × setting × budget (draft tokens verified per call); per family its
    tokens per call with the 95% interval and, where costs were given, its speedup. Pairs with
    fewer than two of the families are left out.
    """
    rows = with_setting(results.filter((pl.col("category") == ALL) & pl.col("family").is_in(EQUAL_BUDGET)))
    if rows.is_empty():
        return pl.DataFrame()
    metric = speed_metric(rows)
    out = []
    for (cache, pair, setting, budget), at in rows.group_by("cache_name", "pair", "setting", "budget",
                                                            maintain_order=True):
        if at["family"].n_unique() < 2:
            continue
        row = {"cache_name": cache, "pair": pair, "setting": setting, "budget": budget}
        for fam in EQUAL_BUDGET:
            hit = at.filter(pl.col("family") == fam)
            r = hit.row(0, named=True) if hit.height else {}
            row[f"{fam}_tokens_per_call"] = r.get("tokens_per_call")
            row[f"{fam}_lo"], row[f"{fam}_hi"] = r.get("tokens_per_call_lo"), r.get("tokens_per_call_hi")
            if metric is not None:
                row[f"{fam}_{metric}"] = r.get(metric)
        out.append(row)
    if not out:
        return pl.DataFrame()
    table = pl.DataFrame(out, infer_schema_length=None)
    numbers = [c for c in table.columns if c.startswith(EQUAL_BUDGET)]  # a family absent everywhere: all null
    return table.with_columns(pl.col(numbers).cast(pl.Float64)).sort("cache_name", "pair", "setting", "budget")


def heads_side_by_side(results: pl.DataFrame, heads: pl.DataFrame) -> pl.DataFrame:
    """Every draft of each cache that holds head drafts, as chains and as dynamic trees (EAGLE-2's, how EAGLE-3 is
    served; where the cache recorded the expansion) at equal verified budgets (category "all").

    One row per cache × setting × draft × tree × budget, at the budgets some head of that cache reached (a head
    recorded D deep drafts chains up to D; a dynamic tree verifies N drafts): its tokens per call with the 95%
    interval, its kind (head, model, model-free) and, for a head, how it was trained and on how many of the cache's
    prompts (`heads`, from `run_study`). Chains before dynamic trees within a draft.
    """
    from specsim.specs import is_head_draft, is_model_free

    if heads.is_empty() or results.is_empty():
        return pl.DataFrame()
    rows = with_setting(results.filter((pl.col("category") == ALL)
                                       & (pl.col("tree").str.starts_with("chain")
                                          | pl.col("tree").str.starts_with("dynamic:"))
                                       & pl.col("cache_name").is_in(heads["cache_name"].unique().to_list())))
    if rows.is_empty():
        return pl.DataFrame()
    kind = [("head" if is_head_draft(d) else "model-free" if is_model_free(d) else "model") for d in rows["draft"]]
    rows = rows.with_columns(pl.Series("kind", kind, dtype=pl.String))
    reached = (rows.filter(pl.col("kind") == "head").group_by("cache_name", "setting", "budget")
               .agg(pl.len().alias("_heads")))
    order = {"head": 0, "model": 1, "model-free": 2}
    table = (rows.join(reached, on=["cache_name", "setting", "budget"])
             .select("cache_name", "setting", "draft", "kind", "tree", "budget", "tokens_per_call",
                     "tokens_per_call_lo", "tokens_per_call_hi", "n_prompts", "n_positions")
             .join(heads.select("cache_name", "draft", "trained", "prompts_trained_on"),
                   on=["cache_name", "draft"], how="left")
             .with_columns(pl.col("kind").replace_strict(order, return_dtype=pl.Int64).alias("_order"),
                           pl.col("tree").str.starts_with("dynamic:").alias("_dynamic")))
    return table.sort("cache_name", "setting", "_order", "draft", "_dynamic", "budget", "tree").drop("_order",
                                                                                                    "_dynamic")


VERIFY_METRICS = ("tokens_per_call", "tokens_per_call_lo", "tokens_per_call_hi", "speedup", "speedup_lo",
                  "speedup_hi")


def block_side_by_side(verification: pl.DataFrame) -> pl.DataFrame:
    """Token-wise speculative sampling against block verification of the same chains (category "all").

    verification: `specsim.simulate` rows of policies sample and block on chains (`run_study` runs them on caches
    that recorded the target along the draft's proposals). One row per cache × draft × temperature × budget: each
    rule's tokens per call with its 95% interval (and speedup where costs were given), block's Monte-Carlo
    standard error, block's gain over token-wise in tokens per call, and what block's steps were charged
    (`block_cost_basis`, where costs were given).
    """
    if verification.is_empty():
        return pl.DataFrame()
    keys = ["cache_name", "draft", "temperature", "budget"]
    rows = verification.filter(pl.col("category") == ALL)
    metrics = [m for m in VERIFY_METRICS if m in rows.columns]

    def rule(policy: str, prefix: str, extra: tuple[str, ...] = ()) -> pl.DataFrame:
        return rows.filter(pl.col("policy") == policy).select(
            *keys, *[pl.col(m).alias(f"{prefix}_{m}") for m in metrics], *extra)

    table = rule("sample", "token_wise", ("n_prompts", "n_positions")).join(
        rule("block", "block", ("mc_se_tokens_per_call", "samples",
                                *(("cost_basis",) if "cost_basis" in rows.columns else ()))), on=keys)
    return (table.rename({"mc_se_tokens_per_call": "block_mc_se", "samples": "block_chains"}
                         | ({"cost_basis": "block_cost_basis"} if "cost_basis" in table.columns else {}))
            .with_columns((pl.col("block_tokens_per_call") / pl.col("token_wise_tokens_per_call") - 1)
                          .alias("block_gain"))
            .sort(keys))


def _equal_budget_findings(results: pl.DataFrame) -> list[str]:
    table = equal_budget(results)
    if table.is_empty() or table["dynamic_tokens_per_call"].drop_nulls().is_empty():
        return []
    out = []
    for (pair, setting), group in table.group_by("pair", "setting", maintain_order=True):
        parts = []
        for r in group.filter(pl.col("dynamic_tokens_per_call").is_not_null()).iter_rows(named=True):
            shown = [f"{fam} {_f(r[f'{fam}_tokens_per_call'])}"
                     + _ci({"tokens_per_call_lo": r[f"{fam}_lo"], "tokens_per_call_hi": r[f"{fam}_hi"]})
                     for fam in EQUAL_BUDGET if r[f"{fam}_tokens_per_call"] is not None]
            parts.append(f"{r['budget']} verified: " + ", ".join(shown))
        out.append(f"Dynamic vs static trees for {pair} at {setting} (tokens per target call): " + "; ".join(parts)
                   + ".")
    return out


def _diminishing(results: pl.DataFrame) -> list[str]:
    out = []
    best = best_per_budget(results)
    for (pair, setting), group in best.group_by("pair", "setting", maintain_order=True):
        g = group.sort("budget").to_dicts()
        for a, b in zip(g, g[1:]):
            gain = b["tokens_per_call"] - a["tokens_per_call"]
            if gain < DIMINISHING * a["tokens_per_call"]:
                out.append(
                    f"Returns diminish for {pair} at {setting} beyond {_n(a['budget'], 'draft token')}: the best "
                    f"shape gives {_f(a['tokens_per_call'])} tokens/call at {a['budget']} and "
                    f"{_f(b['tokens_per_call'])} at {b['budget']} ({gain / a['tokens_per_call']:+.1%} for "
                    f"{_n(b['budget'] - a['budget'], 'more draft')}).")
                break
        else:
            if len(g) > 1:
                out.append(f"Returns have not yet diminished for {pair} at {setting}: every doubling up to "
                           f"{g[-1]['budget']} drafts still adds at least {DIMINISHING:.0%} tokens per call "
                           f"(best: {g[-1]['family']} {_f(g[-1]['tokens_per_call'])}{_ci(g[-1])}).")
    return out


def speed_metric(results: pl.DataFrame) -> str | None:
    """'speedup' (measured), 'speedup_assumed', or None when the study has no costs."""
    return next((m for m in ("speedup", "speedup_assumed") if m in results.columns), None)


def _speedup(results: pl.DataFrame, basis: dict[str, str]) -> list[str]:
    """The fastest configuration per pair and setting: a speedup only when its whole CI is above 1.

    Each cache's cost basis is stated once, in the first line about it; every line still says
    whether its cost was measured or ASSUMED.
    """
    out = []
    for metric in ("speedup", "speedup_assumed"):
        if metric not in results.columns:
            continue
        rows = with_setting(results.filter((pl.col("category") == ALL) & pl.col(metric).is_not_null()
                                           & (pl.col("batch") == 1)))
        how = "measured costs" if metric == "speedup" else "an ASSUMED cost, not measured"
        for (cache,), by_cache in rows.group_by("cache_name", maintain_order=True):
            out.append(f"{cache}: speedups from {how}: {basis.get(cache, '?')}.")
            for (pair, setting), group in by_cache.group_by("pair", "setting", maintain_order=True):
                r = group.sort(metric, descending=True).row(0, named=True)
                lo, hi = r.get(f"{metric}_lo"), r.get(f"{metric}_hi")
                has_ci = lo is not None and lo == lo
                if r[metric] < 1 and (not has_ci or hi < 1):
                    verdict = "no speedup: plain decoding is faster"
                elif has_ci and lo <= 1:
                    verdict = "no demonstrated speedup (the 95% CI includes 1.0)"
                elif not has_ci:
                    verdict = "a speedup, without a CI (n = 1 prompt)"
                else:
                    verdict = "a speedup"
                word = "measured" if metric == "speedup" else "ASSUMED cost"
                out.append(f"{pair} at {setting}, batch 1 ({word}): {verdict}; the fastest configuration is "
                           f"{r['tree']} at {r[metric]:.3f}x{_ci(r, metric)} ({_f(r['tokens_per_call'])} tokens "
                           "per call).")
    return out


def _batches(batch: pl.DataFrame) -> list[str]:
    """The best budget per batch size (measured costs), as serving engines tune it."""
    out = []
    if batch.is_empty():
        return out
    for (pair, setting), group in with_setting(batch).group_by("pair", "setting", maintain_order=True):
        parts = []
        for r in group.sort("batch").iter_rows(named=True):
            if r["speedup"] < 1 and not r["speedup_hi"] >= 1:
                parts.append(f"batch {r['batch']}: plain decoding is faster (best {r['tree']} "
                             f"{r['speedup']:.3f}x{_ci(r, 'speedup')})")
            else:
                shown = "" if r["speedup_lo"] != r["speedup_lo"] or r["speedup_lo"] > 1 else ", CI includes 1.0"
                parts.append(f"batch {r['batch']}: {r['budget']} draft tokens ({r['tree']}) at "
                             f"{r['speedup']:.3f}x{_ci(r, 'speedup')}{shown}")
        out.append(f"Best draft budget per batch size for {pair} at {setting} (measured costs, best of "
                   f"{group['candidates'][0]} budgets each): " + "; ".join(parts) + ".")
    return out


def _trajectory_caveat(results: pl.DataFrame) -> list[str]:
    """Budgets close to the trajectory length are capped by trajectory ends: say so."""
    out = []
    rows = with_setting(results.filter(pl.col("category") == ALL))
    for (cache, setting), group in rows.group_by("cache_name", "setting", maintain_order=True):
        r = group.row(0, named=True)
        mean_len = r["n_positions"] / max(r["n_prompts"], 1)
        long = sorted(b for b in group["budget"].unique().to_list() if b >= mean_len / 2)
        if long:
            out.append(f"Caveat ({cache}, {setting}): budgets {', '.join(map(str, long))} are at least half the mean "
                       f"trajectory length ({mean_len:.0f} tokens); calls near a trajectory's end cannot use them, so "
                       "their tokens per call are capped by the recording's length, not only by the draft. Record "
                       "longer trajectories (--max-new-tokens) before trusting them.")
    return out


def _pairs(results: pl.DataFrame) -> list[str]:
    rows = with_setting(results.filter(pl.col("category") == ALL))
    out = []
    for (setting,), group in rows.group_by("setting", maintain_order=True):
        top = group.sort("budget", "tokens_per_call", descending=[True, True])
        budget = top["budget"][0]
        per_pair = (top.filter(pl.col("budget") == budget).sort("tokens_per_call", descending=True)
                    .group_by("pair", maintain_order=True).first())
        if per_pair.height < 2:
            continue
        items = [f"{r['pair']} {_f(r['tokens_per_call'])} ({r['family']})" for r in per_pair.iter_rows(named=True)]
        out.append(f"At {setting} with {budget} draft tokens, the drafts rank (best shape each, tokens per call): "
                   + ", ".join(items) + ".")
    return out


def _categories(results: pl.DataFrame) -> list[str]:
    rows = with_setting(results)
    out = []
    families = rows["family"].unique().to_list()
    family = next((f for f in ("optimal", "chain") if f in families), None)
    if family is None:
        return out
    from specsim.report.charts import pick_budget

    budget = pick_budget(rows.filter(pl.col("family") == family)["budget"].unique().to_list())
    sub = rows.filter((pl.col("family") == family) & (pl.col("budget") == budget) & (pl.col("category") != ALL))
    for (pair, setting), group in sub.group_by("pair", "setting", maintain_order=True):
        if group.height < 2:
            continue
        g = group.sort("tokens_per_call", descending=True)
        hi, lo = g.row(0, named=True), g.row(-1, named=True)
        out.append(f"By task ({pair}, {setting}, {family} tree of {budget}): {hi['category']} speculates best "
                   f"with {_f(hi['tokens_per_call'])} tokens/call{_ci(hi)} over {_n(hi['n_prompts'], 'prompt')}, "
                   f"{lo['category']} worst with {_f(lo['tokens_per_call'])}{_ci(lo)} over "
                   f"{_n(lo['n_prompts'], 'prompt')}.")
    return out


def _theory(theory: pl.DataFrame) -> list[str]:
    out = []
    if theory.is_empty():
        return out
    for (pair, setting), group in with_setting(theory).group_by("pair", "setting", maintain_order=True):
        r = group.sort("gamma").row(-1, named=True)
        sim, closed = r["tokens_per_call"], r["closed_form_tokens_per_call"]
        inside = r["tokens_per_call_lo"] <= closed <= r["tokens_per_call_hi"]
        out.append(
            f"Leviathan's closed form at the measured α = {r['alpha']:.3f} ({pair}, {setting}) predicts "
            f"{_f(closed)} tokens/call for a chain of {r['gamma']}; the simulation gives {_f(sim)}{_ci(r)}: "
            f"the i.i.d. model is off by {(closed - sim) / sim:+.1%}"
            + (", inside the interval." if inside else ", outside the interval (acceptance is not i.i.d. "
               "along real trajectories, and trajectories end).")
        )
    return out


def grouped_findings(results: pl.DataFrame, theory: pl.DataFrame, basis: dict[str, str],
                     batch: pl.DataFrame | None = None) -> list[tuple[str, list[str]]]:
    """The findings the data supports, grouped and in order of what a reader acts on first."""
    if results.is_empty():
        return [("Results", ["No configuration could be simulated on these caches."])]
    groups = [
        ("Speed (the number to act on)", _speedup(results, basis)),
        ("Best draft budget per batch size", _batches(batch if batch is not None else pl.DataFrame())),
        ("Drafts compared", _pairs(results)),
        ("Tree shapes", _shape_findings(results)),
        ("Dynamic vs static trees at equal budgets", _equal_budget_findings(results)),
        ("Diminishing returns", _diminishing(results)),
        ("Prompt categories", _categories(results)),
        ("Theory vs simulation", _theory(theory)),
        ("Caveats", _trajectory_caveat(results)),
    ]
    return [(title, items) for title, items in groups if items]


def findings(results: pl.DataFrame, theory: pl.DataFrame, basis: dict[str, str],
             batch: pl.DataFrame | None = None) -> list[str]:
    """Every finding the data supports, as sentences quoting the numbers (the groups flattened)."""
    return [item for _, items in grouped_findings(results, theory, basis, batch) for item in items]


def summary(results: pl.DataFrame) -> pl.DataFrame:
    """One row per pair and setting: the most tokens per call, and the fastest configuration with its basis."""
    rows = with_setting(results.filter(pl.col("category") == ALL))
    metric = speed_metric(rows)
    out = []
    for (pair, setting), group in rows.group_by("pair", "setting", maintain_order=True):
        best = group.sort("tokens_per_call", descending=True).row(0, named=True)
        row = {"draft → target": pair, "setting": setting, "most tokens/call": best["tree"],
               "tokens/call [95% CI]": f"{_f(best['tokens_per_call'])}{_ci(best)}"}
        if metric is not None and group[metric].drop_nulls().len():
            fast = group.filter(pl.col(metric).is_not_null()).sort(metric, descending=True).row(0, named=True)
            lo = fast.get(f"{metric}_lo")
            row["fastest"] = fast["tree"]
            row["speedup [95% CI]"] = f"{fast[metric]:.3f}{_ci(fast, metric)}" + (
                "" if metric == "speedup" else " ASSUMED")
            row["verdict"] = ("plain decoding is faster" if fast[metric] < 1 and not (fast.get(f"{metric}_hi") or 0) >= 1
                              else "no demonstrated speedup" if lo is not None and lo == lo and lo <= 1
                              else "speedup" if lo is not None and lo == lo else "no CI (n = 1 prompt)")
        out.append(row)
    return pl.DataFrame(out)

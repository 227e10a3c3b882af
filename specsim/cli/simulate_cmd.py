"""`specsim simulate`: replay draft trees, budgets, drafts and policies on a cache (CPU, seconds)."""

from __future__ import annotations

from pathlib import Path

import click

from specsim.cli._common import friendly_errors

OUT_FORMATS = (".parquet", ".csv", ".json")


@click.command()
@click.argument("cache", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--tree", "trees", multiple=True, required=True, metavar="SPEC",
              help="Tree spec (chain:4, kary:2,3, widths:4,2,1, medusa:[[0],[1]], file:t.json, optimal:16) "
                   "or a family expanded over --budget: chain, optimal, kary:W. Repeatable.")
@click.option("--draft", "drafts", multiple=True, metavar="NAME",
              help="Recorded draft column, or model-free ngram:N / prompt-lookup:N. Default: every recorded draft.")
@click.option("--policy", "policies", multiple=True, default=("greedy",), show_default=True, metavar="POLICY",
              help="greedy (T=0) | sample (T>0) | p>=q | p>=lq:L | typical[:eps,delta] | adaptive-hf | "
                   "adaptive-history[:hi,lo]. Repeatable.")
@click.option("--budget", "budgets", multiple=True, type=click.IntRange(min=1), metavar="N",
              help="Draft tokens per call for family names (chain, optimal, kary:W). Repeatable.")
@click.option("--temperature", "temperatures", multiple=True, type=float, metavar="T",
              help="Recorded temperature to simulate. Default: each policy's usable recorded temperatures.")
@click.option("--multi-draft", type=click.Choice(["iid", "swor"]), default="iid", show_default=True,
              help="How sampling trees draw a node's candidates: i.i.d. (SpecInfer) or without replacement.")
@click.option("--cost-profile", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Measured costs from `specsim profile` (JSON): speedup and tokens/s columns. Refused when it "
                   "was not measured for the cache's target and drafts.")
@click.option("--cost", default=None, metavar="c=RATIO",
              help="An ASSUMED draft-step / target-step cost ratio (verification flat), for what-if questions: "
                   "gives speedup_assumed columns, labelled as an assumption. No default.")
@click.option("--batch", "batches", multiple=True, type=click.IntRange(min=1), metavar="B",
              help="Batch size (repeatable; needs --cost-profile): rows with throughput, latency and speedup over "
                   "plain batched decoding when B requests decode together.")
@click.option("--batching", type=click.Choice(["lockstep", "continuous"]), default="lockstep", show_default=True,
              help="How batches run: lockstep (static: a batch runs until its last request ends) or continuous "
                   "(a finished request's place is refilled at once).")
@click.option("--by-category/--no-by-category", default=True, show_default=True,
              help="Add one row per prompt category next to the 'all' row.")
@click.option("--samples", type=click.IntRange(min=2), default=64, show_default=True,
              help="Monte-Carlo samples per position, for estimators that need them (sampling trees, swor).")
@click.option("--n-boot", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Bootstrap resamples over prompts for the 95% CIs (0: no CIs).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap and Monte-Carlo.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the full table (every column) to .parquet, .csv or .json.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@friendly_errors
def simulate(cache, trees, drafts, policies, budgets, temperatures, multi_draft, cost_profile, cost, batches, batching,
             by_category, samples, n_boot, seed, out, quiet):
    """Replay speculative decoding configurations on CACHE: exact acceptance, tokens/call, speedup.

    Runs the cross product of --tree x --budget x --draft x --policy x
    --temperature; combinations that cannot run (an adaptive rule on a branching
    tree, a p-vs-q rule with a model-free draft) are skipped with one line each on
    stderr. Greedy trees and sampling chains are exact (no Monte-Carlo);
    CIs are 95% bootstrap intervals over prompts.

    Speedup needs costs. --cost-profile (from `specsim profile` on the hardware in
    question) gives measured speedup = time of plain decoding / time of speculative
    decoding of the same trajectories, each call priced at its own context and tree
    size; with --batch B, also B requests decoding together. --cost c=RATIO gives
    speedup_assumed, an assumption that every table labels as such. Without either,
    no speedup is printed.

    \b
    Examples:
      specsim simulate cache/demo.h5 --tree chain:4
      specsim simulate cache/demo.h5 --tree chain --tree optimal --tree kary:2 --budget 4 --budget 16
      specsim simulate cache/demo.h5 --tree chain:4 --cost-profile profile.json --batch 1 --batch 8
      specsim simulate cache/demo.h5 --tree kary:2,3 --policy sample --temperature 1 --multi-draft swor
      specsim simulate cache/demo.h5 --tree chain:4 --draft ngram:3 --cost c=0.1 --out results.parquet
    """
    from specsim.errors import SpecError

    if out is not None and out.suffix.lower() not in OUT_FORMATS:
        raise SpecError(f"--out {out}: unknown format {out.suffix or '(none)'}; use one of {', '.join(OUT_FORMATS)}")
    from specsim.sim.api import simulate as run

    df = run(cache, trees=list(trees), drafts=list(drafts) or None, policies=list(policies),
             budgets=list(budgets) or None, temperatures=list(temperatures) or None, multi_draft=multi_draft,
             cost=cost, cost_profile=cost_profile, batches=list(batches) or None, batching=batching,
             by_category=by_category, n_boot=n_boot, samples=samples, seed=seed, progress=not quiet,
             on_skip=lambda line: click.echo(line, err=True))
    click.echo(format_table(df))
    click.echo()
    click.echo(footer(df))
    if out is not None:
        write_table(df, out)
        click.echo(f"wrote {len(df)} rows x {len(df.columns)} columns to {out}")


def _ci(value, lo, hi) -> str:
    if value is None or value != value:
        return "-"
    if lo is None or lo != lo:
        return f"{value:.3f}"
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def format_table(df) -> str:
    """The columns a user reads, aligned; '*' marks approximate rows (lossy rule or top-k tail)."""
    show_cat = df["category"].n_unique() > 1
    show_batch = df["batch"].n_unique() > 1 or int(df["batch"].max()) > 1
    measured, assumed = "speedup" in df.columns, "speedup_assumed" in df.columns
    header = ["tree", "budget", "draft", "policy", "T"] + (["batch"] if show_batch else []) + (
        ["category"] if show_cat else []) + ["accept rate [95% CI]", "tokens/call [95% CI]"]
    if measured:
        header += ["speedup [95% CI]", "tok/s"]
    elif assumed:
        header += ["speedup ASSUMED [95% CI]"]
    header += ["estimate", "prompts/positions"]
    lines = []
    for r in df.iter_rows(named=True):
        est = r["estimate"]
        if est != "exact":
            se = r.get("mc_se_speedup") if r["batch"] > 1 else r.get("mc_se_tokens_per_call")
            est = f"MC ±{se:.3f}" if se is not None and se == se else "MC"
        if r["approximate"]:
            est += " *"
        line = [r["tree"], str(r["budget"]), r["draft"], r["policy"], f"{r['temperature']:g}"]
        line += ([str(r["batch"])] if show_batch else []) + ([r["category"]] if show_cat else [])
        line += [_ci(r["accept_rate"], r["accept_rate_lo"], r["accept_rate_hi"]),
                 _ci(r["tokens_per_call"], r["tokens_per_call_lo"], r["tokens_per_call_hi"])]
        if measured:
            line += [_ci(r["speedup"], r["speedup_lo"], r["speedup_hi"]),
                     "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}"]
        elif assumed:
            line += [_ci(r["speedup_assumed"], r["speedup_assumed_lo"], r["speedup_assumed_hi"])]
        lines.append(line + [est, f"{r['n_prompts']}/{r['n_positions']}"])
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(row) for row in lines])


def footer(df) -> str:
    """What the numbers were computed from."""
    first = df.row(0, named=True)
    alls = df.filter(df["category"] == "all").unique(["temperature", "draft"], keep="first").sort("temperature")
    per_t = "; ".join(f"T={r['temperature']:g}: {r['n_prompts']} prompts, {r['n_positions']} positions"
                      for r in alls.unique(["temperature"], keep="first").sort("temperature").iter_rows(named=True))
    lines = [
        f"computed from {first['cache']} (target {first['target']}; drafts {', '.join(df['draft'].unique(maintain_order=True))})",
        f"trajectories: {per_t}; storage {first['storage']}",
    ]
    if "speedup" in df.columns:
        lines.append(f"speed: {first['cost_basis']}; speedup = plain decoding time / speculative decoding time of the "
                     "same trajectories, each call priced at its own context and tree size")
        if (df["batch"] > 1).any():
            lines.append(f"batch rows: {first['batching'] or df['batching'].drop_nulls()[0]} batching on a timeline "
                         "of engine steps; speedup over plain batched decoding at the same batch size; CIs "
                         f"{df.filter(df['batch'] > 1)['n_boot'][0]} bootstrap replicates of the schedule")
    elif "speedup_assumed" in df.columns:
        lines.append(f"speed: {first['cost_basis']} -- speedup_assumed is an ASSUMPTION, not measured; "
                     "measure with `specsim profile` and pass --cost-profile")
    else:
        lines.append("speed: no speedup without costs; measure them with `specsim profile` and pass --cost-profile")
    lines.append(f"CIs: 95% bootstrap over prompts ({first['n_boot']} resamples, seed {first['seed']}); "
                 "exact = closed form / dynamic program on the cached trajectories, no Monte-Carlo")
    if (df["estimate"] != "exact").any():
        lines.append("MC ±x: Monte-Carlo standard error of tokens/call (batch rows: of the speedup) "
                     f"({df['samples'].drop_nulls().max() if df['samples'].drop_nulls().len() else 32} samples)")
    if df["approximate"].any():
        lines.append("*: approximate (a lossy rule evaluated along target trajectories, or a top-k cache's tail)")
    return "\n".join(lines)


def write_table(df, out: Path) -> None:
    import polars as pl

    from specsim.errors import SpecError

    suffix = out.suffix.lower()
    try:
        if suffix == ".parquet":
            df.write_parquet(out)
        elif suffix == ".json":
            df.write_json(out)
        else:  # CSV has no list type: one depth_d column per depth
            flat = df
            if "depth_accept" in df.columns:
                depth = int(df["depth_accept"].list.len().max())
                flat = df.with_columns([pl.col("depth_accept").list.get(d, null_on_oob=True).alias(f"depth_{d + 1}")
                                        for d in range(depth)]).drop("depth_accept")
            flat.write_csv(out)
    except OSError as exc:
        raise SpecError(f"--out {out}: cannot write ({exc.strerror or exc})") from None

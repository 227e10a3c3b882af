"""`specsim simulate`: replay draft trees, budgets, drafts and policies on a cache (CPU, seconds)."""

from __future__ import annotations

from pathlib import Path

import click

from specsim import specs as registry
from specsim.checks import few_prompts_caveat
from specsim.cli import _common as c


@c.command()
@click.argument("cache", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--tree", "trees", multiple=True, required=True, metavar="SPEC",
              help="Tree spec (chain:4, kary:2,3, kary:2@8, widths:4,2,1, medusa:[[0],[1]], file:t.json, optimal:16) "
                   "or a family expanded over --budget: chain, optimal, kary:W. Repeatable (specs contain commas). "
                   "`specsim trees` lists them.")
@click.option("--draft", "drafts", multiple=True, metavar="NAME", callback=c.names,
              help="Recorded draft column, or model-free ngram:N / prompt-lookup:N / suffix[:k=v,...]. "
                   "Repeatable or comma-separated. Default: every recorded draft.")
@click.option("--policy", "policies", multiple=True, metavar="POLICY", callback=c.specs,
              help="greedy (T=0) | sample (T>0) | p>=q | p>=lq:L | typical[:eps,delta] | adaptive-hf | "
                   "adaptive-history[:hi,lo]. Repeatable or comma-separated.  [default: greedy]")
@click.option("--budget", "budgets", multiple=True, metavar="N", callback=c.numbers(int, minimum=1),
              help="Draft tokens per call for family names (chain, optimal, kary:W). Repeatable or comma-separated.")
@click.option("--temperature", "temperatures", multiple=True, metavar="T", callback=c.numbers(float, minimum=0),
              help="Recorded temperature to simulate. Default: each policy's usable recorded temperatures.")
@click.option("--multi-draft", type=c.choice(registry.MULTI_DRAFT), default="iid", show_default=True,
              help="How a sampling tree draws a node's k candidates from q. "
                   + registry.vocab_help(registry.MULTI_DRAFT) + ".")
@c.cost_profile_option("Measured costs from `specsim profile` (JSON): speedup and tokens/s columns. Refused when it "
                       "was not measured for the cache's target and drafts.")
@c.cost_extrapolate_option
@click.option("--cost", default=None, metavar="c=RATIO",
              help="An ASSUMED draft-step / target-step cost ratio (verification flat), for what-if questions: "
                   "gives speedup_assumed columns, labelled as an assumption. No default.")
@click.option("--batch", "batches", multiple=True, metavar="B", callback=c.numbers(int, minimum=1),
              help="Batch size (repeatable or comma-separated; needs --cost-profile): rows with throughput, "
                   "latency and speedup over plain batched decoding when B requests decode together.")
@click.option("--batching", type=c.choice(registry.BATCHING), default="lockstep", show_default=True,
              help="How B requests share engine steps. " + registry.vocab_help(registry.BATCHING) + ".")
@click.option("--by-category", is_flag=True,
              help="Also show one row per prompt category (the 'all' row is always shown; --out always has both).")
@click.option("--samples", type=click.IntRange(min=2), default=64, show_default=True,
              help="Monte-Carlo samples per position, for estimators that need them (sampling trees, swor).")
@click.option("--n-boot", type=click.IntRange(0, c.MAX_BOOT), default=1000, show_default=True,
              help="Bootstrap resamples over prompts for the 95% CIs (0: no CIs).")
@c.seed_option
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes replaying blocks of a large cache at once (each holds one block, ~100 MB); the "
                   "rows do not depend on it. Caches within one block (131,072 positions) use one.")
@c.out_options
@click.option("--per-request", type=str, default=None, metavar="PATH",
              help="Also write one row per configuration x trajectory: totals and the histogram of accepted lengths "
                   "(as serving engines export per request); format from the suffix.")
@click.option("--emit-acceptance", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Write the acceptance of the one configuration simulated in the form an engine's benchmarking "
                   "takes: FILE.json -> vLLM's speculative_config with rejection_sample_method 'synthetic' and "
                   "synthetic_acceptance_rates (per position, the share of drafting steps whose first i+1 drafts "
                   "were all accepted); FILE.env -> SGLang's SGLANG_SIMULATE_ACC_LEN (mean acceptance length).")
@click.option("--emit", type=(c.choice(registry.EMIT_TARGETS), click.Path(dir_okay=False, path_type=Path)),
              default=None, metavar="ENGINE FILE",
              help="Write the one configuration simulated as the engine runs it: vllm -> its speculative_config "
                   "JSON (a chain), sglang -> its launch flags (a chain or a dynamic tree, of a draft model or an "
                   "EAGLE-1/2 or EAGLE-3 head, which is written out in the layout SGLang loads).")
@c.quiet_option
@c.friendly_errors
def simulate(cache, trees, drafts, policies, budgets, temperatures, multi_draft, cost_profile, cost_extrapolate, cost,
             batches, batching, by_category, samples, n_boot, seed, workers, out, out_format, overwrite, per_request,
             emit_acceptance, emit, quiet):
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

    Every row also carries vLLM's spec-decode counters with vLLM's meaning
    (docs/design.md §6): vllm_num_drafts (steps that drafted), vllm_num_draft_tokens,
    vllm_num_accepted_tokens (also past the output limit, from the cache's
    overhang), vllm_num_accepted_tokens_per_pos, and vllm_mean_acceptance_length =
    1 + accepted / drafts, beside specsim's tokens per call (which counts every
    target call, the first included); vllm_counts says whether they are exact.
    depth_d is P(at least d drafts accepted) per call; num_speculative_tokens the budget.

    \b
    Examples:
      specsim simulate cache/demo.h5 --tree chain:4
      specsim simulate cache/demo.h5 --tree chain --tree optimal --tree kary:2 --budget 4,16
      specsim simulate cache/demo.h5 --tree chain:4 --cost-profile profile.json --batch 1,8
      specsim simulate cache/demo.h5 --tree kary:2,3 --policy sample --temperature 1 --multi-draft swor
      specsim simulate cache/demo.h5 --tree chain:4 --draft ngram:3 --cost c=0.1 --out results.parquet
      specsim simulate cache/demo.h5 --tree chain:4 --out - --format ndjson | jq .speedup
      specsim simulate cache/v.h5 --tree chain:4 --draft layers:20 --emit-acceptance synthetic.json
      specsim simulate cache/e.h5 --tree dynamic:topk=4,depth=4,tokens=8 --draft eagle3:head \\
          --emit sglang flags.txt  # python -m sglang.launch_server --model-path MODEL $(cat flags.txt)
    """
    target, fmt = c.out_target(out, out_format, overwrite)
    from specsim.files import check_writable

    if emit_acceptance is not None:
        _check_emit_path(emit_acceptance, overwrite)
        check_writable("--emit-acceptance", emit_acceptance)
    if emit is not None and emit[1].exists() and not overwrite:
        from specsim.errors import SpecError

        raise SpecError(f"--emit {emit[1]} exists; pass --overwrite to replace it")
    if emit is not None:
        check_writable("--emit", emit[1])
    requests_target = c.out_target(per_request, None, overwrite, "--per-request") if per_request else (None, None)
    from specsim.cache.provenance import leakage_lines
    from specsim.sim.sweep import SweepConfig, sweep

    config = SweepConfig(trees=list(trees), drafts=list(drafts) or None, policies=list(policies) or ["greedy"],
                         budgets=list(budgets) or None, temperatures=list(temperatures) or None,
                         multi_draft=multi_draft, cost=cost,
                         cost_profile=c.cost_profile_arg(cost_profile, cost_extrapolate),
                         batches=list(batches) or (), batching=batching, by_category=True, n_boot=n_boot,
                         samples=samples, seed=seed, workers=workers)
    result = sweep(cache, config, progress=not quiet, on_skip=lambda line: click.echo(line, err=True))
    df = result.rows
    echo = (lambda text="": click.echo(text, err=True)) if target == "-" else click.echo
    shown = df if by_category else df.filter(df["category"] == "all")
    echo(format_table(shown))
    echo()
    echo(footer(df))
    for line in leakage_lines(cache, df["draft"].unique().to_list() if "draft" in df.columns else []):
        click.echo(line, err=True)
    if target is not None:
        where = c.write_frame(_serving_columns(df), target, fmt)
        echo(f"wrote {len(df)} rows to {where}")
    if requests_target[0] is not None:
        where = c.write_frame(result.requests, *requests_target)
        echo(f"wrote {len(result.requests)} per-request rows to {where}")
    if emit_acceptance is not None:
        echo(_emit_acceptance(df, emit_acceptance))
    if emit is not None:
        echo(_emit_configuration(df, *emit))


def _check_emit_path(path: Path, overwrite: bool) -> None:
    from specsim.errors import SpecError

    if path.suffix.lower() not in (".json", ".env"):
        raise SpecError(f"--emit-acceptance {path}: name a .json file (vLLM's speculative_config) or a .env file "
                        "(SGLang's environment)")
    if path.exists() and not overwrite:
        raise SpecError(f"--emit-acceptance {path} exists; pass --overwrite to replace it")


def _emit_acceptance(df, path: Path) -> str:
    """Write the one configuration's acceptance for an engine's synthetic benchmarking; what was written."""
    from specsim.engines import emit
    from specsim.errors import SpecError

    r = _one_row(df, "--emit-acceptance")
    if r["vllm_num_drafts"] is None:
        raise SpecError(f"--emit-acceptance: {r['policy']} has no per-step acceptance an engine could replay")
    basis = (f"from {r['draft']} {r['tree']} {r['policy']} at T={r['temperature']:g} on {r['cache']} "
             f"({r['n_prompts']} prompts, {r['n_positions']} positions; counts {r['vllm_counts']})")
    if path.suffix.lower() == ".env":
        emit.write_env(path, emit.sglang_simulated(r["vllm_mean_acceptance_length"]))
        return (f"wrote SGLang's simulated acceptance (mean acceptance length {r['vllm_mean_acceptance_length']:.4f}) "
                f"to {path} {basis}: env $(cat {path}) python -m sglang.launch_server ...")
    from specsim.engines.export import draft_directory
    from specsim.engines.vllm import speculative_config
    from specsim.specs import is_model_free, parse_tree

    draft_dir = None
    if not is_model_free(r["draft"]):
        from specsim.engines.check import read_cache

        data = read_cache(r["cache"])
        draft_dir = draft_directory(r["draft"], data.target, target_info=data.target_info,
                                    draft_info=data.drafts_info.get(r["draft"]))
    base = speculative_config(r["draft"], parse_tree(r["tree"]), r["policy"], draft_dir=draft_dir).config
    config = emit.vllm_synthetic(base, r["vllm_num_accepted_tokens_per_pos"], r["vllm_num_drafts"])
    emit.write_json(path, config)
    rates = ", ".join(f"{x:.4f}" for x in config["synthetic_acceptance_rates"])
    return (f"wrote vLLM's synthetic acceptance [{rates}] to {path} {basis}: vllm serve MODEL "
            f"--speculative-config \"$(cat {path})\"")


def _one_row(df, flag: str) -> dict:
    """The one configuration a sweep simulated (all prompts, batch 1), for --emit and --emit-acceptance."""
    from specsim.errors import SpecError

    rows = df.filter((df["category"] == "all") & (df["batch"] == 1))
    if rows.height != 1:
        raise SpecError(f"{flag} writes one configuration; this sweep has {rows.height} (narrow it to one --tree, "
                        "--draft, --policy and --temperature)")
    return rows.row(0, named=True)


def _emit_configuration(df, engine: str, path: Path) -> str:
    """Write the one configuration simulated in the engine's terms (`optimize --emit`'s, for a chosen tree); what
    was written, and what its replay predicts, in the engine's counters."""
    from specsim.engines import emit as engines
    from specsim.engines.check import read_cache
    from specsim.engines.export import draft_directory, sglang_directory
    from specsim.specs import is_model_free, parse_tree

    r = _one_row(df, "--emit")
    draft, tree = r["draft"], parse_tree(r["tree"])
    if engine == "sglang":  # before any directory is written out for it
        engines.check_sglang_policy(r["policy"], draft, tree)
    data = read_cache(r["cache"])
    draft_dir = None if is_model_free(draft) else (sglang_directory if engine == "sglang" else draft_directory)(
        draft, data.target, target_info=data.target_info, draft_info=data.drafts_info.get(draft),
        echo=lambda line: click.echo(line, err=True))
    basis = (f"{draft} {r['tree']} {r['policy']} at T={r['temperature']:g}: replayed {r['tokens_per_call']:.3f} "
             f"tokens per call, vLLM's mean acceptance length {r['vllm_mean_acceptance_length']:.3f}, on {r['cache']} "
             f"({r['n_prompts']} prompts, {r['n_positions']} positions)")
    if engine == "vllm":
        from specsim.engines.vllm import speculative_config

        engines.write_json(path, speculative_config(draft, tree, r["policy"], draft_dir=draft_dir).config)
        return (f"wrote vLLM's speculative_config to {path} ({basis}): vllm serve MODEL --speculative-config "
                f"\"$(cat {path})\"")
    engines.write_flags(path, engines.sglang_flags(draft, tree, draft_dir=draft_dir, policy=r["policy"]))
    return f"wrote SGLang's flags to {path} ({basis}): python -m sglang.launch_server --model-path MODEL $(cat {path})"


def _serving_columns(df):
    """The serving engines' name beside ours: num_speculative_tokens (the tree's budget). vLLM's mean
    acceptance length is its own column (vllm_mean_acceptance_length): tokens_per_call counts every call."""
    import polars as pl

    return df.with_columns(pl.col("budget").alias("num_speculative_tokens"))


def format_table(df) -> str:
    """The columns a user reads, fitted to the terminal; '*' marks approximate rows (lossy rule or top-k tail)."""
    show_cat = df["category"].n_unique() > 1
    show_batch = df["batch"].n_unique() > 1 or int(df["batch"].max()) > 1
    measured, assumed = "speedup" in df.columns, "speedup_assumed" in df.columns
    header = ["tree", "draft", "policy", "T"] + (["batch"] if show_batch else []) + (
        ["category"] if show_cat else []) + ["tokens/call [95% CI]"]
    if measured:
        header += ["speedup [95% CI]", "tok/s"]
    elif assumed:
        header += ["speedup ASSUMED [95% CI]"]
    header += ["accept rate [95% CI]", "vLLM mean acc. len", "estimate", "prompts/positions", "budget"]
    lines = []
    for r in df.iter_rows(named=True):
        est = r["estimate"]
        if est != "exact":
            se = r.get("mc_se_speedup") if r["batch"] > 1 else r.get("mc_se_tokens_per_call")
            est = f"MC ±{se:.3f}" if se is not None and se == se else "MC"
        if r["approximate"]:
            est += " *"
        line = [r["tree"], r["draft"], r["policy"], f"{r['temperature']:g}"]
        line += ([str(r["batch"])] if show_batch else []) + ([r["category"]] if show_cat else [])
        line += [c.ci(r["tokens_per_call"], r["tokens_per_call_lo"], r["tokens_per_call_hi"])]
        if measured:
            line += [c.ci(r["speedup"], r["speedup_lo"], r["speedup_hi"]),
                     "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}"]
        elif assumed:
            line += [c.ci(r["speedup_assumed"], r["speedup_assumed_lo"], r["speedup_assumed_hi"])]
        vllm = "-" if r.get("vllm_mean_acceptance_length") is None else (
            f"{r['vllm_mean_acceptance_length']:.3f}" + ("" if r["vllm_counts"] in ("exact", None) or
                                                          r["vllm_counts"].startswith("expected") else " >="))
        lines.append(line + [c.ci(r["accept_rate"], r["accept_rate_lo"], r["accept_rate_hi"]), vllm, est,
                             f"{r['n_prompts']}/{r['n_positions']}", str(r["budget"])])
    return c.table(header, lines, keep=5)


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
        outside = int(df.filter(df["category"] == "all")["cost_extrapolated"].fill_null(False).sum()) \
            if "cost_extrapolated" in df.columns else 0
        if outside:
            lines.append(f"{outside} configuration row(s) priced past what the profile measured (--cost-extrapolate: "
                         "batch, tokens, draft width or context; the edge's time plus a fitted non-negative slope, at "
                         "most 2x): cost_extrapolated in --out")
        covers = df["speedup_ci_covers"].drop_nulls().unique(maintain_order=True).to_list() \
            if "speedup_ci_covers" in df.columns else []
        if covers:
            lines.append("speedup CIs cover: " + "; ".join(covers))
        if (df["batch"] > 1).any():
            lines.append(f"batch rows: {df['batching'].drop_nulls()[0]} batching on a timeline of engine steps; speedup "
                         "over plain batched decoding at the same batch size; CIs "
                         f"{df.filter(df['batch'] > 1)['n_boot'][0]} bootstrap replicates of the schedule")
    elif "speedup_assumed" in df.columns:
        lines.append(f"speed: {first['cost_basis']} -- speedup_assumed is an ASSUMPTION, not measured; "
                     "measure with `specsim profile` and pass --cost-profile")
    else:
        lines.append("speed: no speedup without costs; measure them with `specsim profile` and pass --cost-profile")
    ci = (f"95% bootstrap over prompts, its percentiles expanded for each row's prompt count ({first['n_boot']} "
          f"resamples, seed {first['seed']})"
          if first["n_prompts"] > 1 else "no CI (n = 1 prompt)")
    lines.append(f"CIs: {ci}; exact = closed form / dynamic program on the cached trajectories, no Monte-Carlo")
    caveat = few_prompts_caveat(df["n_prompts"].to_list())
    if caveat:
        lines.append(caveat)
    if (df["estimate"] != "exact").any():
        used = df.filter(df["estimate"] != "exact").select("policy", "samples").drop_nulls()
        per = ", ".join(f"{p} {max(used.filter(used['policy'] == p)['samples'].to_list())}"
                        + (" chains drawn from q" if p == "block" else "")
                        for p in sorted(set(used["policy"].to_list())))
        lines.append("MC ±x: Monte-Carlo standard error of tokens/call (batch rows: of the speedup)"
                     + (f"; samples per position: {per}" if per else ""))
    if df["approximate"].any():
        lines.append("*: approximate (a lossy rule evaluated along target trajectories, or a top-k cache's tail)")
    lines.append("vLLM mean acc. len: 1 + accepted / drafting steps, as vLLM counts (the prompt pass emits the first "
                 "token; drafts accepted past the output limit count); all its counters are in --out (vllm_*)")
    lower = df.filter(df["vllm_counts"].is_not_null() & df["vllm_counts"].str.starts_with("a lower bound"))
    if lower.height:
        lines.append(">=: " + lower["vllm_counts"][0])
    return "\n".join(lines)

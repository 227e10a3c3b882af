"""`specsim validate`: run live decoding on a cache's own setup and check the simulator against it."""

from __future__ import annotations

from pathlib import Path

import click

from specsim import specs as registry
from specsim.cli import _common as c


@c.command("validate")
@click.argument("cache", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--tree", "trees", multiple=True, default=("chain:4",), show_default=True, metavar="SPEC",
              help="Draft tree to check (repeatable): chain:4, kary:2,3, widths:4,2,1, ...")
@click.option("--engine", type=c.choice(registry.ENGINES), default="specsim", show_default=True,
              help="Ground truth: specsim's own live decoding, or vLLM (run in its own environment, `make vllm`) "
                   "with its spec-decode counters compared to the replay's.")
@click.option("--policy", "policies", multiple=True, callback=c.specs,
              metavar="|".join(registry.policy_names(vllm=True) + registry.policy_names(live=True, adaptive=True)),
              help="greedy: per-call agreement on the T=0 trajectories; sample: acceptance paired by prompt at each "
                   "recorded T>0; "
                   "adaptive-hf, adaptive-history[:hi,lo]: a chain whose length adapts call by call, checked "
                   "call by call at T=0 and paired by prompt at each recorded T>0; "
                   "greedy-draft (--engine vllm): the draft's argmax verified as a point mass, vLLM's default "
                   "draft_sample_method at T>0. Repeatable or comma-separated.  [default: greedy]")
@click.option("--draft", "drafts", multiple=True, metavar="NAME", callback=c.names,
              help="Recorded draft column (or model-free ngram:N / prompt-lookup:N / suffix[:k=v,...]), "
                   "repeatable or comma-separated. "
                   "Default: every recorded draft.")
@click.option("--temperature", "temperatures", multiple=True, metavar="T", callback=c.numbers(float, minimum=0),
              help="Recorded T>0 to check under --policy sample. Default: every recorded T>0.")
@click.option("--multi-draft", type=c.choice(registry.MULTI_DRAFT), default="iid", show_default=True,
              help="How a sampling tree draws a node's k candidates from q. "
                   + registry.vocab_help(registry.MULTI_DRAFT) + ".")
@click.option("--repeats", type=click.IntRange(min=1), default=4, show_default=True,
              help="Sampling: live decodes per prompt, each with its own seed.")
@click.option("--min-agreement", type=click.FloatRange(0, 1), default=0.99, show_default=True,
              help="Greedy: share of live calls that must accept exactly what the replay accepts.")
@c.cost_profile_option("A `specsim profile` of this machine: also compare the predicted speedup with the live one "
                       "(plain decoding of the same requests runs in the same run).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Requests decoded together live, and the batch size the prediction is made for.")
@click.option("--batching", type=c.choice(registry.BATCHING), default="lockstep", show_default=True,
              help="How B requests share engine steps. " + registry.vocab_help(registry.BATCHING) + ".")
@click.option("--speed-tolerance", type=click.FloatRange(0, 10), default=None,
              help="A speedup check passes when predicted / live is within 1 ± this.  [default: 0.10; with --engine "
                   "vllm 0.15, the prediction priced from a profile of vLLM's own steps]")
@click.option("--rounds", type=click.IntRange(min=0), default=0, show_default=True,
              help="--engine vllm: also time vLLM's speculative against its plain decoding of the same requests, "
                   "this many rounds each, alternating (0: no speed check).")
@click.option("--engine-log", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="--engine vllm: keep vLLM's logs in this directory.")
@click.option("--fix-vllm-cpu", is_flag=True,
              help="--engine vllm at T>0 on vLLM's CPU build: run it with its expand kernel corrected (vLLM 0.32 "
                   "divides the target's logits by uninitialised temperatures when it verifies drafts at T>0, "
                   "cpu_triton_utils._expand_kernel_impl); the check says so. Without it such a check is "
                   "reported as not comparable.")
@c.seed_option
@c.device_option
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for torch (the profile's, for a speed comparison).")
@c.out_options
@click.option("--steps-out", type=str, default=None, metavar="PATH",
              help="Greedy: write every compared call (live vs simulated accepted length, verdict).")
@c.quiet_option
@c.friendly_errors
def validate(cache, engine, trees, policies, drafts, temperatures, multi_draft, repeats, min_agreement, cost_profile,
             batch, batching, speed_tolerance, rounds, engine_log, fix_vllm_cpu, seed, device, threads, out, out_format,
             overwrite, steps_out, quiet):
    """Run `specsim live` on CACHE's prompts, models and settings and compare it with `specsim simulate`.

    \b
    greedy   live output must equal the cached greedy trajectory, and each live call
             must accept what the simulator's replay accepts at the same position
             (>= --min-agreement of calls). Disagreements are classified from the
             cached logits: near-tie (target/draft top logits within float16
             rounding), draft ≠ cache (the draft rerun one token at a time ranks
             the token differently from the cached batched pass) or unexplained
             (a bug). Fails on any unexplained one or below --min-agreement.
    sample   live acceptance rate (--repeats seeds per prompt) and the simulated one,
             each with a 95% bootstrap CI, and their difference paired by prompt
             (a prompt's live decodes against the replay of its cached trajectory);
             passes when that difference's 95% interval holds 0. Over fewer than 8
             prompts an interval that excludes 0 is inconclusive; a single prompt
             gives no interval: inconclusive.
    speedup  with --cost-profile: the speedup simulate predicts from the cache and the
             profile, at --batch, beside the live speedup over plain decoding of the
             same requests in the same run; passes within --speed-tolerance.

    With --engine vllm the ground truth is vLLM (`make vllm` creates its environment), run on
    the cache's prompts as token ids with the cache's max_new_tokens, the draft and chain
    mapped to its speculative_config (vllm-ngram:min=A,max=B -> ngram; a draft model or
    layers:K -> draft_model, layers:K written out as a model directory):

    \b
    greedy   vLLM's outputs must equal the cached trajectories and its counters
             (num_drafts, num_draft_tokens, num_accepted_tokens, per position) the
             replay's, exactly; every request's steps are compared one by one and a
             difference is classified (float tie in the target, different proposal,
             different acceptance).
    sample / greedy-draft
             vLLM samples anew (--repeats seeds per prompt): its mean acceptance
             length minus the replay's, paired by prompt, must have a 95%
             interval that holds 0 (as for sample).
    --rounds vLLM's own speedup (speculative vs plain, same requests, alternating),
             beside specsim's prediction when --cost-profile is given.

    Exits with status 1 when any check fails.

    \b
    Examples:
      specsim validate cache/validate.h5 --tree chain:4 --tree kary:2,2
      specsim validate cache/validate.h5 --tree chain:4 --policy sample --repeats 4
      specsim validate cache/demo.h5 --draft int8 --cost-profile profile.json --batch 4 --out checks.csv
      specsim validate cache/v.h5 --engine vllm --draft vllm-ngram:min=2,max=3 --tree chain:4
      specsim validate cache/v.h5 --engine vllm --draft layers:20 --tree chain:3 --rounds 3
    """
    from specsim.errors import SpecError
    from specsim.interrupts import sigterm_as_interrupt

    target, fmt = c.out_target(out, out_format, overwrite)
    if engine_log is not None:
        from specsim.files import check_writable

        check_writable("--engine-log", engine_log)
    steps_target = c.out_target(steps_out, None, overwrite, "--steps-out") if steps_out else (None, None)
    if engine == "vllm":
        with sigterm_as_interrupt():
            return _validate_vllm(cache, trees, policies, drafts, temperatures, repeats, cost_profile, batch, rounds,
                                  speed_tolerance, engine_log, fix_vllm_cpu, seed, threads, target, fmt, steps_target,
                                  quiet)
    if rounds or engine_log is not None or fix_vllm_cpu:
        raise SpecError("--rounds, --engine-log and --fix-vllm-cpu go with --engine vllm")
    from specsim.live.validate import ValidateConfig, run_validation
    unreplayed = [p for p in policies if not registry.parse_policy(p).kind.replayed]
    if unreplayed:
        raise SpecError(f"--policy {unreplayed[0]!r} is run live, not replayed, so there is nothing to validate: "
                        f"`specsim live --policy {unreplayed[0]}` measures it")
    bad = [p for p in policies if not registry.parse_policy(p).kind.live]
    if bad:
        raise SpecError(f"--policy {bad[0]!r}: specsim's live engine decodes with "
                        f"{', '.join(registry.policy_names(live=True))} (--engine vllm also checks greedy-draft)")
    config = ValidateConfig(trees=tuple(trees), policies=tuple(policies) or ("greedy",), drafts=tuple(drafts),
                            temperatures=tuple(temperatures), multi_draft=multi_draft, repeats=repeats,
                            min_agreement=min_agreement, seed=seed,
                            cost_profile=None if cost_profile is None else tuple(str(p) for p in cost_profile)
                            if isinstance(cost_profile, tuple) else str(cost_profile), batch=batch,
                            batching=batching, **_tolerance(speed_tolerance))
    try:
        with sigterm_as_interrupt():
            report = run_validation(cache, config, device=device, threads=threads, progress=not quiet,
                                    echo=lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        raise click.ClickException("interrupted; no verdict") from None
    echo = _checks_table(report.checks, target)
    setup = report.setup
    echo(f"\nlive on {report.device} vs simulate on {cache} (target {setup.target}, {len(setup.prompts)} "
         f"prompts, max {setup.max_new_tokens} new tokens, batch {batch} {batching})")
    _warn_leaks(cache, [ch.draft for ch in report.checks])
    if cost_profile is not None:
        named = ", ".join(str(p) for p in cost_profile) + " pooled" if isinstance(cost_profile, tuple) else cost_profile
        echo(f"speedup: predicted from {named} (measured costs) vs live over plain decoding of the "
             "same requests in the same run (decode steps only); ratio = predicted / live")
        drift = _drift_line(report.checks)
        if drift:
            echo(drift)
    rows = [{"draft": ch.draft, "tree": ch.tree, "policy": ch.policy, "temperature": ch.temperature,
             "batch": ch.batch, "batching": batching, "check": ch.kind, "verdict": ch.verdict,
             "comparison": ch.comparison, "detail": ch.detail, "device": report.device, **ch.values}
            for ch in report.checks]
    _finish(report, rows, echo, (target, fmt), steps_target, steps="compared calls", undecided="inconclusive")


def _finish(report, rows: list[dict], echo, out: tuple, steps_out: tuple, *, steps: str, undecided: str) -> None:
    """Write the checks' rows to `out` and the compared steps to `steps_out` ((target, format) each; target None:
    not asked for), then the verdict: exit 1 naming how many failed, else say all passed or how many checks
    decided nothing (`undecided`: what such a check is called)."""
    import polars as pl

    if out[0] is not None:
        frame = pl.DataFrame(rows, infer_schema_length=None)
        echo(f"wrote {len(frame)} checks to {c.write_frame(frame, *out)}")
    if steps_out[0] is not None and report.steps:
        frame = pl.DataFrame(report.steps, infer_schema_length=None)
        echo(f"wrote {len(frame)} {steps} to {c.write_frame(frame, *steps_out)}")
    if report.failed:
        click.echo(f"{report.failed} of {len(report.checks)} checks FAILED", err=True)
        raise SystemExit(1)
    echo(f"all {len(report.checks)} checks passed" if all(ch.passed for ch in report.checks) else
         f"no check failed ({sum(ch.passed is None for ch in report.checks)} {undecided})")


def _checks_table(checks, target):
    """Print the checks' table, and return how the rest is printed: to stderr when the rows go to stdout (`--out
    -`)."""
    echo = (lambda text="": click.echo(text, err=True)) if target == "-" else click.echo
    header = ["draft", "tree", "policy", "T", "batch", "check", "comparison", "verdict", "detail"]
    lines = [[ch.draft, ch.tree, ch.policy, f"{ch.temperature:g}", str(ch.batch), ch.kind, ch.comparison, ch.verdict,
              ch.detail] for ch in checks]
    echo(c.table(header, lines, keep=8))
    return echo


def _drift_line(checks) -> str | None:
    """How fast the machine ran plain decoding live against what the profile predicts for it: the drift since
    profiling, which the speedup ratio largely cancels (plain and speculative decoding alternate in one run) but
    the predicted CIs do not carry (docs/design.md §3); None without speed checks."""
    runs = {(ch.policy, ch.temperature, ch.batch): ch.values["plain_tokens_per_s_live"]
            / ch.values["plain_tokens_per_s_predicted"] for ch in checks
            if ch.kind == "speedup" and ch.values.get("plain_tokens_per_s_predicted")}
    if not runs:
        return None
    low, high = min(runs.values()), max(runs.values())
    span = f"{low:.3f}" if abs(high - low) < 5e-4 else f"{low:.3f} to {high:.3f}"
    return (f"machine speed: plain decoding ran live at {span}x the tokens/s the profile predicts ({len(runs)} plain "
            f"run{'s' if len(runs) > 1 else ''}): the drift since profiling, which the speedup ratio largely cancels "
            "and the predicted CIs do not carry; profile again, or pool a fresh profile with --cost-profile twice")


def _tolerance(value: float | None) -> dict:
    """--speed-tolerance as a config field: given, or the config's own default (each engine has one)."""
    return {} if value is None else {"speed_tolerance": value}


def _warn_leaks(cache, drafts) -> None:
    """Say when a head draft is checked on prompts it was trained on (its numbers there are not held out)."""
    from specsim.cache.provenance import leakage_lines

    for line in leakage_lines(cache, drafts):
        click.echo(line, err=True)


def _validate_vllm(cache, trees, policies, drafts, temperatures, repeats, cost_profile, batch, rounds,
                   speed_tolerance, engine_log, fix_vllm_cpu, seed, threads, target, fmt, steps_target, quiet):
    """`validate --engine vllm` (see the command's help)."""
    from specsim.engines.check import EngineValidateConfig, validate_with_vllm
    from specsim.errors import SpecError

    if isinstance(cost_profile, tuple):
        raise SpecError("--engine vllm compares with one --cost-profile; pooled profiles go with specsim's live engine")
    bad = [p for p in policies if p not in registry.policy_names(vllm=True)]
    if bad:
        raise SpecError(f"--policy {bad[0]!r}: vLLM verifies chains with {', '.join(registry.policy_names(vllm=True))}")
    config = EngineValidateConfig(trees=tuple(trees), policies=tuple(policies) or ("greedy",), drafts=tuple(drafts),
                                  temperatures=tuple(temperatures), repeats=repeats, batch=batch, rounds=rounds,
                                  seed=seed, cost_profile=None if cost_profile is None else str(cost_profile),
                                  threads=threads, log_dir=None if engine_log is None else str(engine_log),
                                  fix_cpu_expand=fix_vllm_cpu, **_tolerance(speed_tolerance))
    try:
        report = validate_with_vllm(cache, config, echo=(lambda line: None) if quiet else
                                    (lambda line: click.echo(line, err=True)), progress=not quiet)
    except KeyboardInterrupt:
        raise click.ClickException("interrupted; no verdict") from None
    echo = _checks_table(report.checks, target)
    setup = report.setup
    echo(f"\nvLLM {report.vllm_version} vs simulate on {cache} (target {setup['target']}, {setup['prompts']} prompts "
         f"as token ids, max {setup['max_new_tokens']} new tokens, batch {batch}); counters with vLLM's meaning "
         "(docs/design.md §6)")
    _warn_leaks(cache, [ch.draft for ch in report.checks])
    rows = [{"engine": f"vllm {report.vllm_version}", "draft": ch.draft, "tree": ch.tree, "policy": ch.policy,
             "temperature": ch.temperature, "batch": ch.batch, "check": ch.kind, "verdict": ch.verdict,
             "comparison": ch.comparison, "detail": ch.detail, **ch.values} for ch in report.checks]
    _finish(report, rows, echo, (target, fmt), steps_target, steps="compared vLLM steps", undecided="informational")

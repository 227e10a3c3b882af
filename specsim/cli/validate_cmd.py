"""`specsim validate`: run live decoding on a cache's own setup and check the simulator against it."""

from __future__ import annotations

from pathlib import Path

import click

from specsim.cli._common import friendly_errors


def _fmt_ci(v: tuple[float, float, float]) -> str:
    return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


@click.command("validate")
@click.argument("cache", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--tree", "trees", multiple=True, default=("chain:4",), show_default=True, metavar="SPEC",
              help="Draft tree to check (repeatable): chain:4, kary:2,3, widths:4,2,1, ...")
@click.option("--policy", "policies", multiple=True, type=click.Choice(["greedy", "sample"]),
              default=("greedy",), show_default=True,
              help="greedy: per-step agreement on the T=0 trajectories; sample: CI overlap at each recorded T>0.")
@click.option("--draft", "drafts", multiple=True, metavar="NAME",
              help="Recorded draft column (or ngram:N / prompt-lookup:N). Default: every recorded draft.")
@click.option("--temperature", "temperatures", multiple=True, type=float, metavar="T",
              help="Recorded T>0 to check under --policy sample. Default: every recorded T>0.")
@click.option("--multi-draft", type=click.Choice(["iid", "swor"]), default="iid", show_default=True,
              help="Candidate drawing of sampling trees.")
@click.option("--repeats", type=click.IntRange(min=1), default=4, show_default=True,
              help="Sampling: live decodes per prompt, each with its own seed.")
@click.option("--min-agreement", type=click.FloatRange(0, 1), default=0.99, show_default=True,
              help="Greedy: share of live calls that must accept exactly what the replay accepts.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of live sampling and the bootstrap.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads for torch.")
@click.option("--steps-out", type=click.Path(path_type=Path), default=None,
              help="Greedy: write every compared call (live vs simulated accepted length, verdict) to .csv/.parquet.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@friendly_errors
def validate(cache, trees, policies, drafts, temperatures, multi_draft, repeats, min_agreement, seed, device,
             threads, steps_out, quiet):
    """Run `specsim live` on CACHE's prompts, models and temperatures and compare it with `specsim simulate`.

    \b
    greedy  live output must equal the cached greedy trajectory, and each live call
            must accept what the simulator's replay accepts at the same position
            (>= --min-agreement of calls). Disagreements are classified from the
            cached logits: near-tie (target/draft top logits within float16
            rounding), draft ≠ cache (the draft rerun one token at a time ranks
            the token differently from the cached batched pass) or unexplained
            (a bug). Fails on any unexplained one or below --min-agreement.
    sample  live mean acceptance (--repeats seeds per prompt) and the simulated one,
            each with a 95% bootstrap CI; passes when the intervals overlap.

    Exits with status 1 when any check fails.

    \b
    Examples:
      specsim validate cache/validate.h5 --tree chain:4 --tree kary:2,2
      specsim validate cache/validate.h5 --tree chain:4 --policy sample --repeats 4
      specsim validate cache/validate.h5 --policy greedy --policy sample --draft int8 --steps-out steps.csv
    """
    import polars as pl

    from specsim.cli.live_cmd import check_out, device_label, load_models
    from specsim.errors import CacheError
    from specsim.live.engine import LiveConfig, Target
    from specsim.live.drafting import is_model_free
    from specsim.live.runs import build_drafter, run_live, summary_rows
    from specsim.live.validate import cache_setup, greedy_agreement, sampling_agreement
    from specsim.record.models import eos_token_ids
    from specsim.trees import parse_tree

    check_out(steps_out, "--steps-out")
    setup = cache_setup(cache)
    drafts = list(drafts) or list(setup.drafts)
    if not drafts:
        raise CacheError(f"{cache}: records no draft; name a model-free one (--draft ngram:3)")
    for d in drafts:
        if d not in setup.drafts and not is_model_free(d):
            raise CacheError(f"{cache}: no draft named {d!r}; recorded drafts: {', '.join(setup.drafts)}")
    parsed = [(spec, parse_tree(spec)) for spec in dict.fromkeys(trees)]
    plan: list[tuple[str, float]] = []
    for policy in dict.fromkeys(policies):
        if policy == "greedy":
            if 0.0 not in setup.temperatures:
                raise CacheError(f"{cache}: greedy validation needs T=0 trajectories; recorded: "
                                 + ", ".join(f"{t:g}" for t in setup.temperatures))
            plan.append(("greedy", 0.0))
            continue
        hot = [t for t in setup.temperatures if t > 0]
        wanted = [t for t in hot if not temperatures or any(abs(t - w) < 1e-6 for w in temperatures)]
        if not wanted:
            raise CacheError(f"{cache}: sampling validation needs recorded T>0 trajectories"
                             + (f" at {', '.join(f'{t:g}' for t in temperatures)}" if temperatures else "")
                             + "; recorded: " + ", ".join(f"{t:g}" for t in setup.temperatures))
        plan += [("sample", t) for t in wanted]

    loaded, device = load_models(setup.target, device, setup.dtype, threads)
    target = Target(loaded.model, eos_token_ids(loaded))
    verdicts, step_rows = [], []
    for draft in drafts:
        drafter = build_drafter(draft, loaded, device=device, dtype=setup.dtype)
        for policy, T in plan:
            for spec, tree in parsed:
                config = LiveConfig(tree=tree, policy=policy, temperature=T, multi_draft=multi_draft,
                                    max_new_tokens=setup.max_new_tokens)
                run = run_live(target, drafter, setup.prompts, config, target_name=loaded.name,
                               repeats=1 if policy == "greedy" else repeats, seed=seed,
                               device=device_label(device), plain=False, progress=not quiet)
                if run.interrupted:
                    raise click.ClickException("interrupted; no verdict")
                if policy == "greedy":
                    g = greedy_agreement(run, cache, draft, tree, min_agreement=min_agreement,
                                         draft_model=getattr(drafter, "kv", None) and drafter.kv.model)
                    step_rows += [{"draft": draft, "tree": tree.name, **s.__dict__} for s in g.steps]
                    diverged = (f"; {len(g.divergences)} outputs left the cached trajectory "
                                f"({sum(d.verdict.startswith('near') for d in g.divergences)} near-tie)"
                                if g.divergences else "; output = cached trajectory")
                    verdicts.append((draft, tree.name, "greedy", 0.0,
                                     f"{g.identical}/{len(g.steps)} calls identical ({g.agreement:.1%})",
                                     f"{g.near_ties} near-tie, {g.draft_mismatches} draft ≠ cache, "
                                     f"{g.unexplained} unexplained{diverged}", g.passed))
                    continue
                from specsim.sim.api import simulate

                live_row = summary_rows(run, by_category=False, seed=seed)[0]
                sim_row = simulate(cache, trees=[spec], drafts=[draft], policies=["sample"],
                                   temperatures=[T], multi_draft=multi_draft, by_category=False,
                                   seed=seed).row(0, named=True)
                a = sampling_agreement(live_row, sim_row)
                verdicts.append((draft, tree.name, "sample", T,
                                 f"live {_fmt_ci(a.live)} vs sim {_fmt_ci(a.simulated)}",
                                 f"accept rate; {a.live_decodes} live decodes, {a.simulated_positions} cached "
                                 f"positions, sim {a.estimate}; CIs {'overlap' if a.overlap else 'DISJOINT'}",
                                 a.overlap))
    header = ["draft", "tree", "policy", "T", "comparison", "detail", "verdict"]
    lines = [[d, t, p, f"{T:g}", c, detail, "PASS" if ok else "FAIL"] for d, t, p, T, c, detail, ok in verdicts]
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    click.echo("\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines]))
    click.echo(f"\nlive on {device_label(device)} vs simulate on {cache} (target {setup.target}, "
               f"{len(setup.prompts)} prompts, max {setup.max_new_tokens} new tokens)")
    if steps_out is not None and step_rows:
        frame = pl.DataFrame(step_rows, infer_schema_length=None)
        (frame.write_csv if steps_out.suffix.lower() == ".csv" else frame.write_parquet)(steps_out)
        click.echo(f"wrote {len(frame)} compared calls to {steps_out}")
    failed = sum(not v[-1] for v in verdicts)
    if failed:
        click.echo(f"{failed} of {len(verdicts)} checks FAILED", err=True)
        raise SystemExit(1)
    click.echo(f"all {len(verdicts)} checks passed")

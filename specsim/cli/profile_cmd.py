"""`specsim profile`: measure the step times the speedup model needs, on this machine."""

from __future__ import annotations

from pathlib import Path

import click

from specsim import specs as registry
from specsim.cli import _common as c


@c.command("profile")
@click.option("--engine", type=c.choice(registry.ENGINES), default="specsim", show_default=True,
              help="Whose steps to time: specsim's live engine, or vLLM's (needs --for CACHE and `make vllm`): "
                   "vLLM decoding with plain, fixed-length and draft-model steps, written as a profile of vLLM's "
                   "costs for that cache's models and contexts.")
@click.option("--for", "for_cache", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              metavar="CACHE", help="Measure only what simulating this cache needs: its target, its recorded "
                                    "model drafts (or --draft), its contexts, and with --tree the token counts "
                                    "and draft widths those trees run (--engine vllm: always needed).")
@click.option("--tree", "trees", multiple=True, metavar="SPEC",
              help="With --for: the trees you will simulate (repeatable; chain:4, kary:2,2, widths:4,2,1, "
                   "dynamic:..., file:t.json): N and w are measured for exactly their steps.")
@click.option("--target", default=None, help="Target model: packaged short name, GGUF file, HF directory or hub id.")
@click.option("--draft", "drafts", multiple=True, metavar="SPEC", callback=c.names,
              help="Draft model (repeatable): a model spec like --target, layers:K, int8, or heads "
                   f"{registry.head_specs()} (Medusa: one pass of every head per call; EAGLE, EAGLE-3, MTP: its layer per "
                   "tree level). "
                   "Model-free drafts (ngram, prompt-lookup, suffix) need none: they cost no draft forwards.")
@click.option("--batch", "batches", multiple=True, metavar="B", callback=c.numbers(int, minimum=1),
              help="Batch sizes to measure (requests per step), repeatable or comma-separated, e.g. 1,4,16; every "
                   "size up to 8 is measured too.  [default: 1]")
@click.option("--contexts", multiple=True, metavar="L", callback=c.numbers(int, minimum=1),
              help="Context lengths L (tokens already cached per request), repeatable or comma-separated; cover the "
                   "contexts you simulate.  [default: 128,512]")
@click.option("--max-tokens", type=click.IntRange(min=2),
              help="Largest number of tokens verified per request in one target forward (every N up to 17, then "
                   "steps of 8). Cover the largest budget you simulate + 1 for the root.  [default: 33 on CPU, "
                   "256 on CUDA]")
@click.option("--draft-widths", multiple=True, metavar="W", callback=c.numbers(int, minimum=1),
              help="Draft forward widths w (tokens per request per draft step: tree level widths), repeatable or "
                   "comma-separated.  [default: 1,2,...,8]")
@c.device_option
@click.option("--dtype", type=c.choice(["auto", *registry.DTYPES]), default="auto",
              show_default=True, help="auto: float32 on CPU, bfloat16 on CUDA.")
@click.option("--repeats", type=click.IntRange(min=1), default=None,
              help="Timed rounds: each times every entry of a (batch, context) once, in random order; all "
                   "kept, the median used.  [default: 10; --engine vllm: 3 generate calls of 16 steps]")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed runs per entry in the first pass.")
@click.option("--passes", type=click.IntRange(min=1), default=None,
              help="Sweeps through the (batch, context) grid the rounds are spread over (each later sweep "
                   "refills the contexts and runs one untimed forward per model first), so a slow phase of a "
                   "shared machine lands on a few rounds of several entries, which the median discards, not on "
                   "every round of one.  [default: 3]")
@click.option("--max-repeats", type=click.IntRange(min=1), default=None,
              help="After --repeats rounds, keep timing the entries whose median still has a standard error over "
                   "5% (estimated from its rounds' quartiles), one more pass over them at a time, in rounds among "
                   "themselves, until none has or they have run this many rounds: the rounds go to the uncertain "
                   "steps (a small head's 4 ms ones), not to the target's steady 40 ms ones (round r of every entry "
                   "comes from one pass, so they still resample jointly). Small steps on a shared CPU need it: an "
                   "EAGLE-3 head's 5-15 ms steps had 78% with 3 rounds and 16% with 9. --engine vllm: an entry "
                   "with a call over 1.5x its median gets more calls, one at a time, up to this many.  [default: "
                   "--repeats, no more; --engine vllm: 2 x --repeats + 1]")
@c.seed_option
@click.option("--threads", type=click.IntRange(min=1),
              help="CPU threads for torch (use what live decoding will use; the profile records it).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Profile JSON to write.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file.")
@c.quiet_option
@c.friendly_errors
def profile(engine, for_cache, trees, target, drafts, batches, contexts, max_tokens, draft_widths, device, dtype,
            repeats, warmup, passes, max_repeats, seed, threads, out, overwrite, quiet):
    """Measure target verification and draft step times on this machine, for the speedup model.

    With the live engine's own code, over B requests whose KV caches hold L random
    tokens, times one target forward over N new tokens per request laid out as a draft
    tree (4-D tree mask; N = 1 is a plain decode step) and one draft forward over w new
    tokens per request (one tree level), for every B x L x N and B x L x w. Each entry
    is the median of --repeats synchronised wall-clock runs, timed in rounds (every entry
    of a (B, L) once per round, in random order; the rounds spread over --passes sweeps
    through the grid) and all kept: `simulate` resamples the
    rounds jointly, so its speedup CIs carry the profile's own scatter. `specsim
    simulate`, `optimize`, `validate` and `report` take the JSON with --cost-profile and
    refuse it for models it did not measure. A shared machine drifts between minutes
    (10-15% measured): profile again later with the same settings and give `simulate`,
    `optimize` or `validate` both (--cost-profile twice) for CIs that carry that drift.

    \b
    Examples:
      specsim profile --target smollm2-135m --draft int8 --draft layers:20 --batch 1,4 \\
          --contexts 128,512 --max-tokens 32 --out profiles/cpu.json
      specsim profile --target Qwen/Qwen2.5-7B-Instruct --draft Qwen/Qwen2.5-0.5B-Instruct \\
          --device cuda --batch 1,4,16,64 --contexts 512,2048,8192 --out profiles/h100.json
      specsim profile --engine vllm --for cache/v.h5 --draft layers:20 --batch 1,4 --max-tokens 5 \\
          --repeats 3 --out profiles/vllm.json      # vLLM's own step costs (make vllm)
    """
    import transformers

    from specsim.attention.profile import ProfileConfig, check_config, estimate, measure_cost_profile, write_profile
    from specsim.errors import SpecError
    from specsim.files import check_writable
    from specsim.record.models import load_draft, load_model, resolve_device

    if out.suffix != ".json":
        raise click.BadParameter(f"{out}: use a .json file name", param_hint="--out")
    if out.exists() and not overwrite:
        raise SpecError(f"{out} exists; pass --overwrite to replace it")
    check_writable("--out", out)  # before minutes of measuring
    if engine == "vllm":
        if trees:
            raise SpecError("--tree goes with specsim's engine; vLLM's profile times fixed-length steps up to "
                            "--max-tokens")
        if passes is not None:
            raise SpecError("--passes goes with specsim's engine; vLLM's profile times whole generate calls, an "
                            "engine at a time")
        return _vllm(for_cache, target, drafts, batches, contexts, max_tokens, draft_widths, repeats, max_repeats,
                     warmup, seed, threads, out, overwrite, quiet)
    if trees and for_cache is None:
        raise SpecError("--tree goes with --for CACHE (the trees whose steps to measure on that cache)")
    if for_cache is not None:
        if target is not None or contexts or max_tokens or draft_widths:
            raise SpecError("--for CACHE takes the target, contexts, token counts and widths from the cache and "
                            "--tree: drop --target, --contexts, --max-tokens and --draft-widths")
        target, drafts, contexts, max_tokens, draft_widths = plan_for(for_cache, trees, drafts)
        click.echo(f"for {for_cache}: target {target}, drafts {', '.join(drafts) or 'none'}, contexts "
                   f"{', '.join(map(str, contexts))}, N <= {max_tokens}, draft widths "
                   f"{', '.join(map(str, draft_widths)) or 'none'}", err=True)
    if target is None:
        raise SpecError("give --target (the model whose steps to time)")
    device = resolve_device(device)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    on_cuda = device.startswith("cuda")
    dtype = ("bfloat16" if on_cuda else "float32") if dtype == "auto" else dtype
    config = ProfileConfig(
        batches=tuple(batches) or (1,), contexts=tuple(contexts) or (128, 512),
        max_tokens=max_tokens or (256 if on_cuda else 33), draft_widths=tuple(draft_widths) or tuple(range(1, 9)),
        repeats=repeats or 10, warmup=warmup, passes=passes or 3, max_repeats=max_repeats or 0, seed=seed,
    )
    check_config(config)
    from specsim.specs import is_model_free

    free = [d for d in drafts if is_model_free(d)]
    if free:
        raise SpecError(f"--draft {free[0]}: model-free drafts run no draft forwards; profile the target alone")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    click.echo(f"loading target {target}" + (f" and drafts {', '.join(drafts)}" if drafts else "")
               + f" ({dtype}, {device}) ...", err=True)
    p_target = load_model(target, device=device, dtype=dtype)
    from specsim.specs import is_head_draft

    def loaded(spec: str):
        if is_head_draft(spec):  # Medusa / EAGLE heads ride on the target: timed as the engine drafts with them
            from specsim.record.head_checkpoints import load_heads

            return load_heads(spec, p_target)
        return load_draft(spec, p_target, device=device, dtype=dtype)

    q_drafts = [loaded(d) for d in drafts]
    click.echo(estimate(p_target, q_drafts, config), err=True)
    body = measure_cost_profile(p_target, q_drafts, config=config, progress=not quiet)
    write_profile(body, out, overwrite=overwrite)
    click.echo(summary(body))
    click.echo(f"wrote {out}")


def plan_for(cache, trees, drafts) -> tuple[str, tuple, tuple, int, tuple]:
    """(target, drafts, contexts, max tokens N, draft widths) that simulating `trees` on `cache` prices: the
    cache's shortest and longest context and one between; every N and w the trees' steps run at any room
    (and the root feeds: 2 after an unfed leaf, 1 + A for EAGLE layers and dynamic trees); for a tree fitted
    on the cache (optimal:N), whatever a tree of N nodes may run."""
    from specsim.engines.check import read_cache
    from specsim.errors import SpecError
    from specsim.sim.cost import tree_by_room
    from specsim.specs import drafts_in_one_pass, feeds_accepted, fitted_budget, is_model_free, needs_fit, parse_tree

    data = read_cache(cache)
    drafts = tuple(drafts) or tuple(d for d in data.drafts if not is_model_free(d))
    missing = [d for d in drafts if d not in data.drafts]
    if missing:
        raise SpecError(f"--draft {missing[0]}: not recorded in {cache} (recorded: {', '.join(data.drafts) or 'none'})")
    lengths = [len(p) for p in data.prompts]
    lo, hi = min(lengths), max(lengths) + data.max_new_tokens
    contexts = tuple(sorted({lo, (lo + hi) // 2, hi}))
    fitted = [fitted_budget(t) for t in trees if needs_fit(t)]  # optimal:N: any tree of N nodes
    parsed = [parse_tree(t) for t in trees if not needs_fit(t)] or ([] if fitted else [parse_tree("chain:4")])
    tokens, widths = {2}, set()
    for n in fitted:
        tokens.update(range(1, n + 2))
        widths.update(range(1, n + 2) if drafts else ())  # a level of up to N nodes; feeds of up to 1 + N
    for tree in parsed:
        for d in drafts or (None,):
            one_pass = d is not None and drafts_in_one_pass(d)
            for shape in tree_by_room(tree, model_draft=d is not None, one_pass=one_pass):
                tokens.add(shape.verify_tokens)
                widths.update(shape.draft_levels)
            if d is not None and tree.budget and not one_pass:
                widths.update(range(1, tree.max_depth + 2) if feeds_accepted(d, tree) else (2,))
    return data.target, drafts, contexts, max(tokens), tuple(sorted(widths)) if drafts else (1,)


def summary(body: dict) -> str:
    """Plain step time per (B, L) and the other entries in plain-step units."""
    counts = {len(cell.get("runs") or []) or body["timing"]["repeats"]  # --max-repeats: some entries ran more
              for *_, cell in _entries(body)}
    runs = f"{min(counts)}" if len(counts) == 1 else f"{min(counts)}-{max(counts)}"
    lines = [f"device: {body['device']}  dtype: {body['dtype']}  target: {body['target']['name']}  drafts: "
             f"{', '.join(body['drafts']) or 'none'}  (median of {runs} runs, random token ids; "
             f"load average {body['load_average']['before']} -> {body['load_average']['after']})"]
    for B in body["batches"]:
        for L in body["contexts"]:
            row = body["target_verify_s"][str(B)][str(L)]
            unit = row["1"]["median"]
            lines.append(f"B={B} L={L}: plain decode step {unit * 1e3:.2f} ms = 1 unit")
            lines.append("  target verify (units): " + "  ".join(f"N={n}: {c['median'] / unit:.2f}" for n, c in row.items()))
            for name, table in body["draft_step_s"].items():
                lines.append(f"  draft {name} step (units): " + "  ".join(
                    f"w={w}: {c['median'] / unit:.2f}" for w, c in table[str(B)][str(L)].items()))
    overhead = body.get("step_overhead_s")
    if overhead:
        from specsim.sim.cost import OVERHEAD_KINDS

        for B in body["batches"]:
            unit = min(body["target_verify_s"][str(B)][str(L)]["1"]["median"] for L in body["contexts"])
            by_kind = [f"{kind} " + " ".join(f"{c['median'] / unit:.3f}" for c in overhead[kind][str(B)].values())
                       for kind in OVERHEAD_KINDS if kind in overhead]
            lines.append(f"B={B}: work outside the forwards per step (units of the shortest plain step), by N: "
                         + "; ".join(by_kind))
    lines.append(f"interpolation error (leave-one-out, max): {100 * body['fit']['max_relative_error']:.1f}%")
    lines += stall_lines(body) + spread_lines(body)
    return "\n".join(lines)


def _entries(body: dict):
    """(model, axis, B, L, x, entry) for every timed entry of a profile body: "target" over N, then each "draft NAME"
    over w, in the body's order."""
    for who, axis, table in [("target", "N", body["target_verify_s"]),
                             *[(f"draft {d}", "w", t) for d, t in body["draft_step_s"].items()]]:
        for B, by_L in table.items():
            for L, row in by_L.items():
                for x, cell in row.items():
                    yield who, axis, B, L, x, cell


def spread_lines(body: dict) -> list[str]:
    """Per model, the entry whose median is least certain (`median_error`), and, above MEDIAN_ERROR_GOAL, about how
    many rounds would bring it there (the error shrinks as 1 / sqrt(rounds)): `--max-repeats` spends them. Small steps
    on a shared CPU scatter most: an EAGLE-3 head's 5-15 ms steps moved a profile's predictions by 12-34% between
    two 3-round profiles (analyses/results/eagle3-scale-cpu-2026-11-26)."""
    import math

    from specsim.attention.profile import MEDIAN_ERROR_GOAL, median_error

    per_model: dict = {}
    for who, axis, B, L, x, cell in _entries(body):
        if len(cell.get("runs") or []) >= 2:
            per_model.setdefault(who, []).append((median_error(cell["runs"], cell["median"]),
                                                  f"B={B} L={L} {axis}={x}", len(cell["runs"])))
    worst = [(who, *max(cells)) for who, cells in per_model.items()]
    if not worst:
        return []
    line = ("median's standard error, least certain entry per model (estimated from its rounds' quartiles): "
            + "; ".join(f"{who} {100 * e:.1f}% ({where})" for who, e, where, _ in worst))
    unsure = [(who, e, n) for who, e, _, n in worst if e > MEDIAN_ERROR_GOAL]
    if unsure:
        need = ", ".join(f"{who} would need about {math.ceil(n * (e / MEDIAN_ERROR_GOAL) ** 2)} rounds"
                         for who, e, n in unsure)
        line += f"; {need} (--repeats or --max-repeats) for {100 * MEDIAN_ERROR_GOAL:g}%"
    return [line]


def stall_lines(body: dict) -> list[str]:
    """The timed runs that stalled (more than OUTLIER x their entry's median), worst first: a busy machine."""
    from specsim.sim.cost import OUTLIER

    found = []
    for who, axis, B, L, x, cell in _entries(body):
        runs = cell.get("runs") or []
        worst = max(runs, default=0.0)
        if runs and worst > OUTLIER * cell["median"]:
            found.append((worst / cell["median"], f"B={B} L={L} {who} {axis}={x}"))
    if not found:
        return []
    found.sort(reverse=True)
    return [f"{len(found)} entries had a stalled run (> {OUTLIER:g}x their median; a busy machine): "
            + ", ".join(f"{where} ({ratio:.0f}x)" for ratio, where in found[:5]) + (" ..." if len(found) > 5 else "")]


def _vllm(cache, target, drafts, batches, contexts, max_tokens, draft_widths, repeats, max_repeats, warmup, seed,
          threads, out, overwrite, quiet):
    """`profile --engine vllm --for CACHE` (specsim.engines.vllm_profile)."""
    from specsim.attention.profile import write_profile
    from specsim.engines.vllm_profile import measure_vllm_profile
    from specsim.errors import SpecError

    if cache is None:
        raise SpecError("--engine vllm measures what a cache's replay prices: give --for CACHE")
    if target is not None or contexts or draft_widths:
        raise SpecError("--engine vllm takes the target and contexts from --for CACHE (and times draft forwards of "
                        "width 1): drop --target, --contexts and --draft-widths")
    body = measure_vllm_profile(cache, drafts, batches=batches or (1,), max_tokens=max_tokens or 5,
                                repeats=repeats or 3, max_repeats=max_repeats, warmup=min(warmup, 1), seed=seed,
                                threads=threads, echo=(lambda line: None) if quiet else
                                (lambda line: click.echo(line, err=True)), progress=not quiet)
    write_profile(body, out, overwrite=overwrite)
    lines = [f"{body['device']}: target {body['target']['name']}, drafts {', '.join(body['drafts']) or 'none'} "
             f"(median of {body['timing']['repeats']} calls of {body['timing']['steps']} steps"
             + (f", up to {body['timing']['max_repeats']} where one stalled"
                if body["timing"]["max_repeats"] > body["timing"]["repeats"] else "") + ")"]
    for B in body["batches"]:
        for L in body["contexts"]:
            row = body["target_verify_s"][str(B)][str(L)]
            lines.append(f"B={B} L={L}: " + "  ".join(f"N={n}: {c['median'] * 1e3:.1f} ms" for n, c in row.items())
                         + "".join(f"  {d} forward: {t[str(B)][str(L)]['1']['median'] * 1e3:.1f} ms"
                                   for d, t in body["draft_step_s"].items()))
    lines.append(f"spread of repeats (max): {100 * body['fit']['max_relative_error']:.1f}%")
    click.echo("\n".join(lines))
    click.echo(f"wrote {out}")


"""`specsim optimize`: the static draft tree that maximises tokens per target call on a cache."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specsim import specs as registry
from specsim.checks import few_prompts_caveat
from specsim.cli import _common as c
from specsim.cli._common import cost_profile_arg
from specsim.files import check_writable


@c.command()
@click.argument("cache", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--budget", type=click.IntRange(min=1), required=True, metavar="N",
              help="Most draft tokens per target call (tree nodes besides the root).")
@click.option("--draft", default=None, metavar="NAME", help="Recorded draft column. Default: the first recorded.")
@click.option("--policy", type=c.choice(registry.policy_names(fitted=True)), default="greedy", show_default=True,
              help="greedy: most frequent rank paths (T=0). sample: multi-draft sampling trees (T>0). greedy-draft "
                   "(with --emit): the draft's argmax verified as a point mass, vLLM's default at T>0 and SGLang's "
                   "only rule.")
@click.option("--temperature", type=float, default=None, metavar="T",
              help="Recorded temperature. Default: 0 for greedy, the first recorded T>0 for sample.")
@click.option("--multi-draft", type=c.choice(registry.MULTI_DRAFT), default="iid", show_default=True,
              help="How a sampling tree draws a node's k candidates from q. "
                   + registry.vocab_help(registry.MULTI_DRAFT) + ".")
@click.option("--max-depth", type=click.IntRange(min=1), default=None, metavar="D", help="Deepest tree allowed.")
@c.cost_profile_option("Measured costs from `specsim profile`: choose the budget (1..--budget) with the best speedup.")
@c.cost_extrapolate_option
@click.option("--cost", default=None, metavar="c=RATIO",
              help="An ASSUMED draft/target step cost ratio instead of a profile (labelled as an assumption).")
@click.option("--batch", "batches", multiple=True, metavar="B", callback=c.numbers(int, minimum=1),
              help="Batch sizes to choose for (needs --cost-profile): the best budget and tree at each.")
@click.option("--batching", type=c.choice(registry.BATCHING), default="lockstep", show_default=True,
              help="How B requests share engine steps. " + registry.vocab_help(registry.BATCHING) + ".")
@click.option("--n-boot", type=click.IntRange(0, c.MAX_BOOT), default=1000, show_default=True,
              help="Bootstrap resamples for the speedup CIs.")
@click.option("--acceptance-vector", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="JSON list in Sequoia's layout [unused, p_1, p_2, ...] instead of a cache.")
@click.option("--samples", type=click.IntRange(min=2), default=64, show_default=True,
              help="Monte-Carlo samples per position (sample policy with --multi-draft swor).")
@c.seed_option
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the tree as JSON, usable as --tree file:PATH.")
@click.option("--max-lines", type=click.IntRange(min=2), default=60, show_default=True,
              help="Cut the drawing after this many lines.")
@click.option("--emit", type=(c.choice(registry.EMIT_TARGETS), click.Path(dir_okay=False, path_type=Path)),
              default=None, metavar="ENGINE FILE",
              help="Choose among what the engine runs (chains of 1..--budget drafts, per --batch; for sglang also "
                   "the dynamic trees a recorded --expand replays) and write the choice in its terms: vllm -> its "
                   "speculative_config JSON (a length per batch size), sglang -> launch flags. Needs costs "
                   "(--cost-profile, or an assumed --cost).")
@c.overwrite_option
@c.quiet_option
@c.friendly_errors
def optimize(cache, budget, draft, policy, temperature, multi_draft, max_depth, cost_profile, cost_extrapolate, cost,
             batches, batching, n_boot, acceptance_vector, samples, seed, out, max_lines, emit, overwrite, quiet):
    """Find the static tree of at most --budget drafts with the most tokens per target call.

    On a cache the objective is what `specsim simulate` reports: total tokens /
    total expected target calls of decoding the cached trajectories with the
    tree. Candidates: the tree maximising expected tokens of a call at a
    uniformly chosen position (greedy: the N most frequent rank paths, exact;
    sample: best-first on estimated candidate acceptance, and Sequoia's DP on
    the positional vector), its refits on the positions the decoding walk
    visits, and chain / k-ary trees of the same budget; the best by the
    objective is kept, so it never decodes worse than those. With
    --acceptance-vector (no cache): Sequoia's DP on that vector.

    With costs, the hardware-aware choice: the optimal tree of every budget
    N = 1..--budget is priced by the cost model and the fastest is reported
    with its speedup and 95% CI, for each --batch (what serving engines call
    the number of speculative tokens per batch size).

    \b
    Examples:
      specsim optimize cache/demo.h5 --budget 16
      specsim optimize cache/demo.h5 --budget 32 --max-depth 6 --out tree.json
      specsim simulate cache/demo.h5 --tree file:tree.json
      specsim optimize cache/demo.h5 --budget 16 --policy sample --temperature 1 --multi-draft swor
      specsim optimize cache/demo.h5 --budget 16 --cost-profile profile.json --batch 1,4,16
      specsim optimize --acceptance-vector sequoia.json --budget 16
      specsim optimize cache/v.h5 --draft layers:20 --budget 8 --cost-profile p.json --batch 1,4 \\
          --emit vllm spec.json      # then: vllm serve MODEL --speculative-config "$(cat spec.json)"
      specsim optimize cache/v.h5 --draft layers:20 --budget 8 --cost-profile p.json --emit sglang flags.txt
    """
    from specsim.errors import SpecError
    from specsim.trees import draw_tree

    if cost is not None and cost_profile is not None:
        raise SpecError("give a measured --cost-profile or an assumed --cost, not both")
    if (cache is None) == (acceptance_vector is None):
        raise SpecError("give a CACHE or --acceptance-vector FILE (exactly one)")
    if out is not None and out.suffix.lower() != ".json":
        raise SpecError(f"--out {out}: the tree is written as JSON; use a .json file name")
    if out is not None and out.exists() and not overwrite:
        raise SpecError(f"--out {out} exists; pass --overwrite to replace it")
    if out is not None:
        check_writable("--out", out)
    batch_list = tuple(batches) or (1,)
    if cost_extrapolate and cost_profile is None:
        raise SpecError("--cost-extrapolate goes with --cost-profile")
    if batches and cost_profile is None:
        raise SpecError("--batch needs measured costs: give --cost-profile")
    if emit is not None:
        return _emit(cache, emit, budget, draft, policy, temperature, cost_profile, cost_extrapolate, cost,
                     batch_list, batching, n_boot, seed, overwrite, acceptance_vector)
    cost_model = cost_profile_arg(cost_profile, cost_extrapolate, load=True)
    if cost is not None:
        from specsim.sim.cost import parse_cost

        cost_model = parse_cost(cost)
    if acceptance_vector is not None:
        if cost_model is not None:
            raise SpecError("--acceptance-vector gives tokens per call only; pricing needs a cache's trajectories")
        best = _from_vector(acceptance_vector, budget, max_depth)
        click.echo(f"{best.tree.name}: budget {best.tree.budget}, depth {best.tree.max_depth}  "
                   f"(Sequoia acceptance vector {acceptance_vector})")
        click.echo(f"expected tokens/call: {best.expected_tokens_per_call:.3f}  ({best.source})")
        click.echo(draw_tree(best.tree, max_lines=max_lines))
        chosen = best.tree
    else:
        from specsim.sim.choose import best_per_batch, fit_on_cache, pricing_for

        budgets = list(range(1, budget + 1)) if cost_model is not None else [budget]
        fit = fit_on_cache(cache, budgets, draft=draft, policy=policy, temperature=temperature,
                           multi_draft=multi_draft, max_depth=max_depth, samples=samples, seed=seed,
                           progress=not quiet)
        best = fit.results[-1]
        click.echo(f"{best.tree.name}: budget {best.tree.budget}, depth {best.tree.max_depth}  ({fit.what})")
        click.echo(f"objective, tokens/call decoding the cached trajectories: {best.walk_tokens_per_call:.3f} "
                   "(total tokens / total expected target calls, as `specsim simulate` reports)")
        click.echo(f"searched: {best.source}")
        click.echo(f"expected tokens/call of a call at a uniformly chosen start position: "
                   f"{best.expected_tokens_per_call:.3f} (not the objective: decoding starts calls after "
                   "corrections, where misses cluster)")
        click.echo(draw_tree(best.tree, max_lines=max_lines))
        chosen = best.tree
        if cost_model is not None:
            pricing = pricing_for(cache, cost_model, fit.features.draft, fit.features.temperature)
            choices = best_per_batch(fit.features, [r.tree for r in fit.results], fit.policy, pricing, batch_list,
                                     batching=batching, n_boot=n_boot, seed=seed)
            click.echo()
            click.echo(f"hardware-aware choice over N = 1..{budget} ({cost_model.describe()}):")
            word = "speedup" if cost_model.measured else "speedup ASSUMED"
            for c in choices:
                lo, hi = c.speed.speedup[1:]
                ci = f" [{lo:.3f}, {hi:.3f}]" if lo == lo else ""
                rate = f", {c.speed.tokens_per_s:.1f} tok/s" if c.speed.tokens_per_s is not None else ""
                verdict = "  -> plain decoding is faster at this batch size" if c.plain_wins else (
                    "  (the CI includes 1.0: not a demonstrated speedup)" if lo == lo and lo <= 1.0 else "")
                click.echo(f"  batch {c.batch}: N = {c.tree.budget} ({c.tree.name}), "
                           f"{c.speed.tokens_per_call:.3f} tokens/call, {word} {c.speed.speedup[0]:.3f}{ci}{rate}"
                           f"{verdict}")
            caveat = few_prompts_caveat([len(set(fit.features.traj_prompt.tolist()))])
            if caveat and any(c.speed.speedup[1] == c.speed.speedup[1] for c in choices):  # intervals were printed
                click.echo(f"  {caveat}")
            chosen = choices[0].tree
            if len(choices) == 1 and chosen is not best.tree:
                click.echo(draw_tree(chosen, max_lines=max_lines))
    if out is not None:
        from specsim.files import write_text

        write_text(out, chosen.to_json() + "\n")
        click.echo(f"wrote {chosen.name} ({chosen.budget} drafts) to {out}; use --tree file:{out}")


def _from_vector(path: Path, budget: int, max_depth):
    from specsim.errors import SpecError
    from specsim.sim.optimize import optimal_tree_from_vector

    try:
        vector = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"--acceptance-vector {path}: not a JSON list ({type(exc).__name__})") from None
    if not isinstance(vector, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                               for x in vector):
        raise SpecError(f"--acceptance-vector {path}: expected a JSON list of numbers [unused, p_1, p_2, ...]")
    try:
        result = optimal_tree_from_vector(vector, budget, max_depth=max_depth)
    except SpecError as exc:
        raise SpecError(f"--acceptance-vector {path}: {exc}") from None
    return type(result)(tree=_renamed(result.tree, f"optimal:{budget}"),
                        expected_tokens_per_call=result.expected_tokens_per_call, source=result.source)


def _renamed(tree, name):
    from dataclasses import replace

    return replace(tree, name=name)


def _emit(cache, emit, budget, draft, policy, temperature, cost_profile, cost_extrapolate, cost, batches, batching,
          n_boot, seed, overwrite, acceptance_vector):
    """`optimize --emit`: the best chain per batch size, written in the engine's terms."""
    from specsim.engines import emit as engines
    from specsim.errors import SpecError
    from specsim.sim.choose import best_per_batch, pricing_for
    from specsim.sim.cost import parse_cost
    from specsim.sim.features import load_features
    from specsim.sim.policies import check_temperature
    from specsim.specs import parse_policy, parse_tree

    engine, path = emit
    if acceptance_vector is not None or cache is None:
        raise SpecError("--emit chooses on a CACHE's trajectories (not an --acceptance-vector)")
    if cost_profile is None and cost is None:
        raise SpecError("--emit chooses the speculative length by speed: give --cost-profile (or an assumed --cost)")
    if path.exists() and not overwrite:
        raise SpecError(f"{path} exists; pass --overwrite to replace it")
    check_writable("--emit", path)
    if engine == "sglang" and len(batches) > 1:
        raise SpecError("SGLang takes one speculative length for every batch size: give one --batch")
    from specsim.engines.check import read_cache

    data = read_cache(cache)
    draft = draft or (data.drafts[0] if data.drafts else None)
    if draft is None:
        raise SpecError(f"{cache}: records no draft; name one, e.g. --draft vllm-ngram:min=2,max=3")
    spec = parse_policy(policy)
    if engine == "sglang":  # what SGLang's rules are not reproduced for is refused before the replay
        engines.sglang_algorithm(draft)
        engines.check_sglang_policy(spec.label, draft)
    if temperature is None:
        hot = [t for t in data.temperatures if t > 0]
        temperature = 0.0 if policy == "greedy" else (hot[0] if hot else 0.0)
    check_temperature(spec, float(temperature))
    cost_model = cost_profile_arg(cost_profile, cost_extrapolate, load=True) if cost_profile is not None else \
        parse_cost(cost)
    features = load_features(cache, draft, float(temperature), progress=False)
    trees, what = [parse_tree(f"chain:{k}") for k in range(1, budget + 1)], f"chains of 1..{budget} drafts"
    point_mass = spec.label in engines.SGLANG_POINT_MASS  # SGLang's sampled verification runs chains only
    grown = features.expansion() if engine == "sglang" and point_mass else None
    if grown is not None:  # SGLang also grows EAGLE-2 trees: every depth and size the recording replays at its top-k
        from specsim.expansion import candidates

        trees += [parse_tree(f"dynamic:topk={grown.topk},depth={d},tokens={n}") for d in range(1, grown.depth + 1)
                  for n in range(1, min(budget, candidates(grown.topk, d)) + 1)]
        what += f" and dynamic trees topk={grown.topk}, depth 1..{grown.depth}, tokens 1..{budget}"
    choices = best_per_batch(features, trees, spec, pricing_for(cache, cost_model, draft, features.temperature), batches,
                             batching=batching, n_boot=n_boot, seed=seed)
    k_at = {ch.batch: 0 if ch.plain_wins else ch.tree.max_depth for ch in choices}
    word = "speedup" if cost_model.measured else "speedup ASSUMED"
    click.echo(f"{what}, draft {draft}, policy {spec.label}, T={float(temperature):g}, "
               f"{features.n_traj} trajectories of {cache} ({cost_model.describe()}):")
    for ch in choices:
        lo, hi = ch.speed.speedup[1:]
        ci = f" [{lo:.3f}, {hi:.3f}]" if lo == lo else ""
        pick = "plain decoding (k = 0)" if ch.plain_wins else f"k = {ch.tree.max_depth}" if ch.tree.name.startswith(
            "chain") else f"{ch.tree.budget} drafts per call"
        click.echo(f"  batch {ch.batch}: {pick}; best {'tree' if grown else 'chain'} {ch.tree.name}: "
                   f"{ch.speed.tokens_per_call:.3f} tokens/call, {word} {ch.speed.speedup[0]:.3f}{ci}")
    from specsim.engines.export import draft_directory, sglang_directory
    from specsim.specs import is_model_free

    draft_dir = None if is_model_free(draft) else (sglang_directory if engine == "sglang" else draft_directory)(
        draft, data.target, target_info=data.target_info, draft_info=data.drafts_info.get(draft),
        echo=lambda line: click.echo(line, err=True))
    k_max = max(k_at.values())
    if engine == "vllm":
        from specsim.engines.vllm import speculative_config

        base = speculative_config(draft, parse_tree(f"chain:{max(k_max, 1)}"), spec.label, draft_dir=draft_dir).config
        engines.write_json(path, engines.vllm_config(base, k_at))
        # vLLM's mtp method drafts from the target's own checkpoint: serve the one that holds the MTP layers
        model = draft_dir if base["method"] == "mtp" else "MODEL"
        click.echo(f"wrote vLLM's speculative_config to {path}: vllm serve {model} --speculative-config \"$(cat {path})\"")
    else:
        if k_max < 1:
            raise SpecError(f"plain decoding is faster at batch {batches[0]}: no speculative flags to write")
        engines.write_flags(path, engines.sglang_flags(draft, choices[0].tree, draft_dir=draft_dir,
                                                       policy=spec.label))
        click.echo(f"wrote SGLang's flags to {path}: python -m sglang.launch_server --model-path MODEL $(cat {path})")

"""`specsim optimize`: the static draft tree that maximises tokens per target call on a cache."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specsim.cli import _common as c


@c.command()
@click.argument("cache", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--budget", type=click.IntRange(min=1), required=True, metavar="N",
              help="Most draft tokens per target call (tree nodes besides the root).")
@click.option("--draft", default=None, metavar="NAME", help="Recorded draft column. Default: the first recorded.")
@click.option("--policy", type=click.Choice(["greedy", "sample"]), default="greedy", show_default=True,
              help="greedy: most frequent rank paths (T=0). sample: multi-draft sampling trees (T>0).")
@click.option("--temperature", type=float, default=None, metavar="T",
              help="Recorded temperature. Default: 0 for greedy, the first recorded T>0 for sample.")
@click.option("--multi-draft", type=click.Choice(["iid", "swor"]), default="iid", show_default=True,
              help="How a sampling tree draws a node's candidates.")
@click.option("--max-depth", type=click.IntRange(min=1), default=None, metavar="D", help="Deepest tree allowed.")
@click.option("--cost-profile", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Measured costs from `specsim profile`: choose the budget (1..--budget) with the best speedup.")
@click.option("--cost", default=None, metavar="c=RATIO",
              help="An ASSUMED draft/target step cost ratio instead of a profile (labelled as an assumption).")
@click.option("--batch", "batches", multiple=True, metavar="B", callback=c.numbers(int, minimum=1),
              help="Batch sizes to choose for (needs --cost-profile): the best budget and tree at each.")
@click.option("--batching", type=click.Choice(["lockstep", "continuous"]), default="lockstep", show_default=True,
              help="How batches run in the prediction.")
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
@c.quiet_option
@c.friendly_errors
def optimize(cache, budget, draft, policy, temperature, multi_draft, max_depth, cost_profile, cost, batches, batching,
             n_boot, acceptance_vector, samples, seed, out, max_lines, quiet):
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
    """
    from specsim.errors import SpecError
    from specsim.trees import draw_tree

    if cost is not None and cost_profile is not None:
        raise SpecError("give a measured --cost-profile or an assumed --cost, not both")
    if (cache is None) == (acceptance_vector is None):
        raise SpecError("give a CACHE or --acceptance-vector FILE (exactly one)")
    if out is not None and out.suffix.lower() != ".json":
        raise SpecError(f"--out {out}: the tree is written as JSON; use a .json file name")
    batch_list = tuple(batches) or (1,)
    if batches and cost_profile is None:
        raise SpecError("--batch needs measured costs: give --cost-profile")
    cost_model = None
    if cost is not None or cost_profile is not None:
        from specsim.sim.cost import load_cost_profile, parse_cost

        cost_model = load_cost_profile(cost_profile) if cost_profile is not None else parse_cost(cost)
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
            pricing = pricing_for(cache, cost_model, fit.features.draft)
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
            chosen = choices[0].tree
            if len(choices) == 1 and chosen is not best.tree:
                click.echo(draw_tree(chosen, max_lines=max_lines))
    if out is not None:
        try:
            out.write_text(chosen.to_json() + "\n")
        except OSError as exc:
            raise SpecError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
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

"""`specsim optimize`: the static draft tree that maximises tokens per target call on a cache."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specsim.cli._common import friendly_errors


@click.command()
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
@click.option("--cost", default=None, metavar="c=RATIO",
              help="Draft/target step cost ratio: also choose N in 1..budget for speed, not just tokens/call.")
@click.option("--cost-profile", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Measured costs from `specsim profile` (JSON) for the hardware-aware choice of N.")
@click.option("--acceptance-vector", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="JSON list in Sequoia's layout [unused, p_1, p_2, ...] instead of a cache.")
@click.option("--samples", type=click.IntRange(min=2), default=64, show_default=True,
              help="Monte-Carlo samples per position (sample policy with --multi-draft swor).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the Monte-Carlo estimates.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the tree as JSON, usable as --tree file:PATH.")
@click.option("--max-lines", type=click.IntRange(min=2), default=60, show_default=True,
              help="Cut the drawing after this many lines.")
@friendly_errors
def optimize(cache, budget, draft, policy, temperature, multi_draft, max_depth, cost, cost_profile,
             acceptance_vector, samples, seed, out, max_lines):
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
    With --cost or --cost-profile, N = 1..budget is scanned and the N with the
    best tokens/call / call cost is reported with its estimated speedup.

    \b
    Examples:
      specsim optimize cache/demo.h5 --budget 16
      specsim optimize cache/demo.h5 --budget 32 --max-depth 6 --out tree.json
      specsim simulate cache/demo.h5 --tree file:tree.json
      specsim optimize cache/demo.h5 --budget 16 --policy sample --temperature 1 --multi-draft swor
      specsim optimize cache/demo.h5 --budget 64 --cost-profile profile.json
      specsim optimize --acceptance-vector sequoia.json --budget 16
    """
    from specsim.errors import SpecError
    from specsim.trees import draw_tree

    if cost is not None and cost_profile is not None:
        raise SpecError("give --cost or --cost-profile, not both")
    if (cache is None) == (acceptance_vector is None):
        raise SpecError("give a CACHE or --acceptance-vector FILE (exactly one)")
    cost_model = None
    if cost is not None or cost_profile is not None:
        from specsim.sim.cost import load_cost_profile, parse_cost

        cost_model = load_cost_profile(cost_profile) if cost_profile is not None else parse_cost(cost)

    if acceptance_vector is not None:
        results, what, context, model_draft = _from_vector(acceptance_vector, budget, max_depth, cost_model)
    else:
        results, what, context, model_draft = _from_cache(cache, budget, draft, policy, temperature, multi_draft,
                                                          max_depth, samples, seed, cost_model)
    best = results[-1]
    click.echo(f"{best.tree.name}: budget {best.tree.budget}, depth {best.tree.max_depth}  ({what})")
    if best.walk_tokens_per_call is None:  # an acceptance vector: no trajectories to decode
        click.echo(f"expected tokens/call: {best.expected_tokens_per_call:.3f}  ({best.source})")
    else:
        click.echo(f"objective, tokens/call decoding the cached trajectories: {best.walk_tokens_per_call:.3f} "
                   "(total tokens / total expected target calls, as `specsim simulate` reports)")
        click.echo(f"searched: {best.source}")
        click.echo(f"expected tokens/call of a call at a uniformly chosen start position: "
                   f"{best.expected_tokens_per_call:.3f} (not the objective: decoding starts calls after "
                   "corrections, where misses cluster)")
    click.echo(draw_tree(best.tree, max_lines=max_lines))
    chosen = best
    if cost_model is not None:
        def per_call(r):
            return r.walk_tokens_per_call if r.walk_tokens_per_call is not None else r.expected_tokens_per_call

        rates = [(per_call(r) / cost_model.call_cost(r.tree, context=context, model_draft=model_draft), r)
                 for r in results]
        speedup, chosen = max(rates, key=lambda x: x[0])
        click.echo()
        click.echo(f"hardware-aware choice over N = 1..{budget} ({cost_model.describe()}, context {context:.0f}):")
        click.echo(f"  N = {chosen.tree.budget}: {per_call(chosen):.3f} tokens/call, "
                   f"call cost {per_call(chosen) / speedup:.3f} target steps, estimated speedup {speedup:.2f}x")
        if chosen is not best:
            click.echo(draw_tree(chosen.tree, max_lines=max_lines))
    if out is not None:
        try:
            out.write_text(chosen.tree.to_json() + "\n")
        except OSError as exc:
            raise SpecError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
        click.echo(f"wrote {chosen.tree.name} ({chosen.tree.budget} drafts) to {out}; use --tree file:{out}")


def _from_vector(path: Path, budget: int, max_depth, cost_model):
    from specsim.errors import SpecError
    from specsim.sim.optimize import optimal_tree_from_vector

    try:
        vector = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"--acceptance-vector {path}: not a JSON list ({exc})") from None
    if not isinstance(vector, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                               for x in vector):
        raise SpecError(f"--acceptance-vector {path}: expected a JSON list of numbers [unused, p_1, p_2, ...]")
    try:
        budgets = range(1, budget + 1) if cost_model is not None else [budget]
        results = [optimal_tree_from_vector(vector, n, max_depth=max_depth) for n in budgets]
    except SpecError as exc:
        raise SpecError(f"--acceptance-vector {path}: {exc}") from None
    results = [type(r)(tree=_renamed(r.tree, f"optimal:{n}"), expected_tokens_per_call=r.expected_tokens_per_call,
                       source=r.source) for n, r in zip(budgets, results)]
    return results, f"Sequoia acceptance vector {path}", 0.0, True


def _from_cache(cache, budget, draft, policy, temperature, multi_draft, max_depth, samples, seed, cost_model):
    from specsim.cache.store import CacheReader
    from specsim.errors import CacheError
    from specsim.sim.adaptive import mean_context
    from specsim.sim.features import load_features
    from specsim.sim.optimize import optimal_trees
    from specsim.sim.policies import parse_policy

    with CacheReader(cache) as reader:
        if draft is None:
            if not reader.spec.drafts:
                raise CacheError(f"{reader.path}: records no draft column to optimise a tree for")
            draft = reader.spec.drafts[0]
        if temperature is None:
            hot = [t for t in reader.spec.temperatures if t > 0]
            if policy == "greedy" and 0.0 not in reader.spec.temperatures:
                raise CacheError(f"{reader.path}: no greedy (T=0) trajectories; use --policy sample")
            if policy == "sample" and not hot:
                raise CacheError(f"{reader.path}: only greedy (T=0) trajectories; use --policy greedy")
            temperature = 0.0 if policy == "greedy" else hot[0]
        spec = parse_policy(policy, multi_draft=multi_draft, samples=samples)
        from specsim.sim.policies import check_temperature

        check_temperature(spec, float(temperature))
        features = load_features(reader, draft, temperature, progress=True)
        budgets = list(range(1, budget + 1)) if cost_model is not None else [budget]
        results = optimal_trees(features, budgets, policy=spec, max_depth=max_depth, seed=seed)
    context = mean_context(features) if cost_model is not None else 0.0
    what = (f"draft {draft}, policy {spec.label}" + (f" {multi_draft}" if policy == "sample" else "")
            + f", T={features.temperature:g}, {features.n_traj} trajectories of {Path(cache).name}")
    return results, what, context, True


def _renamed(tree, name):
    from dataclasses import replace

    return replace(tree, name=name)

"""`specsim bound`: what the verification rule leaves on the table at nodes with i.i.d. candidates."""

from __future__ import annotations

from pathlib import Path

import click

from specsim.cli import _common as c


@c.command("bound")
@click.argument("cache", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--draft", required=True, help="A model draft recorded in CACHE (its law q at every position).")
@click.option("--temperature", type=float, required=True,
              help="The recorded temperature (> 0) whose trajectories and laws are used.")
@click.option("--candidates", type=click.IntRange(1, 16), default=4, show_default=True,
              help="Compare nodes with 1..N children drawn i.i.d. from q.")
@c.quiet_option
@c.friendly_errors
def bound(cache, draft, temperature, candidates, quiet):
    """Per node with j i.i.d. candidates: how often SpecInfer's rule (specsim's) accepts one, against the most any
    valid verifier can accept of the same candidates (Hu et al., ICLR 2025: the optimal transport's dual).

    Exact at every position of the target-sampled trajectories CACHE recorded at --temperature, from the
    recorded laws p (target) and q (draft); needs a full-storage cache. A per-node figure: how the gap
    compounds over a tree's depths depends on which optimal verifier is used, and is not reported.

    \b
    Example:
      specsim bound cache/demo.h5 --draft layers:20 --temperature 0.7 --candidates 4
    """
    from specsim.sim.bound import node_bound

    result = node_bound(cache, draft, temperature, candidates, progress=not quiet)
    rows = [[str(j + 1), f"{result.rule[j]:.4f} ± {result.rule_se[j]:.4f}",
             f"{result.bound[j]:.4f} ± {result.bound_se[j]:.4f}",
             f"{result.bound[j] - result.rule[j]:.4f} ± {result.gap_se[j]:.4f}"] for j in range(candidates)]
    click.echo(c.table(["candidates", "SpecInfer's rule", "optimal (Hu et al.)", "left on the table"], rows))
    click.echo(f"P(one of j i.i.d. candidates accepted) at the node on the target's path, exact per position, mean "
               f"over {result.positions:,} positions of {result.trajectories} target-sampled trajectories at "
               f"T={result.temperature:g} (target p, draft q = {draft}); ± 1 SE over trajectories (the gap's "
               "paired). Candidates drawn without replacement: not computed.")

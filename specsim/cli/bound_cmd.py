"""`specsim bound`: what the verification rule leaves on the table at nodes with i.i.d. or without-replacement
candidates."""

from __future__ import annotations

from pathlib import Path

import click

from specsim import specs as registry
from specsim.cli import _common as c


@c.command("bound")
@click.argument("cache", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--draft", required=True, help="A model draft recorded in CACHE (its law q at every position).")
@click.option("--temperature", type=float, required=True,
              help="The recorded temperature (> 0) whose trajectories and laws are used.")
@click.option("--candidates", type=click.IntRange(1, 16), default=4, show_default=True,
              help="Compare nodes with 1..N children drawn from q.")
@click.option("--multi-draft", "sampling", type=c.choice(registry.MULTI_DRAFT), default="iid", show_default=True,
              help="How a node's children are drawn from q: " + registry.vocab_help(registry.MULTI_DRAFT) + ".")
@click.option("--samples", type=click.IntRange(min=100), default=4096, show_default=True,
              help="Monte-Carlo candidate tuples per position (--multi-draft swor, 3 or more candidates).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of that Monte-Carlo.")
@c.quiet_option
@c.friendly_errors
def bound(cache, draft, temperature, candidates, sampling, samples, seed, quiet):
    """Per node with j candidates: how often SpecInfer's rule (specsim's) accepts one, against the most any valid
    verifier can accept of the same candidates (Hu et al., ICLR 2025: the optimal transport's dual).

    At every position of the target-sampled trajectories CACHE recorded at --temperature, from the recorded
    laws p (target) and q (draft); needs a full-storage cache. i.i.d. candidates: both exact per position.
    Without replacement (--multi-draft swor): both exact for 1 and 2 candidates, Monte-Carlo estimates for 3
    or more (--samples tuples per position; the bound's minimum over noisy values sits slightly low). A
    per-node figure: how the gap compounds over a tree's depths depends on which optimal verifier is used, and
    is not reported.

    \b
    Examples:
      specsim bound cache/demo.h5 --draft layers:20 --temperature 0.7 --candidates 4
      specsim bound cache/demo.h5 --draft int8 --temperature 0.7 --multi-draft swor
    """
    from specsim.sim.bound import node_bound

    result = node_bound(cache, draft, temperature, candidates, sampling=sampling, samples=samples, seed=seed,
                        progress=not quiet)
    rows = [[str(j + 1), f"{result.rule[j]:.4f} ± {result.rule_se[j]:.4f}",
             f"{result.bound[j]:.4f} ± {result.bound_se[j]:.4f}",
             f"{result.bound[j] - result.rule[j]:.4f} ± {result.gap_se[j]:.4f}"] for j in range(candidates)]
    click.echo(c.table(["candidates", "SpecInfer's rule", "optimal (Hu et al.)", "left on the table"], rows))
    how = ("i.i.d. candidates accepted) at the node on the target's path, exact per position" if sampling == "iid"
           else "candidates drawn without replacement accepted) at the node on the target's path, exact per "
                f"position for j <= 2 and Monte-Carlo beyond ({samples:,} tuples per position, seed {seed})")
    click.echo(f"P(one of j {how}, mean over {result.positions:,} positions of {result.trajectories} target-sampled "
               f"trajectories at T={result.temperature:g} (target p, draft q = {draft}); ± 1 SE over trajectories "
               "(the gap's paired).")

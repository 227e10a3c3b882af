"""`specsim merge`: join the shards of a sharded recording into one cache."""

from __future__ import annotations

from pathlib import Path

import click

from specsim.cli import _common as c


@c.command("merge")
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("--allow-partial", is_flag=True, help="Merge even if some of the run's N shards are not given.")
@c.quiet_option
@c.friendly_errors
def merge(out, shards, overwrite, allow_partial, quiet):
    """Join the shard files of one `specsim cache --shard I/N` run into OUT.

    Every shard must come from the same run (same models, prompts, temperatures, seed,
    storage and statistics; only --shard differs) and no trajectory may appear twice.
    The merged cache holds the trajectories in the order an unsharded run commits them,
    byte for byte, so it equals the unsharded recording. OUT is written under a temporary
    name and renamed at the end.

    \b
    Examples:
      specsim merge cache/run.h5 cache/run-0-of-4.h5 cache/run-1-of-4.h5 \\
          cache/run-2-of-4.h5 cache/run-3-of-4.h5
      specsim merge cache/run.h5 cache/run-*-of-4.h5
    """
    from specsim.cache.merge import merge_shards

    outcome = merge_shards(out, shards, overwrite=overwrite, allow_partial=allow_partial, progress=not quiet,
                           echo=lambda line: click.echo(line, err=True))
    click.echo(f"merged {outcome.shards} shard(s): {outcome.trajectories} trajectories, {outcome.positions} positions, "
               f"{c.human_bytes(outcome.bytes)}; wrote {out}")

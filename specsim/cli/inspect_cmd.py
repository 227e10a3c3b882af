"""`specsim inspect`: what a cache holds, and how well each draft agrees with the target."""

from __future__ import annotations

from pathlib import Path

import click

from specsim.cli import _common as c
from specsim.cli._common import human_bytes as _human_bytes



def _model_line(info: dict) -> str:
    parts = [str(info.get("source", "?"))]
    if info.get("sha256"):
        parts.append(f"sha256 {info['sha256'][:12]}")
    if info.get("revision"):
        parts.append(f"revision {info['revision']}")
    if info.get("layers"):
        parts.append(f"first {info['layers']} layers of the target")
    if info.get("quantization"):
        parts.append(info["quantization"])
    if info.get("params"):
        parts.append(f"{info['params'] / 1e6:.1f}M params")
    if info.get("dtype"):
        parts.append(f"{info['dtype']} on {info.get('device', '?')}")
    return ", ".join(parts)


@c.command("inspect")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--verify", is_flag=True,
              help="Read every position of every dataset and the prompts, recompute each trajectory's content "
                   "digest, and report each damaged chunk, trajectory or table with where it is; exit 1 if any.")
@c.quiet_option
@c.friendly_errors
def inspect(file: Path, verify: bool, quiet: bool) -> None:
    """Summarise a cache: models, prompts, trajectories, storage, and per draft x
    temperature the top-1 agreement with the target and mean α = 1 − TV(p, q).

    Reads the file in bounded memory and works while `specsim cache` is still
    writing it (it sees the trajectories committed so far).

    --verify reads everything (simulate and inspect read only what they need, so bytes flipped in
    logits they never touch would otherwise go unseen) and exits 1 when anything is damaged.

    \b
    Examples:
      specsim inspect cache/demo.h5
      specsim inspect cache/demo.h5 --quiet
      specsim inspect cache/demo.h5 --verify
    """
    from tqdm.auto import tqdm

    from specsim.cache.inspect import agreement_stats
    from specsim.cache.reader import CacheReader

    if verify:
        return _verify(file, quiet)
    with CacheReader(file) as reader:
        run, spec = reader.run, reader.spec
        storage = {"full": "full float16 logits", "topk": f"top-{spec.top_k} logits + tail log-sum-exp",
                   "stats": "statistics only (no logits)"}[spec.storage]
        click.echo(f"{file}: {_human_bytes(reader.size_bytes)} on disk, storage {storage}, vocab (logits) {spec.vocab_size:,}")
        click.echo(f"target     {run.target.get('spec', '?')} ({_model_line(run.target)})")
        for name in spec.drafts:
            keyed = f"; head draft: laws per call start and depth 1..{spec.depths[name]}" if name in spec.depths else ""
            click.echo(f"draft      {name} ({_model_line(run.drafts.get(name, {}))}{keyed})")
        if not spec.drafts:
            click.echo("draft      none (model-free drafts only)")
        click.echo(f"tokenizer  sha256 {(run.tokenizer_sha256 or '?')[:16]}")
        if spec.hidden:
            click.echo(f"hidden     target hidden states {', '.join(spec.hidden)} (width {spec.hidden_size}, float16)")
        expansion = spec.stats.expansion if spec.stats is not None and spec.stats.expand is not None else None
        if expansion is not None:
            click.echo(f"expansion  EAGLE-2 draft expansion {expansion.label} ({expansion.candidates} candidates per "
                       f"position): replays dynamic:topk={expansion.topk},depth<={expansion.depth},"
                       f"tokens<={expansion.candidates}")
        proposals = spec.stats.expand_target if spec.stats is not None else None
        if proposals is not None:
            click.echo(f"proposals  the target along {proposals[1]} chains of {proposals[0]} drafts drawn from each "
                       f"model draft at every T > 0 position: replays --policy block on chains up to chain:{proposals[0]}")
        click.echo(
            f"run        seed {run.setting('seed', '?')}, max_new_tokens {run.setting('max_new_tokens', '?')}, "
            f"dtype {run.setting('dtype', '?')}, device {run.device or '?'}, created {run.created or '?'}; "
            + ", ".join(f"{k} {v}" for k, v in run.versions.items())
        )

        prompts = reader.prompts
        by_cat = prompts.group_by("category", maintain_order=True).len()
        cats = ", ".join(f"{c or '(none)'} {n}" for c, n in by_cat.iter_rows())
        source = run.prompts.get("source", "?")
        click.echo(f"prompts    {prompts.height} from {source}: {cats}")

        trajs = reader.trajectories
        click.echo(f"trajectories ({trajs.height} committed, {reader.n_trajectory_positions:,} positions):")
        for t in spec.temperatures:
            rows = trajs.filter((trajs["temperature"] - t).abs() < 1e-6)
            n_pos = int(rows["length"].sum()) if rows.height else 0
            eos = rows.filter(rows["stop_reason"] == "eos").height
            click.echo(
                f"  T={t:<5g} {rows.height:>5} trajectories of {rows['prompt_index'].n_unique() if rows.height else 0} "
                f"prompts, {n_pos:>7,} positions (mean length {n_pos / max(rows.height, 1):.1f}; "
                f"{eos} stopped at EOS)"
            )
        if not spec.drafts or reader.n_positions == 0:
            click.echo("no agreement statistics: " + ("no drafts recorded" if not spec.drafts else "no committed trajectories yet"))
            return

        with tqdm(total=reader.n_trajectory_positions, unit="pos", desc="statistics", disable=quiet, leave=False) as bar:
            stats = agreement_stats(reader, on_positions=bar.update)
        click.echo("draft agreement with the target (exact means over every recorded position):")
        width = max(len(s.draft) for s in stats)
        click.echo(f"  {'draft':<{width}}  {'T':>5}  {'top-1 agree':>11}  {'mean α=1−TV':>12}  {'positions':>9}  {'prompts':>7}")
        for s in stats:
            flag = "*" if s.alpha_temperature != s.temperature else " "
            click.echo(
                f"  {s.draft:<{width}}  {s.temperature:>5g}  {s.top1_agreement:>11.3f}  {s.mean_alpha:>11.3f}{flag}  "
                f"{s.positions:>9,}  {s.prompts:>7}"
            )
        if any(s.alpha_temperature != s.temperature for s in stats):
            click.echo("  * at T=0 (greedy) α is computed from the T=1 distributions; top-1 agreement is the greedy rate")
        if spec.storage == "topk":
            click.echo(f"  top-{spec.top_k} storage: α treats the non-top-K mass as spread evenly (approximate)")
        for line in reader.recovered:  # chunks a killed writer left half rewritten, read past their checksums
            click.echo(f"note: {line}")


def _verify(file: Path, quiet: bool) -> None:
    """`inspect --verify`: every chunk, every digest, the prompts; one line per damaged thing, exit 1 if any."""
    from tqdm.auto import tqdm

    from specsim.cache.reader import CacheReader

    with CacheReader(file, probe=False) as reader:  # read everything below, reporting damage instead of refusing
        with tqdm(total=reader.n_positions, unit="pos", desc="verifying", disable=quiet, leave=False) as bar:
            found = reader.verify(on_rows=bar.update)
    checked = (f"{found.rows} trajectories, {found.positions:,} position rows x {found.datasets} datasets read"
               + (", every content digest recomputed" if found.digests else ", no digests (written before format 3)")
               + (", prompts against their sha256" if found.prompts_checked else
                  ", prompts read (the file records no sha256 of them)")
               + (", header against its sha256" if found.header_checked else
                  ", header read (the file records no sha256 of it)"))
    if found.ok:
        click.echo(f"{file}: intact ({checked})")
        return
    for line in found.damaged:
        click.echo(f"damaged: {line}")
    click.echo(f"{file}: {len(found.damaged)} damaged ({checked})", err=True)
    raise SystemExit(1)


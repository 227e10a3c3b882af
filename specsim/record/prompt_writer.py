"""Prompts written by an instruct model, usually the target itself (Magpie: Xu et al., "Magpie: Alignment Data
Synthesis from Scratch by Prompting Aligned LLMs with Nothing", arXiv 2406.08464).

An aligned chat model given its chat template up to where a user turn's text begins writes a user request: the kind
of request it was tuned to answer. Sampling at T = 1 until the turn ends gives prompts from the model's own
distribution. Head drafts learn the target's laws on the target's answers, and more varied prompts teach them more
than more answers to the same prompts do. So where no prompts of the kind can be had, the target's own serve.
On SmolLM2-135M, 121 such prompts added to 187 Spec-Bench ones raised an EAGLE-3 head from 1.371 to 1.448 tokens per
call at chain:4 on 13 held-out prompts, and from 1.380 to 1.397 on 46, within noise
(`analyses/results/eagle3-gpu-h200-2026-11-27b/`).

Kept: turns that end (an end-of-generation token) within `max_new_tokens`, with 3 to 2,000 characters, not written
before. Each turn is drawn with HF `generate` from one torch generator seeded by `seed`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from specsim.errors import ModelError

MARK = "\x00specsim-user-turn\x00"  # stands for a user turn's text while the template is rendered


@dataclass(frozen=True)
class PromptWriteConfig:
    count: int  # prompts to keep
    temperature: float = 1.0  # Magpie samples the user turn at T = 1
    max_new_tokens: int = 160  # a turn that has not ended within this many tokens is dropped
    batch_size: int = 64  # turns sampled together
    seed: int = 0  # one generator for the whole run: the same seed writes the same prompts
    min_chars: int = 3  # shorter turns are dropped
    max_chars: int = 2000  # longer ones too
    max_draws: int = 0  # give up after this many turns (0: 4 x count + one batch), so a model that never ends a
    #                     turn cannot loop forever


@dataclass
class PromptWriteOutcome:
    prompts: list[str] = field(default_factory=list)  # kept, in the order drawn
    drawn: int = 0  # turns sampled
    unfinished: int = 0  # not ended within max_new_tokens
    bad_length: int = 0  # outside min_chars..max_chars
    repeated: int = 0  # equal to one kept before
    surplus: int = 0  # drawn in the last batch once `count` were kept
    seconds: float = 0.0
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM: `prompts` holds what was kept until then


def user_turn_prefix(tokenizer) -> str:
    """A chat template rendered up to where a user turn's text begins (its default system prompt
    included); ModelError if the tokenizer has no chat template (a base model: nothing to prompt it with)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError("the model's tokenizer has no chat template: prompts are written by an instruct (chat) "
                         "model from the start of a user turn")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                             add_generation_prompt=False)
    if MARK not in rendered:
        raise ModelError("the model's chat template does not show a user turn's text; cannot find where one starts")
    return rendered.split(MARK)[0]


def write_prompts(writer, config: PromptWriteConfig, *, progress: bool = True,
                  on_round: Callable[[PromptWriteOutcome], None] = lambda outcome: None) -> PromptWriteOutcome:
    """Sample user turns from `writer` (a `LoadedModel`: usually the target itself, or a larger instruct model of
    the same chat format) until `config.count` are kept (see the module docstring). Ctrl-C or SIGTERM stops it with
    what was kept (`interrupted`)."""
    import torch
    from tqdm.auto import tqdm

    from specsim.record.models import eos_token_ids

    if config.count < 1:
        raise ModelError(f"count {config.count}: give at least 1 prompt to write")
    tokenizer, model = writer.tokenizer, writer.model
    prefix = tokenizer(user_turn_prefix(tokenizer), add_special_tokens=False, return_tensors="pt")["input_ids"]
    prefix = prefix.to(writer.info["device"])
    ends = sorted(eos_token_ids(writer))
    if not ends:
        raise ModelError("the model has no end-of-generation token: a user turn would never end")
    limit = config.max_draws or 4 * config.count + config.batch_size
    torch.manual_seed(config.seed)  # generate draws from torch's global generator
    outcome, seen, started = PromptWriteOutcome(), set(), time.perf_counter()
    bar = tqdm(total=config.count, unit="prompt", desc="writing prompts", disable=not progress, dynamic_ncols=True)
    try:
        while len(outcome.prompts) < config.count and outcome.drawn < limit:
            ids = prefix.expand(min(config.batch_size, limit - outcome.drawn), -1)
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                     temperature=config.temperature, top_k=0, top_p=1.0,
                                     max_new_tokens=config.max_new_tokens, eos_token_id=ends, pad_token_id=ends[0])
            for row in out[:, prefix.shape[1]:].tolist():
                outcome.drawn += 1
                end = next((k for k, tok in enumerate(row) if tok in ends), None)
                if end is None:
                    outcome.unfinished += 1
                    continue
                text = tokenizer.decode(row[:end], skip_special_tokens=True).strip()
                if not config.min_chars <= len(text) <= config.max_chars:
                    outcome.bad_length += 1
                elif text in seen:
                    outcome.repeated += 1
                elif len(outcome.prompts) >= config.count:
                    outcome.surplus += 1
                else:
                    seen.add(text)
                    outcome.prompts.append(text)
                    bar.update()
            on_round(outcome)
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        bar.close()
    outcome.seconds = time.perf_counter() - started
    return outcome

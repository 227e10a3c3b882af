"""Which prompts a trained head saw, and whether an evaluated cache shares them.

`specsim train-draft` writes into the head's config.json (`training.trained_on`) the question
id and a fingerprint of the token ids of every prompt it trained on. A cache that evaluates
the head records the head's directory (its run metadata, `drafts[name].path`); `shared_prompts`
compares the two by fingerprint, so a head evaluated on its own training prompts is named as
such by `simulate`, `validate` and `report` rather than passing as held out (heads trained on
the first three Spec-Bench prompts per category and evaluated on the first reach 1.9-2.4
tokens per call where held-out prompts give 1.2).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def prompt_fingerprint(token_ids) -> str:
    """A prompt's identity across caches: the sha256 of its token ids (int64), first 16 hex digits."""
    return hashlib.sha256(np.asarray(token_ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def trained_on(caches, prompts) -> dict:
    """The `training.trained_on` record of a head trained on `caches`' prompts `prompts`: (question id, token
    fingerprint) of each, in order."""
    prompts = [{"question_id": int(qid), "tokens": tokens} for qid, tokens in prompts]
    digest = hashlib.sha256(json.dumps([p["tokens"] for p in prompts]).encode()).hexdigest()[:16]
    return {"caches": [str(c) for c in caches], "prompts": prompts, "fingerprint": digest}


@dataclass(frozen=True)
class Overlap:
    draft: str  # the head draft's spec
    shared: int  # the cache's prompts the head trained on
    prompts: int  # the cache's prompts
    question_ids: tuple[int, ...]  # the shared ones' question ids

    def line(self) -> str:
        ids = ", ".join(map(str, self.question_ids[:8])) + (" ..." if len(self.question_ids) > 8 else "")
        return (f"warning: {self.draft} was trained on {self.shared} of this cache's {self.prompts} prompts "
                f"(question ids {ids}): its numbers on them are not held out")


def _training_record(where) -> dict:
    """The `training` block of the head checkpoint in directory `where` (train-draft writes it), or {} when there is
    none (a published head, or a directory not found)."""
    if not where:
        return {}
    try:
        return json.loads((Path(where) / "config.json").read_text()).get("training") or {}
    except (OSError, ValueError, AttributeError):
        return {}


def shared_prompts(reader, draft: str) -> Overlap | None:
    """The overlap of a head draft's training prompts with an open CacheReader's prompts, or None when the head
    records none (a published head, or one trained before heads recorded their prompts) or shares none."""
    info = (reader.run.drafts or {}).get(draft) or {}
    training = _training_record(info.get("path") or draft.partition(":")[2])
    seen = {p["tokens"] for p in (training.get("trained_on") or {}).get("prompts", [])}
    if not seen:
        return None
    qids = reader.prompts["question_id"].to_list()
    shared = [i for i in range(len(qids)) if prompt_fingerprint(reader.prompt_token_ids(i)) in seen]
    if not shared:
        return None
    return Overlap(draft, len(shared), len(qids), tuple(int(qids[i]) for i in shared))


def leakage_lines(cache, drafts) -> list[str]:
    """A warning line for each head draft in `drafts` evaluated on a cache that shares prompts with its training."""
    from specsim.cache.reader import CacheReader
    from specsim.specs import is_head_draft

    heads = [d for d in dict.fromkeys(drafts) if d and is_head_draft(d)]
    if not heads:
        return []
    with CacheReader(cache) as reader:
        return [o.line() for o in (shared_prompts(reader, d) for d in heads) if o is not None]


def training_summary(info) -> str:
    """How a head draft was trained, from its checkpoint's config.json ("trained by specsim train-draft: 1,200
    steps on 25,379 positions of train.h5, the prompt as context; held-out top-1 0.247 at depth 1"), or "" when it
    says nothing (a published head, or a head draft not found). Heads trained before `--prompt` existed were blind
    to the prompt, and say so."""
    training = _training_record(info.get("path") if info else None)
    if not training:
        return ""
    config = training.get("config") or {}
    caches = training.get("caches") or [training.get("cache", "?")]  # heads trained before several caches: one
    text = (f"trained by specsim train-draft: {int(training.get('steps', 0)):,} steps on "
            f"{int(training.get('positions', 0)):,} positions of {' + '.join(Path(str(c)).name for c in caches)}")
    if config.get("train_prompts"):  # --train-prompts: a subset, a data-scaling curve's point
        text += f" ({int(config['train_prompts'])} of its training prompts)"
    if config.get("train_categories"):  # --train-categories
        text += f" (categories {', '.join(map(str, config['train_categories']))} only)"
    prompt = config.get("prompt", "none")  # heads trained before --prompt never saw it
    if config.get("kind") != "medusa" or prompt == "loss":  # Medusa attends to nothing: context is moot
        text += {"context": ", the prompt as context", "loss": ", the prompt as context and in the loss",
                 "none": ", blind to the prompt"}.get(prompt, "")
    top1 = (training.get("heldout") or {}).get("top1") or {}
    if top1:
        over = training.get("heldout_trajectories")
        text += ("; held-out top-1" + (f" ({int(over)} trajectories)" if over else "") + " "
                 + ", ".join(f"{float(v):.3f} at depth {d}" for d, v in list(top1.items())[:4]))
    return text

"""What a head trains on: a cache's trajectories with their hidden states, the prompt's states
before them, and the split into training and held-out prompts (every k-th held out).

The prompt is the heads' context, as it is when they draft: a head drafting a call attends over
the target's states at every earlier position, the prompt's included (`HeadDraft.start_logits`),
and EAGLE-3's and SpecForge's trainers run the whole conversation through the head with the loss
masked to the assistant's response (SpecForge 0.2's `specforge/data/preprocessing.py`,
`preprocess_conversations`, copied from EAGLE's `traineagle3/cnets.py`: loss_mask 1 on the
assistant spans only). A cache stores states at generated positions only, so the prompt's are
computed here by the target (one forward per prompt), rounded to float16 as the cache rounds the
rest. `prompt` (PROMPT_USES) chooses: "context" (the default; the loss on generated tokens only),
"loss" (the prompt's tokens are predicted too: the target's laws on text it did not write, more
positions per recording), "none" (the generated part alone, the head blind to the prompt: how
heads were trained before, kept to measure the difference).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Collection

import numpy as np
import torch

from specsim.errors import CacheError, ModelError
from specsim.specs import PROMPT_USES

if TYPE_CHECKING:
    from specsim.record.train import TrainConfig


@dataclass(frozen=True)
class TrainSequence:
    """One trajectory's training data."""

    hidden: torch.Tensor  # (n, H) float32: row r is the state at input position start + r, which gave p for tokens[r]
    tokens: torch.Tensor  # (n,) int64: the token after row r's position
    start: int  # input position of row 0: 0 with the prompt's rows, else the prompt length - 1
    features: torch.Tensor | None = None  # (n, F) EAGLE-3, MTP: the states the head reads, side by side
    context: int = 0  # leading rows that are the prompt's (prompt length - 1, or 0): not the target's own output

    def loss_from(self, config: "TrainConfig") -> int:
        """The first row a training step's loss covers: the generated part's, or row 0 with `prompt` "loss"."""
        return 0 if config.prompt == "loss" else self.context


PROMPTS_PER_BATCHED_CALL = 256  # prompts handed to `target_hidden_batched` at once (the progress bar's step)


def load_sequences(cache, target, layers: tuple[str, ...] = (), prompt: str = "context", *,
                   prompts: Collection[int] | None = None, progress: bool = False,
                   hidden_batch: int = 0) -> list[tuple[int, TrainSequence]]:
    """(prompt index, trajectory) of every trajectory of 2+ tokens in a cache with hidden states (of the prompts
    `prompts` only, when given), checked against `target`; `layers` (the head's: EAGLE-3's fused layers, MTP's
    state) are read side by side into `features`. Unless `prompt` is "none", each trajectory is preceded by its
    prompt's states, computed by `target` (`context` rows): one forward per prompt, or with `hidden_batch` > 0
    right-padded forwards of up to that many tokens (`target_hidden_batched`: for a GPU, where a forward of a small
    model costs about the same for one sequence as for many; equal to one per prompt up to rounding)."""
    from tqdm.auto import tqdm

    from specsim.cache.reader import CacheReader
    from specsim.record.head_unroll import target_hidden, target_hidden_batched

    if prompt not in PROMPT_USES:
        raise ModelError(f"--prompt {prompt!r}: one of {', '.join(PROMPT_USES)}")
    with CacheReader(cache) as reader:
        want = tuple(dict.fromkeys(("last", *layers)))
        missing = [k for k in want if k not in reader.spec.hidden]
        if missing:
            raise CacheError(f"{reader.path} has no hidden states {','.join(missing)} to train on (it holds "
                             f"{','.join(reader.spec.hidden) or 'none'}); record it with `specsim cache ... "
                             f"--hidden-states {','.join(want)}`")
        sha = reader.run.tokenizer_sha256
        if sha and sha != target.info.get("tokenizer_sha256"):
            raise ModelError(f"{reader.path} was recorded with target {reader.run.setting('target')!r} "
                             f"(another tokenizer); --target {target.name} is not that model")
        H = int(target.model.config.hidden_size)
        if reader.spec.hidden_size != H:
            raise ModelError(f"{reader.path} stores hidden states of width {reader.spec.hidden_size}; --target "
                             f"{target.name} has hidden size {H}")
        rows = [row for row in reader.iter_trajectories()
                if row.length >= 2 and (prompts is None or row.prompt_index in prompts)]
        ids = {i: reader.prompt_token_ids(i).astype(np.int64) for i in sorted({row.prompt_index for row in rows})}
        context = {}  # prompt index -> {layer: (prompt length - 1, H) float32}, rounded as the cache rounds states
        if prompt != "none":
            device = target.info.get("device", "cpu")
            todo = [i for i in ids if len(ids[i]) >= 2]
            step = PROMPTS_PER_BATCHED_CALL if hidden_batch else 1
            with tqdm(total=len(todo), desc="prompt states", unit="prompt", disable=not progress,
                      dynamic_ncols=True) as bar:
                for first in range(0, len(todo), step):
                    part = todo[first:first + step]
                    xs = [torch.as_tensor(ids[i], device=device) for i in part]
                    got = (target_hidden_batched(target, xs, want, hidden_batch) if hidden_batch
                           else [target_hidden(target, xs[0], want)])
                    for i, states in zip(part, got):
                        context[i] = {k: v.half().float().cpu() for k, v in states.items()}
                    bar.update(len(part))

        def sequence(row) -> TrainSequence:
            prompt_ids, before = ids[row.prompt_index], context.get(row.prompt_index)
            states = {k: torch.as_tensor(reader.hidden(k, row.start, row.stop).astype(np.float32)) for k in want}
            tokens = torch.as_tensor(reader.tokens(row.start, row.stop).astype(np.int64))
            if before is not None:
                states = {k: torch.cat([before[k], v]) for k, v in states.items()}
                tokens = torch.cat([torch.as_tensor(prompt_ids[1:]), tokens])
            rows_before = 0 if before is None else len(prompt_ids) - 1  # the prompt's rows, when given
            return TrainSequence(hidden=states["last"], tokens=tokens, start=len(prompt_ids) - 1 - rows_before,
                                 features=torch.cat([states[k] for k in layers], dim=1) if layers else None,
                                 context=rows_before)

        return [(row.prompt_index, sequence(row)) for row in rows]


RESIDENT_SHARE = 0.25  # the training data moves to a GPU when it takes at most this share of its free memory


def to_device(seqs: list[TrainSequence], device) -> tuple[list[TrainSequence], str | None]:
    """`seqs` on a GPU `device` once, before training, when they fit (RESIDENT_SHARE of its free memory), and a line
    saying where they are. Kept in host memory, every step copies its trajectories over from pageable memory, and
    each such copy waits for the device's queue to drain; on a CPU they are where they are (None)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return seqs, None
    tensors = [t for s in seqs for t in (s.hidden, s.tokens, s.features) if t is not None]
    need = sum(t.numel() * t.element_size() for t in tensors)
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else None
    if free is not None and need > RESIDENT_SHARE * free:
        return seqs, (f"training data kept in host memory ({need / 1e9:.1f} GB, over {RESIDENT_SHARE:.0%} of the "
                      f"{free / 1e9:.1f} GB the device has free): each step copies its trajectories over")
    moved = [replace(s, hidden=s.hidden.to(dev), tokens=s.tokens.to(dev),
                     features=None if s.features is None else s.features.to(dev)) for s in seqs]
    return moved, f"training data on the device ({need / 1e9:.2f} GB), moved once"


def held_out(prompt: int, every: int) -> bool:
    """Whether prompt index `prompt` is held out from training: every `every`-th is."""
    return prompt % every == every - 1


@dataclass(frozen=True)
class PromptPlan:
    """Which prompts a run trains on and which it holds out, over one or more caches: keys (cache number, prompt
    index). Every `every`-th prompt of each cache is held out (the same ones as when that cache is trained on
    alone); a prompt held out in one cache is held out of training in every cache that also holds it (`moved`
    counts those), so no held-out prompt is trained on."""

    keep: frozenset  # (cache, prompt index) trained on
    held: frozenset  # (cache, prompt index) held out
    moved: int = 0  # training prompts left out because another cache holds the same prompt out
    identity: dict = field(default_factory=dict)  # (cache, prompt index) -> (question id, token fingerprint)

    def trained_on(self) -> list[tuple[int, str]]:
        """(question id, token fingerprint) of each prompt trained on, by cache and then prompt index."""
        return [self.identity[k] for k in sorted(self.keep)]

    def of(self, cache: int) -> tuple[set[int], set[int]]:
        """(trained on, held out): cache number `cache`'s prompt indices."""
        return {i for c, i in self.keep if c == cache}, {i for c, i in self.held if c == cache}


def plan_prompts(caches, every: int, prompts: int = 0, seed: int = 0,
                 categories: Collection[str] = ()) -> PromptPlan:
    """The prompts of `caches` (their trajectories of 2+ tokens) split into training and held-out ones: every
    `every`-th prompt of each cache held out; of the rest, those of `categories` (when given), and of those all, or
    `prompts` of them drawn by `seed`, the first of one permutation, so a smaller subset is part of a larger one
    and a data-scaling curve's points add data to one another (the held-out prompts are the same whatever
    `prompts` and `categories`)."""
    from specsim.cache.provenance import prompt_fingerprint
    from specsim.cache.reader import CacheReader

    caches = list(caches)
    twice = next((c for k, c in enumerate(caches) if Path(c).resolve() in {Path(d).resolve() for d in caches[:k]}),
                 None)
    if twice is not None:
        raise CacheError.naming("{caches} {path} is given twice: its trajectories would count twice", path=str(twice))
    identity, category, have = {}, {}, set()  # per recorded (cache, prompt index); every category there is
    for c, cache in enumerate(caches):
        with CacheReader(cache) as reader:
            names = [p.category for p in reader.prompt_records()]
            for i in sorted({row.prompt_index for row in reader.iter_trajectories() if row.length >= 2}):
                identity[c, i] = reader.prompt_question_id(i), prompt_fingerprint(reader.prompt_token_ids(i))
                category[c, i] = names[i]
            have.update(names)
    if categories:
        unknown = sorted(set(categories) - have)
        if unknown:
            shown = ", ".join(sorted({c or "(none)" for c in have}))
            raise CacheError.naming("{train_categories} {value}: no prompt of {cache} has {which}; it has: {shown}",
                                    value=",".join(unknown), cache=" or ".join(map(str, caches)), shown=shown,
                                    which="that category" if len(unknown) == 1 else "those categories")
    held = {k for k in identity if held_out(k[1], every)}
    unseen = {identity[k][1] for k in held}
    wanted = set(categories)
    pool = sorted(k for k in identity if k not in held and (not wanted or category[k] in wanted))
    if wanted and not pool:
        raise CacheError.naming("{train_categories}: none of the training prompts is in those categories")
    kept = [k for k in pool if identity[k][1] not in unseen]
    moved, pool = len(pool) - len(kept), kept
    if prompts:
        if prompts > len(pool):
            raise CacheError.naming("{train_prompts} {value}: {where} {n} training prompts (1 in {every} held out"
                                    + (", in {train_categories}" if categories else "") + ")", value=prompts,
                                    n=len(pool), every=every,
                                    where="the cache has" if len(caches) == 1 else f"the {len(caches)} caches have")
        order = np.random.default_rng([seed, 1]).permutation(len(pool))
        pool = [pool[k] for k in order[:prompts]]
    return PromptPlan(keep=frozenset(pool), held=frozenset(held), moved=moved, identity=identity)


def draft_vocabulary(seqs: list[TrainSequence], size: int, vocab: int, config: "TrainConfig") -> np.ndarray:
    """The `size` most frequent tokens the loss covers in the training trajectories, ascending (ties: the lower
    id), as speculators' `build_vocab_mappings_from_distribution` picks an EAGLE-3 draft vocabulary."""
    if not 0 < size <= vocab:
        raise ModelError(f"--draft-vocab {size}: give 1..{vocab:,} (the target's vocabulary), or 0 for all of it")
    counts = np.bincount(np.concatenate([s.tokens[s.loss_from(config):].numpy() for s in seqs]), minlength=vocab)
    order = np.lexsort((np.arange(vocab), -counts))  # by count, descending; then by id
    return np.sort(order[:size])

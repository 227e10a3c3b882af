"""A recording run, end to end: what `specsim cache` does, as a library function with typed arguments.

Order matters for the user: every check that needs no model comes first (output path, the
exclusive writer lock, --resume settings), then the models load, then prompts too long for
the target's context are refused, and only then does recording start. Ctrl-C and SIGTERM
stop after the trajectory being committed; everything committed stays, and `resume=True`
continues it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specsim.cache.stats import StatsSpec
from specsim.errors import CacheError, PromptError, ResumeMismatchError
from specsim.record.recorder import MAX_OVERHANG, OVERHANG
from specsim.specs import STORES, is_head_draft


@dataclass(frozen=True)
class RecordRequest:
    """What to record."""

    target: str  # model spec: packaged short name, GGUF file, HF directory or hub id
    drafts: tuple[str, ...] = ()  # draft specs (model specs, layers:K, int8, medusa:DIR, eagle:DIR)
    prompts: str = "spec-bench"  # prompt source: 'spec-bench', a JSONL or a text file
    categories: tuple[str, ...] | None = None  # only these categories
    per_category: int | None = None  # the first N prompts of each category
    max_new_tokens: int = 128  # generation limit per trajectory
    temperatures: tuple[float, ...] = (0.0,)  # one trajectory per prompt per temperature; 0 = greedy
    seed: int = 0  # base seed; each (prompt, temperature) derives its own
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    dtype: str = "float32"  # model dtype
    batch_size: int = 1  # prompts generated together
    hidden_batch_tokens: int = 0  # > 0: hidden states from batched forwards of up to this many tokens (RecordConfig)
    top_k: int = 0  # 0: full logits; K: top-K logits + tail log-sum-exp
    store: str = "full"  # "full": statistics and the logits; "stats": the per-position statistics only
    stats: StatsSpec = StatsSpec()  # which statistics (π candidates, swor samples, lossy rules)
    shard: tuple[int, int] | None = None  # (i, n): this process records the prompts with index % n == i
    hidden: tuple[str, ...] = ()  # target hidden states stored per position: "last" and/or decoder layer numbers
    head_depth: int | None = None  # depths recorded for head drafts (None: Medusa's head count, EAGLE 5)
    overhang: int = OVERHANG  # positions recorded past each trajectory's end (engines count drafts accepted there)


@dataclass(frozen=True)
class RecordOutcome:
    """What a run did."""

    trajectories: int  # committed in this run
    positions: int  # generated positions committed in this run
    skipped: int  # (prompt, temperature) pairs already in the file
    seconds: float  # recording loop wall time
    total: int  # trajectories in the file now
    bytes: int  # file size now
    interrupted: bool  # stopped by Ctrl-C / SIGTERM (committed trajectories kept)
    phases: dict = field(default_factory=dict)  # of `seconds`, each phase's (`recorder.Phases`)

    @property
    def expand_seconds(self) -> float:
        """Of `seconds`, expanding the drafts' trees (--expand) or running the target along their proposals
        (--expand-target)."""
        return self.phases.get("expansion", 0.0)


def check_output(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Fail before loading any model if the output cannot be (re)written as asked."""
    if resume and overwrite:
        raise CacheError.naming("{resume} and {overwrite} exclude each other")
    if not str(out).strip():
        raise CacheError.naming("{out}: an empty path; give a file name such as cache/run.h5")
    if out.is_dir():
        raise CacheError.naming("{out} {path} is a directory; give a file name such as {example}", path=out,
                                example=out / "run.h5")
    if out.exists() and not (resume or overwrite):
        raise CacheError.naming("{path} exists; pass {resume} to continue it or {overwrite} to replace it", path=out)
    if resume and not out.exists():
        raise CacheError.naming("{path}: no such file to {resume}; drop {resume} to start a new cache", path=out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheError.naming("{out} {path}: cannot create directory {parent} ({why})", path=out, parent=out.parent,
                                why=exc.strerror or exc) from None
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise CacheError.naming("{out} {path}: not writable; choose another path", path=out)


def check_prompt_lengths(records, model, max_new_tokens: int, overhang: int = 0) -> None:
    """PromptError naming the first prompt whose tokens + max_new_tokens + overhang exceed the target's context."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is None:
        return
    for i, r in enumerate(records):
        if len(r.token_ids) + max_new_tokens + overhang > limit:
            plus = f" and --overhang {overhang}" if overhang else ""
            raise PromptError(f"prompt {i} (question {r.question_id}, {r.category or 'no category'}) has "
                              f"{len(r.token_ids)} tokens; with --max-new-tokens {max_new_tokens}{plus} it exceeds "
                              f"the target's context of {limit} positions: lower --max-new-tokens or drop the prompt")


def record_cache(out, request: RecordRequest, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
                 echo: Callable[[str], None] = lambda line: None) -> RecordOutcome:
    """Record `request` into the cache `out` (see the module docstring for the order of checks)."""
    from specsim.cache.lock import CacheLock
    from specsim.cache.layout import CacheSpec
    from specsim.cache.reader import CacheReader
    from specsim.cache.writer import CacheWriter
    from specsim.prompts import load_prompts
    from specsim.record.recorder import RecordConfig, check_resume, settings

    out = Path(out)
    if request.seed < 0:
        raise CacheError.naming("{seed} {value}: seeds are non-negative integers", value=request.seed)
    temperatures = tuple(dict.fromkeys(float(t) for t in request.temperatures)) or (0.0,)
    cats = list(request.categories) if request.categories else None
    check_output(out, resume=resume, overwrite=overwrite)
    prompt_set = load_prompts(request.prompts, categories=cats, per_category=request.per_category)
    prompt_spec = {
        "spec": request.prompts, "source": prompt_set.source, "categories": cats,
        "per_category": request.per_category, "sha256": prompt_set.fingerprint(), "n_prompts": len(prompt_set.prompts),
    }
    hidden = parse_hidden(request.hidden)
    head_specs = [d for d in request.drafts if is_head_draft(d)]
    if request.stats.expand_target is not None and not any(t > 0 for t in temperatures):
        raise CacheError("--expand-target records what block verification of drafts sampled at T > 0 needs; at T = 0 "
                         "drafts are point masses and block verification is token-wise (greedy-draft replays it): "
                         "add a --temperature above 0")
    if head_specs and request.stats.expand_target is not None:
        raise CacheError(f"--expand-target draws chains from a draft model; head draft {head_specs[0]} is not one: "
                         "record it without --expand-target (or in a cache of its own)")
    if request.hidden_batch_tokens < 0:
        raise CacheError.naming("{hidden_batch_tokens} {value}: give a positive number of tokens",
                                value=request.hidden_batch_tokens)
    if request.hidden_batch_tokens and not (hidden or head_specs):
        raise CacheError.naming("{hidden_batch_tokens} batches the target's hidden-state forwards; without "
                                "{hidden} or a head draft there are none")
    if request.head_depth is not None and not 1 <= request.head_depth <= 16:
        raise CacheError.naming("{head_depth} {value}: give 1..16", value=request.head_depth)
    if not 0 <= request.overhang <= MAX_OVERHANG:
        raise CacheError.naming("{overhang} {value}: give 0..{most} positions past each end", value=request.overhang,
                                most=MAX_OVERHANG)
    config = RecordConfig(max_new_tokens=request.max_new_tokens, temperatures=temperatures, seed=request.seed,
                          batch_size=request.batch_size, shard=request.shard, overhang=request.overhang,
                          hidden_batch_tokens=request.hidden_batch_tokens)
    if request.store not in STORES:
        raise CacheError.naming("{store} {value!r}: use " + " or ".join(STORES), value=request.store)
    if request.store == "stats" and request.top_k:
        raise CacheError.naming("{top_k} keeps truncated logits; {store} stats keeps none: choose one")
    storage = "stats" if request.store == "stats" else "topk" if request.top_k else "full"
    run_settings = settings(target=request.target, drafts=request.drafts, prompt_spec=prompt_spec, config=config,
                            dtype=request.dtype, storage=storage, top_k=request.top_k,
                            statistics=json.loads(request.stats.to_json()))
    if hidden or head_specs:  # older files have neither key: a resume of one still compares equal
        run_settings.update(hidden_states=list(hidden), head_depth=request.head_depth)
    with CacheLock(out):  # before any model loads: a second writer refuses at once
        file_tokenizer = None
        if resume:
            with CacheReader(out) as reader:
                check_resume(out, reader.meta, run_settings)
                file_tokenizer = reader.run.tokenizer_sha256
        loaded = _load(request, echo)
        p_target, q_drafts = loaded
        _check_expandable(q_drafts, request.stats.expansion)
        _check_layers(hidden, p_target)
        from specsim.record.recorder import build_meta, prompt_records, record

        records = prompt_records(prompt_set.prompts, p_target.tokenizer)
        check_prompt_lengths(records, p_target.model, request.max_new_tokens, request.overhang)
        if resume:
            if file_tokenizer != p_target.info["tokenizer_sha256"]:
                raise ResumeMismatchError(f"{out}: cannot --resume, the target's tokenizer differs from the file's")
            writer = CacheWriter.resume(out)
        else:
            meta = build_meta(p_target, q_drafts, prompt_spec, run_settings, device=p_target.info["device"],
                              batch_size=request.batch_size)
            from specsim.record.head_unroll import HeadDraft

            depths = {d.name: head_depth(d, request.head_depth) for d in q_drafts if isinstance(d, HeadDraft)}
            spec = CacheSpec(vocab_size=p_target.vocab_size, drafts=tuple(request.drafts), temperatures=temperatures,
                             storage=storage, top_k=request.top_k, meta=meta, stats=request.stats, depths=depths,
                             hidden=hidden, hidden_size=int(p_target.model.config.hidden_size) if hidden else 0)
            writer = CacheWriter.create(out, spec, records, overwrite=overwrite)
        n_cat = len(prompt_set.categories)
        if request.shard:
            echo(f"shard {request.shard[0]}/{request.shard[1]}: every {request.shard[1]}-th prompt from "
                 f"#{request.shard[0]} ({len(range(request.shard[0], len(records), request.shard[1]))} of "
                 f"{len(records)}); join the shards with `specsim merge`")
        echo(f"recording {len(records)} prompts ({n_cat} categor{'y' if n_cat == 1 else 'ies'}, {prompt_set.source}) "
             f"x T={', '.join(f'{t:g}' for t in temperatures)}, up to {request.max_new_tokens} new tokens, "
             f"drafts: {', '.join(request.drafts) or 'none'}")
        from specsim.interrupts import sigterm_as_interrupt

        interrupted, stats = False, None
        try:
            with writer, sigterm_as_interrupt():
                stats = record(writer, p_target, q_drafts, config, progress=progress)
            interrupted = stats.interrupted
        except KeyboardInterrupt:  # outside the recording loop (closing the file)
            interrupted = True
        with CacheReader(out) as reader:
            total = reader.n_trajectories
        return RecordOutcome(trajectories=stats.trajectories if stats else 0, positions=stats.positions if stats else 0,
                             skipped=stats.skipped if stats else 0, seconds=stats.seconds if stats else 0.0,
                             total=total, bytes=out.stat().st_size, interrupted=interrupted,
                             phases=stats.phases if stats else {})


def _load(request: RecordRequest, echo):
    import transformers

    from specsim.record.models import load_draft, load_model, resolve_device

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    device = resolve_device(request.device)
    echo(f"loading target {request.target} ({request.dtype}, {device}) ...")
    p_target = load_model(request.target, device=device, dtype=request.dtype)
    q_drafts = []
    for spec in request.drafts:
        echo(f"loading draft {spec} ...")
        if is_head_draft(spec):
            from specsim.record.head_checkpoints import load_heads

            q_drafts.append(load_heads(spec, p_target))
        else:
            q_drafts.append(load_draft(spec, p_target, device=device, dtype=request.dtype))
    return p_target, q_drafts


def _check_expandable(drafts, expansion) -> None:
    """CacheError, before anything is recorded, where --expand asks a Medusa head for more levels than it has heads
    (each level's children come from the head of that depth)."""
    for d in drafts:
        if expansion is not None and getattr(d, "kind", None) == "medusa" and expansion.depth > d.config.heads:
            raise CacheError(f"--expand {expansion.label}: {d.name} has {d.config.heads} heads, so it expands to "
                             f"depth {d.config.heads} at most")


def _check_layers(hidden: tuple[str, ...], target) -> None:
    """CacheError, before anything is recorded, for a --hidden-states layer number the target does not have (k is
    the input of decoder layer k, so 0..L for L layers: L is the last layer's output, before the final norm)."""
    layers = int(target.model.config.num_hidden_layers)
    beyond = [k for k in hidden if k.isdigit() and int(k) > layers]
    if beyond:
        raise CacheError.naming("{hidden} {value}: {target} has {layers} decoder layers, so a layer number is 0..{layers}"
                                " (k: the input of decoder layer k)", value=",".join(beyond), target=target.name,
                                layers=layers)


EAGLE_DEPTH = 5  # EAGLE-2's default draft depth


def head_depth(head, asked: int | None) -> int:
    """Depths recorded for a head draft: Medusa's head count (no deeper), EAGLE's --head-depth or 5."""
    if head.kind == "medusa":
        if asked is not None and asked > head.config.heads:
            raise CacheError.naming("{head_depth} {value}: {head} has {heads} heads, so it drafts at most {heads} deep",
                                    value=asked, head=head.name, heads=head.config.heads)
        return asked or head.config.heads
    return asked or EAGLE_DEPTH


def parse_hidden(layers) -> tuple[str, ...]:
    """--hidden-states: "last" (the LM head's input), "prenorm" (before the final norm) and/or decoder layer
    numbers, comma-separated."""
    if not layers:
        return ()
    items = [str(x).strip() for part in ([layers] if isinstance(layers, str) else layers) for x in str(part).split(",")]
    out = []
    for item in items:
        if item not in ("last", "prenorm") and not item.isdigit():
            raise CacheError.naming("{hidden} {value!r}: give 'last', 'prenorm' or decoder layer numbers, e.g. "
                                    "last,12", value=item)
        out.append(item)
    return tuple(dict.fromkeys(out))


SHARD_ENV = (("RANK", "WORLD_SIZE"), ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"))  # torchrun, SLURM arrays


def parse_shard(text: str | None, env=os.environ) -> tuple[int, int] | None:
    """'i/n' -> (i, n); 'auto' -> from torchrun's RANK/WORLD_SIZE or a SLURM array's task id and count."""
    if text is None or text == "":
        return None
    if text == "auto":
        for rank, size in SHARD_ENV:
            if rank in env and size in env:
                i, n = int(env[rank]), int(env[size])
                if rank.startswith("SLURM") and "SLURM_ARRAY_TASK_MIN" in env:
                    i -= int(env["SLURM_ARRAY_TASK_MIN"])  # arrays may start at 1
                break
        else:
            raise CacheError("--shard auto: no RANK/WORLD_SIZE (torchrun) or SLURM_ARRAY_TASK_ID/"
                             "SLURM_ARRAY_TASK_COUNT (sbatch --array) in the environment; give --shard I/N")
    else:
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise CacheError(f"--shard {text!r}: write I/N (e.g. 0/4: the first of four shards) or auto") from None
    if not 0 <= i < n:
        raise CacheError(f"--shard {i}/{n}: I must be in 0..N-1")
    return i, n


def shard_path(out: Path, shard: tuple[int, int] | None) -> Path:
    """The output path with {i} and {n} filled in (cache/run-{i}-of-{n}.h5), for one command on every rank."""
    text = str(out)
    if shard is None:
        if "{i}" in text or "{n}" in text:
            raise CacheError(f"--out {out}: {{i}}/{{n}} name a shard's file; add --shard I/N or --shard auto")
        return out
    if shard[1] > 1 and "{i}" not in text:
        raise CacheError(f"--out {out}: every shard needs its own file: put {{i}} in the name "
                         "(e.g. cache/run-{i}-of-{n}.h5)")
    return Path(text.replace("{i}", str(shard[0])).replace("{n}", str(shard[1])))


def shard_device(device: str, env=os.environ) -> str:
    """One GPU per process under torchrun: --device auto/cuda becomes cuda:LOCAL_RANK."""
    if device in ("auto", "cuda") and "LOCAL_RANK" in env:
        import torch

        if torch.cuda.is_available():
            return f"cuda:{int(env['LOCAL_RANK']) % torch.cuda.device_count()}"
    return device

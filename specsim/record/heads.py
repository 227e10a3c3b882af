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

MTP modules are in `specsim.record.mtp_heads`; running a head on the target's states (the draft law
per call start and depth) in `specsim.record.head_unroll`; checkpoints in their published layouts
in `specsim.record.head_checkpoints`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from specsim.errors import ModelError

PRENORM_INPUT = ("mimo", "speculators")  # MTP styles fed the target's last layer before its final norm ("prenorm")
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

"""Multi-token-prediction heads: DeepSeek-V3's module, MiMo's, and `speculators`' own.

**MTP** (DeepSeek-V3's multi-token prediction, arXiv 2412.19437 §2.2; vLLM's `deepseek_mtp.py` and
`mimo_mtp.py`): one module fed proj(cat(norm(embed(x_{i+1})), norm(h_i))) — the embedding zeroed at
position 0, as vLLM masks it — then a whole decoder block (input norm included) and a final norm
before the target's LM head. vLLM runs it as a chain reusing the layer, each step fed the module's
previous output; SGLang as an EAGLE tree; both are how specsim drafts it. Each step feeds back the
block's output after the final norm (vLLM 0.32's `deepseek_mtp.py` returns both and recycles the
normed one). Two styles, as the engines run them: DeepSeek's (`enorm`, `hnorm`, `eh_proj`,
`shared_head.norm`/`.head`; fed the target's final normed state; its block DeepSeek-V3's own, latent
attention and a mixture of experts, where the checkpoint's is: `DeepseekBlock`) and MiMo's
(`token_layernorm`, `hidden_layernorm`, `input_proj` over cat(state, embedding), `final_layernorm`;
fed the target's last layer before its final norm, "prenorm"). The published layouts are native: the
module's weights sit inside the target's checkpoint (`model.layers.{L}.*` for DeepSeek,
`model.mtp_layers.0.*` for MiMo, with `num_nextn_predict_layers` in its config.json), so `mtp:DIR`
reads those keys only. A third style is `speculators`' own (`speculators_model_type: mtp`,
`models/mtp` of speculators 0.9): its trainer's layout, a head directory of its own
(`mtp_layers.0.*`: `token_layernorm`, `hidden_layernorm`, `input_proj` over cat(embedding, state), a
Qwen3 block with per-head q/k norms, `final_layernorm`; the target's embedding and LM head, not
saved), fed the target's last layer before its final norm and feeding back its normed output, the
embedding never masked.
"""

from __future__ import annotations

import torch
from torch import nn

from specsim import specs
from specsim.errors import ModelError
from specsim.record.heads import EagleLayer, HeadConfig, RMSNorm

MTP_STYLES = {  # how an MTP module is wired, as the engines run each family (module docstring): train-draft's
    **specs.MTP_STYLES,  # and the layout speculators' trainer writes, which specsim reads
    "speculators": "speculators': cat(embedding, state), fed the target's state before its final norm, a Qwen3 block "
                   "(per-head q/k norms)",
}


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

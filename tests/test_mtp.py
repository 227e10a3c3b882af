"""MTP layers: native checkpoints load, vLLM's mtp method counts what the replay counts, training learns.

An MTP module (DeepSeek-V3 §2.2; `specsim.record.mtp_heads.MtpHead`) sits inside its target's own
checkpoint: MiMo's `model.mtp_layers.0.*` (a Qwen2 target whose config names MiMoForCausalLM and
`num_nextn_predict_layers`), DeepSeek's `model.layers.{L}.*`. No library on the package index
writes either (MiMo's modelling code is remote code; transformers' DeepSeek-V3 drops the MTP
layer), so the MiMo checkpoint here is written with the published key names and checked by the
implementation that reads it: vLLM's `mimo_mtp.py`, which must draft, call for call, what the
replay of specsim's recording says (its loader also refuses unknown keys). speculators' own MTP
layout (`speculators_model_type: mtp`) is written by speculators itself (`tests/head_writers.py
mtp`) and checked against its own forward. Recording, replay, live
decoding and pricing of MTP heads are tested with the other heads (tests/test_heads_record.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsim.errors import CacheError, EngineError, ModelError
from tests.conftest import build_tiny_model, vllm_or_skip


def build_bigram_qwen2(out: Path) -> dict:
    """A tiny Qwen2 target (final norm not all ones, its own LM head, head_dim 32: vLLM's CPU attention needs 32+)
    whose layers write nothing (o_proj and down_proj zero): it predicts the next token from the current one. The
    last layer's weights before they were zeroed are returned (a block for an MTP layer)."""
    import copy

    import torch

    from specsim.record.models import load_model

    build_tiny_model(out, family="qwen2", final_norm=True, hidden=128)
    target = load_model(str(out))
    layers = target.model.model.layers
    block = copy.deepcopy(layers[-1].state_dict())
    with torch.no_grad():
        for layer in layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    target.model.save_pretrained(out)
    return block


def build_mimo_target(out: Path) -> Path:
    """A tiny Qwen2 target as a MiMo checkpoint: config.json names MiMoForCausalLM with num_nextn_predict_layers 1
    (transformers still loads it as Qwen2) and model.safetensors also holds model.mtp_layers.0.*.

    The target (`build_bigram_qwen2`) predicts the next token from the current one through its final norm and
    its own LM head. The MTP layer passes the normed embedding
    of the token after its state through eh_proj, so it proposes what the target will take next, disturbed by
    everything vLLM and specsim must agree on: the state half (the target's state before its final norm, then the
    layer's own normed output; hnorm's weights not all 1), the block (a random layer's output projections at
    0.05: its attention reads the embedding vLLM zeroes at position 0) and the final norm. Against vLLM's 74 drafts
    and [10, 8, 0] accepted per position at chain:3, a replay that dropped the position-0 mask counted 73 and
    [11, 8, 0], one that swapped the concatenation 92 and [0, 0, 0], one that fed back the output before its norm
    75 and [10, 7, 0] (probe runs). Reading the target's normed state instead of the one before the norm is not
    told apart here (its half of eh_proj is small); tests/test_heads_record.py pins that live reads what the
    recorder reads, and vLLM's mimo.py returns the state before the norm."""
    import torch
    from safetensors.torch import load_file, save_file

    from specsim.record.head_checkpoints import build, head_config_for, save_heads
    from specsim.record.models import load_model

    block = build_bigram_qwen2(out)
    target = load_model(str(out))
    config = head_config_for("mtp", target, mtp_style="mimo")
    module, H = build(config), config.hidden_size
    torch.manual_seed(0)
    with torch.no_grad():
        module.eh_proj.weight[:, H:] = torch.eye(H)  # MiMo's order: cat(state, embedding)
        module.eh_proj.weight[:, :H].normal_(0.0, 0.3 / H ** 0.5)
        module.hnorm.weight.uniform_(0.5, 1.5)
        module.layers[0].load_state_dict(block, strict=False)
        module.layers[0].self_attn.o_proj.weight.mul_(0.05)
        module.layers[0].mlp.down_proj.weight.mul_(0.05)
        module.norm.weight.copy_(target.model.model.norm.weight)
    head = out.parent / f"{out.name}-mtp"
    save_heads(head, config, module)
    weights = {**load_file(str(out / "model.safetensors")), **load_file(str(head / "model.safetensors"))}
    assert any(k.startswith("model.mtp_layers.0.") for k in weights)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((out / "config.json").read_text())
    raw.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    return out


def build_deepseek_target(out: Path, block: float = 0.05, state: float = 0.3, experts: float = 0.05) -> Path:
    """A tiny DeepSeek-V3 checkpoint written by transformers (`DeepseekV3ForCausalLM`: latent attention at the
    latent size vLLM's CPU kernel takes, 512 + 64; layer 0 dense, layer 1 a mixture of 4 experts in 2 groups, 2
    chosen, a shared expert, a random router bias) whose layers write nothing (o_proj and every down_proj zero),
    so it predicts the next token from the current one, with its DeepSeek MTP layer at model.layers.2.*
    (`num_nextn_predict_layers` 1, keys as DeepSeek publishes them): enorm, hnorm, eh_proj over cat(embedding,
    state) passing the embedding through, shared_head.norm and .head (the target's), embed_tokens, and a block
    that is layer 1 before it was zeroed, its outputs at 0.05. The layer thus proposes what the target takes
    next, disturbed by its latent attention, its routed experts and its state half."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

    build_tiny_model(out)  # its tokenizer; the model is replaced
    for f in out.glob("model*.safetensors"):
        f.unlink()
    tokenizer, H, L = AutoTokenizer.from_pretrained(out), 128, 2
    config = DeepseekV3Config(
        vocab_size=384, hidden_size=H, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=L,
        num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1, n_routed_experts=4, n_group=2,
        topk_group=1, num_experts_per_tok=1, first_k_dense_replace=1, routed_scaling_factor=2.5, kv_lora_rank=512,
        q_lora_rank=96, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=1024,
        initializer_range=0.2, tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.2, 2.0)
        router = model.model.layers[1].mlp.gate
        router.weight.normal_(0.0, 0.3)
        router.e_score_correction_bias.normal_(0.0, 0.3)
    model.save_pretrained(out)
    weights = load_file(str(out / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    src, mtp = "model.layers.1.", f"model.layers.{L}."
    layer = {mtp + k[len(src):]: v.clone() for k, v in weights.items() if k.startswith(src)}
    for k in layer:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            layer[k] *= experts if ".experts." in k else block
    eh = torch.randn(H, 2 * H, generator=g) * state / H ** 0.5
    eh[:, :H] = torch.eye(H)  # DeepSeek's order: cat(embedding, state)
    layer.update({mtp + "enorm.weight": torch.ones(H), mtp + "hnorm.weight": torch.rand(H, generator=g) + 0.5,
                  mtp + "eh_proj.weight": eh, mtp + "shared_head.norm.weight": weights["model.norm.weight"].clone(),
                  mtp + "shared_head.head.weight": weights["lm_head.weight"].clone(),
                  mtp + "embed_tokens.weight": weights["model.embed_tokens.weight"].clone()})
    for k in weights:
        if k.startswith("model.layers.") and k.endswith(("o_proj.weight", "down_proj.weight")):
            weights[k] = torch.zeros_like(weights[k])
    save_file({**weights, **layer}, str(out / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((out / "config.json").read_text())
    raw.update(num_nextn_predict_layers=1, topk_method="noaux_tc", scoring_func="sigmoid")  # as DeepSeek-V3's
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    return out


@pytest.fixture(scope="module")
def deepseek_target(tmp_path_factory) -> Path:
    return build_deepseek_target(tmp_path_factory.mktemp("deepseek") / "target")


@pytest.fixture(scope="module")
def mimo_target(tmp_path_factory) -> Path:
    return build_mimo_target(tmp_path_factory.mktemp("mimo") / "target")


def test_a_targets_own_mtp_layer_loads_alone_and_computes_what_was_written(mimo_target, tmp_path):
    """`mtp:DIR` on a whole MiMo checkpoint reads model.mtp_layers.0.* only (not the target's layers) and gives the
    module that was written; the same from a sharded checkpoint (model.safetensors.index.json)."""
    import torch
    from safetensors.torch import load_file, save_file

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model

    target = load_model(str(mimo_target))
    head = load_heads(f"mtp:{mimo_target}", target)
    assert (head.config.mtp_style, head.hidden_layers, head.config.attention_bias) == ("mimo", ("prenorm",), True)
    written = load_file(str(mimo_target.parent / f"{mimo_target.name}-mtp" / "model.safetensors"))
    got = head.module.weights()
    assert set(got) == set(written) and all(torch.equal(got[k], written[k]) for k in written)

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    full = load_file(str(mimo_target / "model.safetensors"))
    keys = sorted(full)
    halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, part in halves.items():
        save_file({k: full[k] for k in part}, str(sharded / name), metadata={"format": "pt"})
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: name for name, part in halves.items() for k in part}}))
    (sharded / "config.json").write_text((mimo_target / "config.json").read_text())
    again = load_heads(f"mtp:{sharded}", target).module.weights()
    assert all(torch.equal(again[k], written[k]) for k in written)


def test_mtp_checkpoints_that_specsim_cannot_run_are_refused_in_one_line(mimo_target, tmp_path):
    """Latent attention outside DeepSeek-V3, DeepSeek-V3.2's sparse attention, another router, quantized weights,
    and a checkpoint without MTP layers: one line each, naming why."""
    import torch
    from safetensors.torch import save_file

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model

    target = load_model(str(mimo_target))
    L = 4
    mla = {f"model.layers.{L}.enorm.weight": torch.ones(64), f"model.layers.{L}.hnorm.weight": torch.ones(64),
           f"model.layers.{L}.eh_proj.weight": torch.zeros(64, 128),
           f"model.layers.{L}.self_attn.q_a_proj.weight": torch.zeros(16, 64),
           f"model.layers.{L}.self_attn.kv_a_proj_with_mqa.weight": torch.zeros(24, 64)}
    deepseek = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": L,
                "num_nextn_predict_layers": 1, "hidden_size": 64}
    cases = [({"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"]}, {},
              "latent attention in a 'deepseek_v2' checkpoint; specsim runs DeepSeek-V3's"),
             ({"index_topk": 2048}, {}, r"DeepSeek-V3\.2's sparse attention \(index_topk\) is not supported"),
             ({"scoring_func": "softmax"}, {}, r"a router with \{'scoring_func': 'softmax'\}"),
             ({"quantization_config": {"quant_method": "awq"}},
              {f"model.layers.{L}.self_attn.q_a_proj.qweight": torch.ones(1, 1)},
              r"quantized \(awq\) in a scheme specsim does not read"),
             ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
              {f"model.layers.{L}.self_attn.q_a_proj.weight_scale_inv": torch.ones(2, 1)},
              r"q_a_proj\.weight_scale_inv: a scale of shape \(2, 1\) does not cover .* \(16, 64\) in 128 x 128")]
    for i, (config, extra, message) in enumerate(cases):
        where = tmp_path / f"deepseek-{i}"
        where.mkdir()
        save_file({**mla, **extra}, str(where / "model.safetensors"))
        (where / "config.json").write_text(json.dumps({**deepseek, **config}))
        with pytest.raises(ModelError, match=message) as err:
            load_heads(f"mtp:{where}", target)
        assert "\n" not in str(err.value)
    plain = tmp_path / "plain"
    build_tiny_model(plain, family="qwen2")
    with pytest.raises(ModelError, match="no num_nextn_predict_layers: not a checkpoint with MTP layers"):
        load_heads(f"mtp:{plain}", target)


def test_a_deepseek_v3_mtp_layer_loads_with_its_latent_attention_and_experts(deepseek_target):
    """`mtp:DIR` on a DeepSeek-V3 checkpoint: the block is DeepSeek's own (transformers' latent attention, the
    layer's experts), shaped by the checkpoint's config, and the module gives back exactly the keys written
    (the per-expert weights that transformers' module stacks)."""
    import torch
    from safetensors.torch import load_file

    from specsim.record.head_checkpoints import load_heads

    from specsim.record.mtp_heads import DeepseekBlock
    from specsim.record.models import load_model

    target = load_model(str(deepseek_target))
    head = load_heads(f"mtp:{deepseek_target}", target)
    c = head.config
    assert (c.mtp_style, c.mtp_index, head.hidden_layers, c.own_lm_head) == ("deepseek", 2, ("last",), True)
    assert isinstance(head.module.layers[0], DeepseekBlock)
    assert (c.block["kv_lora_rank"], c.block["n_routed_experts"], c.block["first_k_dense_replace"]) == (512, 4, 1)
    assert type(head.module.layers[0].mlp).__name__ == "DeepseekV3MoE"  # layer 2 >= first_k_dense_replace
    written = {k: v for k, v in load_file(str(deepseek_target / "model.safetensors")).items()
               if k.startswith("model.layers.2.") and not k.endswith("embed_tokens.weight")}
    got = head.module.weights()
    assert set(got) == set(written) and all(torch.equal(got[k], written[k]) for k in written)
    assert "model.layers.2.mlp.experts.3.up_proj.weight" in got


def test_a_speculators_mtp_head_loads_and_computes_what_speculators_computes(tiny_model_dir, tmp_path):
    """speculators' MTP layout (`MTPDraftModel`: a Qwen3 block with per-head q/k norms, cat(embedding, state), the
    target's embedding and LM head), written by speculators for the tiny target: `mtp:DIR` loads it and its first
    draft's logits equal speculators' own forward at every position (float32). Deeper steps are not compared:
    speculators' training forward runs step k as a causal pass over step k - 1's outputs at every position,
    while a drafting chain (vLLM's, specsim's) attends the target-fed entries and its own. The same check fails
    for MiMo's wiring of the same weights (cat(state, embedding)), so it can tell; vLLM's export refuses the
    layout with the reason."""
    import dataclasses
    import subprocess

    import numpy as np
    import torch

    from specsim.engines.export import mtp_directory
    from specsim.record.head_checkpoints import load_heads
    from specsim.record.head_unroll import unroll
    from specsim.record.mtp_heads import MtpHead
    from specsim.record.models import load_model
    from tests.test_eagle3 import ROOT

    python = vllm_or_skip()
    rng = np.random.default_rng(5)
    S, steps = 24, 3
    hidden, ids = rng.standard_normal((S, 64)).astype(np.float32), rng.integers(0, 300, S)
    np.savez(tmp_path / "inputs.npz", hidden=hidden, ids=ids)
    head_dir = tmp_path / "speculators-mtp"
    subprocess.run([python, str(ROOT / "tests" / "head_writers.py"), "mtp", str(tiny_model_dir), str(head_dir),
                    str(tmp_path / "inputs.npz"), "--ttt-steps", str(steps), "--seed", "2"],
                   check=True, capture_output=True, timeout=600)
    assert json.loads((head_dir / "config.json").read_text())["speculators_model_type"] == "mtp"
    reference = np.load(head_dir / "reference.npz")["logits"][0]  # step 0: (m, V), m = S - steps - 1
    m = reference.shape[0]
    target = load_model(str(tiny_model_dir))
    head = load_heads(f"mtp:{head_dir}", target)
    assert (head.config.mtp_style, head.config.qk_norm, head.hidden_layers) == ("speculators", True, ("prenorm",))

    def first_step(draft) -> np.ndarray:  # entry e: the state at token e, then the token after it, ids[e + 1]
        with torch.no_grad():
            [feats] = unroll(draft.forward, torch.as_tensor(hidden[:m]), torch.as_tensor(ids[1:m + 1]),
                             torch.arange(m), 1)
            return draft.logits(feats).numpy()

    np.testing.assert_allclose(first_step(head), reference, atol=1e-4, rtol=1e-4)
    assert np.abs(reference).max() > 1.0  # logits of some size: the comparison is not of zeros
    mimo = MtpHead(dataclasses.replace(head.config, mtp_style="mimo"))
    mimo.load_state_dict(head.module.state_dict())
    assert np.abs(first_step(dataclasses.replace(head, module=mimo)) - reference).max() > 1e-2
    with pytest.raises(EngineError, match="speculators' MTP layout has no loader in vLLM"):
        mtp_directory(f"mtp:{head_dir}", str(tiny_model_dir))


@pytest.mark.parametrize("style", ["deepseek", "mimo"])
def test_training_unrolled_lowers_heldout_loss_at_every_depth(training_cache, tiny_model_dir, tmp_path, style):
    """`train-draft --kind mtp`: the layer reused at every depth, fed its own states; held-out loss falls and
    the overlap with the target rises at depths 1..3; what it saved loads back as mtp:DIR in its style's keys."""
    from safetensors.torch import load_file

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    target = load_model(str(tiny_model_dir))
    out = tmp_path / style
    outcome = train(training_cache[0], target, out, TrainConfig(kind="mtp", steps=60, lr=1e-2, batch=4,
                                                               holdout_every=4, ttt_steps=3, ttt_decay=0.6,
                                                               mtp_style=style), progress=False)
    assert outcome.after["loss"] < outcome.before["loss"] - 0.1, (outcome.before, outcome.after)
    assert sorted(outcome.after["overlap"]) == [1, 2, 3]
    for d in (1, 2, 3):
        assert outcome.after["overlap"][d] > outcome.before["overlap"][d] + 0.01, (outcome.before, outcome.after)
    head = load_heads(f"mtp:{out}", target)
    assert head.config.mtp_style == style and head.hidden_layers == (("prenorm",) if style == "mimo" else ("last",))
    prefix = "model.mtp_layers.0." if style == "mimo" else "model.layers.4."
    assert all(k.startswith(prefix) for k in load_file(str(out / "model.safetensors")))
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 1


def test_mimo_training_needs_the_state_before_the_final_norm(tiny_model_dir, tiny_cache, tmp_path):
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    with pytest.raises(CacheError, match=r"no hidden states .*--hidden-states last,prenorm"):
        train(tiny_cache, load_model(str(tiny_model_dir)), tmp_path / "h",
              TrainConfig(kind="mtp", steps=1, mtp_style="mimo"), progress=False)


def test_vllm_runs_mtp_only_from_the_targets_own_checkpoint(mimo_target, tmp_path):
    from specsim.engines.export import draft_directory
    from specsim.engines.vllm import speculative_config
    from specsim.specs import parse_tree

    assert draft_directory(f"mtp:{mimo_target}", str(mimo_target)) == str(mimo_target.resolve())
    config = speculative_config(f"mtp:{mimo_target}", parse_tree("chain:3"), "greedy",
                                draft_dir=str(mimo_target)).config
    assert config == {"method": "mtp", "model": str(mimo_target), "num_speculative_tokens": 3}
    with pytest.raises(EngineError, match="inside the target's checkpoint; give mtp:"):
        draft_directory(f"mtp:{tmp_path}", str(mimo_target))
    deepseek = tmp_path / "deepseek-head"
    (deepseek).mkdir()
    (deepseek / "config.json").write_text(json.dumps({"specsim": {"kind": "mtp", "mtp_style": "deepseek"}}))
    with pytest.raises(EngineError, match="deepseek-style on a qwen2 target, which no vLLM model class runs"):
        draft_directory(f"mtp:{deepseek}", str(mimo_target))


def vllm_counts_what_the_replay_counts(target: Path, prompts: Path, tmp_path: Path, *, tokens: int) -> dict:
    """Record `mtp:TARGET` (the target's own MTP layer) at chain:3, T = 0, run vLLM's mtp method on the same
    prompts, and assert that its outputs, spec-decode counters and steps equal the replay's and that the reused
    layer was accepted at depths 1 and 2. Returns vLLM's counters."""
    from specsim.engines.check import EngineReport, EngineValidateConfig, compare, read_cache
    from specsim.engines.vllm import VllmRun, run_vllm, speculative_config
    from specsim.record.run import RecordRequest, record_cache
    from specsim.specs import parse_tree

    python = vllm_or_skip()
    draft, chain = f"mtp:{target}", parse_tree("chain:3")
    cache = tmp_path / "mtp.h5"
    record_cache(cache, RecordRequest(target=str(target), drafts=(draft,), prompts=str(prompts),
                                      max_new_tokens=tokens, device="cpu", store="stats", overhang=8), progress=False)
    data = read_cache(cache)
    config = speculative_config(draft, chain, "greedy", draft_dir=str(target)).config
    assert config == {"method": "mtp", "model": str(target.resolve()), "num_speculative_tokens": 3}
    run = VllmRun(model=str(target), prompts=data.prompts, max_tokens=tokens, configs={"spec": config},
                  max_model_len=max(map(len, data.prompts)) + tokens + 24)
    result = run_vllm(run, python=python)
    report = EngineReport()
    compare(data, draft, chain, "greedy", 0.0, EngineValidateConfig(), result, report)
    checks = {c.kind: c for c in report.checks}
    assert checks["trajectories"].passed, checks["trajectories"].comparison
    assert checks["counters"].passed, checks["counters"].detail
    assert checks["steps"].passed, checks["steps"].detail
    counters = result["runs"]["spec"][0]["counters"]
    assert all(n > 0 for n in counters["num_accepted_tokens_per_pos"][:2]), counters  # a reused layer was accepted
    return counters


@pytest.mark.slow
def test_vllms_mtp_method_counts_what_the_replay_counts(mimo_target, tiny_prompts_file, tmp_path):
    """vLLM's mtp method on the MiMo checkpoint (its mimo_mtp.py: the layer reused at each of 3 steps, the
    embedding masked at position 0, fed the target's state before its final norm) at T = 0: the same outputs,
    the same spec-decode counters per position and the same steps as specsim's replay of its recording."""
    counters = vllm_counts_what_the_replay_counts(mimo_target, tiny_prompts_file, tmp_path, tokens=24)
    assert counters["num_draft_tokens"] == 3 * counters["num_drafts"] and counters["num_drafts"] >= 20


def test_live_decoding_of_a_deepseek_v3_target_and_its_mtp_layer_equals_the_replay(deepseek_target,
                                                                                  tiny_prompts_file, tmp_path):
    """`validate` decodes the DeepSeek-V3 target with its MTP layer live (the slot cache holding latent attention's
    two differently shaped entries, the target's and the layer's) and every greedy call equals the replay's, on a
    chain and on a tree."""
    from click.testing import CliRunner

    from specsim.cli import main
    from specsim.record.run import RecordRequest, record_cache

    draft = f"mtp:{deepseek_target}"
    cache = tmp_path / "deepseek.h5"
    record_cache(cache, RecordRequest(target=str(deepseek_target), drafts=(draft,), prompts=str(tiny_prompts_file),
                                      max_new_tokens=24, device="cpu", store="stats", overhang=8), progress=False)
    out = CliRunner().invoke(main, ["validate", str(cache), "--draft", draft, "--tree", "chain:3", "--tree",
                                    "kary:2,2", "--quiet"])
    assert out.exit_code == 0, out.output
    assert "all 2 checks passed" in out.output and out.output.count("PASS") == 2, out.output


def test_deepseek_v3s_fp8_layer_loads_dequantized_by_its_block_scales(deepseek_target, tmp_path):
    """DeepSeek-V3 publishes its layers in FP8 (float8_e4m3fn) with one `weight_scale_inv` per 128 x 128 block.
    The test layer's projections quantized that way (the rule of DeepGEMM's `per_block_cast_to_fp8` as vLLM 0.32
    ships it in `vllm/utils/deep_gemm.py`: amax / 448 per block; shapes not multiples of 128) load back within
    FP8's rounding of the originals, and the
    layer's logits stay within 5% of the float layer's; scales read as divisors would not load within FP8's
    rounding."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from specsim.record.head_checkpoints import dequantize_fp8, load_heads
    from specsim.record.models import load_model

    fp8 = tmp_path / "fp8"
    shutil.copytree(deepseek_target, fp8)
    weights = load_file(str(fp8 / "model.safetensors"))
    quantized = {}
    for key, w in weights.items():
        if key.startswith("model.layers.2.") and key.endswith("proj.weight") and "eh_proj" not in key:
            m, n = w.shape
            padded = torch.zeros(-(-m // 128) * 128, -(-n // 128) * 128)
            padded[:m, :n] = w
            blocks = padded.view(-1, 128, padded.shape[1] // 128, 128)
            sf = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(1e-4) / 448.0
            quantized[key] = (blocks / sf).to(torch.float8_e4m3fn).view_as(padded)[:m, :n].contiguous()
            quantized[key + "_scale_inv"] = sf.view(blocks.shape[0], blocks.shape[2])
    assert any(v.shape[0] % 128 for k, v in quantized.items() if k.endswith("weight"))  # partial blocks too
    save_file({**weights, **quantized}, str(fp8 / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((fp8 / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    (fp8 / "config.json").write_text(json.dumps(raw))

    target = load_model(str(deepseek_target))
    exact, rounded = load_heads(f"mtp:{deepseek_target}", target), load_heads(f"mtp:{fp8}", target)
    a, b = exact.module.weights(), rounded.module.weights()

    def within_fp8(got: torch.Tensor, key: str) -> bool:  # e4m3: 3 mantissa bits; subnormals step 2^-9 of the scale
        w, sf = a[key], quantized[key + "_scale_inv"]
        step = sf.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]] * 2.0 ** -9
        return bool(torch.all((got - w).abs() <= w.abs() / 16 + step))

    keys = [k for k in quantized if k.endswith("weight")]
    assert all(within_fp8(b[k], k) for k in keys)
    assert max(float((b[k] - a[k]).abs().max()) for k in keys) > 0  # it was rounded
    inverted = {k: (1 / v if k.endswith("_scale_inv") else v) for k, v in {**weights, **quantized}.items()}
    wrong = dequantize_fp8(inverted, raw)  # what reading `scale_inv` as the quantizer's scale to divide by gives
    assert not any(within_fp8(wrong[k], k) for k in keys)

    torch.manual_seed(0)
    feats, ids = torch.randn(1, 12, 128), torch.randint(0, 300, (1, 12))
    positions, mask = torch.arange(12)[None], torch.tril(torch.ones(12, 12, dtype=torch.bool))[None]
    with torch.no_grad():
        logits = [h.module.logits(h.module(feats, ids, positions, mask, embed=target.model.get_input_embeddings())[0],
                                  target.model.get_output_embeddings()) for h in (exact, rounded)]
    assert float((logits[0] - logits[1]).abs().max()) < 0.05 * float(logits[0].abs().max())  # FP8's rounding only


@pytest.mark.slow
def test_vllms_mtp_method_on_deepseek_v3_counts_what_the_replay_counts(deepseek_target, tiny_prompts_file, tmp_path):
    """vLLM's mtp method on the DeepSeek-V3 checkpoint (its deepseek_mtp.py: latent attention, the layer's experts
    routed with their correction bias, the normed output fed back, the layer reused at each of 3 steps) at T = 0:
    the same outputs, spec-decode counters per position and steps as specsim's replay of its recording. Replays
    of wrong wirings of the same checkpoint disagree with vLLM's [28, 10, 1] accepted per position (probe runs,
    analyses/results/mtp-deepseek-cpu-2026-11-26): the block's output fed back before the final norm (specsim's
    DeepSeek wiring until then) [29, 6, 0]; the router without its correction bias [39, 8, 0]; the rotary
    embedding not interleaved [25, 4, 1]."""
    vllm_counts_what_the_replay_counts(deepseek_target, tiny_prompts_file, tmp_path, tokens=40)


def test_train_draft_on_the_command_line(training_cache, tiny_model_dir, tiny_cache, tmp_path):
    """`specsim train-draft --kind mtp --mtp-style mimo`: trains, saves, says what it held out; options of other
    kinds and a cache without the state MiMo reads are refused in one line."""
    from click.testing import CliRunner

    from specsim.cli import main

    base = ["train-draft", "--target", str(tiny_model_dir), "--quiet"]
    out = CliRunner().invoke(main, base + ["--kind", "mtp", "--mtp-style", "mimo", "--from", str(training_cache[0]),
                                           "--steps", "3", "--ttt-steps", "2", "--out", str(tmp_path / "mtp")])
    assert out.exit_code == 0, out.output
    assert "held-out" in out.output and "depth 2" in out.output
    raw = json.loads((tmp_path / "mtp" / "config.json").read_text())
    assert raw["specsim"]["mtp_style"] == "mimo" and raw["training"]["config"]["ttt_decay"] == 0.6
    for args, message in [(["--kind", "medusa", "--ttt-decay", "0.5", "--from", str(training_cache[0])],
                           "--ttt-decay is EAGLE-3's and MTP's"),
                          (["--kind", "mtp", "--mtp-style", "mimo", "--from", str(tiny_cache)],
                           "--hidden-states last,prenorm")]:
        bad = CliRunner().invoke(main, base + args + ["--out", str(tmp_path / "x")])
        assert bad.exit_code != 0 and message in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) <= 2, bad.output  # "loading target ..." then the error


@pytest.mark.slow
def test_a_head_train_draft_wrote_runs_in_vllms_mtp_method(training_cache, tiny_prompts_file, tmp_path, monkeypatch):
    """`train-draft --kind mtp --mtp-style mimo` for a plain Qwen2 target, then `validate --engine vllm`: the
    target is written out with the head as a MiMo checkpoint, vLLM's mtp method runs it (as target and draft),
    and its outputs, counters and steps equal the replay's of the head specsim recorded."""
    from specsim.engines.check import EngineValidateConfig, validate_with_vllm
    from specsim.record.models import load_model
    from specsim.record.run import RecordRequest, record_cache
    from specsim.record.train import TrainConfig, train

    vllm_or_skip()
    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))  # the MiMo checkpoint is written out to the store
    target = tmp_path / "qwen2"
    build_bigram_qwen2(target)
    record_cache(tmp_path / "train.h5", RecordRequest(target=str(target), prompts=str(training_cache[1]),
                                                     max_new_tokens=24, temperatures=(0.0, 1.0), device="cpu",
                                                     hidden=("last", "prenorm")), progress=False)
    outcome = train(tmp_path / "train.h5", load_model(str(target)), tmp_path / "head",
                    TrainConfig(kind="mtp", mtp_style="mimo", steps=60, lr=1e-2, batch=4, holdout_every=4,
                                ttt_steps=3, ttt_decay=0.6), progress=False)
    assert outcome.after["top1"][1] > 0.2, outcome.after  # a bigram target: the layer learns it
    draft = f"mtp:{tmp_path / 'head'}"
    cache = tmp_path / "eval.h5"
    record_cache(cache, RecordRequest(target=str(target), drafts=(draft,), prompts=str(tiny_prompts_file),
                                      max_new_tokens=24, device="cpu", store="stats", overhang=8), progress=False)
    report = validate_with_vllm(cache, EngineValidateConfig(trees=("chain:3",), drafts=(draft,)))
    assert [p.name.split("-")[-2] for p in (tmp_path / "home" / "models" / "exported").iterdir()] == ["mimo"]
    checks = {c.kind: c for c in report.checks}
    assert checks["trajectories"].passed, checks["trajectories"].comparison
    assert checks["counters"].passed and checks["steps"].passed, (checks["counters"].detail, checks["steps"].detail)
    assert "accepted [0, 0, 0]" not in checks["counters"].detail, checks["counters"].detail


def test_the_routers_correction_bias_moves_toward_balance_as_deepseek_v3_trains_it(deepseek_target):
    """RouterBalance, DeepSeek-V3's auxiliary-loss-free balancing: after a training step each expert's bias moves
    by γ against its load, b_i <- b_i + γ sign(mean load - load_i), on the loads of the tokens routed in training
    mode only; γ = 0 leaves it. The expected bias is computed here from the router's own choices, so a reversed
    sign, a step without the reset or counting the held-out evaluation fails."""
    import torch

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model
    from specsim.record.train import RouterBalance

    head = load_heads(f"mtp:{deepseek_target}", load_model(str(deepseek_target))).module
    router = head.layers[0].mlp.gate
    experts, bias = router.e_score_correction_bias.numel(), router.e_score_correction_bias
    balance = RouterBalance(head, 0.01)
    assert balance.routers == [router]
    torch.manual_seed(0)
    start = bias.clone()
    head.train()
    loads = torch.zeros(experts)
    for n in (7, 5):
        loads += torch.bincount(router(torch.randn(n, router.weight.shape[1]))[2].reshape(-1), minlength=experts)
    assert len(set(loads.tolist())) > 1  # unbalanced: the check can see the sign
    balance.step()
    torch.testing.assert_close(bias, start + 0.01 * torch.sign(loads.mean() - loads))
    head.eval()  # the held-out evaluation routes tokens too, and must not move the bias
    router(torch.randn(9, router.weight.shape[1]))
    moved = bias.clone()
    balance.step()
    assert torch.equal(bias, moved)
    head.train()
    still = RouterBalance(head, 0.0)
    router(torch.randn(9, router.weight.shape[1]))
    still.step()
    assert torch.equal(bias, moved)
    balance.close()
    still.close()


def test_a_head_train_draft_wrote_for_deepseek_v3_is_written_out_as_the_targets_mtp_layer(
        deepseek_target, tiny_prompts_file, tmp_path, monkeypatch):
    """`train-draft --kind mtp` on a DeepSeek-V3 target builds the target's kind of block (latent attention, the
    experts) and learns; `validate --engine vllm` writes the target out with the trained layer as its
    model.layers.2.* (the target's LM head as its shared_head.head, DeepSeek-V3's router named in config.json),
    which is the layout vLLM's mtp method runs in
    `test_vllms_mtp_method_on_deepseek_v3_counts_what_the_replay_counts`: specsim reads the written-out
    checkpoint back as that native layer, weight for weight. (A probe run of vLLM on such a written-out
    checkpoint: analyses/results/mtp-deepseek-cpu-2026-11-26, counters equal to the replay's.)"""
    import torch
    from safetensors.torch import load_file

    from specsim.engines.export import draft_directory
    from specsim.record.head_checkpoints import load_heads
    from specsim.record.mtp_heads import DeepseekBlock
    from specsim.record.models import load_model
    from specsim.record.run import RecordRequest, record_cache
    from specsim.record.train import TrainConfig, train

    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))
    target = load_model(str(deepseek_target))
    record_cache(tmp_path / "train.h5", RecordRequest(target=str(deepseek_target), prompts=str(tiny_prompts_file),
                                                     max_new_tokens=24, device="cpu", hidden=("last",)), progress=False)
    outcome = train(tmp_path / "train.h5", target, tmp_path / "head",
                    TrainConfig(kind="mtp", steps=20, lr=1e-2, batch=2, holdout_every=4, ttt_steps=2), progress=False)
    assert outcome.after["loss"] < outcome.before["loss"] - 1.0, (outcome.before, outcome.after)
    head = load_heads(f"mtp:{tmp_path / 'head'}", target)
    assert isinstance(head.module.layers[0], DeepseekBlock)
    steps = head.module.layers[0].mlp.gate.e_score_correction_bias / 0.001  # moved by ±γ per step (RouterBalance)
    assert steps.abs().max() > 0 and steps.abs().max() <= 20 + 1e-3, steps
    assert torch.allclose(steps, steps.round(), atol=1e-3), steps
    out = Path(draft_directory(f"mtp:{tmp_path / 'head'}", str(deepseek_target)))
    assert out.parent == tmp_path / "home" / "models" / "exported" and out.name.split("-")[-2] == "deepseek"
    raw = json.loads((out / "config.json").read_text())
    assert (raw["model_type"], raw["num_nextn_predict_layers"], raw["topk_method"], raw["scoring_func"]) == (
        "deepseek_v3", 1, "noaux_tc", "sigmoid")
    written = load_file(str(out / "model.safetensors"))
    assert torch.equal(written["model.layers.2.shared_head.head.weight"], written["lm_head.weight"])
    native = load_heads(f"mtp:{out}", target)
    assert native.config.own_lm_head and native.config.block == head.config.block
    trained = head.module.weights()
    got = native.module.weights()
    assert all(torch.equal(got[k], trained[k]) for k in trained)
    assert draft_directory(f"mtp:{tmp_path / 'head'}", str(deepseek_target)) == str(out)  # written once

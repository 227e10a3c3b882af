"""Head drafts with real models: published layouts load, record, replay and decode live; training learns.

A tiny random Llama (`tests.conftest.build_tiny_model`) is the target. Medusa and EAGLE heads
are written in their published layouts (Medusa: `medusa_lm_head.safetensors` with its
`{k}.{j}.linear.*` / `{k}.{L}.weight` keys and `medusa_num_heads` in config.json; EAGLE-1/2:
`model.safetensors` with `fc.weight` and `layers.0.*`, no first input norm, a Llama
config.json), then loaded, recorded and decoded live, where greedy float32 decoding must emit
plain greedy's tokens in exactly the target calls the replay predicts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specsim.errors import CacheError, ModelError

EAGLE3_LAYERS = (1, 2, 3)  # the tiny target has 4 layers: the inputs of layers 1, 2 and 3


def _medusa_published(folder, target, heads=3, seed=0):
    """Medusa-1's layout: each head a ResBlock and its own LM head, initialised from the target's (as Medusa)."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    H = target.model.config.hidden_size
    lm = target.model.get_output_embeddings().weight.detach()
    state = {}
    for k in range(heads):
        state[f"{k}.0.linear.weight"] = torch.randn(H, H) * 0.01  # near Medusa's identity init: "repeat"
        state[f"{k}.0.linear.bias"] = torch.zeros(H)
        state[f"{k}.1.weight"] = lm.clone()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "medusa_lm_head.safetensors"))
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": 1,
                                                    "base_model_name_or_path": "tiny"}))
    return folder


def _eagle_published(folder, target, seed=0):
    """EAGLE-1/2's layout: fc over [embedding, feature] and one Llama layer without its input norm."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    c = target.model.config
    H, d = c.hidden_size, c.hidden_size // c.num_attention_heads
    fc = torch.randn(H, 2 * H) * 0.01
    fc[:, H:] += torch.eye(H)  # pass the feature through, as a barely trained layer does: it proposes repeats
    state = {"fc.weight": fc,
             "layers.0.self_attn.q_proj.weight": torch.randn(c.num_attention_heads * d, H) * 0.1,
             "layers.0.self_attn.k_proj.weight": torch.randn(c.num_key_value_heads * d, H) * 0.1,
             "layers.0.self_attn.v_proj.weight": torch.randn(c.num_key_value_heads * d, H) * 0.1,
             "layers.0.self_attn.o_proj.weight": torch.randn(H, c.num_attention_heads * d) * 0.01,
             "layers.0.mlp.gate_proj.weight": torch.randn(c.intermediate_size, H) * 0.1,
             "layers.0.mlp.up_proj.weight": torch.randn(c.intermediate_size, H) * 0.1,
             "layers.0.mlp.down_proj.weight": torch.randn(H, c.intermediate_size) * 0.01,
             "layers.0.post_attention_layernorm.weight": torch.ones(H)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "rope_theta": 10000.0,
        "vocab_size": c.vocab_size}))
    return folder


def eagle3_from_last_layer(target, folder: Path, *, draft_vocab: int = 0, seed: int = 0, mix: float = 0.05) -> Path:
    """An EAGLE-3 head built from the tiny target's last layer: fc passes the fused state of layer 3's input through,
    the head's layer is the target's layer 3 (its q/k/v reading that state; the embedding half small random weights
    of scale `mix`), its norm and LM head the target's. Its depth-1 law is the target's law at the root's
    predecessor, so it proposes the root token again, as a barely trained EAGLE layer does: the target accepts it
    where it repeats itself. (The draft vocabulary, when given, is a random subset.)"""
    import torch

    from specsim.record.head_checkpoints import build, head_config_for, save_heads

    torch.manual_seed(seed)
    config = head_config_for("eagle3", target, aux_layers=EAGLE3_LAYERS, draft_vocab_size=draft_vocab)
    module = build(config)
    H = config.hidden_size
    last = target.model.model.layers[EAGLE3_LAYERS[-1]]
    with torch.no_grad():
        module.fc.weight.zero_()
        module.fc.weight[:, 2 * H:] = torch.eye(H)
        first = module.layers[0]
        first.hidden_norm.weight.copy_(last.input_layernorm.weight)
        for name in ("q_proj", "k_proj", "v_proj"):
            weight = getattr(first.self_attn, name).weight
            weight[:, :H].normal_(0.0, mix)
            weight[:, H:] = getattr(last.self_attn, name).weight
        first.self_attn.o_proj.weight.copy_(last.self_attn.o_proj.weight)
        first.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(first.mlp, name).weight.copy_(getattr(last.mlp, name).weight)
        module.norm.weight.copy_(target.model.model.norm.weight)
        lm = target.model.get_output_embeddings().weight
        ids = torch.arange(config.vocab_size) if not draft_vocab else torch.sort(
            torch.randperm(config.vocab_size)[:draft_vocab]).values
        module.lm_head.weight.copy_(lm[ids])
        if draft_vocab:
            module.d2t.copy_(ids - torch.arange(draft_vocab))
    save_heads(folder, config, module)
    return folder


def mtp_from_last_layer(target, folder: Path, style: str, *, seed: int = 0, mix: float = 0.05) -> Path:
    """An MTP module in `style`'s wiring built from the tiny target: eh_proj passes the normed state through (the
    embedding half small random weights of scale `mix`), the block is the target's last layer with its output
    projections scaled down, the state normed as the target's LM head reads it: its law is near the target's at
    the root's predecessor, so it proposes the root again and the target accepts it where it repeats itself."""
    import torch

    from specsim.record.head_checkpoints import build, head_config_for, save_heads

    torch.manual_seed(seed)
    config = head_config_for("mtp", target, mtp_style=style)
    module = build(config)
    H = config.hidden_size
    last = target.model.model.layers[-1]
    state_half = slice(H, 2 * H) if style == "deepseek" else slice(0, H)
    embed_half = slice(0, H) if style == "deepseek" else slice(H, 2 * H)
    with torch.no_grad():
        module.eh_proj.weight[:, state_half] = torch.eye(H)
        module.eh_proj.weight[:, embed_half].normal_(0.0, mix)
        if style == "mimo":  # it reads the state before the target's final norm: apply that norm's weights
            module.hnorm.weight.copy_(target.model.model.norm.weight)
        block = module.layers[0]
        block.load_state_dict(last.state_dict(), strict=False)
        block.self_attn.o_proj.weight.mul_(0.2)  # a light touch on the passed-through state
        block.mlp.down_proj.weight.mul_(0.2)
    save_heads(folder, config, module)
    return folder


@pytest.fixture(scope="module")
def heads_cache(tiny_prompts_file, tmp_path_factory):
    """The tiny target with a final norm whose weights are not all 1 (MiMo's MTP reads the state before it), six
    heads: Medusa, EAGLE, EAGLE-3 (whole and reduced vocabulary), MTP in DeepSeek's and MiMo's wiring."""
    import torch

    from specsim.record.models import load_model
    from specsim.record.run import RecordRequest, record_cache
    from tests.conftest import build_tiny_model

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("heads")
    tiny_model_dir = build_tiny_model(folder / "target", final_norm=True)
    target = load_model(str(tiny_model_dir))
    medusa = _medusa_published(folder / "medusa", target)
    eagle = _eagle_published(folder / "eagle", target)
    drafts = (f"medusa:{medusa}", f"eagle:{eagle}", f"eagle3:{eagle3_from_last_layer(target, folder / 'eagle3')}",
              f"eagle3:{eagle3_from_last_layer(target, folder / 'eagle3-v300', draft_vocab=300, seed=1)}",
              f"mtp:{mtp_from_last_layer(target, folder / 'mtp-deepseek', 'deepseek')}",
              f"mtp:{mtp_from_last_layer(target, folder / 'mtp-mimo', 'mimo', seed=1)}")
    request = RecordRequest(target=str(tiny_model_dir), drafts=drafts, prompts=str(tiny_prompts_file),
                            max_new_tokens=12, temperatures=(0.0, 1.0), device="cpu", hidden=("last",),
                            head_depth=3)
    path = folder / "heads.h5"
    record_cache(path, request, progress=False)
    return path, drafts, str(tiny_model_dir)


def test_head_columns_are_keyed_by_depth(heads_cache):
    from specsim.cache.reader import CacheReader

    path, drafts, _ = heads_cache
    with CacheReader(path) as reader:
        assert reader.spec.depths == {d: 3 for d in drafts}
        row = next(reader.iter_trajectories())
        assert reader.stats(drafts[0], "rank", row.start, row.stop).shape == (row.length, 3)
        assert reader.hidden("last", row.start, row.stop).shape == (row.length, 64)
        with pytest.raises(CacheError, match="head draft"):
            reader.logits(drafts[1], row.start, row.stop)


@pytest.mark.parametrize("which, tree", [(0, "kary:2,3"), (1, "chain:3"), (1, "kary:2,2"), (2, "chain:3"),
                                         (2, "kary:2,2"), (3, "widths:3,2,1"), (4, "chain:3"), (4, "kary:2,2"),
                                         (5, "chain:3"), (5, "widths:3,2,1")])
def test_live_head_decoding_matches_the_replay_call_for_call(heads_cache, which, tree):
    """Greedy float32: live decoding with the heads emits plain greedy's tokens, in the calls replay predicts."""
    from specsim.cache.reader import CacheReader
    from specsim.live.decoder import LiveConfig, Target, speculative_decode
    from specsim.live.head_drafting import head_drafter
    from specsim.record.models import eos_token_ids, load_model
    from specsim.sim.sweep import SweepConfig, sweep
    from specsim.specs import parse_tree

    path, drafts, target_dir = heads_cache
    draft = drafts[which]
    replay = sweep(path, SweepConfig(trees=[tree], drafts=[draft], policies=["greedy"], n_boot=0, by_category=False)).requests.sort("prompt_index")
    with CacheReader(path) as reader:
        rows = [r for r in reader.iter_trajectories() if r.temperature == 0]
        max_new = int(reader.meta["settings"]["max_new_tokens"])
        cases = [(reader.prompt_token_ids(r.prompt_index), reader.tokens(r.start, r.stop)) for r in rows]
    target = load_model(target_dir)
    drafter = head_drafter(draft, target)
    accepted = 0
    for (prompt, expected), row in zip(cases, replay.iter_rows(named=True)):
        live = speculative_decode(Target(target.model, eos_token_ids(target)), drafter, np.asarray(prompt),
                                  LiveConfig(tree=parse_tree(tree), max_new_tokens=max_new), np.random.default_rng(0))
        assert live.tokens.tolist() == expected.tolist()
        assert live.target_calls == row["target_calls"], (draft, tree)
        accepted += sum(s.accepted for s in live.steps)
    assert accepted > 0  # the comparison means something: drafts were accepted


@pytest.mark.parametrize("which", [0, 1, 3, 5])
def test_head_sampling_is_priced_as_live_runs_it(heads_cache, which):
    """Medusa and EAGLE heads at T = 1 on kary:2,2: along live's own sampled path, the replay charges the
    forwards live ran (EAGLE's feed of the root and every accepted draft included)."""
    from specsim.specs import parse_tree
    from tests.test_structure import decode_live, features_of, live_counts, per_request_steps, replayed_along

    path, drafts, _ = heads_cache
    draft, tree = drafts[which], parse_tree("kary:2,2")
    run = decode_live(path, draft, "kary:2,2", policy="sample", temperature=1.0)
    features = features_of(path, draft, 1.0)
    for trajectory, steps, replay in zip(run.trajectories, per_request_steps(run),
                                         replayed_along(run, features, tree, draft)):
        assert replay == pytest.approx(live_counts(steps)), f"prompt {trajectory.prompt.prompt_index}"
    assert sum(s.accepted for t in run.trajectories for s in t.live.steps) > 0


def test_medusa_sampling_laws_are_keyed_by_the_calls_start(heads_cache):
    """At T = 1 the replay's acceptance at (position n, depth d) is min(1, q(y_n) / p(y_n)) with q Medusa's head d
    read from the target's hidden state before the call's root (the call starting at n - d + 1), as live drafts;
    computed here from the models, not the cache. (An acceptance-rate comparison with live decodes is too
    noisy on 4 cached trajectories: over 6 recording seeds the replayed chain:1 rate ranged 0.17-0.30 around
    live's 0.29.)"""
    import torch

    from specsim.cache.reader import CacheReader
    from specsim.live.head_drafting import head_drafter
    from specsim.record.models import load_model
    from tests.test_structure import features_of

    path, drafts, target_dir = heads_cache
    features = features_of(path, drafts[0], 1.0)
    beta = features.acceptance()  # (N, D)
    target = load_model(target_dir)
    head = head_drafter(drafts[0], target).head
    checked = 0
    with CacheReader(path) as reader:
        for i in range(features.n_traj):
            prompt = reader.prompt_token_ids(int(features.traj_prompt[i]))
            start, L = int(features.cache_start[i]), int(features.traj_len[i])
            tokens = reader.tokens(start, start + L)
            with torch.inference_mode():
                out = target.model(input_ids=torch.as_tensor(np.concatenate([prompt, tokens]))[None],
                                   output_hidden_states=True)
                p = torch.softmax(out.logits[0].float(), -1)  # p[P - 1 + n] is the law of output n
                q = torch.softmax(head.module(out.hidden_states[-1][0], head.lm_head).float(), -1)  # (S, K, V)
            P = len(prompt)
            for n in range(L):
                for d in range(1, beta.shape[1] + 1):
                    t = n - d + 1  # the call's start; its root is token P - 1 + t, read from the state before it
                    if t < 0:
                        continue
                    y = int(tokens[n])
                    want = min(1.0, float(q[P - 2 + t, d - 1, y] / p[P - 1 + n, y]))
                    assert beta[int(features.traj_start[i]) + n, d - 1] == pytest.approx(want, rel=1e-4, abs=1e-6)
                    checked += 1
    assert checked > 100


class _RunsCode:
    """A pickle that runs code when loaded (writes a file): what torch.load(weights_only=True) must refuse."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_tensor_pickles_load_code_pickles_and_heads_for_another_target_are_refused(heads_cache, tmp_path):
    import torch
    from safetensors.torch import load_file

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model

    _, _, target_dir = heads_cache
    target = load_model(target_dir)
    published = _medusa_published(tmp_path / "safetensors", target)
    as_bin = tmp_path / "bin"
    as_bin.mkdir()
    (as_bin / "config.json").write_text((published / "config.json").read_text())
    torch.save(load_file(str(published / "medusa_lm_head.safetensors")), as_bin / "pytorch_model.bin")
    state = torch.randn(3, target.model.config.hidden_size)
    a, b = load_heads(f"medusa:{published}", target), load_heads(f"medusa:{as_bin}", target)
    assert torch.equal(a.module(state, a.lm_head), b.module(state, b.lm_head))
    marker = tmp_path / "code-ran"
    torch.save({"0.0.linear.weight": _RunsCode(marker)}, as_bin / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"weights_only=True\) refused it .*runs no pickled code"):
        load_heads(f"medusa:{as_bin}", target)
    assert not marker.exists()
    (as_bin / "pytorch_model.bin").unlink()
    (as_bin / "model.pt").write_bytes(b"not really")
    with pytest.raises(ModelError, match="specsim reads model.safetensors.*convert it once"):
        load_heads(f"medusa:{as_bin}", target)
    other = _eagle_published(tmp_path / "other", target)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "hidden_size": 128}))
    with pytest.raises(ModelError, match="hidden size 128; target .* has 64"):
        load_heads(f"eagle:{other}", target)


def test_training_lowers_heldout_loss_and_raises_acceptance(training_cache, tiny_model_dir, tmp_path):
    training_cache = training_cache[0]
    import torch

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    target = load_model(str(tiny_model_dir))
    torch.manual_seed(0)
    out = tmp_path / "trained"
    outcome = train(training_cache, target, out, TrainConfig(kind="medusa", heads=2, steps=80, lr=1e-2, batch=4,
                                                             holdout_every=4), progress=False)
    assert outcome.heldout_positions > 200
    assert outcome.after["loss"] < outcome.before["loss"] - 0.1, (outcome.before, outcome.after)
    for d in (1, 2):  # held-out acceptance of a one-token draft at T = 1 rises at every depth
        assert outcome.after["overlap"][d] > outcome.before["overlap"][d] + 0.01, (outcome.before, outcome.after)
    head = load_heads(f"medusa:{out}", target)  # what it saved loads back for this target
    assert head.config.heads == 2 and not head.config.own_lm_head
    train(training_cache, target, tmp_path / "eagle", TrainConfig(kind="eagle", steps=3, batch=2, holdout_every=4),
          progress=False)
    assert load_heads(f"eagle:{tmp_path / 'eagle'}", target).kind == "eagle"


def test_weight_decay_reaches_the_optimiser(training_cache, tiny_model_dir, tmp_path):
    """AdamW's decoupled decay multiplies every weight by 1 - lr x decay per step: at decay 1/lr one step leaves
    only Adam's own update (at most about lr per weight) of an EAGLE head's matrices, initialised at std 0.02; at
    decay 0 they keep their initial size."""
    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    target = load_model(str(tiny_model_dir))
    largest = {}
    for decay in (0.0, 1e3):
        out = tmp_path / f"decay{decay:g}"
        train(training_cache[0], target, out, TrainConfig(kind="eagle", steps=1, lr=1e-3, weight_decay=decay,
                                                          lr_schedule="constant", batch=2, holdout_every=4),
              progress=False)
        module = load_heads(f"eagle:{out}", target).module
        largest[decay] = max(float(p.detach().abs().max()) for p in module.parameters() if p.dim() >= 2)
        assert json.loads((out / "config.json").read_text())["training"]["config"]["weight_decay"] == decay
    assert largest[1e3] < 1.5e-3 < 0.02 < largest[0.0], largest


def test_an_interrupted_training_saves_the_head_with_its_own_heldout_numbers(training_cache, tiny_model_dir, tmp_path,
                                                                           monkeypatch):
    """Stopped at step 7 (checkpoints every 5): the saved head is step 7's, and the held-out numbers its config
    reports (which `report` and `inspect` quote) are step 7's on the curve's probe, not the untrained head's."""
    import json

    from specsim.cache.provenance import training_summary
    from specsim.record import train as training
    from specsim.record.models import load_model

    calls = []
    real = training.terms

    def stop_at_step_8(*args, full=True, **kwargs):
        if not full:  # a training step's (evaluation runs full=True)
            calls.append(1)
            if len(calls) == 7 * 4 + 1:  # batch 4: the first sequence of step 8
                raise KeyboardInterrupt
        return real(*args, full=full, **kwargs)

    monkeypatch.setattr(training, "terms", stop_at_step_8)
    out = tmp_path / "stopped"
    outcome = training.train(training_cache[0], load_model(str(tiny_model_dir)), out,
                             training.TrainConfig(kind="medusa", heads=2, steps=20, lr=1e-2, batch=4, holdout_every=4,
                                                  save_every=5), progress=False)
    assert outcome.interrupted and outcome.steps == 7 and outcome.after == {}
    record = json.loads((out / "config.json").read_text())["training"]
    assert record["steps"] == 7 and [c["step"] for c in record["curve"]] == [5, 7]
    assert record["heldout"] == record["curve"][-1]["heldout"] != outcome.before
    assert 0 < record["heldout_trajectories"] <= training.CURVE_HELDOUT  # the probe, not every held-out trajectory
    said = training_summary({"path": str(out)})
    assert "7 steps" in said and "trajectories)" in said
    assert "prompt" not in said  # Medusa attends to nothing: what the prompt was to it is moot


def _interrupted_at(step: int, batch_loss):
    """`batch_loss` that raises KeyboardInterrupt (a Ctrl-C) as training step `step` starts computing its loss."""
    calls = []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            raise KeyboardInterrupt
        return batch_loss(*args, **kwargs)

    return stopping


def test_a_resumed_training_ends_with_the_weights_of_an_uninterrupted_one(training_cache, tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    """Stopped at step 5 of 8 (checkpoints every 3) and resumed, a run ends with exactly the weights the same run
    reaches uninterrupted: the optimiser's moments, the schedule, the batch order and the held-out numbers before
    training all continue; the finished run removes its state. Each held-out evaluation is reported as it is made
    (a curve point after its checkpoint is on disk, before the next step; the interrupted step's too), and a
    resumed run reports the earlier ones first. Resuming with another setting, or where no run was interrupted, is
    refused in one line."""
    from dataclasses import replace

    import torch
    from safetensors.torch import load_file

    from specsim.record import train as training
    from specsim.record.models import load_model

    target = load_model(str(tiny_model_dir))
    config = training.TrainConfig(kind="eagle", steps=8, lr=3e-3, batch=2, holdout_every=4, save_every=3)
    straight = training.train(training_cache[0], target, tmp_path / "straight", config, progress=False)
    real = training.batch_loss
    monkeypatch.setattr(training, "batch_loss", _interrupted_at(6, real))
    out = tmp_path / "resumed"
    seen = []

    def report(what, result):  # what the run has done when it reports: the steps in its saved state
        saved = torch.load(out / training.STATE_FILE, weights_only=False)["step"] if what == "step" else None
        seen.append((what, result.get("step"), saved, result.get("positions")))

    stopped = training.train(training_cache[0], target, out, config, progress=False, report=report)
    assert stopped.interrupted and stopped.steps == 5 and (out / training.STATE_FILE).exists()
    assert seen == [("before", None, None, stopped.heldout_positions), ("step", 3, 3, None), ("step", 5, 5, None)]
    monkeypatch.setattr(training, "batch_loss", real)
    with pytest.raises(ModelError, match="setting lr differs: the run in .* had 0.003, now 0.001"):
        training.train(training_cache[0], target, out, replace(config, lr=1e-3), progress=False, resume=True)
    seen.clear()
    resumed = training.train(training_cache[0], target, out, config, progress=False, resume=True,
                             report=lambda what, result: seen.append((what, result.get("step"))))
    assert seen == [("before", None), ("step", 3), ("step", 5), ("step", 6)]
    assert resumed.steps == 8 and not resumed.interrupted and resumed.before == straight.before
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.after == straight.after and not (out / training.STATE_FILE).exists()
    with pytest.raises(ModelError, match="holds no interrupted run"):
        training.train(training_cache[0], target, out, config, progress=False, resume=True)


def test_train_draft_resume_is_refused_in_one_line_before_the_target_loads(training_cache, tiny_model_dir, tmp_path):
    """--resume where no run was interrupted, or with --overwrite, is refused in one line before the target loads."""
    from click.testing import CliRunner

    from specsim.cli import main

    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "config.json").write_text("{}")
    args = ["train-draft", "--kind", "eagle", "--target", str(tiny_model_dir), "--from", str(training_cache[0])]
    for extra, said in ((["--out", str(tmp_path / "done"), "--resume"], "holds no interrupted run"),
                        (["--out", str(tmp_path / "done"), "--resume", "--overwrite"], "exclude each other"),
                        (["--out", str(tmp_path / "done")], "or --resume to continue the run interrupted there")):
        result = CliRunner().invoke(main, args + extra)
        assert result.exit_code == 1 and said in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "loading target" not in result.output


def test_a_resumed_time_limited_schedule_runs_the_rest_of_its_cosine():
    """A time-limited run resumed at half its schedule starts at the cosine's half-way rate and ends at zero."""
    from specsim.record.train import TimedSchedule, TrainConfig

    now = [0.0]
    timed = TimedSchedule(TrainConfig(kind="eagle3", time_limit=60), 0.0, 10.0, lambda: now[0], reached=0.5)
    fresh = TimedSchedule(TrainConfig(kind="eagle3", time_limit=60), 0.0, 10.0, lambda: 5.0)
    assert timed.factor() == pytest.approx(fresh.factor()) and 0.4 < timed.factor() < 0.6
    now[0] = 10.0
    assert timed.reached() == 1.0 and timed.factor() == pytest.approx(0.0)


def test_a_time_limited_run_resumed_runs_the_rest_of_its_schedule_in_the_new_limit(training_cache, tiny_model_dir,
                                                                                   tmp_path, monkeypatch):
    """On a clock that moves 1 s whenever it is read, a 60 s run stopped at step 10 and resumed with 60 s more goes
    on where its schedule was, its rate falling from below the stopped run's last rate to near zero, and finishes."""
    import itertools

    from specsim.record import train as training
    from specsim.record.models import load_model

    target = load_model(str(tiny_model_dir))
    config = training.TrainConfig(kind="eagle", steps=1000, lr=1e-2, batch=2, holdout_every=4, save_every=2,
                                  time_limit=60.0)
    real = training.batch_loss
    ticks = itertools.count()
    monkeypatch.setattr(training, "_clock", lambda: float(next(ticks)))
    monkeypatch.setattr(training, "batch_loss", _interrupted_at(11, real))
    stopped = training.train(training_cache[0], target, tmp_path / "h", config, progress=False)
    assert stopped.interrupted and stopped.steps == 10
    ticks = itertools.count()
    monkeypatch.setattr(training, "_clock", lambda: float(next(ticks)))
    monkeypatch.setattr(training, "batch_loss", real)
    said = []
    resumed = training.train(training_cache[0], target, tmp_path / "h", config, progress=False, resume=True,
                             echo=said.append)
    assert any("resuming the run in" in line and "at step 10" in line for line in said)
    assert not resumed.interrupted and resumed.after and resumed.steps > 10
    before, after = [c["lr"] for c in resumed.curve if c["step"] <= 10], [c["lr"] for c in resumed.curve if c["step"] > 10]
    assert after[0] < before[-1] and all(a > b for a, b in zip(after, after[1:])) and after[-1] < 0.15 * config.lr
    assert not (tmp_path / "h" / training.STATE_FILE).exists()


def test_a_time_limit_fits_the_schedule_to_the_time_and_keeps_the_final_evaluation(training_cache, tiny_model_dir,
                                                                                   tmp_path, monkeypatch):
    """--time-limit: on a clock that moves 1 s whenever it is read (twice a step), a 60 s run keeps 1.25x the untrained
    head's evaluation and 2 s to save, trains until the rest is spent (far fewer steps than the cap), its rate falls
    along the cosine to near zero by then, and it ends with the full held-out evaluation, not interrupted."""
    import itertools
    import json

    from specsim.record import train as training
    from specsim.record.models import load_model

    ticks = itertools.count()
    monkeypatch.setattr(training, "_clock", lambda: float(next(ticks)))
    config = training.TrainConfig(kind="eagle", steps=1000, lr=1e-2, batch=2, holdout_every=4, save_every=4,
                                  time_limit=60.0)
    said = []
    outcome = training.train(training_cache[0], load_model(str(tiny_model_dir)), tmp_path / "h", config,
                             progress=False, echo=said.append)
    # read at: start 0, around the first evaluation 1 and 2, the schedule's first rate 3; then twice a step; the end
    # is 60 - 1.25 * 1 - 2 = 56.75, so the step whose check reads 57 is the last
    assert outcome.steps == 27 and not outcome.interrupted and outcome.after
    assert "time limit 60 s: training until 57 s" in said[-1]
    rates = [c["lr"] for c in outcome.curve]
    assert len(rates) == 6 and all(a > b for a, b in zip(rates, rates[1:])) and rates[-1] < 0.15 * config.lr
    record = json.loads((tmp_path / "h" / "config.json").read_text())["training"]
    assert record["steps"] == 27 and record["config"]["time_limit"] == 60.0 and record["heldout"]["loss"] == outcome.after["loss"]
    schedule = training.TimedSchedule(config, 0.0, 100.0, lambda: 0.0)
    assert schedule.factor() == training.WARMUP_FLOOR  # the first step, before any is timed
    assert [round(training.TimedSchedule(config, 0.0, 100.0, lambda t=t: t).factor(), 3) for t in (50.0, 100.0)] \
        == [round(0.5 * (1 + np.cos(np.pi * (0.5 - 0.015) / 0.985)), 3), 0.0]


def test_a_time_limit_too_short_to_train_is_refused_in_one_line(training_cache, tiny_model_dir, tmp_path):
    from click.testing import CliRunner

    from specsim.cli import main

    result = CliRunner().invoke(main, ["train-draft", "--kind", "eagle", "--target", str(tiny_model_dir), "--from",
                                       str(training_cache[0]), "--holdout-every", "4", "--time-limit", "0.01",
                                       "--out", str(tmp_path / "h"), "--quiet"])
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: --time-limit 0.01 s: loading and evaluating took") and "nothing is left" in line
    assert not (tmp_path / "h" / "config.json").exists()


def test_an_interrupt_in_the_final_evaluation_keeps_every_step(training_cache, tiny_model_dir, tmp_path,
                                                               monkeypatch):
    """A stop (a deadline's SIGTERM) while the trained head is measured on every held-out trajectory, after the last
    step: the head of the last step is on disk, and the run says it was interrupted."""
    import json

    from specsim.record import train as training
    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model

    real, calls = training.evaluate, []

    def stop_in_the_last(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # before training, then after it
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", stop_in_the_last)
    target, out = load_model(str(tiny_model_dir)), tmp_path / "head"
    outcome = training.train(training_cache[0], target, out,
                             training.TrainConfig(kind="eagle", steps=6, lr=1e-2, batch=2, holdout_every=4,
                                                  save_every=100), progress=False)
    assert outcome.interrupted and outcome.steps == 6 and outcome.after == {}
    assert json.loads((out / "config.json").read_text())["training"]["steps"] == 6
    assert load_heads(f"eagle:{out}", target).kind == "eagle"


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "mtp"])
def test_training_computes_the_laws_the_head_drafts(training_cache, tiny_model_dir, kind):
    """What training fits is what drafting uses: the training's law of depth d from every generated start equals
    the recorder's draft there (`HeadDraft.start_logits`, which attends over the prompt's states too) for the same
    head. Trained blind to the prompt (--prompt none, how heads were trained before), the laws differ."""
    import torch

    from specsim.cache.reader import CacheReader
    from specsim.record import train as training
    from specsim.record.head_checkpoints import build, head_config_for
    from specsim.record.head_unroll import HeadDraft, target_hidden
    from specsim.record.models import load_model

    target = load_model(str(tiny_model_dir))
    torch.manual_seed(1)
    config = head_config_for(kind, target, aux_layers=EAGLE3_LAYERS if kind == "eagle3" else ())
    head = HeadDraft(name=f"{kind}:test", kind=kind, config=config, module=build(config).eval(), target=target)
    depth = 1 if kind == "eagle" else 3
    sequences = {}
    for use in ("context", "none"):
        sequences[use] = dict(training.load_sequences(training_cache[0], target, config.hidden_layers
                                                      if kind != "eagle" else (), use)[:6:2])  # prompts 0, 1, 2
    with CacheReader(training_cache[0]) as reader:
        rows = [next(r for r in reader.iter_trajectories() if r.prompt_index == i) for i in sequences["context"]]
        for row in rows:
            prompt = reader.prompt_token_ids(row.prompt_index).astype(np.int64)
            x = torch.as_tensor(np.concatenate([prompt, reader.tokens(row.start, row.stop).astype(np.int64)]))
            states = {k: v.half().float() for k, v in target_hidden(target, x, config.hidden_layers).items()}
            drafted = head.start_logits(head.features(states), x, len(prompt), depth)  # (n, depth, V): call s
            fitted = {}
            for use, seqs in sequences.items():
                with torch.no_grad():
                    laws = fitted[use] = training.terms(kind, head.module, target, seqs[row.prompt_index], depth).depths
                assert len(laws) == depth
                for d, (q, _, y) in enumerate(laws, start=1):
                    # a training row from start t predicts the token d places on: the recorder's call t + 1
                    assert torch.equal(y, torch.as_tensor(x[len(prompt) + d:]))
                    got = torch.log_softmax(q.float(), -1)
                    want = torch.log_softmax(drafted[1 : 1 + q.shape[0], d - 1], -1)
                    gap = float((got - want).abs().max())
                    if use == "context":
                        assert gap < 1e-3, (kind, d, gap)
                    else:
                        assert gap > 0.05, (kind, d, gap)  # the prompt is missing from what it attends to
            seq = sequences["context"][row.prompt_index]
            with torch.no_grad():  # --prompt loss: the prompt's starts too, and the same laws from the generated ones
                wider = training.terms(kind, head.module, target, seq, depth, loss_from=0).depths
            for (q_all, _, y_all), (q, _, y) in zip(wider, fitted["context"]):
                assert q_all.shape[0] == q.shape[0] + seq.context and torch.equal(y_all[seq.context:], y)
                assert torch.allclose(q_all[seq.context:], q, atol=1e-4)


def test_training_needs_hidden_states(tiny_cache, tiny_model_dir, tmp_path):
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    with pytest.raises(CacheError, match="--hidden-states last"):
        train(tiny_cache, load_model(str(tiny_model_dir)), tmp_path / "x", TrainConfig(kind="eagle"), progress=False)


def test_inspect_names_head_drafts_and_hidden_states(heads_cache):
    from click.testing import CliRunner

    from specsim.cli import main

    path, drafts, _ = heads_cache
    out = CliRunner().invoke(main, ["inspect", str(path)]).output
    assert f"{drafts[0]} (heads" in out and "laws per call start and depth 1..3" in out
    assert "hidden     target hidden states last (width 64, float16)" in out
    assert "storage full float16 logits" in out


def test_heads_are_profiled_and_priced_as_the_engine_drafts_with_them(heads_cache, tmp_path):
    """`profile --draft medusa:DIR --draft eagle:DIR` times the head passes; simulate prices them:
    Medusa one pass per call, EAGLE one forward per tree level; validate sets the prediction beside live."""
    import torch

    from specsim.attention.profile import ProfileConfig, measure_cost_profile, write_profile
    from specsim.cache.reader import CacheReader
    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model
    from specsim.sim.pricing import Pricing
    from specsim.sim.sweep import SweepConfig, sweep
    from specsim.sim.cost import load_cost_profile, step_shape
    from specsim.sim.features import load_features
    from specsim.specs import parse_tree

    torch.set_num_threads(1)
    path, drafts, target_dir = heads_cache
    target = load_model(target_dir)
    config = ProfileConfig(batches=(1,), contexts=(16, 64), max_tokens=15, draft_widths=(1, 2, 3, 4), repeats=2,
                           warmup=1)
    body = measure_cost_profile(target, [load_heads(d, target) for d in drafts], config=config, progress=False)
    assert set(body["draft_step_s"]) == set(drafts)
    assert all(body["drafts"][d]["heads"] and body["drafts"][d]["architecture_sha256"] for d in drafts)
    profile = write_profile(body, tmp_path / "heads-profile.json")

    tree = parse_tree("kary:2,3")
    assert step_shape(tree, one_pass=True).draft_levels == (1,)  # Medusa: every head at the root state
    assert step_shape(tree).draft_levels == (1, 2, 4)  # EAGLE, like a model draft: the root, then each level
    model = load_cost_profile(profile)
    for draft, levels in zip(drafts, [(1,)] + [(1, 2, 4)] * 5, strict=True):
        features = load_features(path, draft, 0.0, progress=False)
        with CacheReader(path) as reader:
            pricing = Pricing.for_draft(model, reader, draft)
        call, plain, _ = pricing.priced(features, tree)
        full = features.room() >= tree.max_depth
        L = features.contexts()[full]
        expect = model.verify_s(1, tree.n_nodes, L) + sum(model.draft_s(pricing.draft_key, 1, w, L) for w in levels)
        if levels != (1,):  # EAGLE fed the prompt at admission: a trajectory's first call feeds no root entry
            first = np.isin(np.flatnonzero(full), features.traj_start)
            expect = expect - np.where(first, model.draft_s(pricing.draft_key, 1, 1, L), 0.0)
        np.testing.assert_allclose(call[full], expect)
    rows = sweep(path, SweepConfig(trees=["kary:2,3"], drafts=list(drafts), policies=["greedy"], n_boot=0, by_category=False, cost_profile=str(profile))).rows
    assert rows["speedup"].is_not_null().all() and rows["cost_basis"].str.contains("MEASURED").all()


@pytest.mark.parametrize("which, tree, batch, batching", [(1, "kary:2,2", 2, "lockstep"), (1, "chain:3", 3, "continuous"),
                                                           (0, "kary:2,3", 3, "lockstep"), (2, "kary:2,2", 3, "continuous"),
                                                           (4, "chain:3", 3, "continuous"), (5, "kary:2,2", 2, "lockstep")])
def test_batched_head_decoding_matches_the_replay_call_for_call(heads_cache, which, tree, batch, batching):
    """Medusa and EAGLE heads at batch > 1 (EAGLE's own cache padded across rows): every request's output
    and every call's accepted length equal the replay's."""
    from specsim.cache.reader import CacheReader
    from specsim.live.decoder import LiveConfig, Target, decode
    from specsim.live.head_drafting import head_drafter
    from specsim.record.models import eos_token_ids, load_model
    from specsim.sim.features import load_features
    from specsim.sim.policies import run_policy
    from specsim.specs import parse_policy, parse_tree

    path, drafts, target_dir = heads_cache
    draft = drafts[which]
    features = load_features(path, draft, 0.0, progress=False)
    length = run_policy(features, parse_tree(tree), parse_policy("greedy"), np.random.default_rng(0)).length
    with CacheReader(path) as reader:
        rows = [r for r in reader.iter_trajectories() if r.temperature == 0]
        max_new = int(reader.meta["settings"]["max_new_tokens"])
        prompts = [np.asarray(reader.prompt_token_ids(r.prompt_index)) for r in rows]
        expected = [reader.tokens(r.start, r.stop).tolist() for r in rows]
    target = load_model(target_dir)
    run = decode(Target(target.model, eos_token_ids(target)), head_drafter(draft, target), prompts,
                 [np.random.default_rng(i) for i in range(len(prompts))],
                 LiveConfig(tree=parse_tree(tree), max_new_tokens=max_new, batch=batch, batching=batching))
    assert max(step.batch for step in run.steps) == batch
    for i, (decoded, want) in enumerate(zip(run.decoded, expected)):
        assert decoded.tokens.tolist() == want
        start = int(features.traj_start[i])
        assert [s.accepted for s in decoded.steps] == [int(length[start + s.start]) for s in decoded.steps]
    assert sum(s.accepted for d in run.decoded for s in d.steps) > 0


def test_batched_eagle_laws_equal_one_request_at_a_time(heads_cache):
    """The padded, shared EAGLE cache gives each request the draft laws it gets alone (the sampling laws
    q at every node, compared wherever both runs drafted from the same committed tokens)."""
    from specsim.live.decoder import LiveConfig, Target, decode
    from specsim.live.head_drafting import head_drafter
    from specsim.record.models import eos_token_ids, load_model
    from specsim.specs import parse_tree

    path, drafts, target_dir = heads_cache
    target = load_model(target_dir)
    prompts = [np.arange(5, 5 + n) * 7 % 300 for n in (6, 9, 4, 7)]

    class Spy:
        def __init__(self, inner):
            self.inner, self.laws = inner, {}

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def propose(self, committed, *args, **kwargs):
            proposal = self.inner.propose(committed, *args, **kwargs)
            for r, c in enumerate(committed):
                self.laws[tuple(int(x) for x in c)] = {v: q[r] for v, q in proposal.q_draft.items()}
            return proposal

    runs = []
    for batch in (1, 3):
        spy = Spy(head_drafter(drafts[1], target))
        decode(Target(target.model, eos_token_ids(target)), spy, prompts,
               [np.random.default_rng(i) for i in range(len(prompts))],
               LiveConfig(tree=parse_tree("kary:2,2"), policy="sample", temperature=1.0, max_new_tokens=10,
                          batch=batch))
        runs.append(spy.laws)
    common = set(runs[0]) & set(runs[1])
    assert len(common) >= 10
    worst = max(float(np.abs(runs[0][k][v] - runs[1][k][v]).max()) for k in common for v in runs[0][k])
    assert worst < 1e-5, worst


def test_eagle_heads_are_written_in_the_layout_vllm_loads(tiny_model_dir, tmp_path):
    """`export_eagle`: a trained head's directory as vLLM's eagle method reads it (a one-layer Llama config,
    EAGLE's weight names); specsim reads that directory back as a published checkpoint: the same head."""
    from dataclasses import asdict

    import torch

    from specsim.engines.export import export_eagle
    from specsim.errors import EngineError
    from specsim.record.head_checkpoints import build, head_config_for, load_heads, save_heads
    from specsim.record.models import load_model

    target = load_model(str(tiny_model_dir))
    config = head_config_for("eagle", target)
    torch.manual_seed(0)
    save_heads(tmp_path / "ours", config, build(config))
    out = export_eagle(f"eagle:{tmp_path / 'ours'}", str(tiny_model_dir), out=tmp_path / "vllm")
    raw = json.loads((out / "config.json").read_text())
    c = target.model.config
    assert raw["architectures"] == ["LlamaForCausalLM"] and raw["model_type"] == "llama"  # vLLM: EagleLlama...
    assert (raw["num_hidden_layers"], raw["hidden_size"], raw["num_key_value_heads"]) == (
        1, c.hidden_size, c.num_key_value_heads)
    ours, published = load_heads(f"eagle:{tmp_path / 'ours'}", target), load_heads(f"eagle:{out}", target)
    strip = lambda h: {k: v for k, v in asdict(h.config).items() if k != "target"}  # noqa: E731
    assert strip(published) == strip(ours)
    for (name, a), (_, b) in zip(sorted(ours.module.state_dict().items()), sorted(published.module.state_dict().items())):
        assert torch.equal(a, b), name
    assert export_eagle(f"eagle:{tmp_path / 'ours'}", str(tiny_model_dir), out=tmp_path / "vllm") == out  # reused
    assert export_eagle(f"eagle:{out}", str(tiny_model_dir)) == out.resolve()  # a published layout goes as it is
    medusa = head_config_for("medusa", target)
    save_heads(tmp_path / "medusa", medusa, build(medusa))
    with pytest.raises(EngineError, match="medusa heads"):
        export_eagle(f"eagle:{tmp_path / 'medusa'}", str(tiny_model_dir), out=tmp_path / "x")


@pytest.mark.parametrize("which, tree", [(0, "kary:2,3"), (1, "chain:3"), (1, "widths:3,2,1"), (2, "kary:2,2"),
                                         (4, "widths:3,2,1"), (5, "chain:3")])
def test_replay_prices_the_forwards_live_heads_run(heads_cache, which, tree):
    """Structural fidelity (tests/test_structure.py) for heads: Medusa's one pass of every head per call, an
    EAGLE layer's root feed of 1 + the accepted entries and one forward per tree level with children."""
    from tests.test_structure import assert_priced_as_live

    path, drafts, _ = heads_cache
    assert_priced_as_live(path, drafts[which], tree)


@pytest.mark.parametrize("which, tree, batch, batching", [(1, "kary:2,2", 2, "lockstep"), (1, "chain:3", 3, "continuous"),
                                                           (0, "kary:2,3", 3, "lockstep"), (3, "chain:3", 2, "lockstep")])
def test_batch_timeline_prices_the_forwards_live_heads_run(heads_cache, which, tree, batch, batching):
    """Structural fidelity in batches: an EAGLE lane's root feed is 1 + what it accepted (none right after its
    prompt pass), padded to the batch's longest; Medusa's one pass per step."""
    from tests.test_structure import assert_timeline_priced_as_live

    path, drafts, _ = heads_cache
    assert_timeline_priced_as_live(path, drafts[which], tree, batch=batch, batching=batching)


@pytest.mark.parametrize("which", [1, 2, 4, 5])
def test_live_draft_laws_equal_the_recorders(heads_cache, which):
    """Every law an autoregressive head drafts from live (T = 1, chain:2: depth 1 at the root, depth 2 after the
    drafted token) equals the one the recorder computes for that prefix (`target_hidden` + `HeadDraft.start_logits`,
    the code that fills the cache) within float32 rounding — the states the engine keeps (EAGLE-3's layers, MiMo's
    state before the final norm) are the ones the recorder reads. Unlike the call-for-call tests, this compares
    whole laws, not only their argmax."""
    import torch

    from specsim.live.decoder import LiveConfig, Target, decode
    from specsim.live.head_drafting import head_drafter
    from specsim.record.head_unroll import target_hidden
    from specsim.record.models import eos_token_ids, load_model
    from specsim.specs import parse_tree

    path, drafts, target_dir = heads_cache
    target = load_model(target_dir)
    drafter = head_drafter(drafts[which], target)
    seen = []

    class Spy:
        def __getattr__(self, name):
            return getattr(drafter, name)

        def propose(self, committed, *args, **kwargs):
            proposal = drafter.propose(committed, *args, **kwargs)
            seen.extend((np.asarray(c), proposal.tokens[r].copy(), {v: q[r] for v, q in proposal.q_draft.items()})
                        for r, c in enumerate(committed))
            return proposal

    prompts = [np.arange(5, 5 + n) * 7 % 300 for n in (6, 9)]
    decode(Target(target.model, eos_token_ids(target)), Spy(), prompts, [np.random.default_rng(i) for i in range(2)],
           LiveConfig(tree=parse_tree("chain:2"), policy="sample", temperature=1.0, max_new_tokens=12))
    head, worst, checked = drafter.head, 0.0, 0
    for committed, tokens, laws in seen:
        plen = next(len(p) for p in prompts if np.array_equal(p, committed[: len(p)]))
        x = torch.as_tensor(np.concatenate([committed, tokens[1:2]]))  # the drafted depth-1 token fed at depth 2
        states = target_hidden(target, x, head.hidden_layers)
        want = torch.softmax(head.start_logits(head.features(states), x, plen, 2)[len(committed) - plen], -1)
        for depth in [d for d in (1, 2) if d - 1 in laws]:  # near the end the chain is cut to the room left
            worst = max(worst, float(np.abs(laws[depth - 1] - want[depth - 1].numpy()).max()))
            checked += 1
    assert checked >= 16, checked
    assert worst < 1e-4, worst


def test_train_prompts_trains_on_nested_subsets_with_the_same_heldout_prompts(training_cache, tiny_model_dir,
                                                                             tmp_path):
    """--train-prompts N: a data-scaling curve's points. N of the 18 training prompts (24, every 4th held out), drawn
    by the seed: the 6 are among the 12, every held-out prompt is the same, the head records what it trained on, and
    more prompts than there are is refused in one line."""
    import json

    from click.testing import CliRunner

    from specsim.cli import main

    def trained(n: int | None, out: str) -> dict:
        args = ["train-draft", "--kind", "eagle", "--target", str(tiny_model_dir), "--from", str(training_cache[0]),
                "--steps", "2", "--batch", "2", "--holdout-every", "4", "--out", str(tmp_path / out), "--quiet"]
        result = CliRunner().invoke(main, args + ([] if n is None else ["--train-prompts", str(n)]))
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / out / "config.json").read_text())["training"]

    runs = {n: trained(n, f"h{n}") for n in (6, 12, None)}
    ids = {n: {p["question_id"] for p in r["trained_on"]["prompts"]} for n, r in runs.items()}
    assert (len(ids[6]), len(ids[12]), len(ids[None])) == (6, 12, 18)
    assert ids[6] < ids[12] < ids[None]
    assert not ids[None] & {100 + i for i in range(3, 24, 4)}  # the held-out prompts, never trained on
    assert runs[6]["positions"] < runs[12]["positions"] < runs[None]["positions"]
    assert runs[6]["config"]["train_prompts"] == 6 and runs[None]["config"]["train_prompts"] == 0
    assert runs[6]["heldout_trajectories"] == runs[None]["heldout_trajectories"] > 0
    assert runs[6]["heldout"]["loss"] != runs[None]["heldout"]["loss"]  # the same held-out prompts, other heads
    from specsim.cache.provenance import training_summary

    assert "(6 of its training prompts)" in training_summary({"path": str(tmp_path / "h6")})
    assert "training prompts" not in training_summary({"path": str(tmp_path / "hNone")})
    refused = CliRunner().invoke(main, ["train-draft", "--kind", "eagle", "--target", str(tiny_model_dir), "--from",
                                        str(training_cache[0]), "--holdout-every", "4", "--train-prompts", "19",
                                        "--out", str(tmp_path / "no"), "--quiet"])
    assert refused.exit_code != 0
    assert "--train-prompts 19: the cache has 18 training prompts (1 in 4 held out)" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and "loading target" not in refused.output  # before it


def test_train_categories_trains_on_those_categories_with_the_same_heldout_prompts(training_cache, tiny_model_dir,
                                                                                 tmp_path):
    """--train-categories: a head trained on category "x" only (the even prompts) trains on exactly the even training
    prompts, is held out on the same prompts as a head trained on all (every 4th, both categories), and an unknown
    category is refused in one line, naming those the cache has, before the target is loaded."""
    import json

    from click.testing import CliRunner

    from specsim.cli import main

    def run(extra: list[str], out: str):
        args = ["train-draft", "--kind", "eagle", "--target", str(tiny_model_dir), "--from", str(training_cache[0]),
                "--steps", "2", "--batch", "2", "--holdout-every", "4", "--out", str(tmp_path / out), "--quiet"]
        return CliRunner().invoke(main, args + extra)

    def trained(extra: list[str], out: str) -> dict:
        result = run(extra, out)
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / out / "config.json").read_text())["training"]

    x, both = trained(["--train-categories", "x"], "hx"), trained([], "hall")
    ids = {p["question_id"] for p in x["trained_on"]["prompts"]}
    assert ids == {100 + i for i in range(0, 24, 2) if i % 4 != 3}  # even prompts; none of them is held out
    assert x["config"]["train_categories"] == ["x"] and both["config"]["train_categories"] == []
    assert x["heldout_trajectories"] == both["heldout_trajectories"] == 12  # 6 prompts at 2 temperatures
    assert x["positions"] < both["positions"]
    from specsim.cache.provenance import training_summary

    assert "(categories x only)" in training_summary({"path": str(tmp_path / "hx")})
    refused = run(["--train-categories", "x,writing"], "no")
    assert refused.exit_code != 0
    assert "--train-categories writing: no prompt of" in refused.output and "it has: x, y" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and "loading target" not in refused.output


def test_train_draft_trains_on_several_caches_and_no_prompt_one_of_them_holds_out(training_cache, tiny_model_dir,
                                                                                  tmp_path):
    """--from twice: a head trains on the training prompts of both caches, each cache holding out its own every
    4th prompt (the first cache's are those it holds out alone); a prompt the two caches share is trained on in
    neither when one of them holds it out; its record names both caches; a cache given twice is refused in one
    line before the target loads."""
    import json

    from click.testing import CliRunner

    from specsim.cli import main
    from specsim.record.run import RecordRequest, record_cache

    first = [json.loads(line) for line in training_cache[1].read_text().splitlines()]
    new = [{"prompt": f"a new prompt number {k} about birds", "category": "z", "question_id": 200 + k}
           for k in range(6)]
    # second cache: index 1 is the first cache's held-out prompt 3; index 3 (held out here) is its training prompt 0
    second = [new[0], first[3], new[1], first[0], *new[2:]]
    (tmp_path / "second.jsonl").write_text("".join(json.dumps(p) + "\n" for p in second))
    record_cache(tmp_path / "second.h5", RecordRequest(target=str(tiny_model_dir), prompts=str(tmp_path / "second.jsonl"),
                                                       max_new_tokens=8, temperatures=(0.0,), device="cpu",
                                                       hidden=("last",)), progress=False)

    def run(froms: list, out: str):
        args = ["train-draft", "--kind", "eagle", "--target", str(tiny_model_dir), "--steps", "2", "--batch", "2",
                "--holdout-every", "4", "--out", str(tmp_path / out)]
        return CliRunner().invoke(main, args + [a for f in froms for a in ("--from", str(f))])

    result = run([training_cache[0], tmp_path / "second.h5"], "both")
    assert result.exit_code == 0, result.output
    training = json.loads((tmp_path / "both" / "config.json").read_text())["training"]
    trained = [p["question_id"] for p in training["trained_on"]["prompts"]]
    alone = {100 + i for i in range(24) if i % 4 != 3}
    assert sorted(trained) == sorted(alone - {100} | {200, 201, 202, 203, 204})  # 103 and 100: held out somewhere
    assert training["caches"] == training["trained_on"]["caches"] == [str(training_cache[0]), str(tmp_path / "second.h5")]
    assert training["heldout_trajectories"] == 6 * 2 + 2  # the first's 6 prompts at 2 temperatures, 2 of the second
    assert "2 caches" in result.output and "2 training prompts another cache holds out" in result.output
    from specsim.cache.provenance import training_summary

    assert "positions of train.h5 + second.h5" in training_summary({"path": str(tmp_path / "both")})
    refused = run([training_cache[0], tmp_path / "second.h5", training_cache[0]], "no")
    assert refused.exit_code != 0 and "loading target" not in refused.output
    assert f"--from {training_cache[0]} is given twice" in refused.output
    assert len(refused.output.strip().splitlines()) == 1


def test_train_prompts_computes_the_states_of_the_prompts_it_uses_only(training_cache, tiny_model_dir, tmp_path,
                                                                       monkeypatch):
    """A data-scaling point on a quarter of the prompts does not pay for the prompt states of the rest: with 6 of the
    18 training prompts, the target runs over those 6 and the 6 held out, 12 prompts, not 24."""
    import specsim.record.head_unroll as heads
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    ran = []
    real = heads.target_hidden

    def counted(target, ids, layers):
        ran.append(len(ids))
        return real(target, ids, layers)

    monkeypatch.setattr(heads, "target_hidden", counted)
    outcome = train(training_cache[0], load_model(str(tiny_model_dir)), tmp_path / "h",
                    TrainConfig(kind="eagle", steps=1, batch=2, holdout_every=4, train_prompts=6), progress=False)
    assert len(ran) == 12 and outcome.steps == 1

"""EAGLE-3 heads: published layouts load and compute what their library computes; record, replay, live, train.

Layouts are written by the library that defines them, in vLLM's environment (`make vllm`):
`speculators` (config.json with `speculators_model_type`, `layers.0.*`), SpecForge and Medusa-1
(`tests/head_writers.py` runs them; the EAGLE-3 reference layout SGLang serves, a Llama
config with `draft_vocab_size`, `midlayer.*`). Each writes a head for the tiny target and runs its
own training-time test on fixed inputs; specsim loads the checkpoint and its unrolling
(`specsim.record.head_unroll.unroll`, what the recorder replays) must give the same logits at every
step. `pytorch_model.bin` is tested by re-saving the reference layout as one.

Recording, replay, live decoding and pricing of EAGLE-3 heads are tested with the other heads
(tests/test_heads_record.py); here: training with training-time test, and the prompts a head
trained on named when a cache shares them.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from specsim.errors import EngineError, ModelError

AUX = (1, 2, 3)  # the tiny target has 4 layers: the inputs of layers 1, 2 and 3
STEPS = 3
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vllm_env_python():
    from tests.conftest import vllm_env_with

    return vllm_env_with(("speculators",), "speculators")


def run_head_writers(python, argv: list[list[str]], folder: Path) -> None:
    """`tests/head_writers.py`, run once by `python` (vLLM's environment, whose imports take seconds) on every job
    of `argv` (each one call's arguments), listed in `folder`/jobs.json."""
    listing = folder / "jobs.json"
    listing.write_text(json.dumps(argv))
    subprocess.run([python, str(ROOT / "tests" / "head_writers.py"), "--jobs", str(listing)], check=True,
                   capture_output=True, timeout=600)


def _written_heads(python, target_dir, folder: Path, jobs: dict) -> dict:
    """The heads each library wrote, in one run of `tests/head_writers.py`: name -> (directory, hidden, ids,
    reference logits per step, draft vocabulary's target ids). jobs: name -> (library, out, draft_vocab,
    norm_before_residual, seed)."""
    argv, inputs = [], {}
    for name, (library, out, draft_vocab, norm_before_residual, seed) in jobs.items():
        rng = np.random.default_rng(seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        inputs[name] = (out.parent / f"{out.name}-inputs.npz", rng.standard_normal((24, 64 * len(AUX))).astype(
            np.float32), rng.integers(0, 300, 24))
        np.savez(inputs[name][0], hidden=inputs[name][1], ids=inputs[name][2])
        argv.append([library, str(target_dir), str(out), str(inputs[name][0]), "--aux", ",".join(map(str, AUX)),
                     "--draft-vocab", str(draft_vocab), "--ttt-steps", str(STEPS), "--seed", str(seed)]
                    + ["--norm-before-residual"] * norm_before_residual)
    run_head_writers(python, argv, folder)
    heads = {}
    for name, (_, out, *_rest) in jobs.items():
        ref = np.load(out / "reference.npz")
        heads[name] = (out, inputs[name][1], inputs[name][2], ref["logits"], ref["vocab"])
    return heads


@pytest.fixture(scope="module")
def written(vllm_env_python, tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle3")
    jobs = {(vocab, nbr): ("speculators", folder / f"v{vocab}-n{int(nbr)}", vocab, nbr, vocab + nbr)
            for vocab, nbr in [(200, False), (0, True)]}
    jobs["specforge"] = ("specforge", folder / "specforge", 150, False, 7)
    jobs["medusa"] = ("medusa", folder / "medusa", 0, False, 3)
    return _written_heads(vllm_env_python, tiny_model_dir, folder, jobs)


def _unrolled(head, hidden, ids):
    """specsim's logits per step, on the draft vocabulary when the head has one: (steps, m, V_draft)."""
    import torch

    from specsim.record.head_unroll import unroll

    m = hidden.shape[0]
    with torch.no_grad():
        feats = unroll(head.forward, torch.as_tensor(hidden), torch.as_tensor(ids), torch.arange(m), STEPS)
        return np.stack([head.logits(f).numpy() for f in feats])


@pytest.mark.parametrize("vocab, nbr", [(200, False), (0, True)])
def test_a_speculators_checkpoint_loads_and_computes_what_speculators_computes(written, tiny_model_dir, vocab, nbr):
    """Every training-time-test step's logits equal speculators' own forward's (float32), with a draft vocabulary
    mapped through d2t or the whole vocabulary, with the feature's residual normed or not; the same check fails for
    a head that reads the layout's flag the other way, so it can tell."""
    import dataclasses

    from specsim.record.head_checkpoints import load_heads

    from specsim.record.heads import Eagle3Head
    from specsim.record.models import load_model

    folder, hidden, ids, reference, draft_ids = written[vocab, nbr]
    target = load_model(str(tiny_model_dir))
    head = load_heads(f"eagle3:{folder}", target)
    assert head.config.aux_layers == AUX and head.config.norm_before_residual == nbr
    assert head.config.draft_vocab_size == vocab and head.module.embed_tokens is not None  # speculators saves one
    ours = _unrolled(head, hidden, ids)
    if vocab:  # outside the draft vocabulary a target token gets no mass
        outside = np.setdiff1d(np.arange(ours.shape[-1]), draft_ids)
        assert (ours[..., outside] < -1e8).all()
    ours = ours[..., draft_ids]
    for step in range(STEPS):  # speculators pads the last `step` positions' tokens: those rows are not compared
        rows = hidden.shape[0] - step
        np.testing.assert_allclose(ours[step, :rows], reference[step, :rows], atol=1e-4, rtol=1e-4)
    assert np.abs(reference).max() > 1.0  # logits of some size: the comparison is not of zeros

    flipped = dataclasses.replace(head.config, norm_before_residual=not nbr)
    wrong = dataclasses.replace(head, module=Eagle3Head(flipped))
    wrong.module.embed_tokens = head.module.embed_tokens
    wrong.module.load_state_dict(head.module.state_dict())
    assert np.abs(_unrolled(wrong, hidden, ids)[..., draft_ids][0] - reference[0]).max() > 1e-2


def test_specforge_s_reference_layout_loads_and_computes_what_specforge_computes(written, tiny_model_dir, tmp_path):
    """SpecForge's `LlamaForCausalLMEagle3` (the EAGLE-3 reference layout: `midlayer.*`, a Llama config.json with
    draft_vocab_size and the fused layers in eagle_config): every TTT step's logits equal SpecForge's; the same
    weights as pytorch_model.bin without embeddings (the target's are used) load through weights_only=True."""
    import torch
    from safetensors.torch import load_file

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model

    folder, hidden, ids, reference, draft_ids = written["specforge"]
    state = load_file(str(folder / "model.safetensors"))
    assert any(k.startswith("midlayer.") for k in state) and "d2t" in state  # the layout, as SpecForge wrote it
    target = load_model(str(tiny_model_dir))
    head = load_heads(f"eagle3:{folder}", target)
    assert head.config.aux_layers == AUX and head.config.draft_vocab_size == 150
    assert not head.config.norm_before_residual  # a reference-layout config: vLLM's llama_eagle3.py reads False
    ours = _unrolled(head, hidden, ids)[..., draft_ids]
    for step in range(STEPS):
        rows = hidden.shape[0] - step
        np.testing.assert_allclose(ours[step, :rows], reference[step, :rows], atol=1e-4, rtol=1e-4)

    embed = state.pop("embed_tokens.weight")
    as_bin = tmp_path / "bin"
    as_bin.mkdir()
    torch.save(state, as_bin / "pytorch_model.bin")
    (as_bin / "config.json").write_text((folder / "config.json").read_text())
    head = load_heads(f"eagle3:{as_bin}", target)
    assert head.module.embed_tokens is None
    assert torch.equal(target.model.get_input_embeddings().weight, embed)  # SpecForge kept the target's
    np.testing.assert_allclose(_unrolled(head, hidden, ids)[..., draft_ids][0], reference[0], atol=1e-4, rtol=1e-4)
    with pytest.raises(ModelError, match="is an EAGLE-3 checkpoint: use eagle3:"):
        load_heads(f"eagle:{folder}", target)


def test_medusa_s_own_checkpoint_loads_and_computes_what_medusa_computes(written, tiny_model_dir):
    """Medusa-1 as its library writes it (`medusa-llm`: `medusa_lm_head.pt`, the heads' state dict pickled by its
    trainer, each head with its own LM head; `MedusaConfig`): read through torch.load(weights_only=True), every
    head's logits equal `MedusaModel.medusa_head[k]`'s on the same target states."""
    import torch

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model

    folder, hidden, _, reference, _ = written["medusa"]
    target = load_model(str(tiny_model_dir))
    head = load_heads(f"medusa:{folder}", target)
    assert head.config.heads == STEPS and head.config.own_lm_head
    H = target.model.config.hidden_size
    with torch.no_grad():
        ours = head.module(torch.as_tensor(hidden[:, :H]), head.lm_head).numpy()  # (m, K, V)
    np.testing.assert_allclose(ours.transpose(1, 0, 2), reference, atol=1e-4, rtol=1e-4)
    assert np.abs(reference[1] - reference[0]).max() > 1e-2  # the heads differ: each is compared, not one


def test_heads_that_do_not_fit_the_target_are_refused_naming_both(written, tiny_model_dir, tmp_path):
    import shutil

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model

    folder = written[200, False][0]
    target = load_model(str(tiny_model_dir))
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [1, 2, 7]}))
    with pytest.raises(ModelError, match=r"fuses target layers \[1, 2, 7\]; target .* has 4 decoder layers"):
        load_heads(f"eagle3:{bad}", target)
    (bad / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [1, 2]}))
    with pytest.raises(ModelError, match=r"fc.weight fuses 3 target layers, the config names 2"):
        load_heads(f"eagle3:{bad}", target)


# -- what specsim writes ------------------------------------------------------------------------


def test_a_written_eagle3_head_is_in_speculators_layout(vllm_env_python, tiny_model_dir, tmp_path):
    """What specsim writes, speculators reads: its config validates as an Eagle3SpeculatorConfig and the weights load
    into speculators' Eagle3DraftModel with nothing missing or left over (the target's embeddings aside)."""
    from specsim.record.models import load_model
    from tests.test_heads_record import eagle3_from_last_layer

    folder = str(eagle3_from_last_layer(load_model(str(tiny_model_dir)), tmp_path / "head", draft_vocab=300))
    code = (
        "import sys, json\n"
        "from safetensors.torch import load_file\n"
        "from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig\n"
        "raw = json.load(open(sys.argv[1] + '/config.json'))\n"
        "raw = {k: v for k, v in raw.items() if k != 'specsim'}\n"
        "raw['transformer_layer_config']['_attn_implementation'] = 'eager'\n"
        "model = Eagle3DraftModel(Eagle3SpeculatorConfig(**raw))\n"
        "missing, unexpected = model.load_state_dict(load_file(sys.argv[1] + '/model.safetensors'), strict=False)\n"
        "print(json.dumps({'missing': sorted(missing), 'unexpected': sorted(unexpected),\n"
        "                  'aux': model.config.eagle_aux_hidden_state_layer_ids, 'vocab': model.draft_vocab_size}))\n")
    out = subprocess.run([vllm_env_python, "-c", code, folder], check=True, capture_output=True, text=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["unexpected"] == [] and got["aux"] == list(AUX) and got["vocab"] == 300
    assert set(got["missing"]) <= {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}


# -- training -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def training(training_cache, tiny_model_dir, tmp_path_factory):
    """A head trained with training-time test on the shared training cache (tests/conftest.py)."""
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    cache, prompts = training_cache
    out = tmp_path_factory.mktemp("eagle3-train") / "head"
    outcome = train(cache, load_model(str(tiny_model_dir)), out,
                    TrainConfig(kind="eagle3", steps=60, lr=1e-2, batch=4, holdout_every=4, ttt_steps=3,
                                aux_layers=AUX, draft_vocab=300, save_every=20), progress=False)
    return prompts, out, outcome


def _specforge_rates(steps: int, lr: float) -> list[float]:
    """SpecForge's CosineAnnealingWarmupLR with warmup_ratio 0.015, written out: a linear ramp, then half a cosine."""
    w = int(0.015 * steps)
    return [lr * (i + 1) / w if i < w else lr * (1 + math.cos(math.pi * (i - w) / (steps - w))) / 2
            for i in range(steps)]


def test_the_learning_rate_warms_up_and_decays_as_specforge_s_and_the_gradient_is_clipped(training, training_cache,
                                                                                          tiny_model_dir, tmp_path,
                                                                                          monkeypatch):
    import torch

    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, schedule, train

    for steps in (400, 100, 60, 1):  # six steps of warm-up, one, none
        optimiser = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        rates = schedule(optimiser, TrainConfig(kind="eagle3", steps=steps, lr=1e-3))
        seen = []
        for _ in range(steps):
            seen.append(optimiser.param_groups[0]["lr"])
            optimiser.step()
            rates.step()
        np.testing.assert_allclose(seen, _specforge_rates(steps, 1e-3), rtol=1e-9, atol=1e-15)
    assert _specforge_rates(400, 1e-3)[:6] == pytest.approx([1e-3 * (i + 1) / 6 for i in range(6)])
    # the trainer runs that schedule: the curve's rates are the ones its checkpoints' last steps ran at
    curve = training[2].curve
    assert [c["step"] for c in curve] == [20, 40]
    assert [c["lr"] for c in curve] == pytest.approx([_specforge_rates(60, 1e-2)[s - 1] for s in (20, 40)])
    clipped = []
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, norm: clipped.append(norm))
    cache, _ = training_cache
    for name in ("constant", "cosine"):
        outcome = train(cache, load_model(str(tiny_model_dir)), tmp_path / name,
                        TrainConfig(kind="eagle3", steps=4, lr=1e-2, batch=2, holdout_every=4, ttt_steps=1,
                                    aux_layers=AUX, draft_vocab=300, save_every=2, lr_schedule=name), progress=False)
        assert [c["lr"] for c in outcome.curve] == pytest.approx([1e-2 if name == "constant" else
                                                                  _specforge_rates(4, 1e-2)[1]])
    assert clipped == [0.5] * 4  # cosine's four steps, not constant's
    with pytest.raises(ModelError, match="--lr-schedule 'linear': one of cosine, constant"):
        train(cache, load_model(str(tiny_model_dir)), tmp_path / "x",
              TrainConfig(kind="eagle3", steps=1, aux_layers=AUX, lr_schedule="linear"), progress=False)


def test_training_time_test_lowers_heldout_loss_at_every_depth(training, tiny_model_dir):
    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model

    _, out, outcome = training
    assert outcome.after["loss"] < outcome.before["loss"] - 0.1, (outcome.before, outcome.after)
    assert sorted(outcome.after["overlap"]) == [1, 2, 3]  # held out at each unrolled depth, on its own features
    for d in (1, 2, 3):
        assert outcome.after["overlap"][d] > outcome.before["overlap"][d] + 0.01, (outcome.before, outcome.after)
    head = load_heads(f"eagle3:{out}", load_model(str(tiny_model_dir)))
    assert head.config.aux_layers == AUX and head.config.draft_vocab_size == 300 and head.module.d2t is not None
    raw = json.loads((out / "config.json").read_text())
    assert raw["speculators_model_type"] == "eagle3" and raw["draft_vocab_size"] == 300
    seen = raw["training"]["trained_on"]["prompts"]
    assert len(seen) == 18 and {p["question_id"] for p in seen} == {100 + i for i in range(24) if i % 4 != 3}


def test_bfloat16_training_runs_its_products_in_bfloat16_and_learns_as_float32_does(training, training_cache,
                                                                                    tiny_model_dir, tmp_path,
                                                                                    monkeypatch):
    """--precision bfloat16: the training steps' logits come out of bfloat16 matrix products (autocast), the
    target's laws they are fitted to and the held-out evaluation stay float32, the head learns about as much as the float32 one of `training` with the
    same seed and settings, and its checkpoint says how it was trained. The dtype checks fail without autocast and with the
    teacher under it."""
    import torch

    import specsim.record.train_loss as train_module
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    seen, teacher = [], set()  # (in a training step, the head's logits' dtype); the target's laws' dtypes
    original = train_module._ce_rows  # every cross-entropy, batched steps' and per-trajectory evaluation's

    def watching(logits, p_logits):
        seen.append((torch.is_autocast_enabled(logits.device.type), logits.dtype))
        teacher.add(p_logits.dtype)
        return original(logits, p_logits)

    monkeypatch.setattr(train_module, "_ce_rows", watching)
    cache, _ = training_cache
    config = TrainConfig(kind="eagle3", steps=60, lr=1e-2, batch=4, holdout_every=4, ttt_steps=3, aux_layers=AUX,
                         draft_vocab=300, precision="bfloat16")
    outcome = train(cache, load_model(str(tiny_model_dir)), tmp_path / "bf16", config, progress=False)
    assert set(seen) == {(True, torch.bfloat16), (False, torch.float32)}, set(seen)  # steps bf16, evaluation not
    assert seen.count((True, torch.bfloat16)) >= 60 * 3  # every step, each of its 3 depths
    assert teacher == {torch.float32}  # the target's laws, what the head is fitted to, stay float32
    float32 = training[2]
    assert outcome.after["loss"] < outcome.before["loss"] - 0.1, (outcome.before, outcome.after)
    assert outcome.before == float32.before  # the same untrained head, measured in float32
    assert abs(outcome.after["loss"] - float32.after["loss"]) < 0.05, (outcome.after, float32.after)
    raw = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert raw["training"]["config"]["precision"] == "bfloat16"
    with pytest.raises(ModelError, match="--precision 'float16': one of float32, bfloat16"):
        train(cache, load_model(str(tiny_model_dir)), tmp_path / "x",
              TrainConfig(kind="eagle3", steps=1, aux_layers=AUX, precision="float16"), progress=False)


def test_a_cache_without_the_fused_layers_is_refused_naming_them(tiny_model_dir, tiny_cache, tmp_path):
    """And layers the target does not have, naming its layer count."""
    from specsim.errors import CacheError
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    with pytest.raises(CacheError, match=r"no hidden states .*--hidden-states last,1,2,3"):
        train(tiny_cache, load_model(str(tiny_model_dir)), tmp_path / "h",
              TrainConfig(kind="eagle3", steps=1, aux_layers=AUX), progress=False)
    with pytest.raises(ModelError, match=r"aux_layers 1,2,9: .* has 4 decoder layers, so a layer number is 0\.\.4"):
        train(tiny_cache, load_model(str(tiny_model_dir)), tmp_path / "h",
              TrainConfig(kind="eagle3", steps=1, aux_layers=(1, 2, 9)), progress=False)


def test_simulate_and_report_say_when_a_head_meets_its_training_prompts(training, tiny_model_dir, tmp_path):
    """A cache recorded on prompts the head trained on is named as such (simulate's warning, the report's note);
    one on held-out prompts is not."""
    from click.testing import CliRunner

    from specsim.cli import main
    from specsim.record.run import RecordRequest, record_cache

    prompts, out, _ = training
    lines = prompts.read_text().splitlines()
    seen, held = tmp_path / "seen.jsonl", tmp_path / "held.jsonl"
    seen.write_text("\n".join(lines[:3]) + "\n")  # prompts 0-2: trained on
    held.write_text("\n".join([lines[3], lines[7]]) + "\n")  # every 4th: held out
    draft = f"eagle3:{out}"
    said = {}
    for name, source in (("seen", seen), ("held", held)):
        cache = tmp_path / f"{name}.h5"
        record_cache(cache, RecordRequest(target=str(tiny_model_dir), drafts=(draft,), prompts=str(source),
                                          max_new_tokens=8, device="cpu", head_depth=2), progress=False)
        result = CliRunner().invoke(main, ["simulate", str(cache), "--tree", "chain:2", "--quiet"])
        assert result.exit_code == 0, result.output
        said[name] = result.output
    assert f"warning: {draft} was trained on 3 of this cache's 3 prompts (question ids 100, 101, 102)" in said["seen"]
    assert "was trained on" not in said["held"]
    result = CliRunner().invoke(main, ["report", str(tmp_path / "seen.h5"), str(tmp_path / "held.h5"), "--out",
                                       str(tmp_path / "report"), "--budget", "2", "--model-free", "suffix", "--quiet"])
    assert result.exit_code == 0, result.output
    assert f"note: seen.h5: {draft} was trained on 3 of this cache's 3 prompts" in result.output
    assert "note: held.h5" not in result.output
    page = (tmp_path / "report" / "index.html").read_text()
    assert "trained by specsim train-draft: 60 steps on" in page and "held-out top-1" in page  # how, in its setup
    assert "train.h5, the prompt as context; held-out top-1" in page
    # the heads section: the head beside the suffix draft at equal budget, how it was trained, which prompts it saw
    import polars as pl

    from specsim.sim.sweep import SweepConfig, sweep

    assert "Head drafts side by side" in page and "3 of 3: NOT held out" in page and "none of 2: held out" in page
    side = pl.read_csv(tmp_path / "report" / "tables" / "heads_side_by_side.csv")
    assert sorted(side.filter(pl.col("cache_name") == "seen.h5")["draft"].to_list()) == sorted([draft, "suffix"])
    for name, trained_on in (("seen", 3), ("held", 0)):
        row = side.filter((pl.col("cache_name") == f"{name}.h5") & (pl.col("draft") == draft)).row(0, named=True)
        assert row["budget"] == 2 and row["kind"] == "head" and row["prompts_trained_on"] == trained_on
        assert row["trained"].startswith("trained by specsim train-draft: 60 steps")
        expected = sweep(tmp_path / f"{name}.h5", SweepConfig(trees=["chain:2"], drafts=[draft], policies=["greedy"],
                                                               n_boot=0, by_category=False)).rows
        assert row["tokens_per_call"] == pytest.approx(float(expected["tokens_per_call"][0]), abs=1e-12)


def test_medusa_2_heads_inside_a_whole_model_checkpoint_load(written, tiny_model_dir, tmp_path):
    """Medusa-2 keeps the heads in the fine-tuned model's own checkpoint (`medusa_head.{k}.…` beside `model.*`
    and `lm_head.*`, config.json with medusa_num_heads): medusa:DIR reads the heads alone, sharded or not, and
    they compute what the Medusa-1 file of the same heads computes. (No package on the index writes Medusa-2;
    the heads here are medusa-llm's, under the `medusa_head` name its MedusaModel gives them.)"""
    import torch
    from safetensors.torch import load_file, save_file

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model

    folder, hidden, _, reference, _ = written["medusa"]
    target = load_model(str(tiny_model_dir))
    heads = torch.load(folder / "medusa_lm_head.pt", weights_only=True)
    model = load_file(str(tiny_model_dir / "model.safetensors"))
    full = {**model, **{f"medusa_head.{k}": v for k, v in heads.items()}}
    config = {**json.loads((tiny_model_dir / "config.json").read_text()),
              **json.loads((folder / "config.json").read_text())}
    one, sharded = tmp_path / "one", tmp_path / "sharded"
    for out in (one, sharded):
        out.mkdir()
        (out / "config.json").write_text(json.dumps(config))
    save_file(full, str(one / "model.safetensors"), metadata={"format": "pt"})
    keys = sorted(full)
    parts = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, part in parts.items():
        save_file({k: full[k] for k in part}, str(sharded / name), metadata={"format": "pt"})
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: name for name, part in parts.items() for k in part}}))
    H = target.model.config.hidden_size
    for where in (one, sharded):
        head = load_heads(f"medusa:{where}", target)
        assert head.config.heads == STEPS and head.config.own_lm_head
        with torch.no_grad():
            ours = head.module(torch.as_tensor(hidden[:, :H]), head.lm_head).numpy()
        np.testing.assert_allclose(ours.transpose(1, 0, 2), reference, atol=1e-4, rtol=1e-4)
    (one / "model.safetensors").unlink()
    save_file(model, str(one / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"no medusa_head\.\* weights \(Medusa-2's heads\)"):
        load_heads(f"medusa:{one}", target)


# -- written out for SGLang ---------------------------------------------------------------------------


def _random_eagle3(target, folder: Path, *, draft_vocab: int, seed: int, **changes) -> Path:
    """An EAGLE-3 head as `train-draft` writes it (speculators' layout), on the target's default layers, with random
    weights large enough that a misplaced tensor changes its laws; `changes` override its config."""
    import dataclasses

    import torch

    from specsim.record.head_checkpoints import build, head_config_for, save_heads

    torch.manual_seed(seed)
    config = dataclasses.replace(head_config_for("eagle3", target, draft_vocab_size=draft_vocab), **changes)
    module = build(config)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif param.dim() == 2 and not name.startswith("lm_head"):
                param.normal_(0.0, 0.2)
        lm = target.model.get_output_embeddings().weight
        ids = torch.sort(torch.randperm(config.vocab_size)[:draft_vocab]).values
        module.lm_head.weight.copy_(lm[ids])
        module.d2t.copy_(ids - torch.arange(draft_vocab))
    save_heads(folder, config, module)
    return folder


def test_an_eagle3_head_written_out_for_sglang_loads_into_specforge_and_computes_the_same_logits(
        vllm_env_python, tiny_model_dir, tmp_path):
    """`export_eagle3_sglang` writes a `train-draft` head in the EAGLE-3 reference layout SGLang's llama_eagle3.py
    loads: SpecForge's LlamaForCausalLMEagle3 (the class that writes that layout) reads its config.json and weights
    with no key left over and only the embeddings missing (SGLang sets the target's), and every training-time-test
    step's logits, on SGLang's hot token ids (d2t + arange), equal specsim's for the head it came from. The same
    check fails for a copy with two of the layer's norms swapped, so it can tell a wrong layout."""
    import shutil

    from safetensors.torch import load_file, save_file

    from specsim.engines.export import export_eagle3_sglang
    from specsim.record.head_checkpoints import default_aux_layers, load_heads
    from specsim.record.models import load_model

    target = load_model(str(tiny_model_dir))
    folder = _random_eagle3(target, tmp_path / "head", draft_vocab=150, seed=5)
    out = export_eagle3_sglang(f"eagle3:{folder}", str(tiny_model_dir), out=tmp_path / "sglang")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 150
    assert "eagle_config" not in config and not config["tie_word_embeddings"]  # SGLang's default layers; own LM head
    assert export_eagle3_sglang(f"eagle3:{folder}", str(tiny_model_dir), out=tmp_path / "sglang") == out  # reused
    swapped = tmp_path / "swapped"
    shutil.copytree(out, swapped)
    state = load_file(str(out / "model.safetensors"))
    state["midlayer.hidden_norm.weight"], state["midlayer.input_layernorm.weight"] = (
        state["midlayer.input_layernorm.weight"], state["midlayer.hidden_norm.weight"])
    save_file(state, str(swapped / "model.safetensors"))

    rng = np.random.default_rng(11)
    inputs = tmp_path / "inputs.npz"
    hidden, ids = rng.standard_normal((24, 64 * 3)).astype(np.float32), rng.integers(0, 300, 24)
    np.savez(inputs, hidden=hidden, ids=ids)
    argv = [["specforge", str(tiny_model_dir), str(tmp_path / f"ran-{name}"), str(inputs), "--ttt-steps", str(STEPS),
             "--load", str(where)] for name, where in [("ours", out), ("swapped", swapped)]]
    run_head_writers(vllm_env_python, argv, tmp_path)
    loading = json.loads((tmp_path / "ran-ours" / "loading.json").read_text())
    assert loading["unexpected"] == [] and loading["missing"] == ["embed_tokens.weight"]

    head = load_heads(f"eagle3:{folder}", target)
    assert head.config.aux_layers == default_aux_layers(4)
    ours = _unrolled(head, hidden, ids)
    for name, same in [("ours", True), ("swapped", False)]:
        ref = np.load(tmp_path / f"ran-{name}" / "reference.npz")
        theirs, draft_ids = ref["logits"], ref["vocab"]
        assert np.array_equal(np.sort(draft_ids), np.flatnonzero(ours[0, 0] > -1e8))  # the same draft vocabulary
        close = all(np.allclose(ours[step, : 24 - step][..., draft_ids], theirs[step, : 24 - step], atol=1e-4,
                                rtol=1e-4) for step in range(STEPS))
        assert close == same, name


def test_sglang_s_layout_is_refused_for_what_sglang_s_layer_does_not_compute(tiny_model_dir, tmp_path):
    """One line each: another kind of head, a residual of the normed feature, target layers other than the default
    (SGLang and vLLM read a config's layer ids one layer apart), a published speculators directory; a directory
    already in the reference layout is given as it is."""
    from specsim.engines.export import export_eagle3_sglang
    from specsim.record.models import load_model
    from tests.test_heads_record import eagle3_from_last_layer

    target = load_model(str(tiny_model_dir))
    t = str(tiny_model_dir)
    for name, folder, why in [
        ("residual", _random_eagle3(target, tmp_path / "nbr", draft_vocab=50, seed=1, norm_before_residual=True),
         "residual normed"),
        ("layers", eagle3_from_last_layer(target, tmp_path / "aux", draft_vocab=50), "not the default"),
    ]:
        with pytest.raises(EngineError, match=why):
            export_eagle3_sglang(f"eagle3:{folder}", t, out=tmp_path / f"out-{name}")
        assert not (tmp_path / f"out-{name}").exists()
    published = tmp_path / "published"
    published.mkdir()
    (published / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    with pytest.raises(EngineError, match="speculators' layout, whose config SGLang's EAGLE3 does not read"):
        export_eagle3_sglang(f"eagle3:{published}", t)
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"],
                                                       "draft_vocab_size": 32}))
    assert export_eagle3_sglang(f"eagle3:{reference}", t) == reference.resolve()

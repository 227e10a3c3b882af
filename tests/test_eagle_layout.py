"""EAGLE-1/2 heads against EAGLE's own code: `eagle.model.cnets.Model` (the `eagle-llm` package,
SafeAILab/EAGLE), which defines the layout EAGLE publishes and SGLang's EAGLE algorithm loads
(`srt/models/llama_eagle.py` cites it): a head EAGLE's class wrote loads into specsim and computes what
EAGLE computes; a head specsim wrote out for SGLang loads into EAGLE's class and computes what specsim
computes. `tests/head_writers.py` runs EAGLE's class in vLLM's environment (`make vllm`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specsim.errors import EngineError
from tests.test_eagle3 import run_head_writers

M = 24  # positions each forward runs on


@pytest.fixture(scope="module")
def vllm_env_python():
    from tests.conftest import vllm_env_with

    return vllm_env_with(("eagle.model.cnets",), "eagle-llm (EAGLE's own code)")


def _random_eagle(target, folder: Path, seed: int) -> Path:
    """A head `train-draft` could have written (specsim's layout, fc without a bias), with random weights."""
    import torch

    from specsim.record.head_checkpoints import build, head_config_for, save_heads

    torch.manual_seed(seed)
    config = head_config_for("eagle", target)
    module = build(config)
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.normal_(0.0, 0.2) if param.dim() == 2 else param.uniform_(0.5, 1.5)
    save_heads(folder, config, module)
    return folder


def _swapped_fc(src: Path, dst: Path) -> Path:
    """A copy of EAGLE head `src` (its config.json, and its weights however stored, as model.safetensors) whose fc
    reads [feature, embedding] instead of [embedding, feature]: a wrong layout."""
    from safetensors.torch import save_file

    from specsim.record.head_checkpoints import read_head_weights

    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    state = dict(read_head_weights(src, "eagle")[1])
    H = state["fc.weight"].shape[0]
    state["fc.weight"] = state["fc.weight"].roll(H, dims=1).contiguous()
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"))
    return dst


def _specsim_logits(spec: str, target, hidden, ids) -> np.ndarray:
    """specsim's teacher-forced depth-1 logits (m, V) of head `spec` on the target's states `hidden` (m, H)."""
    from specsim.record.head_checkpoints import load_heads
    from tests.test_eagle3 import _unrolled

    return _unrolled(load_heads(spec, target), hidden, ids)[0]


@pytest.fixture(scope="module")
def ran(vllm_env_python, tiny_model_dir, tmp_path_factory):
    """One run of EAGLE's class: it writes a head (`written`), and reads specsim's SGLang export of a random head
    (`ours`) and of a copy with fc's halves swapped (`swapped`). name -> (directory, reference logits)."""
    from specsim.engines.export import export_eagle_sglang
    from specsim.record.models import load_model

    folder = tmp_path_factory.mktemp("eagle-layout")
    target = load_model(str(tiny_model_dir))
    head = _random_eagle(target, folder / "head", seed=3)
    out = export_eagle_sglang(f"eagle:{head}", str(tiny_model_dir), out=folder / "sglang")
    swapped = _swapped_fc(out, folder / "swapped")
    rng = np.random.default_rng(5)
    hidden, ids = rng.standard_normal((M, 64)).astype(np.float32), rng.integers(0, 300, M)
    inputs = folder / "inputs.npz"
    np.savez(inputs, hidden=hidden, ids=ids)
    jobs = {"written": [], "ours": ["--load", str(out)], "swapped": ["--load", str(swapped)]}
    argv = [["eagle", str(tiny_model_dir), str(folder / f"ran-{name}"), str(inputs), "--seed", "9", *extra]
            for name, extra in jobs.items()]
    run_head_writers(vllm_env_python, argv, folder)
    where = {"written": folder / "ran-written", "ours": out, "swapped": swapped}
    runs = {name: (where[name], np.load(folder / f"ran-{name}" / "reference.npz")["logits"][0]) for name in jobs}
    return runs, head, target, hidden, ids, folder


def test_a_head_eagle_s_own_class_wrote_loads_and_computes_what_eagle_computes(ran):
    """EAGLE's published layout as EAGLE's class saves it (pytorch_model.bin without embeddings, fc with a bias,
    a Llama config.json): specsim's logits equal EAGLE's forward's (float32); the same file with fc's halves
    swapped does not, so the comparison can tell a wrong reading."""
    runs, _, target, hidden, ids, folder = ran
    written, reference = runs["written"]
    assert (written / "pytorch_model.bin").is_file() and not (written / "model.safetensors").exists()
    assert np.abs(reference).max() > 1.0  # logits of some size: the comparison is not of zeros
    ours = _specsim_logits(f"eagle:{written}", target, hidden, ids)
    np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=1e-4)
    wrong = _swapped_fc(written, folder / "written-swapped")
    assert np.abs(_specsim_logits(f"eagle:{wrong}", target, hidden, ids) - reference).max() > 1e-2


def test_an_eagle_head_written_out_for_sglang_loads_into_eagle_s_class_and_computes_the_same_logits(ran,
                                                                                                     tiny_model_dir):
    """`export_eagle_sglang`: a `train-draft` head (fc without a bias) in EAGLE's layout under SGLang's class name,
    with a zero fc bias (SGLang's fc always has one). EAGLE's class reads it with nothing left over and only the
    embeddings missing (SGLang sets the target's), and its logits equal specsim's for the head it came from; a copy
    with fc's halves swapped does not."""
    from safetensors.torch import load_file

    runs, head, target, hidden, ids, folder = ran
    out, theirs = runs["ours"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle"] and config["num_hidden_layers"] == 1
    state = load_file(str(out / "model.safetensors"))
    assert not state["fc.bias"].any() and "layers.0.input_layernorm.weight" not in state
    loading = json.loads((folder / "ran-ours" / "loading.json").read_text())
    assert loading["unexpected"] == [] and loading["missing"] == ["embed_tokens.weight"]
    ours = _specsim_logits(f"eagle:{head}", target, hidden, ids)
    assert np.abs(ours).max() > 1.0
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=1e-4)
    assert np.abs(runs["swapped"][1] - ours).max() > 1e-2


def test_eagle_heads_go_to_sglang_as_eagle_and_other_heads_are_refused(ran, tiny_model_dir, tmp_path):
    """A published head EAGLE's class wrote (a Llama architecture) is written out under SGLang's class with its own
    fc bias; a directory already naming SGLang's class is given as it is, as is an export asked again; an EAGLE-3
    head is refused in one line, in specsim's layout or a published one; SGLang's flags name the EAGLE algorithm
    and the sampled rules for its chains."""
    import torch
    from safetensors.torch import load_file, save_file

    from specsim.engines import emit
    from specsim.engines.export import export_eagle_sglang, sglang_directory
    from specsim.specs import parse_tree
    from tests.test_heads_record import eagle3_from_last_layer

    runs, head, target, *_ = ran
    written = runs["written"][0]
    t = str(tiny_model_dir)
    out = export_eagle_sglang(f"eagle:{written}", t, out=tmp_path / "published")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle"]
    bias = torch.load(written / "pytorch_model.bin", weights_only=True)["fc.bias"]
    assert torch.equal(load_file(str(out / "model.safetensors"))["fc.bias"], bias) and bias.any()
    assert export_eagle_sglang(f"eagle:{out}", t) == out.resolve()  # SGLang's class named: as it is
    assert export_eagle_sglang(f"eagle:{written}", t, out=tmp_path / "published") == out  # reused
    exported = runs["ours"][0]
    assert sglang_directory(f"eagle:{exported}", t) == str(exported.resolve())
    with pytest.raises(EngineError, match="SGLang's EAGLE algorithm loads EAGLE-1/2 heads"):
        export_eagle_sglang(f"eagle:{eagle3_from_last_layer(target, tmp_path / 'e3')}", t, out=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    speculators = tmp_path / "speculators"  # an EAGLE-3 head in a published layout, given as eagle:
    speculators.mkdir()
    (speculators / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    save_file({"fc.weight": torch.zeros(64, 192)}, str(speculators / "model.safetensors"))
    with pytest.raises(EngineError, match=r"fc.weight of shape \(64, 192\), not EAGLE-1/2's"):
        export_eagle_sglang(f"eagle:{speculators}", t, out=tmp_path / "y")
    flags = emit.sglang_flags(f"eagle:{head}", parse_tree("chain:3"), draft_dir="d", policy="block")
    assert flags[:2] == ["--speculative-algorithm", "EAGLE"] and flags[-1] == "--speculative-use-block-verification"
    with pytest.raises(EngineError, match="NEXTN"):
        emit.sglang_algorithm("mtp:some/head")


def test_simulate_and_optimize_hand_an_eagle_head_to_sglang(tiny_model_dir, tiny_prompts_file, tmp_path, monkeypatch):
    """An EAGLE-1/2 head (in the published layout) recorded with its expansion: `simulate --emit sglang` writes the
    EAGLE algorithm's flags for the dynamic tree it replayed, the head written out under SGLang's class;
    `optimize --emit sglang` picks among chains and dynamic trees and writes the same kind of flags; a sampled policy
    on a tree is refused in one line."""
    import re
    import shlex

    from click.testing import CliRunner

    from specsim.cache.stats import StatsSpec
    from specsim.cli import main
    from specsim.record.models import load_model
    from specsim.record.run import RecordRequest, record_cache

    from tests.test_heads_record import _eagle_published

    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))
    head = _eagle_published(tmp_path / "head", load_model(str(tiny_model_dir)))  # it proposes repeats: some accepted
    draft, cache = f"eagle:{head}", tmp_path / "e.h5"
    record_cache(cache, RecordRequest(target=str(tiny_model_dir), drafts=(draft,), prompts=str(tiny_prompts_file),
                                      max_new_tokens=10, temperatures=(0.0, 1.0), device="cpu", head_depth=3,
                                      stats=StatsSpec(expand=(3, 3))), progress=False)
    dynamic = ["simulate", str(cache), "--draft", draft, "--tree", "dynamic:topk=3,depth=2,tokens=4", "-q"]
    res = CliRunner().invoke(main, [*dynamic, "--emit", "sglang", str(tmp_path / "flags.txt")])
    assert res.exit_code == 0, res.output
    flags = shlex.split((tmp_path / "flags.txt").read_text())
    assert flags[:2] == ["--speculative-algorithm", "EAGLE"] and flags[4:] == [
        "--speculative-num-steps", "2", "--speculative-eagle-topk", "3", "--speculative-num-draft-tokens", "5"]
    written = Path(flags[3])
    assert str(tmp_path / "home") in str(written)
    assert json.loads((written / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle"]
    res = CliRunner().invoke(main, ["optimize", str(cache), "--draft", draft, "--budget", "3", "--cost", "c=0.001",
                                    "--emit", "sglang", str(tmp_path / "opt.txt")])
    assert res.exit_code == 0, res.output
    assert re.search(r"best (tree|chain) \S+: [0-9.]+ tokens/call, speedup ASSUMED", res.output)
    assert shlex.split((tmp_path / "opt.txt").read_text())[:4] == flags[:4]
    res = CliRunner().invoke(main, [*dynamic, "--policy", "block", "--temperature", "1", "--emit", "sglang",
                                    str(tmp_path / "block.txt")])
    assert res.exit_code != 0 and "verifies chains only" in res.output and not (tmp_path / "block.txt").exists()

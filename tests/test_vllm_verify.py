"""vLLM's own rejection sampler against specsim's rules, draw for draw.

vLLM 0.32 verifies drafted chains in its GPU worker's Triton kernels (`rejection_sample` in
`vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py`): token by token, or by block verification
(`rejection_sample_method="block"`, Sun et al., arXiv 2403.10444), with the draft's laws (a draft model) or
without them (one-hot drafts: n-gram, greedy heads). Its CPU build does not run them; Triton's interpreter
does (`tests/vllm_kernels.py`, in vLLM's environment). Given the target's and the draft's laws along a chain
and the drafts, it returns what vLLM keeps and emits, and vLLM's own randomness: each draft's uniform
(`tl_rand32(seed, pos)`) and the Gumbel noise it resamples with. specsim's rules fed those numbers
(`block_thresholds` / `block_correction`, token-wise rejection with `residual`; the emitted token as Gumbel-max,
argmax(log law + noise)) must keep as many drafts and emit the same token on every row where no uniform or
noise gap is within float32's reach; the same comparison fails for the other rule and for a block rule
without its η correction.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_sglang_verify import _block, _chains, _token_wise, run_script

GAP = 1e-4  # a uniform this close to a threshold, or the two best of log law + noise (float32 logs), may swap


@pytest.fixture(scope="module")
def kernel_python():
    from tests.conftest import vllm_env_with

    return vllm_env_with(("triton", "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"),
                         "Triton or vLLM's GPU-worker sampler")


def _gumbel(noise: np.ndarray):
    """vLLM's draw of the emitted token: the argmax of the law's log plus the noise at the resampled position
    (`pos` of entry `kept`), and the gap to the runner-up."""
    def draw(law, r, kept):
        with np.errstate(divide="ignore"):
            score = np.log(law) + noise[r, kept]
        top = np.sort(score)[-2:]
        return int(np.argmax(score)), float(top[1] - top[0])
    return draw


def _inputs(c: dict) -> dict:
    """The sampler's inputs for chains `c` (one-hot drafts when c["q"] is None), with seeds and positions."""
    rows, g = c["drafts"].shape
    rng = np.random.default_rng(rows + g)
    return {"logp": np.log(c["p"]), "logq": np.log(c["q"]) if c.get("q") is not None else np.zeros(0),
            "drafts": c["drafts"], "seeds": rng.integers(0, 2**31, rows),
            "pos": rng.integers(0, 4096, (rows, 1)) + np.arange(g + 1)}


CASES = [(1, False), (3, False), (3, True)]  # (chain length, one-hot drafts)


@pytest.fixture(scope="module")
def sampler_runs(kernel_python, tmp_path_factory):
    """Per case: the chains (with the draft's laws; one-hot ones as the point masses they are) and vLLM's sampler's
    decisions and randomness on them, from one run of its script."""
    chains = {}
    for g, one_hot in CASES:
        c = _chains(np.random.default_rng(10 + g), 120, g)
        if one_hot:
            c["q"] = np.eye(c["p"].shape[-1])[c["drafts"]]
        chains[g, one_hot] = c
    got = run_script(kernel_python, "vllm_kernels.py",
                     {f"g{g}-{one_hot}": _inputs(dict(c, q=None) if one_hot else c)
                      for (g, one_hot), c in chains.items()}, tmp_path_factory.mktemp("vllm-sampler"), timeout=900)
    return {(g, one_hot): (c, got[f"g{g}-{one_hot}"]) for (g, one_hot), c in chains.items()}


def compare(c: dict, got: dict) -> dict:
    """Per rule, [rows compared, rows where vLLM keeps and emits what specsim's rule does]; and how many rows a
    wrong rule (token-wise for block, block without η) keeps another count on."""
    c = dict(c, u=got["u"])
    draw = _gumbel(got["noise"])
    out = {"block": [0, 0], "token_wise": [0, 0], "block vs token-wise": 0, "block without eta": 0}
    for r in range(c["drafts"].shape[0]):
        for name, rule in (("block", _block), ("token_wise", _token_wise)):
            kept, token, margin = rule(c, r, draw=draw)
            if margin < GAP:  # a uniform at a threshold, or two tokens' scores, within float32's reach
                continue
            out[name][0] += 1
            out[name][1] += (got[f"{name}_kept"][r], got[f"{name}_token"][r]) == (kept, token)
        out["block vs token-wise"] += int(got["block_kept"][r] != _token_wise(c, r, draw=draw)[0])
        out["block without eta"] += int(got["block_kept"][r] != _block(c, r, eta=False, draw=draw)[0])
    return out


@pytest.mark.parametrize("g, one_hot", CASES)
def test_vllm_s_rejection_sampler_decides_what_specsim_s_rules_decide(sampler_runs, g, one_hot):
    """With the draft's laws (a draft model's chain) and without them (one-hot drafts, vLLM's path for n-gram and
    greedy drafts, whose q is a point mass on the draft)."""
    c, got = sampler_runs[g, one_hot]
    seen = compare(c, got)
    for rule in ("block", "token_wise"):
        compared, agree = seen[rule]
        assert compared >= 110 and agree == compared, (rule, seen)  # nearly every row compared; all agree
    if g > 1:  # one draft: block verification is token-wise verification, and h_1 = a_1
        assert seen["block vs token-wise"] > 0 and seen["block without eta"] > 0  # the comparison can tell
    wrong = compare(c, dict(got, noise=np.roll(got["noise"], 1, axis=1)))  # another position's noise
    assert wrong["token_wise"][1] < wrong["token_wise"][0]

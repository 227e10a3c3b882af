"""SGLang's own chain verification kernel against specsim's rules, on the same uniforms.

SGLang 0.5.23 verifies a drafted chain (EAGLE/EAGLE-3 heads, topk 1) with
`--speculative-use-rejection-sampling` token by token and, with `--speculative-use-block-verification`,
by block verification (Sun et al., arXiv 2403.10444), both in one Triton kernel
(`chain_speculative_sampling_triton`), run here by Triton's interpreter on the CPU in vLLM's environment
(`tests/sglang_kernels.py`). Given the target's and the draft's laws along a chain, the drafts and the
uniforms the kernel reads (one per step, one for the last token), specsim's rules
(`specsim.verify.block_thresholds` / `block_correction`, and token-wise rejection with `residual`) decide the
same number of kept drafts and the same emitted token, wherever the uniform is not within float32's reach of
a threshold. The same comparison fails for the other rule and for a block rule without its η correction.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest


ROOT = Path(__file__).resolve().parents[1]
MARGIN = 1e-5  # float32 kernel against float64 rules: a uniform this close to a threshold may fall either side


@pytest.fixture(scope="module")
def kernel_python():
    from tests.conftest import vllm_env_with

    return vllm_env_with(("triton",), "SGLang's wheel or Triton",
                         "assert sorted((pathlib.Path(sys.executable).parents[1] / 'wheels').glob('sglang-*.whl'))")


def _chains(rng, rows: int, g: int, V: int = 10):
    """Random chains: the draft's laws q, drafts drawn from them, target laws p near q (so chains are often
    kept in part), the kernel's uniforms."""
    def law(shape, scale):
        z = rng.standard_normal(shape) * scale
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    q = law((rows, g, V), 1.5)
    p = law((rows, g + 1, V), 1.5)
    p[:, :g] = 0.6 * q + 0.4 * p[:, :g]
    drafts = np.array([[rng.choice(V, p=q[r, i]) for i in range(g)] for r in range(rows)])
    return dict(p=p, q=q, drafts=drafts, u=rng.random((rows, g + 1)), u_final=rng.random(rows))


def _first_above(law: np.ndarray, u: float) -> tuple[int, float]:
    """Inverse CDF as the kernel draws (the first token whose cumulative mass exceeds u), and u's distance to the
    nearest cumulative mass."""
    cdf = np.cumsum(law)
    return int(np.argmax(cdf > u)), float(np.abs(cdf - u).min())


def _inverse_cdf(c):
    """SGLang's draw of the emitted token: `_first_above` the row's last uniform."""
    return lambda law, r, kept: _first_above(law, c["u_final"][r])


def _block(c, r: int, *, eta: bool = True, draw=None) -> tuple[int, int, float]:
    """specsim's block verification of row r on the kernel's uniforms: (kept, token, the nearest margin).
    eta=False: a wrong rule that keeps prefix i with probability a_i (no η correction). draw(law, r, kept): the
    engine's draw of the emitted token from `law` with its randomness, and its margin (SGLang's by default)."""
    from specsim.verify import block_correction, block_thresholds

    p, q, x, u = c["p"][r], c["q"][r], c["drafts"][r], c["u"][r]
    a, h = block_thresholds(p, q, x)
    h = h if eta else a
    g = x.shape[0]
    kept = max([i for i in range(1, g + 1) if u[i - 1] < h[i]], default=0)
    margin = min(abs(u[i - 1] - h[i]) for i in range(1, g + 1))
    token, gap = (draw or _inverse_cdf(c))(block_correction(p, q, x, kept), r, kept)
    return kept, token, min(margin, gap)


def _token_wise(c, r: int, *, draw=None) -> tuple[int, int, float]:
    """Token-wise rejection on the kernel's uniforms: keep draft i while u_i < p_i(x_i) / q_i(x_i); then a token
    from the residual norm(max(p - q, 0)) of the first rejected step, or the bonus position's p (`draw` as in
    `_block`)."""
    from specsim.verify import residual

    p, q, x, u = c["p"][r], c["q"][r], c["drafts"][r], c["u"][r]
    g, kept, margin = x.shape[0], 0, 1.0
    while kept < g:
        ratio = p[kept, x[kept]] / q[kept, x[kept]]
        margin = min(margin, abs(u[kept] - ratio))
        if not u[kept] < ratio:
            break
        kept += 1
    law = p[g] if kept == g else residual(p[kept], q[kept])
    token, gap = (draw or _inverse_cdf(c))(law, r, kept)
    return kept, token, min(margin, gap)


def run_script(python, script: str, cases: dict[str, dict], tmp_path: Path, timeout: int = 600) -> dict[str, dict]:
    """`tests/<script> IN.npz OUT.npz [IN.npz OUT.npz ...]` run once by `python` (an engine's environment, whose
    imports take seconds) on each case's inputs: each case's outputs, by name."""
    args = []
    for name, inputs in cases.items():
        np.savez(tmp_path / f"{name}-in.npz", **inputs)
        args += [str(tmp_path / f"{name}-in.npz"), str(tmp_path / f"{name}-out.npz")]
    subprocess.run([python, str(ROOT / "tests" / script), *args], check=True, capture_output=True, timeout=timeout)
    return {name: dict(np.load(tmp_path / f"{name}-out.npz")) for name in cases}


DRAFTS = (1, 2, 4)  # chain lengths checked


@pytest.fixture(scope="module")
def kernel_runs(kernel_python, tmp_path_factory):
    """Per chain length g: the chains and what SGLang's kernel decided on them (one run of the kernel's script)."""
    chains = {g: _chains(np.random.default_rng(g), 150, g) for g in DRAFTS}
    got = run_script(kernel_python, "sglang_kernels.py", {f"g{g}": c for g, c in chains.items()},
                     tmp_path_factory.mktemp("sglang"))
    return {g: (chains[g], got[f"g{g}"]) for g in DRAFTS}


@pytest.mark.parametrize("g", DRAFTS)
def test_sglang_s_chain_kernel_decides_what_specsim_s_rules_decide(kernel_runs, g):
    c, got = kernel_runs[g]
    compared = {"block": 0, "token_wise": 0}
    differ = {"block vs token-wise": 0, "block without eta": 0}
    for r in range(len(c["u_final"])):
        for name, rule in (("block", _block), ("token_wise", _token_wise)):
            kept, token, margin = rule(c, r)
            if margin < MARGIN:
                continue
            compared[name] += 1
            assert (got[f"{name}_kept"][r], got[f"{name}_token"][r]) == (kept, token), (name, r)
        differ["block vs token-wise"] += got["block_kept"][r] != _token_wise(c, r)[0]
        differ["block without eta"] += got["block_kept"][r] != _block(c, r, eta=False)[0]
    assert min(compared.values()) >= 140  # nearly every row compared, both rules
    if g > 1:  # one draft: block verification is token-wise verification, and h_1 = a_1
        assert differ["block vs token-wise"] > 0 and differ["block without eta"] > 0  # the comparison can tell

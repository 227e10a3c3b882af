"""Run SGLang's own chain verification kernel on given inputs, in vLLM's environment (which has Triton; `make
vllm` downloads SGLang's wheel into .venv-vllm/wheels, and only this kernel's module is read from it).

    .venv-vllm/bin/python tests/sglang_kernels.py INPUTS.npz OUT.npz [INPUTS.npz OUT.npz ...]

SGLang (0.5.23, `sglang/kernels/ops/speculative/reject_sampling.py`, `chain_speculative_sampling_triton`)
verifies a drafted chain with `--speculative-use-rejection-sampling` token by token (accept draft i while
u_i q_i(x_i) < p_i(x_i)) and with `--speculative-use-block-verification` by block verification (Sun et al.,
arXiv 2403.10444, Algorithm 2), then draws the correction or bonus token by inverse CDF with one more uniform.
It is a Triton kernel, run here by Triton's interpreter (TRITON_INTERPRET=1) on the CPU.

INPUTS.npz: `p` (B, γ+1, V) the target's laws along each chain, `q` (B, γ, V) the draft's, `drafts` (B, γ),
`u` (B, γ+1) the per-step uniforms (step i reads u[:, i-1]), `u_final` (B,). OUT.npz: for `token_wise` and
`block`, the drafts kept per row (`*_kept`, (B,)) and the token emitted after them (`*_token`, (B,)).
"""

from __future__ import annotations

import functools
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402


KERNEL = "sglang/kernels/ops/speculative/reject_sampling.py"


@functools.cache
def _kernel():
    """SGLang's kernel module, read from its wheel (`make vllm` downloads it into .venv-vllm/wheels; installing
    the package would import its whole runtime): the module imports Triton only. Read once a process."""
    import importlib.util
    import tempfile
    import zipfile
    from pathlib import Path

    from triton_interpreter import patch_once

    patch_once()
    wheels = sorted((Path(sys.executable).parents[1] / "wheels").glob("sglang-*.whl"))
    if not wheels:
        raise SystemExit(f"no SGLang wheel in {Path(sys.executable).parents[1] / 'wheels'} (make vllm)")
    folder = Path(tempfile.mkdtemp())
    with zipfile.ZipFile(wheels[-1]) as wheel:
        (folder / "reject_sampling.py").write_bytes(wheel.read(KERNEL))
    spec = importlib.util.spec_from_file_location("sglang_reject_sampling", folder / "reject_sampling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.chain_speculative_sampling_triton


def run(p, q, drafts, u, u_final, block: bool) -> tuple[np.ndarray, np.ndarray]:
    chain_speculative_sampling_triton = _kernel()

    B, g = drafts.shape
    candidates = torch.zeros(B, g + 1, dtype=torch.int64)  # slot 0 is the root, its token unused
    candidates[:, 1:] = torch.as_tensor(drafts, dtype=torch.int64)
    index = torch.arange(B * (g + 1), dtype=torch.int64).reshape(B, g + 1)
    predicts = torch.full((B * (g + 1),), -1, dtype=torch.int32)
    accept_index = torch.full((B, g + 1), -1, dtype=torch.int32)
    kept = torch.zeros(B, dtype=torch.int32)
    chain_speculative_sampling_triton(
        predicts, accept_index, kept, candidates, index, None, None,
        torch.as_tensor(u, dtype=torch.float32), torch.as_tensor(u_final, dtype=torch.float32),
        torch.as_tensor(p, dtype=torch.float32), torch.as_tensor(q, dtype=torch.float32), 1.0, 1.0, True,
        block_verification=block)
    last = accept_index[torch.arange(B), kept.long()]  # the slot of the last kept token: the emitted one is there
    return kept.numpy(), predicts[last.long()].numpy()


def main() -> None:
    for inputs, outputs in zip(sys.argv[1::2], sys.argv[2::2]):  # each pair in one process: imports once
        data = np.load(inputs)
        out = {}
        for name, block in (("token_wise", False), ("block", True)):
            out[f"{name}_kept"], out[f"{name}_token"] = run(data["p"], data["q"], data["drafts"], data["u"],
                                                          data["u_final"], block)
        np.savez(outputs, **out)


if __name__ == "__main__":
    main()

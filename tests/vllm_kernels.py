"""Run vLLM's own rejection sampler on given chains, in vLLM's environment, on the CPU.

    .venv-vllm/bin/python tests/vllm_kernels.py INPUTS.npz OUT.npz [INPUTS.npz OUT.npz ...]

vLLM 0.32's GPU worker verifies drafted chains in Triton kernels (`vllm/v1/worker/gpu/spec_decode/
rejection_sampler_utils.py`, `rejection_sample`): token by token (`rejection_sample_method="standard"`: accept
draft i while p(x_i) > u_i q(x_i)) or by block verification (`"block"`, Sun et al., arXiv 2403.10444), then the
correction or bonus token by Gumbel-max over the residual's logits. Its CPU build turns Triton off ("doesn't
include CPU backend"); here the installed Triton runs those kernels in its interpreter (TRITON_INTERPRET=1):
`vllm.triton_utils` is pointed at the real Triton before the module is imported, and libdevice's `log1p`, which
the interpreter does not implement, is numpy's.

The randomness is vLLM's own: draft i's uniform is `tl_rand32(seed, pos_i)` and the resampled token's Gumbel noise
is `murmur3_uniform32(seed, pos, token)` through `_log1p_neg_stable` (vllm/v1/worker/gpu/sample/gumbel.py); this
script returns both, computed by those functions, so a rule fed the same numbers can be compared draw for draw.

INPUTS.npz: `logp` (B, γ+1, V) the target's log-laws along each chain (the last row the bonus position's),
`logq` (B, γ, V) the draft's (absent or empty: one-hot drafts, vLLM's path without draft logits), `drafts`
(B, γ), `seeds` (B,), `pos` (B, γ+1). OUT.npz: for `token_wise` and `block`, the drafts kept per row (`*_kept`,
(B,)) and the token emitted after them (`*_token`); `u` (B, γ) and `noise` (B, γ+1, V).
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402


def _modules():
    """vLLM's rejection sampler and Gumbel modules, their Triton the real one, run by its interpreter (`tl` and
    `gumbel` become this module's globals: a Triton kernel resolves names there)."""
    global tl, gumbel
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import interpreter_builder
    from triton_interpreter import patch_once

    import vllm.triton_utils as shim

    class LibDevice:
        """libdevice as the interpreter lacks it: only what the sampler calls."""

        @staticmethod
        def log1p(x):
            with np.errstate(invalid="ignore"):  # the sampler masks out the rows where -ratio < -1
                return tl.tensor(interpreter_builder.unary_op(x.handle, np.log1p), x.type)

    shim.triton, shim.tl, shim.tldevice = triton, tl, LibDevice
    patch_once()
    from vllm.v1.worker.gpu.sample import gumbel
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler_utils as sampler

    assert sampler.triton is triton and gumbel.triton is triton, "vLLM's modules were imported before the shim"
    return triton, tl, gumbel, sampler


def run(logp, logq, drafts, seeds, pos):
    triton, _, _, sampler = _modules()

    @triton.jit
    def randomness(u_ptr, noise_ptr, seed_ptr, pos_ptr, G1: tl.constexpr, GP: tl.constexpr, V: tl.constexpr,
                   VP: tl.constexpr):
        # One program per row, over all its positions at once: the interpreter's cost is per program and per
        # operation, not per element, and these functions are elementwise in (seed, position, token).
        row = tl.program_id(0)
        seed = tl.load(seed_ptr + row)
        js = tl.arange(0, GP)
        at = tl.load(pos_ptr + row * G1 + js, mask=js < G1, other=0)
        tl.store(u_ptr + row * G1 + js, gumbel.tl_rand32(seed, at, includes_zero=False), mask=js < G1)
        keys = tl.arange(0, VP)[None, :]
        w = gumbel.murmur3_uniform32(seed, at[:, None], keys)
        tl.store(noise_ptr + (row * G1 + js[:, None]) * V + keys, -tl.log(-gumbel._log1p_neg_stable(w)),
                 mask=(js[:, None] < G1) & (keys < V))

    B, g = drafts.shape
    V = logp.shape[-1]
    seeds_t = torch.as_tensor(seeds, dtype=torch.int64)
    pos_t = torch.as_tensor(pos, dtype=torch.int64).reshape(-1)
    u = torch.empty(B * (g + 1), dtype=torch.float32)
    noise = torch.empty(B * (g + 1), V, dtype=torch.float32)
    randomness[(B,)](u, noise, seeds_t, pos_t, g + 1, triton.next_power_of_2(g + 1), V, triton.next_power_of_2(V))
    sampled_in = torch.zeros(B, g + 1, dtype=torch.int64)  # entry 0 of a request: the token before its drafts
    sampled_in[:, 1:] = torch.as_tensor(drafts, dtype=torch.int64)
    out = {"u": u.reshape(B, g + 1)[:, :g].numpy(), "noise": noise.reshape(B, g + 1, V).numpy()}
    for name, block in (("token_wise", False), ("block", True)):
        sampled, num_sampled = sampler.rejection_sample(
            torch.as_tensor(logp, dtype=torch.float32).reshape(B * (g + 1), V).contiguous(),
            None if logq is None else torch.as_tensor(logq, dtype=torch.float32).contiguous(),
            sampled_in.reshape(-1).contiguous(),
            torch.arange(0, B * (g + 1) + 1, g + 1, dtype=torch.int32),
            pos_t, torch.arange(B, dtype=torch.int32),
            torch.arange(B, dtype=torch.int32).repeat_interleave(g + 1),
            torch.arange(g + 1, dtype=torch.int32).repeat(B),
            torch.ones(B, dtype=torch.float32), seeds_t, g, use_block_verification=block)
        kept = num_sampled.long() - 1  # num_sampled counts the emitted token
        out[f"{name}_kept"] = kept.numpy()
        out[f"{name}_token"] = sampled[torch.arange(B), kept].numpy()
    return out


def main() -> None:
    for inputs, outputs in zip(sys.argv[1::2], sys.argv[2::2]):  # each pair in one process: imports once
        data = np.load(inputs)
        logq = data["logq"] if "logq" in data and data["logq"].size else None
        np.savez(outputs, **run(data["logp"], logq, data["drafts"], data["seeds"], data["pos"]))


if __name__ == "__main__":
    main()

"""Tree attention: each draft-tree token sees the whole context plus its own ancestors.

Verifying a draft tree in one target forward (SpecInfer, Miao et al. 2023; Medusa,
Cai et al. 2024; Sequoia, Chen et al. 2024) replaces the causal mask over the new
tokens by the tree's ancestor mask. This module holds the implementations specsim
times against each other. All share one calling convention::

    impl = IMPLEMENTATIONS[name](parents, context_len, device)   # masks built once
    out = impl(q, k, v)
    # q (B, H, N, D); k, v (B, H_kv, L + N, D) -> out (B, H, N, D)

The last N keys/values are the tree nodes in node order (node i sits at L + i),
`parents[i]` is node i's parent and -1 marks the root (node 0, the last verified
token, whose KV is computed in the same pass). H_kv may divide H (grouped-query
attention, heads grouped as in `repeat_interleave`).

Implementations:

* ``per_branch``  one causal SDPA call per root-to-leaf path (the baseline);
* ``dense``       one SDPA call with a boolean [context | ancestor] mask;
* ``flex``        one FlexAttention call with a block mask from the parent array
                  (compiled on CUDA, eager on CPU unless asked);
* ``lse_merge``   context and tree attended separately and merged by log-sum-exp:
                  the context part needs no mask, so it runs on the fastest
                  unmasked kernel with the GQA group folded into the query length
                  (each KV head read once), and the N x N tree part is tiny;
* ``causal``      plain causal attention over N new tokens; equal to tree attention
                  only for a chain, kept as the "no tree" yardstick.

`reference_tree_attention` is the plain float64/float32 definition every
implementation is checked against before it is timed.
"""

from __future__ import annotations

import math
import warnings
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from specsim.errors import SpecError

# -- trees as parent arrays ------------------------------------------------------


def validate_parents(parents: np.ndarray | list[int]) -> np.ndarray:
    """Return `parents` as int64 after checking it is one rooted tree (root 0, parent -1)."""
    arr = np.asarray(parents)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise SpecError(f"a tree's parent array must be a non-empty 1-D integer array, got {arr!r}")
    arr = arr.astype(np.int64)
    n = arr.size
    if arr[0] != -1:
        raise SpecError(f"tree node 0 must be the root (parent -1), got parent {arr[0]}")
    bad = [i for i in range(1, n) if not 0 <= arr[i] < n or arr[i] == i]
    if bad:
        i = bad[0]
        raise SpecError(f"tree node {i} has parent {arr[i]}, which is not another node in 0..{n - 1}")
    for i in range(n):  # every node must reach the root within n steps (no cycles)
        j, steps = i, 0
        while j != -1:
            j, steps = int(arr[j]), steps + 1
            if steps > n:
                raise SpecError(f"tree parent array has a cycle through node {i}: {arr.tolist()}")
    return arr


def ancestor_mask(parents: np.ndarray) -> np.ndarray:
    """(N, N) bool: [i, j] is True when node j is node i or one of its ancestors."""
    parents = validate_parents(parents)
    n = parents.size
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j != -1:
            mask[i, j] = True
            j = int(parents[j])
    return mask


def leaf_paths(parents: np.ndarray) -> list[np.ndarray]:
    """Root-to-leaf node-id paths, one per leaf, in leaf order."""
    parents = validate_parents(parents)
    has_child = np.zeros(parents.size, dtype=bool)
    has_child[parents[parents >= 0]] = True
    paths = []
    for leaf in np.flatnonzero(~has_child):
        path, j = [], int(leaf)
        while j != -1:
            path.append(j)
            j = int(parents[j])
        paths.append(np.array(path[::-1], dtype=np.int64))
    return paths


def is_chain(parents: np.ndarray) -> bool:
    """True when node i's parent is i - 1 for every i (a plain causal sequence)."""
    parents = np.asarray(parents)
    return bool(np.array_equal(parents, np.arange(-1, parents.size - 1)))


# -- the reference -----------------------------------------------------------------


def reference_tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, parents: np.ndarray
) -> torch.Tensor:
    """Tree attention by its definition: explicit scores, mask, softmax, in high precision.

    Computed in float64 on CPU and float32 elsewhere; returns that precision.
    Each node's allowed keys are found by walking its parent pointers here, not
    by the mask helpers above, so the check does not share their bugs.
    """
    parents = validate_parents(parents)
    batch, heads, n, dim = q.shape
    context_len = k.shape[2] - n
    group = heads // k.shape[1]
    hi = torch.float64 if q.device.type == "cpu" else torch.float32
    qf = q.to(hi)
    kf = k.to(hi).repeat_interleave(group, dim=1)  # (B, H, L + N, D)
    vf = v.to(hi).repeat_interleave(group, dim=1)
    allowed = torch.zeros(n, context_len + n, dtype=torch.bool, device=q.device)
    allowed[:, :context_len] = True
    for i in range(n):
        j = i
        while j != -1:
            allowed[i, context_len + j] = True
            j = int(parents[j])
    scores = (qf @ kf.transpose(-1, -2)) / math.sqrt(dim)  # (B, H, N, L + N)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ vf  # (B, H, N, D)


# -- implementations ---------------------------------------------------------------


class TreeAttention:
    """Base: holds the tree and context length; subclasses build masks in __init__."""

    name: ClassVar[str] = ""
    detail: str = ""  # which kernel/path does the work, shown in benchmark tables

    def __init__(self, parents: np.ndarray, context_len: int, device: str | torch.device = "cpu",
                 *, compile: bool = False) -> None:
        self.parents = validate_parents(parents)
        self.n_nodes = int(self.parents.size)
        self.context_len = int(context_len)
        self.device = torch.device(device)
        self.compiled = False

    @classmethod
    def supports(cls, parents: np.ndarray) -> bool:
        """Whether this implementation computes tree attention for this tree."""
        return True

    @property
    def calls_per_step(self) -> int:
        """Attention kernel launches per verification step (per layer)."""
        return 1

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _gqa(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        return q.shape[1] != k.shape[1]


class PerBranch(TreeAttention):
    """One causal SDPA call per root-to-leaf path: the context is re-read once per branch."""

    name = "per_branch"
    detail = "sdpa x leaves, causal lower-right"

    def __init__(self, parents, context_len, device="cpu", *, compile=False):
        super().__init__(parents, context_len, device)
        from torch.nn.attention.bias import causal_lower_right

        self.paths = [torch.as_tensor(p, device=self.device) for p in leaf_paths(self.parents)]
        self.masks = {len(p): causal_lower_right(len(p), self.context_len + len(p)) for p in self.paths}

    @property
    def calls_per_step(self) -> int:
        return len(self.paths)

    def __call__(self, q, k, v):
        ctx = self.context_len
        out = torch.empty_like(q)
        k_ctx, v_ctx = k[:, :, :ctx], v[:, :, :ctx]
        for path in self.paths:
            k_b = torch.cat([k_ctx, k[:, :, ctx + path]], dim=2)  # (B, H_kv, L + d, D)
            v_b = torch.cat([v_ctx, v[:, :, ctx + path]], dim=2)
            o = F.scaled_dot_product_attention(
                q[:, :, path], k_b, v_b, attn_mask=self.masks[len(path)], enable_gqa=self._gqa(q, k)
            )  # (B, H, d, D)
            out[:, :, path] = o  # shared prefixes are written once per branch, identically
        return out


class DenseMask(TreeAttention):
    """One SDPA call with a boolean (N, L + N) mask: [all context | ancestors]."""

    name = "dense"
    detail = "sdpa, bool mask"

    def __init__(self, parents, context_len, device="cpu", *, compile=False):
        super().__init__(parents, context_len, device)
        mask = np.ones((self.n_nodes, self.context_len + self.n_nodes), dtype=bool)
        mask[:, self.context_len:] = ancestor_mask(self.parents)
        self.mask = torch.as_tensor(mask, device=self.device)

    def __call__(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=self._gqa(q, k))


_COMPILED_FLEX = None


def _compiled_flex_attention():
    """`torch.compile(flex_attention)`, built once per process."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        # A sweep visits many shapes; without headroom dynamo would silently fall
        # back to eager after its default recompile limit and we would time that.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


class FlexBlockSparse(TreeAttention):
    """One FlexAttention call; its `mask_mod` reads the ancestor matrix of the parent array.

    The block mask skips (B, H, q-block, kv-block) tiles that are fully masked,
    so the tree part costs in proportion to its non-empty tiles. Compiled, this
    is a fused kernel; eager (the CPU default) it materialises the scores.
    """

    name = "flex"

    def __init__(self, parents, context_len, device="cpu", *, compile=False):
        super().__init__(parents, context_len, device)
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        ctx = self.context_len
        anc = torch.as_tensor(ancestor_mask(self.parents), device=self.device)  # (N, N)

        def tree_mask(b, h, q_idx, kv_idx):
            in_tree = kv_idx >= ctx
            return ~in_tree | (in_tree & anc[q_idx, (kv_idx - ctx).clamp(min=0)])

        self.block_mask = create_block_mask(
            tree_mask, None, None, self.n_nodes, ctx + self.n_nodes, device=self.device
        )
        self.compiled = bool(compile)
        if not compile:  # eager is chosen on purpose here (CPU); its advice to compile is noise
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        self.fn = _compiled_flex_attention() if compile else flex_attention
        self.detail = "flex_attention " + ("compiled" if compile else "eager")

    def __call__(self, q, k, v):
        return self.fn(q, k, v, block_mask=self.block_mask, enable_gqa=self._gqa(q, k))


def _attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Unmasked attention returning (out, lse) with lse (B, H, Lq) in float32."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, scale=scale)
        return out, lse.float()
    if q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16):
        res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
        return res[0], res[1].float()
    if q.device.type == "cuda":
        res = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False, scale=scale)
        return res[0], res[1][..., : q.shape[2]].float()  # lse may be padded along the query axis
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores, dim=-1)
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype), lse


class LseMerge(TreeAttention):
    """Context and tree attention computed apart, merged by log-sum-exp (FlashDecoding-style).

    Every tree token sees the entire context, so the context part needs no mask
    and the GQA group folds into the query axis: (B, H_kv, G*N, D) against
    (B, H_kv, L, D) reads each KV head once on the fastest unmasked kernel. The
    tree part is an N x N masked product done in float32.
    """

    name = "lse_merge"

    def __init__(self, parents, context_len, device="cpu", *, compile=False):
        super().__init__(parents, context_len, device)
        self.anc = torch.as_tensor(ancestor_mask(self.parents), device=self.device)  # (N, N)
        kind = self.device.type
        self.detail = {"cpu": "flash_for_cpu ctx + matmul tree", "cuda": "flash/efficient ctx + matmul tree"}.get(
            kind, "matmul ctx + matmul tree"
        )

    @property
    def calls_per_step(self) -> int:
        return 2

    def __call__(self, q, k, v):
        batch, heads, n, dim = q.shape
        kv_heads, ctx = k.shape[1], self.context_len
        group = heads // kv_heads
        scale = 1.0 / math.sqrt(dim)
        qg = q.reshape(batch, kv_heads, group * n, dim)  # (B, H_kv, G*N, D), heads grouped as repeat_interleave
        # tree part: (B, H_kv, G*N, N) scores against the tree's own keys
        k_tree, v_tree = k[:, :, ctx:].float(), v[:, :, ctx:].float()
        s_tree = (qg.float() @ k_tree.transpose(-1, -2)) * scale
        s_tree = s_tree.masked_fill(~self.anc.repeat(group, 1), float("-inf"))
        lse_tree = torch.logsumexp(s_tree, dim=-1)  # (B, H_kv, G*N)
        out = torch.softmax(s_tree, dim=-1) @ v_tree  # (B, H_kv, G*N, D)
        if ctx > 0:
            out_ctx, lse_ctx = _attention_with_lse(qg, k[:, :, :ctx], v[:, :, :ctx], scale)
            lse = torch.logaddexp(lse_ctx, lse_tree)
            out = out_ctx.float() * torch.exp(lse_ctx - lse)[..., None] + out * torch.exp(lse_tree - lse)[..., None]
        return out.to(q.dtype).reshape(batch, heads, n, dim)


class CausalChain(TreeAttention):
    """Plain causal attention over N new tokens (lower-right aligned): only a chain is a tree it computes."""

    name = "causal"
    detail = "sdpa, causal lower-right"

    def __init__(self, parents, context_len, device="cpu", *, compile=False):
        super().__init__(parents, context_len, device)
        if not is_chain(self.parents):
            raise SpecError("the 'causal' attention computes chains only; use a tree implementation for this tree")
        from torch.nn.attention.bias import causal_lower_right

        self.mask = causal_lower_right(self.n_nodes, self.context_len + self.n_nodes)

    @classmethod
    def supports(cls, parents):
        return is_chain(parents)

    def __call__(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=self._gqa(q, k))


IMPLEMENTATIONS: dict[str, type[TreeAttention]] = {
    cls.name: cls for cls in (PerBranch, DenseMask, FlexBlockSparse, LseMerge, CausalChain)
}

# (atol, rtol) for comparing an implementation with the reference, by input dtype
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-4, 2e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (3e-2, 3e-2),
}


def random_qkv(batch: int, heads: int, kv_heads: int, context_len: int, n_nodes: int, head_dim: int,
               *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int = 0):
    """Gaussian q (B, H, N, D) and k, v (B, H_kv, L + N, D) from a seeded generator."""
    if heads % kv_heads:
        raise SpecError(f"--heads {heads} must be a multiple of --kv-heads {kv_heads} (grouped-query attention)")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(batch, heads, n_nodes, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, context_len + n_nodes, head_dim, generator=gen)
    v = torch.randn(batch, kv_heads, context_len + n_nodes, head_dim, generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def max_violation(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, bool]:
    """(max |out - ref|, whether every entry is within the dtype's atol + rtol * |ref|)."""
    atol, rtol = TOLERANCES.get(out.dtype, (1e-2, 1e-2))
    diff = (out.to(ref.dtype) - ref).abs()
    ok = bool((diff <= atol + rtol * ref.abs()).all()) and bool(torch.isfinite(out).all())
    return float(diff.max()), ok

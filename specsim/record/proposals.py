"""The target along the draft's own proposals (`specsim cache --expand-target K`): what replaying block
verification of drafts sampled from q needs.

Block verification's decision to keep a prefix of the drafted chain depends on the target at prefixes of
the *drafted* chain, which leave the target's trajectory as soon as a draft differs from it. Given the
output the step emitted (which is what a replay on the target's trajectory conditions on), its law is a
product of factors on the trajectory and one expectation over the draft's continuation from where the
call left it (docs/design.md 2f; `specsim.verify.block_path_factors`, `block_chain_tails`). At every
position s of a trajectory this draws R chains of K tokens from the draft's law at s (the root: its
teacher-forced law, then one draft forward per depth, every chain of a chunk of positions in the same
forward), runs ONE target forward over all of them, each chain seeing the committed prefix of its own
position and its own earlier tokens (as `specsim.record.expand` does for the draft), and keeps what the
replay reads: per position the trajectory's factors for the calls starting there (K + K + 1 numbers) and
Π (1 − h_j) per chain for every call depth and chain length (R·K·K), not logits.
"""

from __future__ import annotations

import zlib
from typing import Mapping

import numpy as np
import torch

from specsim.record.kv import SlotKV
from specsim.verify import block_chain_tails, block_path_factors

QUERIES_PER_FORWARD = 512  # chain tokens fed per forward while recording (bounds the mask and the logits held)


def _laws(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


@torch.inference_mode()
def draw_chains(draft_kv: SlotKV, target_kv: SlotKV, q_root: torch.Tensor, p_root: torch.Tensor,
                first_position: np.ndarray, *, depth: int, chains: int, temperature: float,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R chains of K tokens drawn from the draft at each of c positions, and both models' laws along them.

    q_root, p_root (c, V): the draft's and the target's laws at each position (its teacher-forced ones);
    first_position (c,): the position id of each position's first chain token; each sees the first
    first_position committed entries of both caches (the prompt and the trajectory before it).
    Returns tokens (c, R, K), q_chain and p_chain (c, R, K, V): the laws at each chain node (node 1: the roots).
    Leaves nothing pending in either cache.
    """
    c, V = q_root.shape
    R, K = chains, depth
    w = c * R  # chain tokens per depth
    first = np.repeat(np.asarray(first_position, dtype=np.int64), R)  # (w,)
    q_chain = torch.empty((c, R, K, V), dtype=torch.float32, device=q_root.device)
    p_chain = torch.empty_like(q_chain)
    q_chain[:, :, 0] = q_root[:, None]
    p_chain[:, :, 0] = p_root[:, None]
    tokens = torch.empty((c, R, K), dtype=torch.long, device=q_root.device)
    tokens[:, :, 0] = torch.multinomial(q_chain[:, :, 0].reshape(w, V), 1, generator=generator).view(c, R)
    for m in range(1, K):  # feed each chain's token m (1-based) to the draft: the law of token m + 1
        attend = np.tile(np.eye(w, dtype=bool), (1, m))  # its own chain's fed tokens, itself last
        logits = draft_kv.forward(tokens[:, :, m - 1].reshape(1, w).cpu().numpy(),
                                  (first + m - 1 - draft_kv.lengths[0])[None], attend, visible=first[None])
        q_chain[:, :, m] = _laws(logits.view(c, R, V), temperature)
        tokens[:, :, m] = torch.multinomial(q_chain[:, :, m].reshape(w, V), 1, generator=generator).view(c, R)
    if K > 1:  # the target over every chain's first K − 1 tokens at once, chain-causal
        fed = tokens[:, :, : K - 1].reshape(1, w * (K - 1))
        position = (first[:, None] + np.arange(K - 1)[None]).reshape(-1)
        attend = np.kron(np.eye(w, dtype=bool), np.tril(np.ones((K - 1, K - 1), dtype=bool)))
        logits = target_kv.forward(fed.cpu().numpy(), (position - target_kv.lengths[0])[None], attend,
                                   visible=np.repeat(first, K - 1)[None])
        p_chain[:, :, 1:] = _laws(logits.view(c, R, K - 1, V), temperature)
    for kv in (draft_kv, target_kv):
        if kv.pending:
            kv.commit([np.zeros(0, dtype=np.int64)] * kv.rows)  # forget the chains
    return tokens, q_chain, p_chain


def target_along_proposals(target_model, drafts: Mapping[str, tuple], prompt_ids, tokens, p_logits: torch.Tensor, *,
                           temperature: float, depth: int, chains: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Per draft, block_keep (n, K), block_whole (n, K + 1) and block_tails (n, R, K, K) of one trajectory at T > 0.

    drafts: name -> (draft model, its teacher-forced logits (n, V) along the trajectory); p_logits (n, V): the
    target's. Logits at temperature 1; the laws are taken at `temperature`, the one the trajectory was sampled at.
    The target's cache is filled once and serves every draft. block_tails[s, r, i, γ − 1] is Π_{j=i+1..γ} (1 − h_j)
    along chain r drawn at s for the call started at s − i (0 where i > s or γ <= i). Each draft's chains are drawn
    from a generator seeded by `seed` and its name.
    """
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    y = np.asarray(tokens, dtype=np.int64)
    n, P = y.shape[0], prompt.shape[0]
    K, R = int(depth), int(chains)
    p_root = _laws(p_logits, temperature)
    p_path = p_root.double().cpu().numpy()
    target_kv = SlotKV(target_model)
    target_kv.start([np.concatenate([prompt, y[:-1]])])
    chunk = max(1, QUERIES_PER_FORWARD // (R * max(K - 1, 1)))
    out = {}
    for name, (draft_model, q_logits) in drafts.items():
        q_root = _laws(q_logits, temperature)
        a, keep, whole = block_path_factors(p_path, q_root.double().cpu().numpy(), y, K)
        tails = np.zeros((n, R, K, K), dtype=np.float32)
        generator = torch.Generator(device=p_root.device).manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
        draft_kv = SlotKV(draft_model)
        draft_kv.start([np.concatenate([prompt, y[:-1]])])
        for lo in range(0, n, chunk):
            t = np.arange(lo, min(n, lo + chunk))
            x, q_chain, p_chain = draw_chains(draft_kv, target_kv, q_root[t[0] : t[-1] + 1], p_root[t[0] : t[-1] + 1],
                                              P + t, depth=K, chains=R, temperature=temperature, generator=generator)
            x = x.cpu().numpy()
            for k, s in enumerate(t):
                branch = np.array([a[s - i, i] if i <= s else 0.0 for i in range(K)])  # a_i of the call from s − i
                tails[s] = block_chain_tails(branch, p_chain[k].double().cpu().numpy(),
                                             q_chain[k].double().cpu().numpy(), x[k])
        for i in range(1, K):  # no call started before the trajectory
            tails[:i, :, i] = 0.0
        out[name] = {"block_keep": keep, "block_whole": whole, "block_tails": tails}
    return out


def no_proposals(n: int, depth: int, chains: int) -> dict[str, np.ndarray]:
    """The rows of a greedy (T = 0) trajectory: block verification of point-mass drafts is token-wise
    verification (docs/design.md 2d), replayed by `greedy-draft`; nothing is drawn and these are never read."""
    K, R = int(depth), int(chains)
    return {"block_keep": np.zeros((n, K)), "block_whole": np.zeros((n, K + 1)),
            "block_tails": np.zeros((n, R, K, K), dtype=np.float32)}

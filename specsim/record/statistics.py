"""Per-position statistics computed where the models run, before any logit leaves the device.

The same quantities as `specsim.cache.stats` (the numpy reference, and the math in its
docstring), computed in torch from the models' float32 logits on their device: a GPU
recording ships a few hundred bytes per position instead of the full distributions, and
nothing is rounded to float16 before ranks and probabilities are taken. Positions are
processed in chunks so the (positions × vocabulary) working set stays bounded.
"""

from __future__ import annotations

import numpy as np
import torch

from specsim.cache.stats import StatsSpec, lossy_rule, sampling_placeholders

_NO_MASS = 1e-12  # as specsim.cache.stats
CHUNK_ELEMENTS = 1 << 24  # positions × vocabulary drawn for at once, and processed at once on a GPU (float64: 128 MB)
CPU_CHUNK_ELEMENTS = 1 << 20  # ... processed at once on a CPU: 8 MB arrays stay in cache (2.6x faster than 2^24
#                               on a 2-core Xeon, V = 49,152: 6.4 against 17.0 ms per position)


def target_stats(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> dict[str, np.ndarray]:
    """log p_t(y_t) at the trajectory's temperature (T = 0: T = 1), from (n, V) logits on any device."""
    T = temperature if temperature > 0 else 1.0
    y = tokens.to(logits.device, torch.long)
    logp = torch.log_softmax(logits.double() / T, dim=-1).gather(1, y[:, None])[:, 0]
    return {"logprob": logp.cpu().numpy(), "top_id": top_ids(logits.float(), 1)[:, 0].cpu().numpy().astype(np.int32)}


def draft_stats(p_logits: torch.Tensor, q_logits: torch.Tensor, tokens: torch.Tensor, temperature: float,
                spec: StatsSpec, generator: torch.Generator) -> dict[str, np.ndarray]:
    """A draft column's statistics (`specsim.cache.stats.draft_stats`), computed on the logits' device.

    The swor estimates' uniforms are drawn per block of CHUNK_ELEMENTS, whatever the device; a CPU then works
    through each block in pieces of CPU_CHUNK_ELEMENTS, which its caches hold. So a seed gives the same
    estimates in pieces as in whole blocks: on a CPU as on a GPU, and as before pieces existed."""
    n, V = q_logits.shape
    step = max(1, CHUNK_ELEMENTS // max(V, 1))
    piece = step if q_logits.device.type != "cpu" else max(1, CPU_CHUNK_ELEMENTS // max(V, 1))
    parts = []
    for a in range(0, n, step):
        b = min(n, a + step)
        uniforms = _swor_uniforms(b - a, temperature, spec, generator)
        parts += [_draft_chunk(p_logits[c : min(b, c + piece)], q_logits[c : min(b, c + piece)],
                               tokens[c : min(b, c + piece)], temperature, spec,
                               None if uniforms is None else uniforms[:, c - a : min(b, c + piece) - a])
                  for c in range(a, b, piece)]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _swor_uniforms(n: int, temperature: float, spec: StatsSpec, generator: torch.Generator) -> torch.Tensor | None:
    """(K - 1, n, M) the uniforms `acceptance_swor` draws for n positions, in its order (None: it draws none)."""
    if temperature <= 0 or spec.candidates < 3:
        return None
    return torch.stack([torch.rand((n, spec.swor_samples), generator=generator, dtype=torch.float64)
                        for _ in range(spec.candidates - 1)])


def _draft_chunk(p_logits, q_logits, tokens, temperature, spec: StatsSpec, uniforms) -> dict[str, np.ndarray]:
    device = q_logits.device
    y = tokens.to(device, torch.long)
    q32 = q_logits.float()
    n, V = q32.shape
    K = spec.candidates
    T = temperature if temperature > 0 else 1.0
    p = torch.softmax(p_logits.double() / T, dim=-1)
    q = torch.softmax(q_logits.double() / T, dim=-1)
    out = {"rank": token_rank(q32, y).cpu().numpy().astype(np.int32),
           "logprob": torch.log_softmax(q32.double() / T, dim=-1).gather(1, y[:, None])[:, 0].cpu().numpy(),
           "top_ids": top_ids(q32, spec.top_ids).cpu().numpy().astype(np.int32),
           "overlap": torch.minimum(p, q).sum(dim=1).cpu().numpy()}
    out.update(sampling_placeholders(n, K, spec))  # NaN at T = 0; filled below when sampling
    if temperature <= 0:
        return out
    out["pi_iid"] = acceptance_iid(p, q, y, K).float().cpu().numpy()
    reps = acceptance_swor(p, q, y, K, spec.swor_samples, uniforms=uniforms)  # (n, M, K)
    out["pi_swor"] = reps.mean(dim=1).float().cpu().numpy()
    out["pi_swor_groups"] = reps.view(n, spec.swor_groups, -1, K).mean(dim=2).cpu().numpy().astype(np.float16)
    for j, (alpha, tv) in enumerate(lossy_acceptances([lossy_rule(label) for label in spec.lossy], p, q)):
        out["lossy_alpha"][:, j], out["lossy_tv"][:, j] = alpha.cpu().numpy(), tv.cpu().numpy()
    return out


def token_rank(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(n,) rank of y under each row: larger entries, plus equal ones with a lower id."""
    ly = logits.gather(1, y[:, None])  # (n, 1)
    ids = torch.arange(logits.shape[1], device=logits.device)[None, :]
    return ((logits > ly) | ((logits == ly) & (ids < y[:, None]))).sum(dim=1)


def top_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """(n, k) the k largest entries' ids, ties broken by the lower id (padded with -1 past V)."""
    n, V = logits.shape
    m = min(V, k + 8)
    vals, ids = torch.topk(logits, m, dim=1)  # (n, m), ties in no particular order
    # order by (value desc, id asc): sort by id, then a stable sort by value
    ids, perm = torch.sort(ids, dim=1)
    vals = vals.gather(1, perm)
    vals, perm = torch.sort(vals, dim=1, descending=True, stable=True)
    ids = ids.gather(1, perm)
    if m < V:  # a tie run reaching the edge of the top-m may hide a lower id outside it
        for i in torch.nonzero(vals[:, m - 1] == vals[:, min(k, m) - 1]).flatten().tolist():
            ids[i] = torch.sort(-logits[i], stable=True).indices[:m]
    ids = ids[:, :k]
    if ids.shape[1] < k:
        ids = torch.cat([ids, ids.new_full((n, k - ids.shape[1]), -1)], dim=1)
    return ids


def _safe(x: torch.Tensor) -> torch.Tensor:
    """x where positive, else 1: a divisor for `torch.where(x > 0, a / _safe(x), ...)`, exact for tiny x."""
    return torch.where(x > 0, x, torch.ones_like(x))


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, idx[..., None])[..., 0]


def acceptance_iid(p: torch.Tensor, q: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """(n, k) exact π_i(y) for i.i.d. candidates (`specsim.cache.stats.acceptance_iid`)."""
    p_y, q_y = _take(p, y), _take(q, y)
    inv_p_y = torch.where(p_y > 0, 1.0 / torch.where(p_y > 0, p_y, torch.ones_like(p_y)), torch.zeros_like(p_y))
    out = torch.zeros((p.shape[0], k), dtype=torch.float64, device=p.device)
    r, survive = p, torch.ones_like(p_y)
    for i in range(k):
        out[:, i] = survive * torch.minimum(q_y, _take(r, y)) * inv_p_y
        if i + 1 < k:
            survive = survive * (1.0 - torch.minimum(q, r).sum(dim=1)).clamp(0.0, 1.0)
            nxt = (r - q).clamp_min(0.0)
            total = nxt.sum(dim=1, keepdim=True)
            r = torch.where(total > _NO_MASS, nxt / total.clamp_min(1e-300), r)
    return out


def acceptance_swor(p: torch.Tensor, q: torch.Tensor, y: torch.Tensor, k: int, samples: int,
                    generator: torch.Generator | None = None, *, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """(n, samples, k) estimates of π_i(y) without replacement (`specsim.cache.stats.acceptance_swor`).

    Exact for i ≤ 1; for i ≥ 2, Monte-Carlo over the residual's closed shape, all positions
    and samples at once (batched searches over each position's sorted p/q). The k - 1 draws'
    uniforms come from `generator` (CPU) or are given, (k - 1, n, samples) (`_swor_uniforms`).
    """
    q = q / q.sum(dim=1, keepdim=True)
    n, V = p.shape
    dev = p.device
    p_y, q_y = _take(p, y), _take(q, y)
    inv_p_y = torch.where(p_y > 0, 1.0 / torch.where(p_y > 0, p_y, torch.ones_like(p_y)), torch.zeros_like(p_y))
    out = torch.zeros((n, samples, k), dtype=torch.float64, device=dev)
    out[:, :, 0] = (torch.minimum(p_y, q_y) * inv_p_y)[:, None]
    if k == 1:
        return out
    rejected = (q - p).clamp_min(0.0).scatter(1, y[:, None], 0.0)
    z1 = (p - q).clamp_min(0.0).sum(dim=1)
    r1_y = torch.where(z1 > _NO_MASS, (p_y - q_y).clamp_min(0.0) / z1.clamp_min(1e-300), torch.zeros_like(z1))
    rest = 1.0 - q  # Σ_{v≠x} q(v); only a row's largest entry can cancel, so it gets the others' sum
    top = q.argmax(dim=1, keepdim=True)
    rest.scatter_(1, top, q.scatter(1, top, 0.0).sum(dim=1, keepdim=True))
    q1_y = torch.where(rest > 0, q_y[:, None] / _safe(rest), torch.zeros_like(rest))
    out[:, :, 1] = ((rejected * torch.minimum(q1_y, r1_y[:, None])).sum(dim=1) * inv_p_y)[:, None]
    if k == 2:
        return out
    ratio = torch.where(q > 0, p / torch.where(q > 0, q, torch.ones_like(q)), torch.full_like(q, float("inf")))
    neg, order = torch.sort(-ratio, dim=1)  # ascending -p/q: live sets are prefixes (ties: any order)
    ps, qs = p.gather(1, order), q.gather(1, order)
    P, Q = ps.cumsum(dim=1), qs.cumsum(dim=1)
    starts = Q - qs
    y_pos = torch.argmax((order == y[:, None]).to(torch.int8), dim=1)  # (n,)
    # undrawn mass 1 − Q_i without cancellation (see specsim.cache.stats._later_candidates): the K + 8 largest q
    # are tracked one by one, the rest as one sum from which only drawn small tokens are subtracted
    n_big = min(V, k + 8)
    q_big, big = torch.topk(qs, n_big, dim=1)  # (n, B) values and positions in `order`
    small_mass = qs.scatter(1, big, 0.0).sum(dim=1, keepdim=True)  # (n, 1) summed, not subtracted
    big_left = torch.ones((n, samples, n_big), dtype=torch.bool, device=dev)
    small_drawn = torch.zeros((n, samples), dtype=torch.float64, device=dev)
    c = torch.zeros((n, samples), dtype=torch.float64, device=dev)
    z = torch.ones_like(c)
    weight = torch.ones_like(c)
    drawn = torch.zeros((n, samples, 0), dtype=torch.long, device=dev)
    q_yy, p_yy = q_y[:, None], p_y[:, None]
    for i in range(k):
        rest = (small_mass - small_drawn).clamp_min(0.0) + (big_left * q_big[:, None, :]).sum(dim=2)
        if i >= 2:
            fresh = ~(drawn == y_pos[:, None, None]).any(dim=2)
            q_i_y = torch.where(rest > 0, q_yy / _safe(rest), torch.zeros_like(rest))
            r_i_y = torch.where(z > _NO_MASS, (p_yy - c * q_yy).clamp_min(0.0) / z.clamp_min(1e-300),
                                torch.zeros_like(z))
            out[:, :, i] = weight * fresh * torch.minimum(q_i_y, r_i_y) * inv_p_y[:, None]
        if i + 1 == k:
            break
        alive = rest > 1e-12 * small_drawn  # undrawn mass left, beyond the rounding of what was subtracted
        # drawn from the (CPU) generator, then moved: a seed gives the same uniforms on any device
        u = (torch.rand((n, samples), generator=generator, dtype=torch.float64) if uniforms is None
             else uniforms[i]).to(dev) * rest
        for m in range(drawn.shape[2]):
            d = drawn[:, :, m]
            u = u + torch.where(u >= starts.gather(1, d), qs.gather(1, d), torch.zeros_like(u))
        x = torch.searchsorted(Q, u, right=True).clamp_max(V - 1)  # (n, M)
        q_x, p_x = qs.gather(1, x), ps.gather(1, x)
        denom = z * q_x
        a = torch.where(alive & (z > _NO_MASS) & (q_x > 0),
                        ((p_x - c * q_x).clamp_min(0.0) * rest / torch.where(denom > 0, denom, torch.ones_like(denom))
                         ).clamp_max(1.0),
                        torch.ones_like(c))
        weight = weight * (1.0 - a)
        c = c + torch.where(alive, z / _safe(rest), torch.zeros_like(c))
        hit = (x[:, :, None] == big[:, None, :]) & alive[:, :, None]  # (n, M, B)
        big_left = big_left & ~hit
        small_drawn = small_drawn + torch.where(alive & ~hit.any(dim=2), q_x, torch.zeros_like(q_x))
        drawn = torch.sort(torch.cat([drawn, x[:, :, None]], dim=2), dim=2).values
        live = torch.searchsorted(neg, -c, right=False)  # tokens with p/q > c
        at = (live - 1).clamp_min(0)
        z = torch.where(live > 0, P.gather(1, at) - c * Q.gather(1, at), torch.zeros_like(c)).clamp_min(0.0)
    return out


def lossy_acceptances(rules, p: torch.Tensor, q: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(α, TV) per row for each rule (`specsim.cache.stats.lossy_acceptance`); the renormalised q, the entropy and
    the residual law the p >= λq rules fall back to are computed once for all of them."""
    q = q / q.sum(dim=1, keepdim=True)
    shared = {}

    def residual():
        if "residual" not in shared:
            r = (p - q).clamp_min(0.0)
            total = r.sum(dim=1, keepdim=True)
            shared["residual"] = torch.where(total > _NO_MASS, r / total.clamp_min(1e-300), p)
        return shared["residual"]

    def entropy():
        if "entropy" not in shared:
            shared["entropy"] = -torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))),
                                             torch.zeros_like(p)).sum(dim=1)
        return shared["entropy"]

    out = []
    for rule in rules:
        if rule.name == "typical":
            h = entropy()
            threshold = torch.minimum(torch.full_like(h, rule.eps), rule.delta * torch.exp(-h))
            ok, fallback = p > threshold[:, None], p
        else:
            ok, fallback = p >= rule.lam * q, residual()
        alpha = (q * ok).sum(dim=1).clamp(0.0, 1.0)
        rejected = (q * ~ok).sum(dim=1, keepdim=True)
        law = torch.where(ok, q, torch.zeros_like(q)) + rejected * fallback
        out.append((alpha, 0.5 * (law - p).abs().sum(dim=1)))
    return out

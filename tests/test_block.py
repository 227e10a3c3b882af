"""Block verification (Sun et al., ICLR 2025; vLLM's `rejection_sample_method="block"`), checked by enumeration.

A toy language with context-dependent target and draft laws over a few tokens: every drafted
chain, every number of kept drafts and every correction is enumerated with its exact probability, and
what the step emits, continued by sampling the target, must have the target's law. Wrong rules (a
threshold h_i = a_i, a residual without its a_τ weight) must fail the same check.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specsim.verify import (block_correction, block_kept_law, block_thresholds, token_wise_kept_law, verify_block)

class Toy:
    """p(. | prefix) and q(. | prefix) over `vocab` tokens, a Dirichlet draw per prefix."""

    def __init__(self, seed: int, gamma: int, concentration: float = 1.0, vocab: int = 3):
        rng = np.random.default_rng(seed)
        self.gamma, self.vocab = gamma, vocab
        prefixes = [t for n in range(gamma + 2) for t in itertools.product(range(vocab), repeat=n)]
        self.p = {t: rng.dirichlet(np.full(vocab, concentration)) for t in prefixes}
        self.q = {t: rng.dirichlet(np.full(vocab, concentration)) for t in prefixes}

    def rows(self, x: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(p_rows, q_rows) along the drafted chain x."""
        return (np.stack([self.p[x[:i]] for i in range(len(x) + 1)]),
                np.stack([self.q[x[:i]] for i in range(len(x))]))

    def draws(self):
        """Every chain the draft can draw, with its probability."""
        for x in itertools.product(range(self.vocab), repeat=self.gamma):
            yield x, float(np.prod([self.q[x[:i]][x[i]] for i in range(self.gamma)]))

    def target_law(self, n: int) -> dict[tuple[int, ...], float]:
        return {s: float(np.prod([self.p[s[:i]][s[i]] for i in range(n)]))
                for s in itertools.product(range(self.vocab), repeat=n)}


def emitted_law(toy: Toy, kept_law=block_kept_law, correction=block_correction) -> dict[tuple[int, ...], float]:
    """The law of the first γ+1 tokens: one verification step, then the target sampling what is left."""
    n = toy.gamma + 1
    out: dict[tuple[int, ...], float] = {}
    for x, weight in toy.draws():
        p_rows, q_rows = toy.rows(x)
        for kept, p_kept in enumerate(kept_law(p_rows, q_rows, x)):
            for y, p_y in enumerate(correction(p_rows, q_rows, x, kept)):
                head = x[:kept] + (y,)
                for rest in itertools.product(range(toy.vocab), repeat=n - len(head)):
                    s = head + rest
                    cont = np.prod([toy.p[s[:i]][s[i]] for i in range(len(head), n)])
                    out[s] = out.get(s, 0.0) + weight * p_kept * p_y * cont
    return out


def _tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.parametrize("seed, gamma, concentration, vocab", [(0, 2, 1.0, 3), (1, 3, 1.0, 3), (2, 3, 0.3, 3),
                                                               (3, 2, 5.0, 3), (4, 2, 0.5, 5)])
def test_block_verification_emits_the_target_law(seed, gamma, concentration, vocab):
    toy = Toy(seed, gamma, concentration, vocab)
    assert _tv(emitted_law(toy), toy.target_law(gamma + 1)) < 1e-12


def kept_with_h_equal_a(p_rows, q_rows, x):
    """A wrong rule: block verification with the threshold h_i = a_i (each prefix kept with its joint ratio)."""
    a, _ = block_thresholds(p_rows, q_rows, x)
    law, tail = np.empty(len(a)), 1.0
    for i in range(len(a) - 1, 0, -1):
        law[i], tail = a[i] * tail, tail * (1 - a[i])
    law[0] = tail
    return law


def correction_without_weight(p_rows, q_rows, x, kept):
    """A wrong correction for block verification (token-wise's own residual): norm(max(p − q, 0)), no a_τ weight."""
    if kept == len(x):
        return p_rows[kept]
    r = np.maximum(p_rows[kept] - q_rows[kept], 0.0)
    return r / r.sum() if r.sum() > 1e-12 else p_rows[kept]


def test_wrong_block_rules_do_not():
    """The check can fail: a threshold h_i = a_i (keep each prefix with its joint ratio), or the correction drawn
    from norm(max(p - q, 0)) without the a_τ weight, changes the law of what is emitted (five tokens: with three,
    the residuals here often have one token of support, where the weight cannot matter)."""
    toy = Toy(1, 3, vocab=5)

    target = toy.target_law(4)
    assert _tv(emitted_law(toy), target) < 1e-12
    assert _tv(emitted_law(toy, kept_law=kept_with_h_equal_a), target) > 1e-3
    assert _tv(emitted_law(toy, correction=correction_without_weight), target) > 1e-3


@pytest.mark.parametrize("seed", range(6))
def test_block_keeps_at_least_as_many_drafts_as_token_wise_verification(seed):
    """Sampled drafts: more kept in expectation over the drafted chains (the paper's optimality), here strictly."""
    toy = Toy(seed, 3, 0.5)
    block = token = 0.0
    for x, weight in toy.draws():
        p_rows, q_rows = toy.rows(x)
        block += weight * block_kept_law(p_rows, q_rows, x) @ np.arange(4)
        token += weight * token_wise_kept_law(p_rows, q_rows, x) @ np.arange(4)
    assert block > token + 1e-6, (block, token)


@pytest.mark.parametrize("seed", range(8))
def test_for_point_mass_drafts_block_verification_is_token_wise_verification(seed):
    """Greedy drafting (q a point mass at each draft): a_i = Π p_j(x_j) =: P_i, so h_i = (P_i − P_{i+1}) / (1 − P_{i+1})
    and P(τ = i) = P_i − P_{i+1}, token-wise's law; the correction is p_{τ+1} without x_{τ+1} in both."""
    rng = np.random.default_rng(seed)
    gamma = int(rng.integers(1, 6))
    p_rows = rng.dirichlet(np.full(5, 0.5), size=gamma + 1)
    x = rng.integers(0, 5, size=gamma)
    q_rows = np.eye(5)[x]
    np.testing.assert_allclose(block_kept_law(p_rows, q_rows, x), token_wise_kept_law(p_rows, q_rows, x), atol=1e-12)
    for kept in range(gamma):
        without = np.where(np.arange(5) == x[kept], 0.0, p_rows[kept])
        np.testing.assert_allclose(block_correction(p_rows, q_rows, x, kept), without / without.sum(), atol=1e-12)


def test_verify_block_draws_from_its_law():
    """The function live decoding would run: its kept counts match block_kept_law within 4 standard errors."""
    toy = Toy(4, 3, 0.5)
    x = max(toy.draws(), key=lambda d: d[1])[0]
    p_rows, q_rows = toy.rows(x)
    law = block_kept_law(p_rows, q_rows, x)
    rng = np.random.default_rng(0)
    n = 20_000
    counts = np.bincount([verify_block(p_rows, q_rows, x, rng).kept for _ in range(n)], minlength=4) / n
    se = np.sqrt(law * (1 - law) / n)
    assert np.all(np.abs(counts - law) <= 4 * se + 1e-12), (counts, law)

"""Block verification replayed on the output: the law of the drafts kept given what the step emitted.

A replay walks the target's own trajectory y, so it needs P(τ = i | the step emitted y_1..y_{i+1}),
not P(τ = i | the drafts). docs/design.md 2f derives it:

    P(τ = i | y) = c_i · E_{x_{i+1..γ} ~ q(· | y_<=i)} [Π_{j=i+1..γ} (1 − h_j)],   i < γ,
    P(τ = γ | y) = Π_{j<=γ} (q_j(y_j) / p_j(y_j)) · a_γ,

c_i = Π_{j<=i} q_j(y_j) / Π_{j<=i+1} p_j(y_j) · h_i · r_i(y_{i+1}) (`specsim.verify.block_path_factors`), the
expectation over the draft's continuation after it left the output (`block_chain_tails`). Here every
drafted chain, kept count and correction of a toy language is enumerated with its probability, Bayes'
rule gives the law given the output, and the formula must equal it for every output; with chains
sampled from q (what `cache --expand-target` records) it must agree within 4 standard errors. The
same check rejects replays that are wrong in the ways a replay could be: token-wise verification's
law, the continuation read along the output instead of drawn from q (what a cache recorded only
along the target's trajectory would give), and a rule with h_i = a_i.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from specsim.verify import (block_chain_tails, block_correction, block_kept_law, block_path_factors,
                            token_wise_kept_law)
from tests.test_block import correction_without_weight, kept_with_h_equal_a


class LazyToy:
    """p(. | prefix) and q(. | prefix) over `vocab` tokens: a Dirichlet draw per prefix, any prefix length."""

    def __init__(self, seed: int, vocab: int = 3, concentration: float = 1.0):
        self.seed, self.vocab, self.concentration = seed, vocab, concentration
        self._laws: dict = {}

    def _law(self, which: int, prefix: tuple[int, ...]) -> np.ndarray:
        key = (which, tuple(int(v) for v in prefix))
        if key not in self._laws:
            rng = np.random.default_rng([self.seed, which, zlib.crc32(repr(key[1]).encode())])
            self._laws[key] = rng.dirichlet(np.full(self.vocab, self.concentration))
        return self._laws[key]

    def p(self, prefix) -> np.ndarray:
        return self._law(0, tuple(prefix))

    def q(self, prefix) -> np.ndarray:
        return self._law(1, tuple(prefix))

    def rows(self, x: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        return (np.stack([self.p(x[:i]) for i in range(len(x) + 1)]),
                np.stack([self.q(x[:i]) for i in range(len(x))]))


def block_output_law(keep_row, whole_row, tails, gamma: int) -> np.ndarray:
    """The formula of the module docstring for one call verifying γ drafts (`specsim.sim.policies.block_table`
    computes it for every start at once): (γ+1,) P(τ = i | the output). keep_row, whole_row: one start's rows of
    `block_path_factors`; tails (K, K) or (R, K, K): E[Π (1 − h_j)] at the call's depth i (row i: from the
    position the call left the output at depth i; `block_chain_tails`, averaged over chains when R is given)."""
    t = np.asarray(tails, dtype=np.float64)
    t = t.mean(axis=0) if t.ndim == 3 else t
    law = np.zeros(gamma + 1)
    for i in range(gamma):
        law[i] = keep_row[i] * t[i, gamma - 1]
    law[gamma] = whole_row[gamma]
    return law


def brute_force(toy: LazyToy, gamma: int, y: tuple[int, ...], kept_law=block_kept_law,
                correction=block_correction) -> np.ndarray:
    """P(τ = i | the step emitted y_1..y_{i+1}) by enumerating every drafted chain (Bayes' rule)."""
    law = np.zeros(gamma + 1)
    for x in itertools.product(range(toy.vocab), repeat=gamma):
        p_rows, q_rows = toy.rows(x)
        weight = float(np.prod([q_rows[j, x[j]] for j in range(gamma)]))
        kept = kept_law(p_rows, q_rows, x)
        for i in range(gamma + 1):
            if x[:i] == y[:i]:
                law[i] += weight * kept[i] * correction(p_rows, q_rows, x, i)[y[i]]
    target = np.cumprod([toy.p(y[:j])[y[j]] for j in range(gamma + 1)])  # Π_{j<=i+1} p_j(y_j)
    return law / target


def path_of(toy: LazyToy, y: tuple[int, ...]):
    """(p_path, q_path) along the output y."""
    return (np.stack([toy.p(y[:s]) for s in range(len(y))]), np.stack([toy.q(y[:s]) for s in range(len(y))]))


def chain_rows(toy: LazyToy, prefix: tuple[int, ...], chains) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p_chain, q_chain, tokens) of chains drawn after `prefix`."""
    p = np.stack([[toy.p(prefix + c[:m]) for m in range(len(c))] for c in chains])
    q = np.stack([[toy.q(prefix + c[:m]) for m in range(len(c))] for c in chains])
    return p, q, np.asarray(chains, dtype=np.int64)


def exact_tails(toy: LazyToy, y, a, gamma: int) -> np.ndarray:
    """(γ, γ): row i the exact E[Π (1 − h_j)] of a call at depth i, by enumerating the continuation from y_<=i."""
    out = np.zeros((gamma, gamma))
    for i in range(gamma):
        length = gamma - i
        chains = list(itertools.product(range(toy.vocab), repeat=length))
        p, q, x = chain_rows(toy, y[:i], chains)
        weight = np.prod(q[np.arange(len(chains))[:, None], np.arange(length)[None, :], x], axis=1)
        tails = block_chain_tails(np.full(length, a[0, i]), p, q, x)[:, 0, :]  # (chains, length): γ' = i+1..γ
        out[i, i:] = weight @ tails
    return out


def formula(toy: LazyToy, gamma: int, y, tails=None) -> np.ndarray:
    p_path, q_path = path_of(toy, y)
    a, keep, whole = block_path_factors(p_path, q_path, y, gamma)
    tails = exact_tails(toy, y, a, gamma) if tails is None else tails
    return block_output_law(keep[0], whole[0], tails, gamma)


CASES = [(0, 2, 3, 1.0), (1, 3, 3, 1.0), (2, 3, 3, 0.3), (3, 2, 4, 5.0), (4, 2, 5, 0.5)]


@pytest.mark.parametrize("seed, gamma, vocab, concentration", CASES)
def test_the_law_given_the_output_is_bayes_rule_on_the_enumerated_rule(seed, gamma, vocab, concentration):
    toy = LazyToy(seed, vocab, concentration)
    worst = 0.0
    for y in itertools.product(range(vocab), repeat=gamma + 1):
        truth = brute_force(toy, gamma, y)
        assert truth.sum() == pytest.approx(1.0, abs=1e-9)
        worst = max(worst, float(np.abs(formula(toy, gamma, y) - truth).max()))
    assert worst < 1e-9


@pytest.mark.parametrize("seed, gamma, vocab, concentration", CASES)
def test_wrong_replays_fail_the_same_check(seed, gamma, vocab, concentration):
    """The check above has teeth: each wrong replay misses the enumerated law by a wide margin somewhere."""
    toy = LazyToy(seed, vocab, concentration)
    gaps = {"token-wise": 0.0, "continuation along the output": 0.0, "h = a": 0.0}
    for y in itertools.product(range(vocab), repeat=gamma + 1):
        truth = brute_force(toy, gamma, y)
        token_wise = brute_force(toy, gamma, y, token_wise_kept_law, correction_without_weight)
        gaps["token-wise"] = max(gaps["token-wise"], float(np.abs(token_wise - truth).max()))
        wrong_h = brute_force(toy, gamma, y, kept_with_h_equal_a)
        gaps["h = a"] = max(gaps["h = a"], float(np.abs(wrong_h - truth).max()))
        p_path, q_path = path_of(toy, y)
        a, _, _ = block_path_factors(p_path, q_path, y, gamma)
        along = np.zeros((gamma, gamma))
        for i in range(gamma):  # the output's own continuation as the draft's only chain
            p, q, x = chain_rows(toy, y[:i], [y[i:gamma]])
            along[i, i:] = block_chain_tails(np.full(gamma - i, a[0, i]), p, q, x)[0, 0]
        gaps["continuation along the output"] = max(gaps["continuation along the output"],
                                                    float(np.abs(formula(toy, gamma, y, along) - truth).max()))
    assert min(gaps.values()) > 0.01, gaps


@pytest.mark.parametrize("seed, gamma, vocab, concentration", [(5, 3, 3, 1.0), (6, 4, 3, 0.5)])
def test_sampled_continuations_estimate_the_law_without_bias(seed, gamma, vocab, concentration):
    """What a recording holds: R chains drawn from q where the call left the output. The estimate's mean is the
    exact law (within 4 standard errors over independent draws of the R chains)."""
    toy = LazyToy(seed, vocab, concentration)
    rng = np.random.default_rng(seed)
    R, draws = 8, 300
    for y in [tuple(int(v) for v in rng.integers(0, vocab, gamma + 1)) for _ in range(3)]:
        truth = brute_force(toy, gamma, y)
        p_path, q_path = path_of(toy, y)
        a, keep, whole = block_path_factors(p_path, q_path, y, gamma)
        estimates = []
        for _ in range(draws):
            tails = np.zeros((R, gamma, gamma))
            for i in range(gamma):
                chains = []
                for _r in range(R):
                    c: tuple[int, ...] = ()
                    for _m in range(gamma):  # K-token chains, as recorded; the call at depth i reads gamma - i
                        c += (min(int(np.searchsorted(np.cumsum(toy.q(y[:i] + c)), rng.random(), side="right")),
                                  vocab - 1),)
                    chains.append(c)
                p, q, x = chain_rows(toy, y[:i], chains)
                tails[:, i] = block_chain_tails(a[0], p, q, x)[:, i]
            estimates.append(block_output_law(keep[0], whole[0], tails, gamma))
        estimates = np.asarray(estimates)
        mean, se = estimates.mean(axis=0), estimates.std(axis=0, ddof=1) / np.sqrt(draws)
        assert np.all(np.abs(mean - truth) <= 4 * se + 1e-12), (y, mean, truth, se)

"""A toy language model whose next-token law is known for every prefix, and real
speculative decoding on it: the ground truth the simulator's coupling is checked against.

    from tests.toy_markov import MarkovLM, sticky_pair, speculative_decode, record_cache

The target and the draft are Markov chains of order 1 or 2 over a small vocabulary
(`MarkovLM`). `speculative_decode` runs the real algorithm with the one implementation of
each verification rule in `specsim.verify`: the draft proposes a static tree (rank r = the
draft's r-th most likely token for greedy; the r-th of k candidates drawn from q, i.i.d. or
without replacement, for sampling), the target walks down it verifying each node's
children, and the call emits the accepted path plus one target token. `record_cache`
writes target-sampled trajectories with the chains' log-probabilities as logits, which is
what the simulator replays.

`sticky_pair` builds a pair on which acceptance is strongly autocorrelated: the target
lingers in an "easy" block of tokens where the draft nearly agrees with it, or in a "hard"
block where it does not. There a positional / i.i.d. acceptance model is visibly wrong,
so agreement with the real loop means something.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from specsim import verify
from specsim.cache.layout import CacheSpec, PromptRecord
from specsim.cache.writer import CacheWriter
from specsim.trees import Tree


@dataclass(frozen=True)
class MarkovLM:
    """Next-token law given the last `order` tokens, softmax of float16-exact logits.

    float16-exact logits make the cache (which stores float16) hold exactly this model.
    """

    logits: np.ndarray  # (V**order, V) float64 holding float16 values
    order: int = 1  # tokens of context the law depends on

    def __post_init__(self) -> None:
        z = self.logits - self.logits.max(axis=1, keepdims=True)
        object.__setattr__(self, "trans", np.exp(z) / np.exp(z).sum(axis=1, keepdims=True))

    @classmethod
    def from_probs(cls, probs: np.ndarray, order: int = 1) -> "MarkovLM":
        return cls(np.log(probs).astype(np.float16).astype(np.float64), order)

    @property
    def vocab(self) -> int:
        return int(self.logits.shape[1])

    def state(self, context: Sequence[int]) -> int:
        s = 0
        for tok in context[len(context) - self.order :]:
            s = s * self.vocab + int(tok)
        return s

    def dist(self, context: Sequence[int]) -> np.ndarray:
        """(V,) p(· | context); the context needs at least `order` tokens."""
        return self.trans[self.state(context)]

    def logits_along(self, prompt: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """(n, V) logits at every position of `tokens` given prompt + the tokens before it."""
        seq = list(prompt) + list(tokens)
        return np.stack([self.logits[self.state(seq[: len(prompt) + i])] for i in range(len(tokens))])


def sticky_pair(vocab: int = 8, order: int = 1, *, stay: float = 0.9, seed: int = 0) -> tuple[MarkovLM, MarkovLM]:
    """(target, draft): two blocks of tokens; the target stays in its block w.p. `stay`.

    In the easy block (first half) the draft is 0.9·p + 0.1·noise; in the hard block it is an
    unrelated random law. Rows are distinct and tie-free, so greedy ranks are well defined.
    """
    rng = np.random.default_rng(seed)
    n_states = vocab**order
    half = vocab // 2
    target = np.empty((n_states, vocab))
    draft = np.empty((n_states, vocab))
    for s in range(n_states):
        last = s % vocab
        easy = last < half
        home = np.arange(vocab) < half if easy else np.arange(vocab) >= half
        w = rng.dirichlet(np.full(vocab, 0.8)) + 1e-3
        p = np.where(home, stay * w / w[home].sum(), (1 - stay) * w / w[~home].sum())
        target[s] = p / p.sum()
        noise = rng.dirichlet(np.full(vocab, 0.8))
        q = 0.9 * target[s] + 0.1 * noise if easy else 0.5 * noise + 0.5 * rng.dirichlet(np.ones(vocab))
        draft[s] = q / q.sum()
    return MarkovLM.from_probs(target, order), MarkovLM.from_probs(draft, order)


def sample_tokens(lm: MarkovLM, prompt: Sequence[int], n: int, rng: np.random.Generator, *, greedy: bool) -> np.ndarray:
    """n tokens from the chain (argmax when greedy)."""
    seq = list(prompt)
    for _ in range(n):
        p = lm.dist(seq)
        seq.append(int(np.argmax(p)) if greedy else int(rng.choice(lm.vocab, p=p)))
    return np.array(seq[len(prompt) :], dtype=np.int32)


def random_prompts(vocab: int, order: int, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, order + 1).astype(np.int32) for _ in range(count)]


# ---------------------------------------------------------------------------- the real loop


@dataclass(frozen=True)
class DecodeResult:
    tokens: np.ndarray  # (n,) emitted tokens
    calls: int  # target calls (verification passes)
    accepted: int  # draft tokens accepted over all calls
    accepted_per_call: tuple[int, ...]  # A of each call, in order


def _draft_children(q: np.ndarray, k: int, ranks: np.ndarray, rng, *, greedy: bool,
                    scheme: str) -> np.ndarray:
    """Tokens proposed for a node's children from the draft's law q there (−1 where none)."""
    if greedy:
        order = np.lexsort((np.arange(q.shape[0]), -q))  # most likely first, ties by lower id
        return order[ranks].astype(np.int64)
    cands = verify.sample_candidates(q, k, rng, scheme=scheme)
    out = np.full(k, -1, dtype=np.int64)
    out[: cands.shape[0]] = cands
    return out


def speculative_decode(target: MarkovLM, draft: MarkovLM | None, prompt: Sequence[int], n: int, tree: Tree,
                       rng: np.random.Generator, *, greedy: bool, scheme: str = "iid",
                       law=None) -> DecodeResult:
    """Generate n tokens by speculative decoding with a static tree, verifying with specsim.verify.

    The draft's law at a node is draft.dist(committed + path), or law(committed, path) when given
    (a head draft's, which depends on where the call started: `tests.toy_heads`). A call at t
    accepts at most n − 1 − t drafts (the last token is always the target's), the end cap the
    simulator applies.
    """
    law = law or (lambda committed, path: draft.dist(committed + path))
    seq = list(prompt)
    out: list[int] = []
    calls, accepted_total, per_call = 0, 0, []
    while len(out) < n:
        cap = n - 1 - len(out)
        calls += 1
        node, path, accepted = 0, [], 0
        while True:
            context = seq + out + path
            kids = tree.children(node)
            p = target.dist(context)
            if accepted >= cap or kids.size == 0:
                token = int(np.argmax(p)) if greedy else int(rng.choice(target.vocab, p=p))
                path.append(token)
                break
            q = law(seq + out, path)
            cands = _draft_children(q, kids.size, tree.ranks[kids], rng, greedy=greedy, scheme=scheme)
            live = np.flatnonzero(cands >= 0)
            if greedy:
                step = verify.verify_greedy(p, cands[live])
            elif scheme == "iid":
                step = verify.verify_multi_iid(p, q, cands[live], rng)
            else:
                step = verify.verify_multi_swor(p, q, cands[live], rng)
            path.append(step.token)
            if step.accepted < 0:
                break
            node = int(kids[live[step.accepted]])
            accepted += 1
        out.extend(path)
        accepted_total += accepted
        per_call.append(accepted)
    return DecodeResult(np.array(out[:n], dtype=np.int32), calls, accepted_total, tuple(per_call))


# ---------------------------------------------------------------------------- the cache


def record_cache(path, target: MarkovLM, draft: MarkovLM, prompts: Sequence[np.ndarray], n: int, *,
                 temperatures: Sequence[float] = (0.0, 1.0), seed: int = 0, draft_name: str = "toy-draft",
                 stats_spec=None, draft_stats=None) -> Path:
    """One target-sampled trajectory per prompt and temperature; logits = the chains' log-probs.

    stats_spec: the cache's StatsSpec (default: the standard one); draft_stats(prompt, tokens): statistics
    of the draft the logits cannot give (an expansion), passed to the writer beside them.
    """
    from specsim.cache.stats import StatsSpec

    rng = np.random.default_rng(seed)
    records = [PromptRecord(question_id=i, category=("a", "b")[i % 2], text=f"toy prompt {i}",
                            token_ids=np.asarray(pr, dtype=np.int32)) for i, pr in enumerate(prompts)]
    meta = {"settings": {"target": "toy-markov-target", "drafts": [draft_name]}, "target": {"spec": "toy-markov-target"}}
    spec = CacheSpec(vocab_size=target.vocab, drafts=(draft_name,), temperatures=tuple(temperatures), meta=meta,
                     stats=stats_spec or StatsSpec())
    with CacheWriter.create(Path(path), spec, records, overwrite=True) as writer:
        for T in temperatures:
            for i, pr in enumerate(prompts):
                tokens = sample_tokens(target, pr, n, rng, greedy=T == 0)
                writer.append_trajectory(
                    prompt_index=i, temperature=T, seed=i, tokens=tokens,
                    target_logits=target.logits_along(pr, tokens),
                    draft_logits={draft_name: draft.logits_along(pr, tokens)}, stop_reason="max_new_tokens",
                    stats=None if draft_stats is None else {draft_name: draft_stats(pr, tokens)})
    return Path(path)


# ---------------------------------------------------------------------------- exact expectations


def exact_totals(target: MarkovLM, draft: MarkovLM, prompt: Sequence[int], n: int, tree: Tree, *,
                 rule: str = "sample", scheme: str = "iid") -> tuple[float, float]:
    """EXACT (E[target calls], E[accepted drafts]) of `speculative_decode` from `prompt`.

    A dynamic program over (call start t, tree node, chain state) with the exact one-step
    law of each verification (`verify.output_joint`): no sampling, no coupling argument.
    Order-1 chains only (the state is the last token).
    """
    if target.order != 1:
        raise ValueError("exact_totals needs order-1 chains")
    joints: dict[tuple[int, int], np.ndarray] = {}

    def joint(s: int, k: int) -> np.ndarray:
        if (s, k) not in joints:
            joints[(s, k)] = verify.output_joint(rule, target.trans[s], draft.trans[s], k, scheme)
        return joints[(s, k)]

    memo_call: dict[tuple[int, int], np.ndarray] = {}
    memo_node: dict[tuple[int, int, int, int], np.ndarray] = {}

    def call(t: int, s: int) -> np.ndarray:  # (calls, accepted) from a call starting at t
        if t >= n:
            return np.zeros(2)
        if (t, s) not in memo_call:
            memo_call[(t, s)] = np.array([1.0, 0.0]) + node(t, 0, 0, s)
        return memo_call[(t, s)]

    def node(t: int, v: int, depth: int, s: int) -> np.ndarray:  # after reaching node v of the call at t
        key = (t, v, depth, s)
        if key in memo_node:
            return memo_node[key]
        kids = tree.children(v)
        pos = t + depth
        total = np.zeros(2)
        if depth >= n - 1 - t or kids.size == 0:
            p = target.trans[s]
            for y in np.flatnonzero(p > 0):
                total += p[y] * call(pos + 1, int(y))
        else:
            J = joint(s, kids.size)  # (V, k + 1)
            for y in range(target.vocab):
                for i in np.flatnonzero(J[y, :-1] > 0):
                    total += J[y, i] * (np.array([0.0, 1.0]) + node(t, int(kids[i]), depth + 1, y))
                if J[y, -1] > 0:
                    total += J[y, -1] * call(pos + 1, y)
        memo_node[key] = total
        return total

    calls, accepted = call(0, int(prompt[-1]))
    return float(calls), float(accepted)


# ---------------------------------------------------------------------------- dynamic trees


def expansion_along(draft: MarkovLM, prompt: Sequence[int], tokens: Sequence[int], topk: int, depth: int,
                    *, on_path_only: bool = False) -> dict[str, np.ndarray]:
    """The draft's EAGLE-2 expansion at every position of a trajectory (what `--expand` records).

    on_path_only=True is a deliberately WRONG recording: every node's children are read from the
    draft's distribution on the target's path (q at t + depth), ignoring the path the node is on.
    """
    from specsim.sim.dynamic import expand_reference

    seq = list(prompt) + list(tokens)
    rows = {"expand_token": [], "expand_parent": [], "expand_score": []}
    for t in range(len(tokens)):
        context = seq[: len(prompt) + t]

        def logq(path, context=context):
            if on_path_only:
                where = seq[: len(context) + len(path)]
                return np.log(draft.dist(where))
            return np.log(draft.dist(context + list(path)))

        tok, par, score = expand_reference(logq, topk, depth)
        rows["expand_token"].append(tok)
        rows["expand_parent"].append(par)
        rows["expand_score"].append(score)
    return {k: np.stack(v) for k, v in rows.items()}


def point_mass_call(target: MarkovLM, context: Sequence[int], children, root, cap: int, rng, *,
                    greedy: bool) -> tuple[list[int], int]:
    """One target call over point-mass candidates, walked down from `root`: children(node) -> [(child,
    token), ...] in verification order; greedy accepts the target's argmax, sampling verifies them
    in order (`verify.verify_point_mass`). At most `cap` drafts are accepted. Returns the emitted
    tokens (the accepted drafts, then the target's) and the number accepted."""
    node, path, accepted = root, [], 0
    while True:
        p = target.dist(list(context) + path)
        kids = children(node) if accepted < cap else []
        cands = np.array([t for _, t in kids], dtype=np.int64)
        step = verify.verify_greedy(p, cands) if greedy else verify.verify_point_mass(p, cands, rng)
        path.append(step.token)
        if step.accepted < 0:
            return path, accepted
        node = kids[step.accepted][0]
        accepted += 1


def dynamic_decode(target: MarkovLM, draft: MarkovLM, prompt: Sequence[int], n: int, shape, rng: np.random.Generator,
                   *, greedy: bool) -> DecodeResult:
    """n tokens by dynamic-tree speculative decoding, written directly against the chains.

    Each call expands the draft's beam from the current context (EAGLE-2), keeps the N best
    candidates, and walks down them: greedy accepts the child equal to the target's argmax;
    sampling verifies the children as point masses (`verify.verify_point_mass`, EAGLE's rule).
    """
    from specsim.sim.dynamic import expand_reference, select_reference

    seq = list(prompt)
    out: list[int] = []
    calls, accepted_total, per_call = 0, 0, []
    while len(out) < n:
        cap = n - 1 - len(out)
        context = seq + out
        tok, par, score = expand_reference(lambda path: np.log(draft.dist(context + list(path))), shape.topk,
                                           shape.depth)
        chosen = select_reference(score, shape)
        calls += 1
        path, accepted = point_mass_call(target, context, lambda node: [(i, tok[i]) for i in chosen if par[i] == node],
                                         -1, cap, rng, greedy=greedy)
        out.extend(path)
        accepted_total += accepted
        per_call.append(accepted)
    return DecodeResult(np.array(out[:n], dtype=np.int32), calls, accepted_total, tuple(per_call))


def record_dynamic_cache(path, target: MarkovLM, draft: MarkovLM, prompts: Sequence[np.ndarray], n: int, *,
                         topk: int, depth: int, temperatures: Sequence[float] = (0.0, 1.0), seed: int = 0,
                         draft_name: str = "toy-draft", on_path_only: bool = False) -> Path:
    """`record_cache` with the draft's expansion at every position (a `--expand topk=K,depth=D` recording)."""
    from specsim.cache.stats import StatsSpec

    return record_cache(path, target, draft, prompts, n, temperatures=temperatures, seed=seed, draft_name=draft_name,
                        stats_spec=StatsSpec(expand=(topk, depth)),
                        draft_stats=lambda pr, tokens: expansion_along(draft, pr, tokens, topk, depth,
                                                                       on_path_only=on_path_only))


# ---------------------------------------------------------------------------- block verification


def proposals_along(target: MarkovLM, draft: MarkovLM, prompt: Sequence[int], tokens: Sequence[int], depth: int,
                    chains: int, rng: np.random.Generator | None) -> dict[str, np.ndarray]:
    """What `cache --expand-target depth` records at T = 1 along a trajectory, with the chains' own laws: R chains
    drawn from the draft at every position (rng), or, with rng None, the exact expectation over every chain (two
    identical rows, so the replay's machinery sees R = 2)."""
    import itertools

    seq, y = list(prompt), [int(v) for v in tokens]
    n, K, V = len(y), depth, target.vocab
    along = [seq + y[:s] for s in range(n)]
    a, keep, whole = verify.block_path_factors(np.stack([target.dist(c) for c in along]),
                                               np.stack([draft.dist(c) for c in along]), y, K)
    tails = np.zeros((n, 2 if rng is None else chains, K, K), dtype=np.float32)
    every = list(itertools.product(range(V), repeat=K))
    for s in range(n):
        drawn = every if rng is None else []
        for _ in range(0 if rng is None else chains):
            c: list[int] = []
            for _m in range(K):
                c.append(int(rng.choice(V, p=draft.dist(along[s] + c))))
            drawn.append(tuple(c))
        p = np.stack([[target.dist(along[s] + list(c[:m])) for m in range(K)] for c in drawn])
        q = np.stack([[draft.dist(along[s] + list(c[:m])) for m in range(K)] for c in drawn])
        x = np.asarray(drawn, dtype=np.int64)
        branch = np.array([a[s - i, i] if i <= s else 0.0 for i in range(K)])
        per_chain = verify.block_chain_tails(branch, p, q, x)
        if rng is None:
            weight = np.prod(q[np.arange(len(drawn))[:, None], np.arange(K)[None], x], axis=1)
            tails[s] = np.tensordot(weight, per_chain, axes=1)[None]
        else:
            tails[s] = per_chain
        for i in range(s + 1, K):
            tails[s, :, i] = 0.0
    return {"block_keep": keep, "block_whole": whole, "block_tails": tails}


def exact_block_calls(target: MarkovLM, draft: MarkovLM, prompt: Sequence[int], n: int, gamma: int) -> float:
    """EXACT E[target calls] of generating n tokens with block verification of chains of gamma drafts drawn from the
    draft (a call at t drafts min(gamma, n − 1 − t)), by enumerating every chain, kept count and correction. Order-1
    chains only."""
    import itertools

    memo: dict[tuple[int, int], float] = {}

    def calls(t: int, s: int) -> float:
        if t >= n:
            return 0.0
        if (t, s) not in memo:
            g = min(gamma, n - 1 - t)
            total = 1.0
            for x in itertools.product(range(target.vocab), repeat=g):
                states = (s, *x)
                p_rows = np.stack([target.trans[states[j]] for j in range(g + 1)])
                q_rows = np.stack([draft.trans[states[j]] for j in range(g)]) if g else np.zeros((0, target.vocab))
                weight = float(np.prod([q_rows[j, x[j]] for j in range(g)]))
                for kept, p_kept in enumerate(verify.block_kept_law(p_rows, q_rows, x)):
                    if weight * p_kept == 0:
                        continue
                    for y, p_y in enumerate(verify.block_correction(p_rows, q_rows, x, kept)):
                        if p_y > 0:
                            total += weight * p_kept * p_y * calls(t + kept + 1, y)
            memo[(t, s)] = total
        return memo[(t, s)]

    return calls(0, int(prompt[-1]))

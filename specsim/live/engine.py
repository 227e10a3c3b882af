"""Real speculative decoding: draft a tree, verify it in one target forward, keep the accepted path.

Leviathan et al. (2023) and Chen et al. (2023) for chains; SpecInfer (Miao et al.
2024) for token trees verified in one pass with a tree attention mask. One step:

1. the drafter fills the tree's nodes (`specsim.live.drafting`, one draft forward per level);
2. the target runs ONE forward over all nodes (root = the last committed token) with a
   4-D tree mask and positions context + depth (`specsim.live.tree_forward`);
3. `verify_tree` walks down from the root with the rules of `specsim.verify`
   (greedy: `verify_greedy`; sampling: `verify_single` for one child,
   `verify_multi_iid` / `verify_multi_swor` for k children), following the accepted
   child, and emits the correction (or bonus) token where the walk stops;
4. both KV caches keep the accepted path and drop the rest.

Accounting follows the simulator (see the sim seam notes): a call at position t
accepts A drafts and emits A + 1 tokens, and A <= n - 1 - t where n is the final
output length (the last token, EOS or the max_new_tokens-th, is always counted as
the target's). Output is truncated at EOS and at max_new_tokens.

Invariant: the target's cache holds every committed token except the last one (the
root of the next tree).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from specsim.errors import SpecError
from specsim.live.drafting import Drafter, Proposal, probabilities
from specsim.live.tree_forward import KVModel
from specsim.trees import Tree
from specsim.verify import verify_greedy, verify_multi_iid, verify_multi_swor, verify_point_mass, verify_single

POLICIES = ("greedy", "sample")
MULTI_DRAFT = ("iid", "swor")


@dataclass(frozen=True)
class LiveConfig:
    """One speculative decoding configuration."""

    tree: Tree  # static draft tree (chain:γ is a tree too)
    policy: str = "greedy"  # 'greedy' (argmax, T = 0) or 'sample' (lossless speculative sampling at temperature)
    temperature: float = 0.0  # sampling temperature; must be 0 for greedy and > 0 for sample
    multi_draft: str = "iid"  # how a node with k children draws them under sampling: 'iid' or 'swor'
    max_new_tokens: int = 128  # output length limit per prompt

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise SpecError(f"live policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        if self.multi_draft not in MULTI_DRAFT:
            raise SpecError(f"--multi-draft {self.multi_draft!r} is not one of {', '.join(MULTI_DRAFT)}")
        if self.policy == "greedy" and self.temperature != 0:
            raise SpecError(f"policy greedy decodes at temperature 0, got {self.temperature:g}; use --policy sample")
        if self.policy == "sample" and not self.temperature > 0:
            raise SpecError("policy sample needs a temperature > 0 (e.g. --temperature 0.7); T = 0 is greedy")
        if self.tree.budget < 1:
            raise SpecError("the draft tree has no draft tokens; use e.g. --tree chain:4")
        if self.max_new_tokens < 1:
            raise SpecError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class TreeVerdict:
    """What one verification walk decided."""

    path: tuple[int, ...]  # accepted node ids below the root, root to leaf
    token: int  # the token the target emits where the walk stopped (correction or bonus)


@dataclass(frozen=True)
class StepRecord:
    """One target call of a live run."""

    start: int  # output tokens already emitted when the call started (t)
    accepted: int  # drafts accepted (A, after the end-of-output cap)
    path: tuple[int, ...]  # accepted node ids (first `accepted` of them count)
    drafted: int  # draft tokens verified in this call (valid tree nodes)
    draft_s: float  # seconds spent drafting
    verify_s: float  # seconds of the target forward + verification walk


@dataclass(frozen=True)
class Decoded:
    """One prompt decoded (speculatively or plainly)."""

    tokens: np.ndarray  # (n,) int64 output tokens
    steps: tuple[StepRecord, ...]  # one per target call
    seconds: float  # wall-clock of the decode, prompt pass included
    stop_reason: str  # 'eos' | 'max_new_tokens'

    @property
    def target_calls(self) -> int:
        return len(self.steps)


def verify_tree(tree: Tree, proposal: Proposal, p_target: np.ndarray, *, policy: str, multi_draft: str,
                rng: np.random.Generator) -> TreeVerdict:
    """Walk from the root: verify each node's children with `specsim.verify`, follow the accepted one.

    `p_target` (n_nodes, V): the target's logits (greedy) or probabilities (sample) at each node.
    """
    node, path = 0, []
    while True:
        children = tree.children(node)
        children = children[proposal.valid[children]]
        candidates = proposal.tokens[children]
        if policy == "greedy":
            step = verify_greedy(p_target[node], candidates)
        elif children.size == 0 or proposal.q_draft is None:
            # A leaf (the bonus token y ~ p), or candidates that are a function of the prefix.
            step = verify_point_mass(p_target[node], candidates, rng)
        elif children.size == 1:
            step = verify_single(p_target[node], proposal.q_draft[node], int(candidates[0]), rng)
        elif multi_draft == "swor":
            step = verify_multi_swor(p_target[node], proposal.q_draft[node], candidates, rng)
        else:
            step = verify_multi_iid(p_target[node], proposal.q_draft[node], candidates, rng)
        if step.accepted < 0:
            return TreeVerdict(path=tuple(path), token=step.token)
        node = int(children[step.accepted])
        path.append(node)


class Target:
    """The target model with its KV cache and stop tokens."""

    def __init__(self, model, eos: set[int]):
        self.kv = KVModel(model)
        self.eos = set(eos)

    def start(self, prompt_ids: np.ndarray) -> None:
        """Prefill everything but the last prompt token (the first tree's root)."""
        self.kv.start(np.asarray(prompt_ids[:-1]))


def _finish(emitted: list[int], produced: int, max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cut a call's emitted tokens at EOS (inclusive) and at max_new_tokens; whether the output ended."""
    room = max_new_tokens - produced
    for i, token in enumerate(emitted[:room]):
        if token in eos:
            return emitted[: i + 1], True
    return emitted[:room], len(emitted) >= room


def speculative_decode(target: Target, drafter: Drafter, prompt_ids: np.ndarray, config: LiveConfig,
                       rng: np.random.Generator) -> Decoded:
    """Decode one prompt speculatively; see the module docstring for the step and the accounting."""
    started = time.perf_counter()
    prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
    if prompt_ids.size == 0:
        raise SpecError("cannot decode an empty prompt")
    tree = config.tree
    target.start(prompt_ids)
    drafter.reset(prompt_ids)
    committed = list(prompt_ids.tolist())
    anc = tree.ancestor_mask()
    steps: list[StepRecord] = []
    produced, done = 0, False
    while not done:
        t0 = time.perf_counter()
        proposal = drafter.propose(np.asarray(committed), tree, policy=config.policy,
                                   temperature=config.temperature, multi_draft=config.multi_draft, rng=rng)
        t1 = time.perf_counter()
        context = target.kv.length
        live = np.flatnonzero(proposal.valid)  # nodes with a token; the target sees only these
        attend = np.concatenate([np.ones((live.size, context), bool), anc[np.ix_(live, live)]], axis=1)
        logits = target.kv.forward(proposal.tokens[live], context + tree.depths[live], attend)  # (n_live, V)
        p_live = logits.double().cpu().numpy() if config.policy == "greedy" else probabilities(logits, config.temperature)
        p_target = np.zeros((tree.n_nodes, p_live.shape[1]))  # (n_nodes, V); rows of nodes without tokens unused
        p_target[live] = p_live
        verdict = verify_tree(tree, proposal, p_target, policy=config.policy, multi_draft=config.multi_draft, rng=rng)
        emitted = [int(proposal.tokens[n]) for n in verdict.path] + [verdict.token]
        emitted, done = _finish(emitted, produced, config.max_new_tokens, target.eos)
        accepted = len(emitted) - 1
        target.kv.keep(context, np.searchsorted(live, (0, *verdict.path[:accepted])))
        drafter.accept(np.asarray(verdict.path[:accepted], dtype=np.int64))
        t2 = time.perf_counter()
        steps.append(StepRecord(start=produced, accepted=accepted, path=verdict.path, drafted=live.size - 1,
                                draft_s=t1 - t0, verify_s=t2 - t1))
        committed += emitted
        produced += len(emitted)
    tokens = np.asarray(committed[len(prompt_ids):], dtype=np.int64)
    stop = "eos" if tokens[-1] in target.eos else "max_new_tokens"
    return Decoded(tokens=tokens, steps=tuple(steps), seconds=time.perf_counter() - started, stop_reason=stop)


def plain_decode(target: Target, prompt_ids: np.ndarray, *, temperature: float, max_new_tokens: int,
                 rng: np.random.Generator) -> Decoded:
    """Plain autoregressive decoding with the same KV cache code: the speedup baseline.

    Greedy (T = 0) takes argmax p (`verify_greedy` with no candidates); T > 0 samples y ~ p.
    """
    started = time.perf_counter()
    prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
    if prompt_ids.size == 0:
        raise SpecError("cannot decode an empty prompt")
    target.start(prompt_ids)
    none = np.empty(0, dtype=np.int64)
    out: list[int] = []
    steps: list[StepRecord] = []
    last = int(prompt_ids[-1])
    while True:
        t0 = time.perf_counter()
        logits = target.kv.feed_chain(np.array([last]))[-1:]  # (1, V)
        if temperature == 0:
            last = verify_greedy(logits[0].double().cpu().numpy(), none).token
        else:
            last = verify_point_mass(probabilities(logits, temperature)[0], none, rng).token
        steps.append(StepRecord(start=len(out), accepted=0, path=(), drafted=0, draft_s=0.0,
                                verify_s=time.perf_counter() - t0))
        out.append(last)
        if last in target.eos or len(out) >= max_new_tokens:
            break
    stop = "eos" if out[-1] in target.eos else "max_new_tokens"
    return Decoded(tokens=np.asarray(out, dtype=np.int64), steps=tuple(steps),
                   seconds=time.perf_counter() - started, stop_reason=stop)

"""Real speculative decoding of B requests at once: draft a tree, verify it in one target forward.

Leviathan et al. (2023) and Chen et al. (2023) for chains; SpecInfer (Miao et al.
2024) for token trees verified in one pass with a tree attention mask. One engine step,
for every request in the batch together:

1. the drafter fills the tree's nodes (`specsim.live.drafting`, one draft forward per
   level, one row per request; a request drafts no deeper than it can still accept);
2. the target runs ONE forward over the nodes any request drafted (root = each request's
   last committed token), a 4-D tree mask per request and positions context + depth
   (`specsim.record.kv`);
3. `verify_tree` walks down each request's tree from the root with the rules of
   `specsim.verify` (greedy: the child equal to the target's argmax; sampling:
   `verify_single` for one child, `verify_multi_iid` / `verify_multi_swor` for k, point
   masses for model-free candidates) and emits the correction (or bonus) token where the
   walk stops;
4. both KV caches keep each request's accepted path and forget the rest.

Scheduling, as serving engines do it: at most `batch` requests decode together. In
`lockstep` (static batching) a batch starts together and decodes until its last request
finishes; finished requests leave, the batch shrinks. In `continuous` batching a finished
request's place goes to the next waiting request before the next step. Plain decoding is
the same engine with the root-only tree (no draft): the baseline shares every line of code.

Accounting follows the simulator: a call at output position t accepts A drafts and
emits A + 1 tokens, with A <= n - 1 - t where n is the final output length (the last
token, EOS or the max_new_tokens-th, is always counted as the target's). Output is cut
at EOS and at max_new_tokens. Times: a step's seconds count drafting, verification and
bookkeeping; prompt passes (prefill) are timed apart, since speculation does not change
them (serving engines report them as time to first token).

Invariant: the target's cache holds every committed token except the last one (the
root of the next tree).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from specsim.errors import ArgumentError, SpecError
from specsim.live.drafting import Drafter, Proposal, probabilities
from specsim.record.kv import SlotKV
from specsim.specs import BATCHING, MULTI_DRAFT, parse_policy, policy_names
from specsim.trees import Tree, chain
from specsim.verify import (LossyRule, verify_block, verify_lossy, verify_multi_iid, verify_multi_swor,
                            verify_point_mass, verify_single)

POLICIES = tuple(policy_names(live=True, adaptive=False))  # what this engine verifies with
SCHEDULES = tuple(policy_names(live=True, adaptive=True))  # the chain-length schedules it runs
ROOT_ONLY = Tree(np.array([-1]), np.array([-1]), name="plain")  # plain decoding: verify the root, draft nothing


@dataclass(frozen=True)
class LiveConfig:
    """One speculative decoding configuration."""

    tree: Tree  # static draft tree (chain:γ is a tree too; ROOT_ONLY is plain decoding)
    policy: str = "greedy"  # 'greedy' (argmax, T = 0), 'sample' (lossless speculative sampling at temperature),
    #                         'block' (a chain drafted from q, kept or cut as a block: `specsim.verify.verify_block`)
    #                         or a lossy rule with its parameters ('p>=q', 'p>=lq:0.5', 'typical:0.09,0.3')
    temperature: float = 0.0  # sampling temperature; must be 0 for greedy and > 0 for the others
    multi_draft: str = "iid"  # how a node with k children draws them under sampling: 'iid' or 'swor'
    max_new_tokens: int = 128  # output length limit per request
    batch: int = 1  # requests decoded together
    batching: str = "lockstep"  # 'lockstep' (static batches) or 'continuous' (finished requests replaced)
    schedule: str = ""  # an adaptive chain-length rule ('adaptive-hf', 'adaptive-history:0.8,0.4'): each request's
    #                     chain starts at the tree's depth and changes call by call (`specsim.sim.adaptive`)

    def __post_init__(self) -> None:
        try:
            rule = parse_policy(self.policy)
        except SpecError:
            rule = None
        if rule is None or rule.name not in POLICIES:
            raise SpecError(f"live policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        if self.schedule:
            rule = parse_policy(self.schedule)
            if not rule.kind.adaptive:
                raise SpecError(f"schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
            from specsim.sim.adaptive import check_chain

            check_chain(self.tree, f"{rule.label}: ")
            if not self.tree.budget:  # live drafts at least one token: a root-only tree has no chain to adapt
                raise SpecError(f"{rule.label}: adaptive speculation lengths apply to chains, not to the tree "
                                f"{self.tree.name or self.tree.to_spec()}")
        if self.multi_draft not in MULTI_DRAFT:
            raise ArgumentError("{multi_draft} {value!r} is not one of {known}", value=self.multi_draft,
                                known=", ".join(MULTI_DRAFT))
        if self.policy == "greedy" and self.temperature != 0:
            raise ArgumentError("{policy} greedy decodes at {temperature} 0, got {value:g}; use {policy} sample",
                                value=self.temperature)
        if rule.kind.temperature == ">0" and not self.temperature > 0:
            raise ArgumentError("{policy} {name} needs {temperature} > 0 (e.g. 0.7); T = 0 is greedy",
                                name=self.policy)
        if not rule.lossless and self.multi_draft != "iid" and self.tree.budget and int(self.tree.n_children.max()) > 1:
            raise ArgumentError("lossy rule {name} tries i.i.d. candidates in order; use {multi_draft} iid",
                                name=self.policy)
        if self.policy == "block":
            from specsim.sim.adaptive import BLOCK_ON_CHAINS, check_chain

            check_chain(self.tree, rule=BLOCK_ON_CHAINS)
            if self.temperature == 0:
                raise ArgumentError("{policy} block at {temperature} 0 verifies point masses, which is greedy "
                                    "verification (docs/design.md 2d): decode with {policy} greedy "
                                    "(LiveConfig.for_policy maps it)")
        if self.max_new_tokens < 1:
            raise ArgumentError("{max_new_tokens} {value}: at least 1", value=self.max_new_tokens)
        if self.batch < 1:
            raise ArgumentError("{batch} {value}: at least 1", value=self.batch)
        if self.batching not in BATCHING:
            raise ArgumentError("{batching} {value!r} is not one of {known}", value=self.batching, known=", ".join(BATCHING))

    def plain(self) -> "LiveConfig":
        """The plain-decoding baseline of this configuration: same policy, limits and batching."""
        return LiveConfig(tree=ROOT_ONLY, policy=self.policy, temperature=self.temperature,
                          max_new_tokens=self.max_new_tokens, batch=self.batch, batching=self.batching)

    @classmethod
    def for_policy(cls, tree: Tree, policy: str, temperature: float, **kwargs) -> "LiveConfig":
        """The configuration that decodes with `policy` as named on the command line: a verification rule
        ('greedy', 'sample', 'block': greedy at T = 0, where drafts and target are point masses) or an adaptive
        schedule ('adaptive-hf', 'adaptive-history:0.9,0.3'), which verifies greedily at T = 0 and by
        speculative sampling at T > 0."""
        rule = parse_policy(policy)
        if not rule.kind.live:
            raise SpecError(f"live policy {policy!r} is not one of {', '.join(POLICIES + SCHEDULES)}")
        if rule.kind.adaptive:
            return cls(tree=tree, policy="greedy" if temperature == 0 else "sample", temperature=temperature,
                       schedule=rule.label, **kwargs)
        if rule.name == "block" and temperature == 0:  # point-mass drafts and target: greedy verification (§2d)
            from specsim.sim.adaptive import BLOCK_ON_CHAINS, check_chain

            check_chain(tree, rule=BLOCK_ON_CHAINS)
            return cls(tree=tree, policy="greedy", temperature=temperature, **kwargs)
        return cls(tree=tree, policy=rule.label, temperature=temperature, **kwargs)

    @property
    def lossy_rule(self) -> LossyRule | None:
        """The lossy acceptance rule this configuration verifies with (None: a lossless policy)."""
        rule = parse_policy(self.policy)
        if rule.lossless:
            return None
        from specsim.cache.stats import lossy_rule

        return lossy_rule(rule.label)

    @property
    def label(self) -> str:
        """The policy as rows name it: the schedule where there is one ('adaptive-hf'), else the rule."""
        return parse_policy(self.schedule).label if self.schedule else self.policy

    def next_gamma(self) -> np.ndarray:
        """The schedule's table γ' = table[γ, accepted] (`specsim.sim.adaptive.next_gamma_table`, the one the
        replay walks), capped at Γ = max(16, 2 · the start γ)."""
        from specsim.sim.adaptive import MIN_GAMMA_CAP, next_gamma_table

        rule = parse_policy(self.schedule)
        return next_gamma_table(rule.name, max(MIN_GAMMA_CAP, 2 * self.tree.max_depth), rule.params)


@dataclass(frozen=True)
class TreeVerdict:
    """What one verification walk decided."""

    path: tuple[int, ...]  # accepted node ids below the root, root to leaf
    token: int  # the token the target emits where the walk stopped (correction or bonus)


@dataclass(frozen=True)
class StepRecord:
    """One target call of one request."""

    start: int  # output tokens already emitted when the call started (t)
    accepted: int  # drafts accepted (A, after the end-of-output cap)
    path: tuple[int, ...]  # accepted node ids (first `accepted` of them count)
    drafted: int  # draft tokens this request verified in this call (its valid tree nodes)
    draft_s: float  # seconds the batch spent drafting in this step
    verify_s: float  # seconds of the target forward, the verification walks and the cache updates
    batch: int = 1  # requests in the engine step


@dataclass(frozen=True)
class Decoded:
    """One request decoded (speculatively or plainly)."""

    tokens: np.ndarray  # (n,) int64 output tokens
    steps: tuple[StepRecord, ...]  # one per target call
    seconds: float  # decode time: the engine steps this request took part in (prefill excluded)
    stop_reason: str  # 'eos' | 'max_new_tokens'
    prefill_s: float = 0.0  # seconds of the prompt pass that admitted it (shared by requests admitted together)

    @property
    def target_calls(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class EngineStep:
    """One engine step: every request in the batch drafted and was verified."""

    batch: int  # requests in the step
    verified: int  # tree nodes per request in the target forward (the batch's widest need)
    draft_levels: tuple[int, ...]  # width of each draft forward (root feed first); () without a model draft
    emitted: int  # output tokens the step produced over the batch
    draft_s: float  # seconds drafting
    verify_s: float  # seconds verifying (target forward, walks, cache updates)
    seconds: float  # the whole step, finished requests leaving included


@dataclass
class DecodeRun:
    """Every request of one `decode` call, in request order, and the engine steps."""

    decoded: list[Decoded | None]  # None: not finished (interrupted)
    steps: list[EngineStep] = field(default_factory=list)
    prefill_s: float = 0.0  # prompt passes, all admissions together
    interrupted: bool = False  # True when a Ctrl-C cut the run short

    @property
    def decode_s(self) -> float:
        return float(sum(s.seconds for s in self.steps))


class Target:
    """The target model with its slot KV cache and stop tokens."""

    def __init__(self, model, eos: set[int]):
        self.kv = SlotKV(model)
        self.eos = set(eos)


def verify_tree(tree: Tree, tokens: np.ndarray, valid: np.ndarray, *, policy: str, multi_draft: str,
                rng: np.random.Generator, top_of: Callable[[int], int] | None = None,
                p_of: Callable[[int], np.ndarray] | None = None,
                q_of: Callable[[int], np.ndarray] | None = None, lossy: LossyRule | None = None) -> TreeVerdict:
    """Walk one request's tree from the root and follow the accepted child.

    tokens, valid (n_nodes,): the request's row of the proposal. Greedy needs `top_of(node)`,
    the target's argmax after the node (lowest id on ties); sampling needs `p_of(node)`, the
    target's probabilities there, and `q_of(node)` the draft's (None: point-mass candidates).
    """
    if policy == "block":
        return _verify_block(tree, tokens, valid, rng, p_of, q_of)
    node, path = 0, []
    while True:
        children = tree.children(node)
        children = children[valid[children]]
        candidates = tokens[children]
        if policy == "greedy":
            y = int(top_of(node))
            hit = np.flatnonzero(candidates == y)
            if hit.size == 0:
                return TreeVerdict(path=tuple(path), token=y)
            node = int(children[hit[0]])
            path.append(node)
            continue
        p = p_of(node)
        if children.size == 0 or q_of is None:
            # A leaf (the bonus token y ~ p), or candidates that are a function of the prefix.
            step = verify_point_mass(p, candidates, rng)
        elif lossy is not None:
            step = verify_lossy(lossy, p, q_of(node), candidates, rng)
        elif children.size == 1:
            step = verify_single(p, q_of(node), int(candidates[0]), rng)
        elif multi_draft == "swor":
            step = verify_multi_swor(p, q_of(node), candidates, rng)
        else:
            step = verify_multi_iid(p, q_of(node), candidates, rng)
        if step.accepted < 0:
            return TreeVerdict(path=tuple(path), token=step.token)
        node = int(children[step.accepted])
        path.append(node)


def _verify_block(tree: Tree, tokens: np.ndarray, valid: np.ndarray, rng: np.random.Generator,
                  p_of: Callable[[int], np.ndarray], q_of: Callable[[int], np.ndarray] | None) -> TreeVerdict:
    """Block verification of one request's drafted chain (the valid nodes of a chain tree, root first): the
    target's laws after the root and after each draft, the draft's law each draft was drawn from (one-hot
    for point-mass proposals), and `verify_block`'s kept count and token."""
    chain = [0]
    while (children := tree.children(chain[-1])).size and valid[children[0]]:
        chain.append(int(children[0]))
    drafts = tokens[chain[1:]]
    p_rows = np.stack([p_of(node) for node in chain])
    vocab = p_rows.shape[1]
    q_rows = np.stack([q_of(node) if q_of is not None else np.eye(vocab)[int(x)] for node, x in zip(chain, drafts)]) \
        if drafts.size else np.zeros((0, vocab))
    step = verify_block(p_rows, q_rows, drafts, rng)
    return TreeVerdict(path=tuple(chain[1:step.kept + 1]), token=step.token)


def _finish(emitted: list[int], produced: int, max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cut a call's emitted tokens at EOS (inclusive) and at max_new_tokens; whether the output ended."""
    room = max_new_tokens - produced
    for i, token in enumerate(emitted[:room]):
        if token in eos:
            return emitted[: i + 1], True
    return emitted[:room], len(emitted) >= room


@dataclass
class _Active:
    """A request in the batch."""

    index: int  # position in the request list
    committed: list[int]  # prompt + output so far
    prompt_len: int
    rng: np.random.Generator
    prefill_s: float
    steps: list[StepRecord] = field(default_factory=list)
    seconds: float = 0.0  # engine steps taken part in
    done: bool = False  # output ended (EOS or max_new_tokens)
    gamma: int = 0  # an adaptive schedule's chain length for this request's next call

    @property
    def produced(self) -> int:
        return len(self.committed) - self.prompt_len


def decode(target: Target, drafter: Drafter | None, prompts: Sequence[np.ndarray],
           rngs: Sequence[np.random.Generator], config: LiveConfig, *,
           on_step: Callable[[EngineStep], None] | None = None) -> DecodeRun:
    """Decode every prompt (speculatively, or plainly with ROOT_ONLY or no drafter); see the module docstring.

    rngs[i] drives request i's drafting and verification, so a request's sampling does not
    depend on which others share its batch. A Ctrl-C stops after the step in progress; the
    requests that finished are kept.
    """
    prompts = [np.asarray(p, dtype=np.int64) for p in prompts]
    if any(p.size == 0 for p in prompts):
        raise SpecError("cannot decode an empty prompt")
    if drafter is None and config.tree.budget:
        raise SpecError("a draft tree needs a drafter; plain decoding uses ROOT_ONLY")
    needs_hidden = bool(getattr(drafter, "needs_hidden", False))  # head drafts read the target's hidden states
    if needs_hidden and any(p.size < 2 for p in prompts):
        raise SpecError("head drafts need prompts of at least two tokens (the root's predecessor state)")
    target.kv.keep_hidden = tuple(drafter.hidden_layers) if needs_hidden else ()  # the states the heads read
    if hasattr(drafter, "begin"):  # drafters that learn from earlier requests start this run afresh
        drafter.begin()
    run = DecodeRun(decoded=[None] * len(prompts))
    schedule = config.next_gamma() if config.schedule else None
    queue = list(range(len(prompts)))
    active: list[_Active] = []
    try:
        while queue or active:
            if queue and (not active or (config.batching == "continuous" and len(active) < config.batch)):
                joining = queue[: config.batch - len(active)]
                del queue[: len(joining)]
                started = time.perf_counter()
                _admit(target, drafter, [prompts[i] for i in joining], first=not active)
                seconds = time.perf_counter() - started
                run.prefill_s += seconds
                active += [_Active(i, prompts[i].tolist(), len(prompts[i]), rngs[i], seconds,
                                   gamma=config.tree.max_depth) for i in joining]
            step = _step(target, drafter, active, config, schedule)
            run.steps.append(step)
            done = [a for a in active if a.done]
            if done:
                started = time.perf_counter()
                keep = np.array([k for k, a in enumerate(active) if not a.done], dtype=np.int64)
                target.kv.drop(keep)
                if hasattr(drafter, "finish"):
                    for a in done:
                        drafter.finish(a.committed)
                if drafter is not None:
                    drafter.drop(keep)
                leaving = time.perf_counter() - started
                run.steps[-1] = step = EngineStep(**{**step.__dict__, "seconds": step.seconds + leaving})
                for a in active:
                    a.seconds += leaving
                for a in done:
                    out = np.asarray(a.committed[a.prompt_len:], dtype=np.int64)
                    run.decoded[a.index] = Decoded(
                        tokens=out, steps=tuple(a.steps), seconds=a.seconds, prefill_s=a.prefill_s,
                        stop_reason="eos" if int(out[-1]) in target.eos else "max_new_tokens")
                active = [a for a in active if not a.done]
            if on_step is not None:
                on_step(step)
    except KeyboardInterrupt:
        run.interrupted = True
    return run


def _admit(target: Target, drafter: Drafter | None, prompts: list[np.ndarray], *, first: bool) -> None:
    """Prefill new requests (everything but each prompt's last token, the first root)."""
    heads = [p[:-1] for p in prompts]
    kv = target.kv if first else SlotKV(target.kv.model, keep_hidden=target.kv.keep_hidden)
    kv.start(heads)
    extra = {}
    if target.kv.keep_hidden:  # head drafts: the target's states over each prompt but its last token
        extra["hidden"] = [kv.hidden[r, : len(h)] for r, h in enumerate(heads)]
    if first:
        if drafter is not None:
            drafter.start(prompts, **extra)
        return
    target.kv.append(kv)
    if drafter is not None:
        drafter.join(prompts, **extra)


def _step(target: Target, drafter: Drafter | None, active: list[_Active], config: LiveConfig,
          schedule: np.ndarray | None = None) -> EngineStep:
    """One engine step. `schedule` (an adaptive rule's γ table): request r drafts a chain of its own
    length a.gamma, the longest chain's tree cut by each request's γ as by its room."""
    tree, B = config.tree, len(active)
    rngs = [a.rng for a in active]
    started = time.perf_counter()
    rooms = np.array([config.max_new_tokens - a.produced - 1 for a in active], dtype=np.int64)
    drafting = drafter is not None and bool(tree.budget) and int(rooms.max()) > 0  # room 0: the last token, no draft
    if schedule is not None and drafting:
        gammas = np.array([a.gamma for a in active], dtype=np.int64)
        tree, rooms = chain(str(int(gammas.max()))), np.minimum(rooms, gammas)
    if not drafting:
        tree = ROOT_ONLY
        proposal = Proposal(tokens=np.array([[a.committed[-1]] for a in active], dtype=np.int64),
                            valid=np.ones((B, 1), dtype=bool), q_draft=None)
        levels: tuple[int, ...] = ()
    else:
        proposal = drafter.propose([a.committed for a in active], tree, rooms, policy=config.policy,
                                   temperature=config.temperature, multi_draft=config.multi_draft, rngs=rngs)
        levels = tuple(getattr(drafter, "levels", ()))
    drafted_at = time.perf_counter()
    trees = proposal.trees if proposal.trees is not None else [tree] * B  # dynamic: each request grew its own
    if proposal.trees is None:  # one tree: the nodes some request verifies (prefix-closed), shared columns
        layouts = [np.flatnonzero(proposal.valid.any(axis=0))] * B
    else:
        layouts = [np.flatnonzero(v) for v in proposal.valid]
    width = max(c.size for c in layouts)
    col_of, cols_tok = [], np.zeros((B, width), dtype=np.int64)
    depth = np.zeros((B, width), dtype=np.int64)
    attend = np.broadcast_to(np.eye(width, dtype=bool), (B, width, width)).copy()  # padding sees itself only
    for r, (t, cols) in enumerate(zip(trees, layouts)):
        k = cols.size
        cols_tok[r, :k], depth[r, :k] = proposal.tokens[r, cols], t.depths[cols]
        attend[r, :k, :k] |= t.ancestor_mask()[np.ix_(cols, cols)] & proposal.valid[r, cols][None, :]
        where = np.full(t.n_nodes, -1, dtype=np.int64)
        where[cols] = np.arange(k)
        col_of.append(where)
    logits = target.kv.forward(cols_tok, depth, attend)  # (B, width, V)
    greedy = config.policy == "greedy"
    top = logits.argmax(dim=-1).cpu().numpy() if greedy else None  # (B, m): first maximum = lowest id
    lossy = config.lossy_rule
    if lossy is not None and proposal.q_draft is None and drafting:
        raise SpecError(f"lossy rule {config.policy} compares p with q; this draft proposes point masses (no q)")
    keeps, paths, emitted_total = [], [], 0
    for r, a in enumerate(active):
        q = proposal.q_draft
        n = trees[r].n_nodes
        verdict = verify_tree(
            trees[r], proposal.tokens[r, :n], proposal.valid[r, :n], policy=config.policy,
            multi_draft=config.multi_draft, rng=a.rng,
            top_of=(lambda node, r=r: top[r, col_of[r][node]]) if greedy else None,
            p_of=None if greedy else (lambda node, r=r: probabilities(logits[r, col_of[r][node]], config.temperature)),
            q_of=None if q is None else (lambda node, r=r: q[node][r]), lossy=lossy)
        emitted = [int(proposal.tokens[r, n]) for n in verdict.path] + [verdict.token]
        start = a.produced
        emitted, a.done = _finish(emitted, start, config.max_new_tokens, target.eos)
        accepted = len(emitted) - 1
        if schedule is not None:
            a.gamma = int(schedule[a.gamma, accepted])
        keeps.append(col_of[r][[0, *verdict.path[:accepted]]])
        paths.append(verdict.path[:accepted])
        a.committed += emitted
        emitted_total += len(emitted)
        a.steps.append(StepRecord(start=start, accepted=accepted, path=verdict.path,
                                  drafted=int(proposal.valid[r].sum()) - 1, draft_s=0.0, verify_s=0.0, batch=B))
    target.kv.commit(keeps)
    if drafting:
        if target.kv.keep_hidden:  # the target's states at the root and the accepted nodes
            hidden = target.kv.hidden
            drafter.accept(paths, hidden=[hidden[r, torch.as_tensor(k, device=hidden.device)]
                                          for r, k in enumerate(keeps)])
        else:
            drafter.accept(paths)
    done_at = time.perf_counter()
    draft_s, verify_s = drafted_at - started, done_at - drafted_at
    for a in active:
        a.steps[-1] = StepRecord(**{**a.steps[-1].__dict__, "draft_s": draft_s, "verify_s": verify_s})
        a.seconds += done_at - started
    return EngineStep(batch=B, verified=int(width), draft_levels=levels, emitted=emitted_total,
                      draft_s=draft_s, verify_s=verify_s, seconds=done_at - started)


def speculative_decode(target: Target, drafter: Drafter, prompt_ids: np.ndarray, config: LiveConfig,
                       rng: np.random.Generator) -> Decoded:
    """Decode one prompt speculatively (a batch of one)."""
    run = decode(target, drafter, [prompt_ids], [rng], config)
    if run.interrupted:
        raise KeyboardInterrupt
    return run.decoded[0]


def plain_decode(target: Target, prompt_ids: np.ndarray, *, temperature: float, max_new_tokens: int,
                 rng: np.random.Generator) -> Decoded:
    """Plain autoregressive decoding of one prompt with the same engine: the speedup baseline.

    Greedy (T = 0) takes argmax p; T > 0 samples y ~ p (`verify_point_mass` with no candidates).
    """
    config = LiveConfig(tree=ROOT_ONLY, policy="greedy" if temperature == 0 else "sample", temperature=temperature,
                        max_new_tokens=max_new_tokens)
    return speculative_decode(target, None, prompt_ids, config, rng)

"""Cost profile: measured step times that turn accepted tokens into wall-clock speedup.

The speedup of speculative decoding is (tokens per step) / (time per step) over the
plain step's rate (Leviathan et al. 2023, sec. 3; Sequoia, Chen et al. 2024, for the
width-dependence of verification; serving engines for its dependence on batch size).
This module times, with the live engine's own code (`specsim.record.kv.SlotKV`, the same
masks and the same post-processing), over B requests whose KV caches hold L random
tokens each:

* ``target_verify_s[B][L][N]``: one target forward over N new tokens per request laid out
  as a draft tree (a binary tree cut to N nodes, breadth-first) with its 4-D tree mask,
  plus the argmax the verification reads; N = 1 is a plain decode step;
* ``draft_step_s[draft][B][L][w]``: one draft forward over w new tokens per request (one
  tree level: siblings that see the context and themselves), plus picking their children;
* ``step_overhead_s[kind][B][N]``: the work of a step outside the forwards that grows with the
  tree, with the live engine's own functions over B requests and the same N-token tree:
  ``walk_greedy`` (each request's greedy walk down the tree, `verify_tree`), ``walk_sample``
  (the sampling walk at T = 1: the target's probabilities at each visited node and the
  accept/reject draws, `verify_tree`), ``walk_block`` (block verification of a chain of N − 1
  drafts at T = 1: the target's and the draft's laws at every drafted position, the thresholds
  h_i and the correction, `verify_tree` with policy "block") and ``draft_sample`` (drawing every
  node's children from the draft's law at T = 1, `fill_children`). Random logits of the target's vocabulary, the
  draft's a noisy copy of the target's (most candidates accepted, some rejected). The engine's
  remaining per-step glue (building the tree layout, committing KV entries) is not in it: measured inside the
  live engine on a 2-core CPU, 1.2-2.4% of a speculative step and 1.2-1.3% of a plain one, which largely cancel
  in a speedup.

Timing: for each (B, L), `warmup` untimed runs of every entry, then `repeats` rounds, each timing every entry
of that (B, L) once in a fresh random order (a slow moment of a shared machine then falls on all entries
alike, not on one). The plain step (N = 1) is timed right after an untimed plain step, as plain decoding runs
it back to back. Timed after whatever entry the order put before it, it cost 1.8-4.6% more in 5 of 6 cases in
one run on a 2-core CPU (4 of 6 in a noisier second), and a plain step priced too slow raises every predicted
speedup: predictions ran a median 3.6% above live before this, level with it after
(`analyses/results/speed-error-cpu-2026-11-28/`, `bench-cpu-2026-11-28b/`). The rounds are spread over
`passes` sweeps through the (B, L) grid (contexts refilled; in later sweeps one untimed run of each model's first
entry, since the first forward on a refilled context can run slow, see `ProfileConfig.warmups`): a slow
phase of the machine lasting as long as one block's measurement then lands on a few rounds of several blocks,
which the median discards, not on every round of one block, which would shift that block's medians (seen on a
GPU host: whole (B, L) blocks of a profile 1.5-2x their neighbours, the plain step among them). With
`max_repeats`, further passes follow, each timing, in rounds among themselves, only the entries whose median
still has a relative standard error (`median_error`) over MEDIAN_ERROR_GOAL (or that have fewer than
TRUSTED_ROUNDS rounds, too few to estimate it from), until none has or they have run that many rounds: the
rounds go where the medians are uncertain (a small draft head's 4 ms steps on a busy CPU), not to the target's
steady 40 ms ones. The entries timed in a pass are those still timed in the one before, so round r of any two
entries that have it came from the same pass. Every round's time is kept (`runs`: `specsim.sim.cost` resamples
the rounds jointly to carry the profile's error into speedup CIs); the median is used, the quartiles are kept
(the spread); every run ends with a device synchronisation, so a time is the wall-clock the engine waits (CPU
launch overhead included, as live decoding pays it). The profile records device, dtype, threads, load average,
library versions, the models with the architecture fingerprints caches record, and the interpolation error of
the grid (leave-one-out: each interior point predicted from its neighbours). The JSON written here is what
`specsim.sim.cost` reads.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from specsim.errors import ArgumentError, ModelError, SpecError
from specsim.files import check_writable, write_text
from specsim.sim.cost import OVERHEAD_KINDS, batch_grid

FORMAT = "specsim-cost-profile"
VERSION = 2
DENSE = 17  # N measured one by one up to here: a budget-16 tree verifies 17 tokens


@dataclass(frozen=True)
class ProfileConfig:
    """What to measure."""

    batches: tuple[int, ...] = (1,)  # B: requests per step
    contexts: tuple[int, ...] = (128, 512)  # L: tokens already in each request's KV cache
    max_tokens: int = 64  # largest N; every N up to DENSE, then steps of 8 (16 beyond 64) up to max_tokens
    draft_widths: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)  # w: draft tokens per request per draft forward
    repeats: int = 10  # timed rounds per (B, L): every entry once per round (all kept; the median is used)
    warmup: int = 2  # untimed runs per entry in the first pass (later passes: one per model and (B, L) block)
    passes: int = 3  # sweeps through the (B, L) grid the rounds are spread over (at most `repeats`)
    max_repeats: int = 0  # above `repeats`: further passes over the entries whose medians are not yet within
    #                        MEDIAN_ERROR_GOAL, up to this many rounds
    seed: int = 0  # random token ids

    @property
    def batch_grid(self) -> list[int]:
        """B measured (`specsim.sim.cost.batch_grid`): every B up to 8, then the batch sizes asked for."""
        return batch_grid(self.batches)

    def entries(self, n_drafts: int) -> int:
        """Entries timed: every (B, L) by every target N and every draft's widths."""
        return len(self.batch_grid) * len(self.contexts) * (len(self.sizes) + n_drafts * len(self.draft_widths))

    @property
    def pass_rounds(self) -> list[int]:
        """Timed rounds per (B, L) in each pass: `repeats` split as evenly as `passes` allows, larger first."""
        p = min(self.passes, self.repeats)
        return [self.repeats // p + (i < self.repeats % p) for i in range(p)]

    def warmups(self, pass_index: int) -> int:
        """Untimed runs per entry in a pass: `warmup` in the first, none in the later ones, which run one untimed
        forward per model on each refilled (B, L) block instead (`primes`). The first forward on a refilled
        context ran 1.19-1.58x slow at B = 4, L = 832 (`analyses/results/profile-passes-cpu-2026-11-26`); one run
        of every entry for it cost the demo's profile a third of its forwards. Four profiles of the demo's grid,
        alternating the two rules on a 2-core CPU, differed between rules (median 4.5-8.6% per entry) about as much
        as between two profiles of one rule (5.0-5.8%), and the rule of one run per block did not run slower, as
        cold forwards would make it (1.1% slower, then 2.0% and 7.2% faster than the neighbouring profile of the
        other rule; `analyses/results/demo-warmups-cpu-2026-11-28`)."""
        return self.warmup if pass_index == 0 else 0

    def primes(self, pass_index: int) -> bool:
        """Whether a pass runs one untimed forward per model on each block before its rounds (later passes)."""
        return pass_index > 0 and self.warmup > 0

    @property
    def overhead_entries(self) -> int:
        """Per-step work outside the forwards timed: every B by every N, for each of `OVERHEAD_KINDS`."""
        return len(self.batch_grid) * len(self.sizes) * len(OVERHEAD_KINDS)

    @property
    def sizes(self) -> list[int]:
        """N measured: every N up to DENSE (small GEMMs are far from linear in N on CPUs: measured on
        SmolLM2, N = 3 and 7 cost more than N = 4 and 8), then steps of 8, and 16 beyond 64."""
        sizes = list(range(1, min(self.max_tokens, DENSE) + 1))
        n = sizes[-1]
        while n < self.max_tokens:
            n = min(self.max_tokens, (n // 8 + 1) * 8 if n < 64 else (n // 16 + 1) * 16)
            sizes.append(n)
        return sizes


def device_label(device: torch.device | str) -> str:
    """The profile's device string: 'cpu (2 threads)' or 'cuda (<GPU name>)'."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({torch.get_num_threads()} threads)"


def verify_tree_parents(n_tokens: int) -> np.ndarray:
    """Parent array of the tree verified with N tokens: a binary tree cut to N nodes in BFS order."""
    return np.array([-1] + [(i - 1) // 2 for i in range(1, n_tokens)], dtype=np.int64)


def _tree_layout(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(depth (n,), attend (n, n)) of a parent array in BFS order."""
    n = len(parents)
    depth = np.zeros(n, dtype=np.int64)
    attend = np.eye(n, dtype=bool)
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
        attend[i] |= attend[parents[i]]
    return depth, attend


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _summary(t: list[float]) -> dict:
    """A profile entry: the median of its rounds, their quartiles, and every round kept."""
    q25, median, q75 = np.percentile(t, [25, 50, 75])
    return {"median": float(median), "q25": float(q25), "q75": float(q75), "n": len(t), "runs": list(t)}


def _extend(into: dict, more: dict) -> None:
    """Append each entry's rounds in `more` to its rounds in `into`."""
    for key, t in more.items():
        into.setdefault(key, []).extend(t)


MEDIAN_ERROR_GOAL = 0.05  # a median this certain (relative standard error) needs no more rounds


def median_error(runs: Sequence[float], median: float) -> float:
    """A median's standard error relative to it, estimated from its rounds' quartiles: the normal approximation
    1.2533 x sigma / sqrt(n), sigma from the interquartile range (IQR / 1.349), robust to a stalled round. Rough with
    few rounds, which is when it matters most (an EAGLE-3 head's 5-15 ms steps on a shared 2-core CPU: 78% with 3
    rounds, 16% with 9; analyses/results/eagle3-scale-cpu-2026-11-26)."""
    q25, q75 = np.percentile(runs, [25, 75])
    return 1.2533 * (q75 - q25) / 1.349 / np.sqrt(len(runs)) / median


def _least_certain(times: dict) -> float:
    """The largest `median_error` over the timed entries of `times` ((B, L) -> {entry: [seconds per round]})."""
    return max((median_error(t, float(np.median(t))) for (_, L), block in times.items() if L != "overhead"
                for t in block.values()), default=0.0)


TRUSTED_ROUNDS = 8  # `max_repeats` stops timing an entry only after this many rounds: fewer rounds' quartiles do not
#                    say how certain a median is (a plain step's 5 rounds of 43-45 ms and one stalled at 79 ms gave
#                    a 1% error, and resampling those 5 put the plain step at 79 ms in some replicas,
#                    analyses/results/profile-blocks-cpu-2026-11-27)


def _unsure(times: dict) -> dict:
    """{(B, L): the entries with fewer than TRUSTED_ROUNDS rounds or whose median's `median_error` is over
    MEDIAN_ERROR_GOAL}, blocks with none left out."""
    out = {key: {k for k, t in block.items()
                 if len(t) < TRUSTED_ROUNDS or median_error(t, float(np.median(t))) > MEDIAN_ERROR_GOAL}
           for key, block in times.items() if key[1] != "overhead"}
    return {key: entries for key, entries in out.items() if entries}


def _round_times(runs: dict, device: torch.device, *, warmup: int, repeats: int,
                 rng: np.random.Generator, tick: Callable[[], None] = lambda: None,
                 lead_in: dict | None = None, prime: bool = False) -> dict:
    """{key: [seconds per round]} of every run in `runs`, measured in `repeats` rounds: each round times every
    run once, in a fresh random order, synchronised before and after each, so a slow moment of the machine
    falls on all entries alike and the rounds can be resampled jointly. `lead_in` {key: run}: run, untimed,
    right before that key's timed run (what the engine runs before it). `prime`: first one untimed run of each
    model's first key (keys are (model, x)), for a context just refilled."""
    keys = list(runs)
    lead_in = lead_in or {}
    if prime:
        for key in {key[0]: key for key in reversed(keys)}.values():
            runs[key]()
    for _ in range(warmup):
        for key in keys:
            runs[key]()
    times: dict = {key: [] for key in keys}
    for _ in range(repeats):
        for i in rng.permutation(len(keys)):
            if keys[i] in lead_in:
                lead_in[keys[i]]()
            _sync(device)
            started = time.perf_counter()
            runs[keys[i]]()
            _sync(device)
            times[keys[i]].append(time.perf_counter() - started)
            tick()
    return times


class _Bench:
    """One model with B rows of L entries of random keys and values in a slot cache (`SlotKV.fill_random`: no
    prefill, whose cost was most of a profile's); forwards are timed and never committed."""

    def __init__(self, model, batch: int, context: int, rng: np.random.Generator):
        from specsim.record.kv import SlotKV

        self.kv = SlotKV(model)
        self.vocab = int(model.config.vocab_size)
        self.rng = rng
        device = next(model.parameters()).device
        self.kv.fill_random(batch, context, torch.Generator(device=device).manual_seed(int(rng.integers(2**31))))

    def run(self, depth: np.ndarray, attend: np.ndarray, pick: Callable) -> Callable[[], None]:
        tokens = self.rng.integers(0, self.vocab, (self.kv.rows, len(depth)))

        def once() -> None:
            logits = self.kv.forward(tokens, depth, attend)
            pick(logits)
            self.kv.commit([np.empty(0, dtype=np.int64)] * self.kv.rows)  # forget: the context stays L

        return once


class _HeadBench:
    """A head draft at B requests and context L: Medusa's head pass at the root state, or an EAGLE / EAGLE-3 layer
    forward of w entries over a cache of L entries (random features and tokens; never committed). The timed
    forward is a tree level's (the head's own features; EAGLE-3's fusion of the target's layers runs on the root
    feed only)."""

    def __init__(self, head, batch: int, context: int, rng: np.random.Generator):
        self.head, self.B, self.L = head, batch, context
        dev = next(head.module.parameters()).device
        dtype = next(head.module.parameters()).dtype
        self.gen = torch.Generator(device="cpu").manual_seed(int(rng.integers(2**31)))
        H, self.V = head.config.hidden_size, head.config.vocab_size
        self.rand = lambda *shape: torch.randn(*shape, generator=self.gen).to(device=dev, dtype=dtype)  # noqa: E731
        self.ids = lambda *shape: torch.randint(0, self.V, shape, generator=self.gen).to(dev)  # noqa: E731
        self.past = None
        if head.autoregressive:
            mask = torch.ones(context, context, dtype=torch.bool, device=dev).tril().expand(batch, -1, -1)
            positions = torch.arange(context, device=dev).expand(batch, -1)
            width = H * len(head.hidden_layers)  # the target's states the head reads, side by side
            _, self.past = head.forward(self.rand(batch, context, width), self.ids(batch, context), positions, mask,
                                        None, from_target=True)

    def run(self, w: int, pick: Callable) -> Callable[[], None]:
        head, B, L = self.head, self.B, self.L
        H = head.config.hidden_size
        if not head.autoregressive:  # Medusa: one pass of every head at the root's state, whatever the tree
            state = self.rand(B, H)
            return lambda: pick(head.module(state, head.lm_head))
        dev = self.past[0][0].device
        feats, ids = self.rand(B, w, H), self.ids(B, w)
        positions = torch.full((B, w), L, device=dev)
        mask = torch.cat([torch.ones(w, L, dtype=torch.bool, device=dev), torch.eye(w, dtype=torch.bool, device=dev)],
                         dim=1).expand(B, -1, -1)

        def once() -> None:
            out, _ = head.forward(feats, ids, positions, mask, self.past, from_target=False)
            pick(head.logits(out))

        return once


OVERHEAD_TEMPERATURE = 1.0  # the sampling entries' temperature (softmax and draws cost the same at any T > 0)


def _overhead_runs(batch: int, sizes: Sequence[int], vocab: int, device: torch.device,
                   rng: np.random.Generator) -> dict:
    """{(kind, N): one run} of the per-step work outside the forwards (`OVERHEAD_KINDS`) for B = `batch`
    requests over the N-token tree the target entries verify, with the live engine's functions."""
    from specsim.live.drafting import fill_children, probabilities
    from specsim.live.decoder import verify_tree
    from specsim.trees import Tree

    gen = torch.Generator(device="cpu").manual_seed(int(rng.integers(2**31)))
    runs = {}
    for n in sizes:
        parents = verify_tree_parents(n)
        ranks = np.array([-1] + [(i - 1) % 2 for i in range(1, n)], dtype=np.int64)
        tree = Tree(parents, ranks)
        target = torch.randn(batch, n, vocab, generator=gen).to(device)
        draft = target + torch.randn(batch, n, vocab, generator=gen).to(device)  # a noisy copy
        valid = np.ones((batch, n), dtype=bool)
        rngs = [np.random.default_rng(int(rng.integers(2**31))) for _ in range(batch)]
        top = target.argmax(dim=-1).cpu().numpy()
        greedy_tokens = top[:, parents.clip(0)]  # each node the target's choice after its parent: deepest walk
        laws = probabilities(draft, OVERHEAD_TEMPERATURE)  # (B, n, V): the draft's law after each node

        def walk_greedy(tree=tree, top=top, tokens=greedy_tokens) -> None:
            for r in range(batch):
                verify_tree(tree, tokens[r], valid[r], policy="greedy", multi_draft="iid", rng=rngs[r],
                            top_of=lambda node, r=r: top[r, node])

        def draft_sample(n=n, tree=tree, draft=draft) -> list[np.ndarray]:
            tokens, fresh, q = np.zeros((batch, n), dtype=np.int64), valid.copy(), {}
            level = np.array([0])
            while True:
                inner = level[tree.n_children[level] > 0]
                if inner.size == 0:
                    return tokens
                level = fill_children(tree, inner, draft[:, inner], tokens, fresh, q, sampling=True,
                                      temperature=OVERHEAD_TEMPERATURE, multi_draft="iid", rngs=rngs)

        def walk(policy: str, tree: Tree, tokens: np.ndarray, target=target, laws=laws) -> Callable[[], None]:
            """Each request's verification walk at T = 1 under `policy`, reading the target's and the draft's laws."""
            def once() -> None:
                for r in range(batch):
                    verify_tree(tree, tokens[r], valid[r], policy=policy, multi_draft="iid", rng=rngs[r],
                                p_of=lambda node, r=r: probabilities(target[r, node], OVERHEAD_TEMPERATURE),
                                q_of=lambda node, r=r: laws[r, node])
            return once

        chain = Tree(np.arange(-1, n - 1), np.where(np.arange(n) == 0, -1, 0))  # block verifies chains
        drafted = np.zeros((batch, n), dtype=np.int64)  # node i + 1 drawn from the draft's law after node i
        if n > 1:
            drafted[:, 1:] = torch.multinomial(torch.from_numpy(laws[:, :n - 1].reshape(-1, vocab)), 1,
                                               generator=gen).reshape(batch, n - 1).numpy()
        runs[("walk_greedy", n)], runs[("walk_sample", n)], runs[("walk_block", n)], runs[("draft_sample", n)] = (
            walk_greedy, walk("sample", tree, draft_sample()), walk("block", chain, drafted), draft_sample)
    return runs


def tree_mask_honoured(model, seed: int = 0) -> bool:
    """Whether the model applies a custom 4-D mask: a sibling must not see its sibling.

    Root r with children a and b: b's logits under the tree mask must equal b's logits
    when the input is just (r, b). Any exception from the 4-D path counts as "not honoured".
    """
    from specsim.record.kv import SlotKV

    rng = np.random.default_rng(seed)
    vocab = int(model.config.vocab_size)
    context, ids = rng.integers(0, vocab, 8), rng.integers(0, vocab, 3)
    try:
        kv = SlotKV(model)
        kv.start([context])
        depth, attend = _tree_layout(np.array([-1, 0, 0]))
        tree = kv.forward(ids[None], depth, attend)[0, 2]
        kv.commit([np.empty(0, dtype=np.int64)])
        chain = kv.forward(ids[None, [0, 2]], np.arange(2), np.tril(np.ones((2, 2), bool)))[0, 1]
    except (RuntimeError, ValueError, TypeError, IndexError):
        return False
    scale = float(chain.abs().max()) or 1.0
    return float((tree - chain).abs().max()) / scale < 1e-2


def leave_one_out_error(table: np.ndarray, grids: Sequence[Sequence[float]]) -> float:
    """Max relative error of predicting each interior grid point by linear interpolation from its neighbours."""
    worst = 0.0
    for axis, grid in enumerate(grids):
        g = np.asarray(grid, dtype=np.float64)
        for k in range(1, len(g) - 1):
            w = (g[k] - g[k - 1]) / (g[k + 1] - g[k - 1])
            lo, mid, hi = (np.take(table, i, axis=axis) for i in (k - 1, k, k + 1))
            worst = max(worst, float(np.max(np.abs((1 - w) * lo + w * hi - mid) / mid)))
    return worst


def measure_cost_profile(target, drafts: Sequence, *, config: ProfileConfig = ProfileConfig(),
                         progress: bool = True) -> dict:
    """Time target verification and draft steps over the (B, L, N) and (B, L, w) grids; the profile JSON body.

    target, drafts: `specsim.record.models.LoadedModel`s (drafts may be empty: plain steps only).
    """
    from tqdm.auto import tqdm

    from specsim.live.drafting import top_ranked

    from specsim.record.head_unroll import HeadDraft

    check_config(config)
    heads = {d.name for d in drafts if isinstance(d, HeadDraft)}
    models = [("target", target)] + [(d.name, d) for d in drafts if d.name not in heads]
    for what, m in models:
        widest = config.max_tokens if what == "target" else max(config.draft_widths)
        check_fits(m.model, config.contexts, widest, f"{what} {m.name}")
        if not tree_mask_honoured(m.model, seed=config.seed):
            raise ModelError(f"{what} {m.name} ignores custom 4-D attention masks; tree verification and "
                             "live decoding need them (try another attention implementation)")
    device = next(target.model.parameters()).device
    rng = np.random.default_rng(config.seed)
    sizes, widths = config.sizes, list(config.draft_widths)
    batches = config.batch_grid
    load_before = _loadavg()
    verify: dict = {}
    draft: dict = {d.name: {} for d in drafts}
    overhead: dict = {kind: {} for kind in OVERHEAD_KINDS}
    bar = tqdm(total=(config.entries(len(drafts)) + config.overhead_entries) * config.repeats, desc="profile",
               unit="run", disable=not progress)
    greedy_pick = lambda logits: logits.argmax(dim=-1).cpu()  # noqa: E731  what greedy verification reads
    times: dict = {}  # (B, L or "overhead") -> {entry: [seconds per round]}, the passes' rounds in order
    ran: list[tuple[int, int]] = []  # (rounds, entries timed) per pass: the planned passes, then further ones
    planned = config.pass_rounds
    with torch.inference_mode():
        while True:
            p = len(ran)
            if p < len(planned):
                rounds, unsure = planned[p], None  # every entry
            else:  # further passes (`max_repeats`): only the entries whose median is still too uncertain
                done = config.repeats + sum(r for r, _ in ran[len(planned):])
                rounds = min(planned[-1], config.max_repeats - done)
                unsure = _unsure(times) if rounds > 0 else {}
                if not unsure:
                    break
                bar.total += sum(map(len, unsure.values())) * rounds
                bar.refresh()
            ran.append((rounds, config.entries(len(drafts)) if unsure is None else sum(map(len, unsure.values()))))
            for B in batches:
                for L in config.contexts:
                    want = None if unsure is None else unsure.get((B, L), set())
                    keys = ([("target", n) for n in sizes] + [(d.name, w) for d in drafts for w in widths]
                            if want is None else sorted(want, key=str))
                    runs, benches = {}, {}  # (who, x) -> one forward, timed together in interleaved rounds
                    for who, x in keys:
                        if who not in benches:  # each model's context filled once per block and pass
                            model = target if who == "target" else next(d for d in drafts if d.name == who)
                            benches[who] = (_HeadBench(model, B, L, rng) if who in heads
                                            else _Bench(model.model, B, L, rng))
                        bench = benches[who]
                        if who == "target":
                            runs[(who, x)] = bench.run(*_tree_layout(verify_tree_parents(x)), greedy_pick)
                        else:  # siblings: each sees the context and itself; their children are picked
                            pick = lambda logits: top_ranked(logits.reshape(-1, logits.shape[-1]), 1)  # noqa: E731
                            runs[(who, x)] = (bench.run(x, pick) if who in heads
                                              else bench.run(np.ones(x, np.int64), np.eye(x, dtype=bool), pick))
                    if runs:  # plain decoding runs its step back to back: timed after one of its own
                        plain = {("target", 1): runs[("target", 1)]} if ("target", 1) in runs else {}
                        _extend(times.setdefault((B, L), {}), _round_times(runs, device, warmup=config.warmups(p),
                                                                           repeats=rounds, rng=rng, tick=bar.update,
                                                                           lead_in=plain, prime=config.primes(p)))
                    del benches, runs
                if unsure is None:  # the work outside the forwards: the planned rounds only (no goal to meet)
                    runs = _overhead_runs(B, sizes, int(target.model.config.vocab_size), device, rng)
                    _extend(times.setdefault((B, "overhead"), {}),
                            _round_times(runs, device, warmup=config.warmups(p), repeats=rounds, rng=rng,
                                         tick=bar.update, prime=config.primes(p)))
            if p + 1 >= len(planned) and config.max_repeats <= config.repeats:
                break
    bar.close()
    for B in batches:
        for kind in OVERHEAD_KINDS:
            overhead[kind][str(B)] = {str(n): _summary(times[(B, "overhead")][(kind, n)]) for n in sizes}
        for L in config.contexts:
            timed = times[(B, L)]
            verify.setdefault(str(B), {})[str(L)] = {str(n): _summary(timed[("target", n)]) for n in sizes}
            for d in drafts:
                draft[d.name].setdefault(str(B), {})[str(L)] = {str(w): _summary(timed[(d.name, w)]) for w in widths}
    medians = lambda t, xs: np.array([[[t[str(b)][str(L)][str(x)]["median"] for x in xs]  # noqa: E731
                                       for L in config.contexts] for b in batches])
    errors = [leave_one_out_error(medians(verify, sizes), (batches, config.contexts, sizes))]
    errors += [leave_one_out_error(medians(draft[d.name], widths), (batches, config.contexts, widths)) for d in drafts]
    import transformers

    from specsim import __version__

    return {
        "format": FORMAT, "version": VERSION,
        "device": device_label(device), "device_type": device.type,
        "threads": torch.get_num_threads(), "dtype": str(next(target.model.parameters()).dtype).removeprefix("torch."),
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "load_average": {"before": load_before, "after": _loadavg()},
        "versions": {"specsim": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "mask": "tree-4d",
        "target": _model_entry(target),
        "drafts": {d.name: _model_entry(d) for d in drafts},
        "batches": batches, "contexts": list(config.contexts), "sizes": sizes, "widths": widths,
        "timing": {"warmup": config.warmup, "repeats": config.repeats, "passes": len(ran),
                   "max_repeats": config.max_repeats or config.repeats,
                   "max_rounds": max(len(t) for key, block in times.items() if key[1] != "overhead"
                                     for t in block.values()),
                   "least_certain_median": _least_certain(times),
                   "statistic": "median",
                   "spread": "q25/q75", "clock": "wall, synchronised", "seed": config.seed,
                   "tokens": "random ids", "context": "random keys and values (no prefill)",
                   "rounds": "every entry of a (B, L) timed once per round, in random order (the plain step, N = "
                             "1, right after an untimed one of its own, as plain decoding runs it); `runs` keeps each "
                             "round's time; the rounds spread over `passes` sweeps through the (B, L) grid "
                             f"({'+'.join(str(r) for r, _ in ran[:len(planned)])} rounds; a slow phase of the "
                             "machine then falls on a few rounds of several blocks, not all of one)"
                             + (f"; then further passes, each over the entries with fewer than {TRUSTED_ROUNDS} "
                                f"rounds or whose median's standard error was still over "
                                f"{100 * MEDIAN_ERROR_GOAL:g}%, in rounds among themselves (entries per "
                                f"pass: {', '.join(str(n) for _, n in ran[len(planned):]) or 'none'}; at most "
                                f"{config.max_repeats} rounds)" if config.max_repeats > config.repeats else "")},
        "target_verify_s": verify,
        "draft_step_s": draft,
        "step_overhead_s": {**overhead, "temperature": OVERHEAD_TEMPERATURE,
                            "what": "per step, outside the forwards, B requests over the N-token tree of "
                                    "target_verify_s: walk_greedy / walk_sample (verification walks, "
                                    "greedy / sampling at T > 0), walk_block (block verification of an "
                                    "N-token chain at T > 0), draft_sample (drawing the tree's "
                                    "candidates from the draft's law at T > 0); random logits"},
        "fit": {"max_relative_error": max(errors),
                "method": "leave-one-out: each interior grid point predicted by linear interpolation "
                          "from its neighbours along each axis"},
    }


def estimate(target, drafts: Sequence, config: ProfileConfig) -> str:
    """How many timed forwards `measure_cost_profile` makes and about how long the whole profile takes, before
    anything is measured: the forwards from one timed plain step and one at the largest N and context, at the
    largest batch; filling each (B, L)'s contexts (every model's B x L entries of random keys and values, scaled
    from one timed fill per model, the target's at the largest batch and context, each draft's at one request); and the
    per-step work outside the forwards, from one run of each at the largest batch."""
    from specsim.record.head_unroll import HeadDraft

    passes = len(config.pass_rounds)
    runs_per_entry = config.repeats + sum(config.warmups(p) for p in range(passes))
    total = config.entries(len(drafts)) * runs_per_entry
    primes = sum(config.primes(p) for p in range(passes)) * len(config.batch_grid) * len(config.contexts)
    total += primes * (1 + len(drafts))  # later passes: one untimed forward per model on each refilled block
    total += len(config.batch_grid) * len(config.contexts) * config.repeats  # the plain step's untimed lead-ins
    B, L = max(config.batch_grid), max(config.contexts)
    cells = passes * sum(b * c for b in config.batch_grid for c in config.contexts)  # B x L filled per model
    rng = np.random.default_rng(0)
    seconds, fill = [], 0.0
    with torch.inference_mode():
        for n, context in ((1, min(config.contexts)), (config.sizes[-1], L)):
            depth, attend = _tree_layout(verify_tree_parents(n))
            started = time.perf_counter()
            bench = _Bench(target.model, B, context, rng)
            if context == L:
                fill += (time.perf_counter() - started) * cells / (B * L)
            once = bench.run(depth, attend, lambda logits: logits.argmax(dim=-1))
            once()
            started = time.perf_counter()
            once()
            seconds.append(time.perf_counter() - started)
        for d in drafts:
            if not isinstance(d, HeadDraft):
                started = time.perf_counter()
                _Bench(d.model, 1, L, rng)
                fill += (time.perf_counter() - started) * cells / L
        device = next(target.model.parameters()).device
        runs = _overhead_runs(B, config.sizes, int(target.model.config.vocab_size), device, rng)
        started = time.perf_counter()
        for run in runs.values():
            run()
        outside = (time.perf_counter() - started) * runs_per_entry * len(config.batch_grid)
    forwards = total * float(np.mean(seconds))
    about = forwards + fill + outside
    more = ""
    if config.max_repeats > config.repeats:
        def further_s(extra: int) -> float:  # every entry `extra` more rounds; the contexts refilled (and a
            further = -(-extra // config.pass_rounds[-1])  # forward per model) per further pass; no work outside
            return forwards * extra / runs_per_entry + fill * further / passes

        least = min(TRUSTED_ROUNDS, config.max_repeats) - config.repeats  # every entry runs to TRUSTED_ROUNDS
        more = (f"; then further passes over the entries with fewer than {TRUSTED_ROUNDS} rounds or a median not yet "
                f"within {100 * MEDIAN_ERROR_GOAL:g}%: "
                + (f"at least {least} more rounds of every entry (about {about + further_s(least):.0f} s in all), "
                   if least > 0 else "")
                + f"up to {config.max_repeats - config.repeats} more (up to about "
                f"{about + further_s(config.max_repeats - config.repeats):.0f} s)")
    primed = "; one untimed forward per model as each later pass refills a block" if primes else ""
    return (f"{config.entries(len(drafts))} entries x ({config.repeats} rounds + {runs_per_entry - config.repeats} "
            f"warm-up, over {passes} passes through the grid{primed}): {total} forwards, then "
            f"{config.overhead_entries} entries of the per-step work outside the forwards; about "
            f"{about:.0f} s ({forwards:.0f} s of forwards, from a plain step and the largest at the "
            f"largest batch; {fill:.0f} s filling the contexts; {outside:.0f} s of work outside the forwards){more}")


def _model_entry(loaded) -> dict:
    from specsim.record.head_unroll import HeadDraft

    if isinstance(loaded, HeadDraft):  # timed as the engine drafts with it (docs/design.md §3)
        return {"name": loaded.name, "kind": loaded.kind, "heads": True,
                **{k: loaded.info[k] for k in ("spec", "path", "params", "architecture", "architecture_sha256")
                   if k in loaded.info}}
    keys = ("spec", "source", "sha256", "id", "revision", "n_layers", "params", "tokenizer_sha256", "architecture",
            "architecture_sha256", "layers", "quantization")
    return {"name": loaded.name, **{k: loaded.info[k] for k in keys if k in loaded.info}}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def write_profile(body: dict, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the profile JSON atomically (temporary file + rename); refuse to replace a file unless asked."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ArgumentError("{path} exists; pass {overwrite} to replace it", path=path)
    check_writable("--out", path)
    return write_text(path, json.dumps(body, indent=1) + "\n")


def check_config(config: ProfileConfig) -> None:
    """Refuse a grid or a round count that cannot be measured, before any model is loaded."""
    if not config.batches or min(config.batches) < 1:
        raise ArgumentError("{batches} {value}: batch sizes are positive", value=config.batches)
    if not config.contexts or min(config.contexts) < 1:
        raise ArgumentError("{contexts} {value}: contexts are positive token counts", value=config.contexts)
    if config.max_tokens < 2:
        raise ArgumentError("{max_tokens} {value}: at least 2 (N = 1 is the plain step)", value=config.max_tokens)
    if not config.draft_widths or min(config.draft_widths) < 1 or 1 not in config.draft_widths:
        raise ArgumentError("{draft_widths} {value}: positive, and 1 among them", value=config.draft_widths)
    if config.repeats < 1 or config.warmup < 0:
        raise SpecError(f"repeats must be >= 1 and warmup >= 0, got {config.repeats} and {config.warmup}")
    if config.passes < 1:
        raise ArgumentError("{passes} {value}: at least 1 sweep through the grid", value=config.passes)
    if config.max_repeats and config.max_repeats < config.repeats:
        raise ArgumentError("{max_repeats} {value}: at least {repeats} ({minimum})", value=config.max_repeats,
                            minimum=config.repeats)


def check_fits(model, contexts: tuple[int, ...], max_tokens: int, what: str) -> None:
    """Refuse contexts the model's position table cannot hold, before any timing."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and max(contexts) + max_tokens > limit:
        raise ModelError(
            f"{what} holds {limit} positions; context {max(contexts)} + {max_tokens} new tokens exceeds it: "
            "lower --contexts or --max-tokens"
        )

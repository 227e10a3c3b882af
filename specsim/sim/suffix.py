"""SuffixDecoding (Oliaro et al. 2024): a model-free draft from suffix trees over earlier tokens.

The rule, as ArcticInference implements it (csrc/suffix_decoding/suffix_tree.cc:
`SuffixTree::speculate`, `_speculate_path`, `_speculate_tree`) and vLLM calls it
(vllm/v1/spec_decode/suffix_decoding.py, `SuffixDecodingProposer.propose`):

* two trees of token suffixes, each truncated at `depth` tokens (vLLM's
  `suffix_decoding_max_tree_depth`, default 24): the request's **local** tree (its prompt,
  then its output so far, as one sequence), and a **global** tree of outputs: the last
  `requests` requests' (`suffix_decoding_max_cached_requests`, FIFO, this request's included;
  its slot is taken when it starts);
* a node's count is the number of suffixes through it, i.e. the occurrences of its string;
  a child's estimated probability is its parent's times count(child) / count(parent), in
  float32 as there;
* the pattern is the last `depth` tokens of prompt + output. For each match length
  m = 1, 2, … below the pattern's length that the tree holds, speculate at most
  min(budget, ⌊factor·m + offset⌋) tokens (`max_spec_factor`, `max_spec_offset`), best
  first by estimated probability, keeping only tokens with probability ≥ `prob`
  (`min_token_prob`, default 0.1); the candidate's score is the sum of its tokens'
  probabilities. The best-scoring match wins (ties: the longer match), then the global
  tree's candidate replaces the local tree's when it scores strictly higher.

The draft tree's shape is the `--tree` given (its rank paths, as for every draft): a
node's r-th child proposes its r-th child in ArcticInference's sibling order (most frequent
first; equal counts in the order its linked lists keep, `SuffixTrie`), and the best-first
expansion only grows nodes of that tree. `chain:N` is vLLM's suffix decoding with
num_speculative_tokens = N (ArcticInference's path mode); a branching tree is
ArcticInference's tree mode within that shape (its heap's order among equal probabilities is
its own; here the lower tree node goes first). tests/test_suffix.py checks every proposal of
ArcticInference itself in 300 recorded runs (tests/data/arctic_suffix.json).

Exactness: the proposal is a function of the tokens only (the prompt, this request's
output so far and the earlier requests' outputs in cache order), a point mass per node,
so replay on the recorded trajectories is exact for greedy and sampling alike
(docs/design.md §2). The global tree makes requests depend on each other: live decoding
must run them one at a time in cache order (--batch 1), as `validate` does.

The counts live in an uncompressed suffix trie: about `depth` nodes per token held, each
an entry of a dict, so memory grows as depth × tokens (about 100 bytes per node).
numpy only.
"""

from __future__ import annotations

import bisect
import heapq
import re
from collections import deque
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import numpy as np

from specsim.errors import SpecError
from specsim.trees import Tree

if TYPE_CHECKING:  # pragma: no cover
    from specsim.sim.engine import AcceptanceTable
    from specsim.sim.features import Features


@dataclass(frozen=True)
class SuffixDraft:
    """suffix[:depth=24,factor=1,offset=0,prob=0.1,requests=10000] (vLLM's defaults)."""

    depth: int = 24  # suffixes kept per tree, and the longest pattern matched
    factor: float = 1.0  # tokens speculated per matched token
    offset: float = 0.0  # tokens speculated beyond factor × match length
    prob: float = 0.1  # least estimated probability of a speculated token
    requests: int = 10_000  # outputs the global tree holds, this request's included (FIFO); 0: no global tree

    @property
    def name(self) -> str:
        changed = [f"{f.name}={getattr(self, f.name):g}" for f in fields(self)
                   if getattr(self, f.name) != f.default]
        return "suffix" + (":" + ",".join(changed) if changed else "")


_EXAMPLE = "suffix:depth=24,factor=1,prob=0.1"


def parse_suffix(text: str) -> SuffixDraft:
    """'suffix' | 'suffix:depth=24,factor=1.5,offset=0,prob=0.1,requests=10000' (any subset, any order)."""
    head, _, arg = str(text).strip().partition(":")
    if head.strip().lower() != "suffix":
        raise SpecError(f"{text!r} is not a suffix draft (e.g. {_EXAMPLE})")
    types = {f.name: f.type for f in fields(SuffixDraft)}
    values: dict[str, float | int] = {}
    for part in filter(None, (p.strip() for p in arg.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in types:
            raise SpecError(f"{text}: {part!r} is not one of {', '.join(types)}=VALUE (e.g. {_EXAMPLE})")
        if key in values:
            raise SpecError(f"{text}: {key} is given twice")
        integer = types[key] == "int"
        if not re.fullmatch(r"\d+" if integer else r"\d+(\.\d*)?|\.\d+", value.strip()):
            raise SpecError(f"{text}: {key}={value.strip()!r} is not a non-negative {'integer' if integer else 'number'}")
        values[key] = int(value) if integer else float(value)
    draft = SuffixDraft(**values)
    if draft.depth < 1:
        raise SpecError(f"{text}: depth must be at least 1 (the longest suffix kept)")
    if draft.prob > 1:
        raise SpecError(f"{text}: prob={draft.prob:g} is above 1; no token would be speculated")
    return draft


F32 = np.float32  # ArcticInference computes probabilities and scores in float32: so does the replay


class SuffixTrie:
    """Counts of every token string of length ≤ depth in a set of sequences (an uncompressed suffix tree).

    Node 0 is the root (the empty string; its count is the number of tokens appended). Each
    sequence keeps its last `depth` suffixes open and extends them by every appended token.

    Children keep ArcticInference's sibling order (suffix_tree.cc: `_increment_count`,
    `_decrement_count`, new children at the tail): most frequent first, and among equal counts
    the order its linked lists leave. A child whose count rises from c to c + 1 goes first among
    the c + 1 siblings when it was first among the c ones, else last among the c + 1; one whose
    count falls from c to c − 1 goes first among the c − 1; a child counted 0 is dropped (a later
    occurrence starts it again at the tail). vLLM's suffix proposals are its head children, so
    this order decides them where counts tie.
    """

    def __init__(self, depth: int):
        self.depth = depth
        self.count: list[int] = [0]
        self.token: list[int] = [-1]
        self._child: dict[tuple[int, int], int] = {}  # (node, token) -> child counted > 0
        self._kids: list[list[int]] = [[]]  # node -> children counted > 0, in sibling order
        self._open: dict[int, deque[int]] = {}  # sequence -> nodes of its open suffixes
        self._seqs: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._seqs)

    def __contains__(self, seq: int) -> bool:
        return seq in self._seqs

    def _first_at_most(self, kids: list[int], c: int, lo: int = 0, hi: int | None = None) -> int:
        """Index of the first child counted ≤ c (counts fall along `kids`)."""
        return bisect.bisect_left(kids, -c, lo, len(kids) if hi is None else hi, key=lambda k: -self.count[k])

    def _increment(self, parent: int, node: int) -> None:
        kids, count = self._kids[parent], self.count
        c = count[node]
        i = kids.index(node)
        if i and count[kids[i - 1]] <= c + 1:  # it moves: first of the c + 1 siblings, or last of them
            j = self._first_at_most(kids, c + 1 if count[kids[i - 1]] == c + 1 else c, 0, i)
            kids.insert(j, kids.pop(i))
        count[node] = c + 1

    def _decrement(self, parent: int, node: int) -> None:
        kids, count = self._kids[parent], self.count
        c = count[node]
        i = kids.index(node)
        if i + 1 < len(kids) and count[kids[i + 1]] == c:  # it moves: first of the c − 1 siblings
            j = self._first_at_most(kids, c - 1, i + 1)
            kids.insert(j - 1, kids.pop(i))
        count[node] = c - 1

    def extend(self, seq: int, tokens: Sequence[int]) -> None:
        """Append tokens to sequence `seq` (a new one starts empty)."""
        opened = self._open.setdefault(seq, deque())
        stored = self._seqs.setdefault(seq, [])
        count, child, kids, token_of = self.count, self._child, self._kids, self.token
        for tok in tokens:
            tok = int(tok)
            opened.append(0)
            if len(opened) > self.depth:
                opened.popleft()
            count[0] += 1
            for i, node in enumerate(opened):
                nxt = child.get((node, tok))
                if nxt is None:  # a new child, at the tail of its siblings
                    nxt = len(count)
                    child[(node, tok)] = nxt
                    kids[node].append(nxt)
                    count.append(1)
                    token_of.append(tok)
                    kids.append([])
                else:
                    self._increment(node, nxt)
                opened[i] = nxt
            stored.append(tok)

    def remove(self, seq: int) -> None:
        """Forget sequence `seq`: every suffix of it leaves the counts (ArcticInference's `remove` order)."""
        tokens = self._seqs.pop(seq)
        self._open.pop(seq, None)
        for start in range(len(tokens)):
            self.count[0] -= 1
            node = 0
            for tok in tokens[start : start + self.depth]:
                nxt = self._child[(node, tok)]
                if self.count[nxt] == 1:  # the last occurrence: the child and everything under it go
                    del self._child[(node, tok)]
                    self._kids[node].remove(nxt)
                    self.count[nxt] = 0
                    break
                self._decrement(node, nxt)
                node = nxt

    def match(self, pattern: Sequence[int]) -> int:
        """The node of `pattern` (−1 when the sequences do not hold it)."""
        node = 0
        for tok in pattern:
            node = self._child.get((node, int(tok)), -1)
            if node < 0:
                return -1
        return node

    def ranked(self, node: int) -> list[int]:
        """The children of `node`, in sibling order (most frequent first; ties: ArcticInference's order)."""
        return self._kids[node]


@dataclass(frozen=True)
class Speculation:
    tokens: np.ndarray  # (n_nodes,) int64 token per tree node, −1: not speculated (and the root)
    score: float  # sum of the speculated tokens' estimated probabilities (float32 sums, as ArcticInference)
    match_len: int  # tokens of the pattern matched (0: no match)


NOTHING = Speculation(np.empty(0, dtype=np.int64), 0.0, 0)


@lru_cache(maxsize=16)
def _children(tree: Tree) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per node, its children as (node, rank) pairs: read once per tree, not once per push."""
    return tuple(tuple((int(c), int(tree.ranks[c])) for c in tree.children(v)) for v in range(tree.n_nodes))


def _grow(trie: SuffixTrie, node: int, tree: Tree, limit: int, prob: float) -> tuple[np.ndarray, float]:
    """Best-first growth from `node` over `tree`'s rank paths: at most `limit` tokens of probability ≥ prob.

    Pops in (probability desc, tree node id asc) order. A child's probability never exceeds its
    parent's and its id is larger, so the grown set is the `limit` smallest keys among the nodes
    whose path qualifies: prefix-closed, and independent of the heap's internals. A chain is
    ArcticInference's path mode (probability × (count / parent count)), a branching tree its tree
    mode ((probability × count) / parent count), each in float32 as there.
    """
    tokens = np.full(tree.n_nodes, -1, dtype=np.int64)
    score, grown = F32(0), 0
    heap: list[tuple[float, int, int]] = []  # (−probability, tree node, trie node)
    children = _children(tree)
    count = trie.count
    path = tree.n_nodes == tree.max_depth + 1  # one path: path mode
    least = F32(prob)

    def push(v: int, at: int, p) -> None:
        kids = children[v]
        if not kids:
            return
        ranked = trie.ranked(at)
        for c, r in kids:
            if r < len(ranked):
                n = F32(count[ranked[r]])
                q = p * (n / F32(count[at])) if path else (p * n) / F32(count[at])
                if q >= least:
                    heapq.heappush(heap, (-q, c, ranked[r]))

    push(0, node, F32(1))
    while heap and grown < limit:
        q, v, at = heapq.heappop(heap)
        tokens[v] = trie.token[at]
        score = score - q
        grown += 1
        push(v, at, -q)
    return tokens, float(score)


def speculate_in(trie: SuffixTrie, pattern: np.ndarray, tree: Tree, draft: SuffixDraft) -> Speculation:
    """The best speculation of one tree over the suffixes of `pattern` (ArcticInference's `SuffixTree::speculate`).

    Match lengths 1, 2, … below the pattern's length (it stops at the first the tree does not hold);
    a later (longer) match replaces the best on an equal score.
    """
    best = NOTHING
    n = pattern.shape[0]
    factor, offset = F32(draft.factor), F32(draft.offset)
    for m in range(1, n):
        node = trie.match(pattern[n - m :])
        if node < 0:
            break
        limit = min(tree.budget, max(0, int(float(F32(m) * factor + offset) + 1e-6)))
        tokens, score = _grow(trie, node, tree, limit, draft.prob)
        if score >= best.score:
            best = Speculation(tokens, score, m)
    return best


class SuffixSpeculator:
    """The state SuffixDecoding keeps across requests, as ArcticInference's `SuffixDecodingCache` keeps it.

    A local tree per request holds its prompt and, appended to it, its output so far; the global
    tree holds the outputs of the last `requests` requests, this one's included (a request's slot
    is taken when it starts, evicting the oldest, FIFO; requests=0: no global tree). Requests run
    one at a time: `start(prompt)`, then `propose(context, tree)` with context = prompt + output so
    far (the output's new tokens enter both trees first), then `finish(output)` with the whole output.
    """

    def __init__(self, draft: SuffixDraft):
        self.draft = draft
        self.global_trie = SuffixTrie(draft.depth)
        self._local: SuffixTrie | None = None
        self._prompt_len = 0
        self._request = -1
        self._seen = 0  # output tokens of the current request already in the trees
        self._held: deque[int] = deque()  # requests whose outputs the global tree holds, oldest first

    def start(self, prompt: Sequence[int]) -> None:
        if self._local is not None:
            raise SpecError("suffix draft: a request is already decoding (requests run one at a time)")
        self._request += 1
        self._local = SuffixTrie(self.draft.depth)
        self._local.extend(0, prompt)
        self._prompt_len, self._seen = len(prompt), 0
        if self.draft.requests:
            self._held.append(self._request)
            while len(self._held) > self.draft.requests:
                gone = self._held.popleft()
                if gone in self.global_trie:  # an output of no tokens never entered it
                    self.global_trie.remove(gone)

    def _catch_up(self, context: Sequence[int]) -> None:
        new = context[self._prompt_len + self._seen :]
        if len(new):
            self._local.extend(0, new)
            if self.draft.requests:
                self.global_trie.extend(self._request, new)
            self._seen += len(new)

    def propose(self, context: np.ndarray, tree: Tree) -> np.ndarray:
        """(n_nodes,) token per node of `tree` after `context`; −1 where nothing is speculated."""
        self._catch_up(context)
        pattern = np.asarray(context[-self.draft.depth :], dtype=np.int64)
        mine = speculate_in(self._local, pattern, tree, self.draft)
        held = speculate_in(self.global_trie, pattern, tree, self.draft)
        best = mine if mine.score >= held.score else held
        return best.tokens if best.tokens.size else np.full(tree.n_nodes, -1, dtype=np.int64)

    def finish(self, context: Sequence[int]) -> None:
        """The request ended with prompt + output = `context`: its output stays in the global tree."""
        self._catch_up(context)
        self._local = None


def suffix_table(features: "Features", tree: Tree, spec, rng: np.random.Generator) -> "AcceptanceTable":
    """Exact, deterministic table of a suffix draft: trajectories replayed one after another in cache order."""
    from tqdm.auto import tqdm

    from specsim.cache.reader import CacheReader
    from specsim.sim.engine import AcceptanceTable
    from specsim.sim.modelfree import _past_end, accepted_length, exact_table

    draft = parse_suffix(features.draft)
    if features.parent is not None:  # a subset (cross-fitting folds): the global tree still holds every output
        base, rows = features.parent
        whole = suffix_table(base, tree, spec, rng)
        return AcceptanceTable(p_len=whole.p_len[rows], drafted=whole.drafted[rows], exact=True,
                               length=whole.length[rows], engine_drafted=whole.engine_drafted[rows],
                               engine_note="the engine's counts past each end are not replayed on a subset")
    N, D = features.n_positions, tree.max_depth
    remaining, room = features.remaining(), features.room()
    length = np.zeros(N, dtype=np.int64)
    drafted = np.zeros(N)
    proposed = np.zeros(N)  # what an engine drafts: every node with a candidate, whatever the output limit
    past = _past_end(features, D)
    tail_rows: list[int] = []
    tail_len: list[int] = []
    with CacheReader(features.cache_path) as reader:
        prompts = {int(i): reader.prompt_token_ids(int(i)) for i in np.unique(features.traj_prompt)}
    speculator = SuffixSpeculator(draft)
    # vLLM's own history: each request's output enters its global tree with what the last step accepted past the
    # end (it caches the sampled tokens before the scheduler trims them), so later requests can propose otherwise
    engine = SuffixSpeculator(draft) if past else None
    engine_length = np.zeros(N, dtype=np.int64) if engine is not None else None
    for i in tqdm(range(features.n_traj), desc=f"{draft.name} candidates", unit="traj",
                  leave=False, disable=None if N >= 20_000 else True):
        start, n = int(features.traj_start[i]), int(features.traj_len[i])
        prompt = np.asarray(prompts[int(features.traj_prompt[i])], dtype=np.int64)
        p = prompt.shape[0]
        seq = np.concatenate([prompt, features.token[start : start + n].astype(np.int64)])
        speculator.start(prompt)
        beyond = past.get(i)
        for t in range(n):
            tokens = speculator.propose(seq[: p + t], tree)
            drafted[start + t] = float(((tokens >= 0) & (tree.depths <= room[start + t])).sum())
            length[start + t] = accepted_length(tree, tokens, seq[p + t : p + t + int(remaining[start + t])])
        speculator.finish(seq)
        if engine is None:
            proposed[start : start + n] = drafted[start : start + n]
            continue
        engine.start(prompt)
        ahead = {}  # row -> accepted past the end
        for t in range(n):
            tokens = engine.propose(seq[: p + t], tree)
            proposed[start + t] = float((tokens >= 0).sum())
            engine_length[start + t] = accepted_length(tree, tokens, seq[p + t : p + t + int(remaining[start + t])])
            if beyond is not None and remaining[start + t] < D:  # the engine verifies y_{n-1} and past the end
                ahead[start + t] = accepted_length(tree, tokens, np.concatenate([seq[p + t :], beyond]))
        t = 1  # vLLM's walk (the prompt pass emitted y_0): its last step decides what it cached past the end
        while t < n:
            last, t = t, t + int(engine_length[start + t]) + 1
        emitted = ahead.get(start + last, int(engine_length[start + last])) + 1 if n > 1 else 1
        extra = max(0, (last if n > 1 else 0) + emitted - n)
        engine.finish(np.concatenate([seq, beyond[:extra]]) if beyond is not None else seq)
        tail_rows += list(ahead)
        tail_len += list(ahead.values())
    return exact_table(features, D, length, drafted, proposed, tail_rows, tail_len, engine_length)

"""SuffixDecoding (Oliaro et al. 2024): a model-free draft from suffix trees over earlier tokens.

The rule, as ArcticInference implements it (csrc/suffix_decoding/suffix_tree.cc:
`SuffixTree::speculate`, `_speculate_path`, `_speculate_tree`) and vLLM calls it
(vllm/v1/spec_decode/suffix_decoding.py, `SuffixDecodingProposer.propose`):

* two trees of token suffixes, each truncated at `depth` tokens (vLLM's
  `suffix_decoding_max_tree_depth`, default 24): the request's **prompt** tree, and a
  **global** tree of responses: earlier requests' outputs (the last `requests` of them,
  `suffix_decoding_max_cached_requests`, FIFO) plus this request's output so far;
* a node's count is the number of suffixes through it, i.e. the occurrences of its string;
  a child's estimated probability is its parent's times count(child) / count(parent);
* the pattern is the last `depth` tokens of prompt + output. For every suffix of it,
  longest first, that the tree holds (match length m), speculate at most
  min(budget, ⌊factor·m + offset⌋) tokens (`max_spec_factor`, `max_spec_offset`), best
  first by estimated probability, keeping only tokens with probability ≥ `prob`
  (`min_token_prob`, default 0.1); the candidate's score is the sum of its tokens'
  probabilities. The best-scoring match wins (ties: the longer match), then the global
  tree's candidate replaces the prompt tree's when it scores strictly higher.

The draft tree's shape is the `--tree` given (its rank paths, as for every draft): a
node's r-th child proposes the r-th most frequent continuation (ties: the lower token id),
and the best-first expansion only grows nodes of that tree. `chain:N` is vLLM's suffix
decoding with num_speculative_tokens = N (ArcticInference's path mode); a branching tree
is ArcticInference's tree mode within that shape. Probabilities are float64 here (float32
there): a threshold or a tie decided by the last bit can differ from ArcticInference, but
replay and `specsim live` share this code, so they agree exactly.

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
    requests: int = 10_000  # earlier outputs the global tree keeps (FIFO); 0: none

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


class SuffixTrie:
    """Counts of every token string of length ≤ depth in a set of sequences (an uncompressed suffix tree).

    Node 0 is the root (the empty string; its count is the number of tokens appended). Each
    sequence keeps its last `depth` suffixes open and extends them by every appended token.
    """

    def __init__(self, depth: int):
        self.depth = depth
        self.count: list[int] = [0]
        self.token: list[int] = [-1]
        self._child: dict[tuple[int, int], int] = {}  # (node, token) -> child
        self._kids: list[list[int]] = [[]]  # node -> children, in creation order
        self._open: dict[int, deque[int]] = {}  # sequence -> nodes of its open suffixes
        self._seqs: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._seqs)

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
                if nxt is None:
                    nxt = len(count)
                    child[(node, tok)] = nxt
                    kids[node].append(nxt)
                    count.append(0)
                    token_of.append(tok)
                    kids.append([])
                count[nxt] += 1
                opened[i] = nxt
            stored.append(tok)

    def remove(self, seq: int) -> None:
        """Forget sequence `seq`: every suffix of it leaves the counts."""
        tokens = self._seqs.pop(seq)
        self._open.pop(seq, None)
        for start in range(len(tokens)):
            self.count[0] -= 1
            node = 0
            for tok in tokens[start : start + self.depth]:
                node = self._child[(node, tok)]
                self.count[node] -= 1

    def match(self, pattern: Sequence[int]) -> int:
        """The node of `pattern` (−1 when the sequences do not hold it)."""
        node = 0
        for tok in pattern:
            node = self._child.get((node, int(tok)), -1)
            if node < 0 or self.count[node] == 0:
                return -1
        return node

    def ranked(self, node: int) -> list[int]:
        """The children of `node` still counted, most frequent first (ties: the lower token id)."""
        kids = [c for c in self._kids[node] if self.count[c] > 0]
        kids.sort(key=lambda c: (-self.count[c], self.token[c]))
        return kids


@dataclass(frozen=True)
class Speculation:
    tokens: np.ndarray  # (n_nodes,) int64 token per tree node, −1: not speculated (and the root)
    score: float  # sum of the speculated tokens' estimated probabilities
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
    whose path qualifies: prefix-closed, and independent of the heap's internals.
    """
    tokens = np.full(tree.n_nodes, -1, dtype=np.int64)
    score, grown = 0.0, 0
    heap: list[tuple[float, int, int]] = []  # (−probability, tree node, trie node)
    children = _children(tree)
    count = trie.count

    def push(v: int, at: int, p: float) -> None:
        kids = children[v]
        if not kids:
            return
        ranked = trie.ranked(at)
        for c, r in kids:
            if r < len(ranked):
                q = p * count[ranked[r]] / count[at]
                if q >= prob:
                    heapq.heappush(heap, (-q, c, ranked[r]))

    push(0, node, 1.0)
    while heap and grown < limit:
        q, v, at = heapq.heappop(heap)
        tokens[v] = trie.token[at]
        score -= q
        grown += 1
        push(v, at, -q)
    return tokens, score


def speculate_in(trie: SuffixTrie, pattern: np.ndarray, tree: Tree, draft: SuffixDraft) -> Speculation:
    """The best speculation of one tree over every suffix of `pattern` it holds (ArcticInference's `speculate`)."""
    best = NOTHING
    n = pattern.shape[0]
    for start in range(max(0, n - draft.depth), n):
        node = trie.match(pattern[start:])
        if node < 0:
            continue
        m = n - start
        limit = min(tree.budget, max(0, int(m * draft.factor + draft.offset + 1e-6)))
        tokens, score = _grow(trie, node, tree, limit, draft.prob)
        if score > best.score:
            best = Speculation(tokens, score, m)
    return best


class SuffixSpeculator:
    """The state SuffixDecoding keeps across requests: one prompt tree, one global tree of outputs.

    Requests run one at a time: `start(prompt)`, then `propose(context, tree)` with
    context = prompt + output so far (the output's new tokens enter the global tree
    first), then `finish(output)` with the whole output.
    """

    def __init__(self, draft: SuffixDraft):
        self.draft = draft
        self.global_trie = SuffixTrie(draft.depth)
        self._prompt_trie: SuffixTrie | None = None
        self._prompt_len = 0
        self._request = -1
        self._seen = 0  # output tokens of the current request already in the global tree
        self._finished: deque[int] = deque()  # earlier requests still held, oldest first

    def start(self, prompt: Sequence[int]) -> None:
        if self._prompt_trie is not None:
            raise SpecError("suffix draft: a request is already decoding (requests run one at a time)")
        self._request += 1
        self._prompt_trie = SuffixTrie(self.draft.depth)
        self._prompt_trie.extend(0, prompt)
        self._prompt_len, self._seen = len(prompt), 0

    def _catch_up(self, context: Sequence[int]) -> None:
        new = context[self._prompt_len + self._seen :]
        if len(new):
            self.global_trie.extend(self._request, new)
            self._seen += len(new)

    def propose(self, context: np.ndarray, tree: Tree) -> np.ndarray:
        """(n_nodes,) token per node of `tree` after `context`; −1 where nothing is speculated."""
        self._catch_up(context)
        pattern = np.asarray(context[-self.draft.depth :], dtype=np.int64)
        mine = speculate_in(self._prompt_trie, pattern, tree, self.draft)
        held = speculate_in(self.global_trie, pattern, tree, self.draft)
        best = held if held.score > mine.score else mine
        return best.tokens if best.match_len else np.full(tree.n_nodes, -1, dtype=np.int64)

    def finish(self, context: Sequence[int]) -> None:
        """The request ended with prompt + output = `context`: its output stays in the global tree."""
        self._catch_up(context)
        if self._seen:
            self._finished.append(self._request)
        while len(self._finished) > self.draft.requests:
            self.global_trie.remove(self._finished.popleft())
        self._prompt_trie = None


def suffix_table(features: "Features", tree: Tree, spec, rng: np.random.Generator) -> "AcceptanceTable":
    """Exact, deterministic table of a suffix draft: trajectories replayed one after another in cache order."""
    from tqdm.auto import tqdm

    from specsim.cache.store import CacheReader
    from specsim.sim.engine import AcceptanceTable
    from specsim.sim.modelfree import accepted_length

    from specsim.sim.engine import EngineTail
    from specsim.sim.modelfree import _past_end
    from specsim.sim.policies import overhang_note

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
    p_len = np.zeros((N, D + 1))
    p_len[np.arange(N), length] = 1.0
    tail = None
    if tail_rows:
        reach = (np.array(tail_len)[:, None] >= np.arange(1, D + 1)[None, :]).astype(np.float64)  # (M, D)
        tail = EngineTail(rows=np.array(tail_rows, dtype=np.int64), reach=reach)
    return AcceptanceTable(p_len=p_len, drafted=drafted, exact=True, length=length, engine_drafted=proposed,
                           engine_tail=tail, engine_note=overhang_note(features, D), engine_length=engine_length)

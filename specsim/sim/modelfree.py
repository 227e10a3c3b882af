"""Model-free drafts: candidates copied from the context (n-gram / prompt lookup).

* ``ngram:N`` — suffix matching as SGLang's NGRAM speculator does it: find earlier
  occurrences of the last N tokens of prompt + output so far; the candidates are the tokens
  that followed each occurrence, most recent occurrence first.
* ``prompt-lookup:N`` — Hugging Face prompt lookup decoding (Saxena 2023): try the last
  N, N−1, …, 1 tokens; for each length, earlier occurrences from the first one on; propose
  what followed. HF keeps only the first hit; a tree keeps the others as alternatives.
* ``vllm-ngram:min=A,max=B`` — vLLM's ``ngram`` method (``prompt_lookup_min=A``,
  ``prompt_lookup_max=B``), as `vllm/v1/spec_decode/ngram_proposer.py` (vLLM 0.32,
  ``_find_longest_matched_ngram_and_propose_tokens``) runs it: the longest suffix of the
  context, at most B tokens, that occurred earlier (occurrences may overlap the suffix but
  must end before the last token); among occurrences of that length the EARLIEST one; nothing
  when the longest is shorter than A (or the context is). It proposes ONE continuation: the
  up to k = `num_speculative_tokens` tokens that followed that occurrence, fewer where the
  context ends sooner. vLLM finds it with a KMP pass over the reversed context; `vllm_ngram`
  below finds the same occurrence by trying lengths B, B−1, …, A (a match of length m at s
  implies one of length m − 1 at s + 1, so the first length with a match is the longest).

A tree over such candidates puts alternative continuations side by side: the continuations,
in priority order, are inserted into a trie whose children keep insertion order, so the node
with rank path (r_1, …, r_d) proposes the token of the trie path "r_1-th child, then r_2-th
child, …" (no token where the trie has none). The proposal is a point mass, so a node is
accepted iff the target's token equals it, for greedy and sampling alike (docs/design.md §2;
`specsim.verify.verify_point_mass`). Replaying a cached trajectory is therefore exact and
deterministic. `specsim live` drafts with the same `tree_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specsim.errors import SpecError
from specsim.trees import Tree

if TYPE_CHECKING:  # pragma: no cover
    from specsim.sim.engine import AcceptanceTable
    from specsim.sim.features import Features

MAX_MATCHES = 64  # continuations considered per call: bounds the cost on highly repetitive text


@dataclass(frozen=True)
class ModelFreeDraft:
    kind: str  # "ngram" | "prompt-lookup" | "vllm-ngram"
    n: int  # suffix length matched (prompt-lookup: the longest one tried; vllm-ngram: prompt_lookup_max)
    max_matches: int = MAX_MATCHES  # continuations kept per call, in priority order
    n_min: int | None = None  # vllm-ngram: prompt_lookup_min, the shortest match that proposes

    @property
    def name(self) -> str:
        if self.kind == "vllm-ngram":
            return f"{self.kind}:min={self.n_min},max={self.n}"
        return f"{self.kind}:{self.n}"


VLLM_NGRAM_EXAMPLE = "vllm-ngram:min=2,max=3"
RULES = ("ngram", "prompt-lookup", "vllm-ngram")  # the draft kinds whose continuations this module computes


def parse_modelfree(text: str) -> ModelFreeDraft:
    """'ngram:3' | 'prompt-lookup:2' | 'vllm-ngram:min=2,max=3' (as vLLM: a missing bound equals the other)."""
    from specsim.specs import draft_kind, model_free_help

    kind, sep, arg = str(text).strip().partition(":")
    kind = kind.strip().lower()
    if draft_kind(kind).name not in RULES:
        raise SpecError(f"{text!r} is not an n-gram or prompt-lookup draft; model-free drafts: {model_free_help()}")
    if kind == "vllm-ngram":
        return _parse_vllm_ngram(text, arg if sep else "")
    try:
        n = int(arg) if sep else 0
    except ValueError:
        raise SpecError(f"{text}: N must be an integer, e.g. {kind}:3") from None
    if n < 1:
        raise SpecError(f"{text}: N must be at least 1, e.g. {kind}:3")
    return ModelFreeDraft(kind, n)


def _parse_vllm_ngram(text: str, arg: str) -> ModelFreeDraft:
    bounds: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in arg.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("min", "max"):
            raise SpecError(f"{text}: {part!r} is not min=A or max=B (e.g. {VLLM_NGRAM_EXAMPLE})")
        if key in bounds:
            raise SpecError(f"{text}: {key} is given twice")
        if not value.strip().isdigit() or int(value) < 1:
            raise SpecError(f"{text}: {key}={value.strip()!r} is not an integer >= 1 (e.g. {VLLM_NGRAM_EXAMPLE})")
        bounds[key] = int(value)
    if not bounds:
        raise SpecError(f"{text}: give the match lengths, prompt_lookup_min and _max, e.g. {VLLM_NGRAM_EXAMPLE}")
    lo, hi = bounds.get("min", bounds.get("max")), bounds.get("max", bounds.get("min"))
    if lo > hi:
        raise SpecError(f"{text}: min={lo} is above max={hi} (vLLM refuses prompt_lookup_min > prompt_lookup_max)")
    return ModelFreeDraft("vllm-ngram", hi, max_matches=1, n_min=lo)


def _match_starts(context: np.ndarray, m: int) -> np.ndarray:
    """Starts j of earlier occurrences of the last m tokens that have a continuation (j + m < len)."""
    L = context.shape[0]
    if m < 1 or L <= m:
        return np.empty(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(context[:-1], m)  # (L - m, m): starts 0..L-m-1
    return np.flatnonzero((windows == context[-m:]).all(axis=1))


def vllm_ngram(context: np.ndarray, n_min: int, n_max: int, k: int) -> np.ndarray:
    """vLLM's n-gram proposal after `context` (the module docstring): up to k tokens, empty for none."""
    context = np.asarray(context, dtype=np.int64)
    for m in range(min(n_max, context.shape[0] - 1), n_min - 1, -1):
        starts = _match_starts(context, m)
        if starts.size:
            s = int(starts[0]) + m  # the earliest occurrence of the longest match; what followed it
            return context[s : s + k]
    return context[:0]


def continuations(context: np.ndarray, draft: ModelFreeDraft, depth: int) -> list[np.ndarray]:
    """Candidate continuations (each ≤ depth tokens), highest priority first."""
    context = np.asarray(context, dtype=np.int64)
    if draft.kind == "vllm-ngram":
        cont = vllm_ngram(context, draft.n_min, draft.n, depth)
        return [cont] if cont.size else []
    if draft.kind == "ngram":
        starts = [(j, draft.n) for j in _match_starts(context, draft.n)[::-1]]  # most recent first
    else:
        starts = []
        for m in range(min(draft.n, context.shape[0] - 1), 0, -1):
            starts.extend((j, m) for j in _match_starts(context, m))  # earliest first, as HF
            if len(starts) >= draft.max_matches:
                break
    return [context[j + m : j + m + depth] for j, m in starts[: draft.max_matches]]


def tree_tokens(context: np.ndarray, draft: ModelFreeDraft, tree: Tree) -> np.ndarray:
    """(n_nodes,) int64 token each tree node proposes after `context`; −1 for none (and the root)."""
    children: list[dict[int, int]] = [{}]  # trie: node -> {token: child}, insertion (priority) order
    for cont in continuations(context, draft, tree.max_depth):
        node = 0
        for tok in cont.tolist():
            nxt = children[node].get(tok)
            if nxt is None:
                nxt = len(children)
                children[node][tok] = nxt
                children.append({})
            node = nxt
    ordered = [list(c.items()) for c in children]  # [(token, child), ...] by rank
    out = np.full(tree.n_nodes, -1, dtype=np.int64)
    trie_of = np.full(tree.n_nodes, -1, dtype=np.int64)
    trie_of[0] = 0
    for v in range(1, tree.n_nodes):
        parent = trie_of[tree.parents[v]]
        rank = int(tree.ranks[v])
        if parent >= 0 and rank < len(ordered[parent]):
            out[v], trie_of[v] = ordered[parent][rank]
    return out


def accepted_length(tree: Tree, node_tokens: np.ndarray, future: np.ndarray) -> int:
    """Depth reached by walking down the nodes whose tokens equal future[0], future[1], …."""
    node, depth = 0, 0
    while depth < future.shape[0]:
        kids = tree.children(node)
        hit = kids[node_tokens[kids] == future[depth]]
        if hit.size == 0:
            break
        node, depth = int(hit[0]), depth + 1
    return depth


def modelfree_table(features: "Features", tree: Tree, spec, rng: np.random.Generator) -> "AcceptanceTable":
    """Exact, deterministic table for a model-free draft (`features.draft`, e.g. 'ngram:3')."""
    from tqdm.auto import tqdm

    from specsim.cache.reader import CacheReader

    draft = parse_modelfree(features.draft)
    N, D = features.n_positions, tree.max_depth
    remaining, room = features.remaining(), features.room()
    length = np.zeros(N, dtype=np.int64)
    drafted = np.zeros(N)
    proposed = np.zeros(N)  # what an engine drafts: every node with a candidate, whatever the output limit
    past = _past_end(features, D)  # trajectory -> tokens the cache recorded past its end
    tail_rows: list[int] = []
    tail_len: list[int] = []
    with CacheReader(features.cache_path) as reader:  # one open, not one per trajectory
        prompts = {int(i): reader.prompt_token_ids(int(i)) for i in np.unique(features.traj_prompt)}
    # disable=None: a bar on a terminal only (tables printed by the CLI stay clean in pipes and logs)
    for i in tqdm(range(features.n_traj), desc=f"{draft.name} candidates", unit="traj", leave=False,
                  disable=None if N >= 20_000 else True):
        start, n = int(features.traj_start[i]), int(features.traj_len[i])
        seq = np.concatenate([np.asarray(prompts[int(features.traj_prompt[i])], dtype=np.int64),
                              features.token[start : start + n].astype(np.int64)])
        offset = seq.shape[0] - n
        beyond = past.get(i)
        for t in range(n):
            tokens = tree_tokens(seq[: offset + t], draft, tree)
            has = tokens >= 0
            drafted[start + t] = float((has & (tree.depths <= room[start + t])).sum())
            proposed[start + t] = float(has.sum())
            future = seq[offset + t : offset + t + int(remaining[start + t])]
            length[start + t] = accepted_length(tree, tokens, future)
            if beyond is not None and remaining[start + t] < D:  # the engine verifies y_{n-1} and past the end too
                tail_rows.append(start + t)
                tail_len.append(accepted_length(tree, tokens, np.concatenate([seq[offset + t :], beyond])))
    return exact_table(features, D, length, drafted, proposed, tail_rows, tail_len)


def exact_table(features: "Features", depth: int, length: np.ndarray, drafted: np.ndarray, proposed: np.ndarray,
                tail_rows: list[int], tail_len: list[int], engine_length: np.ndarray | None = None) -> "AcceptanceTable":
    """The table of a deterministic (model-free) draft from its accepted `length` per position: a point mass there,
    with what an engine drafts (`proposed`) and, at the rows in `tail_rows`, how far the engine's verification past
    the output's end reaches (`tail_len`)."""
    from specsim.sim.engine import AcceptanceTable, EngineTail
    from specsim.sim.policies import overhang_note

    N = len(length)
    p_len = np.zeros((N, depth + 1))  # (N, D+1)
    p_len[np.arange(N), length] = 1.0
    tail = None
    if tail_rows:
        reach = (np.array(tail_len)[:, None] >= np.arange(1, depth + 1)[None, :]).astype(np.float64)  # (M, D)
        tail = EngineTail(rows=np.array(tail_rows, dtype=np.int64), reach=reach)
    return AcceptanceTable(p_len=p_len, drafted=drafted, exact=True, length=length, engine_drafted=proposed,
                           engine_tail=tail, engine_note=overhang_note(features, depth), engine_length=engine_length)


def _past_end(features: "Features", depth: int) -> dict[int, np.ndarray]:
    """Trajectory index -> the tokens the cache recorded past its end (`Features.tail`)."""
    tail = features.tail(depth)
    if tail is None:
        return {}
    f = tail.features
    return {int(w): f.token[s + k : s + n].astype(np.int64)
            for w, s, k, n in zip(tail.trajectory, f.traj_start, tail.kept, f.traj_len)}

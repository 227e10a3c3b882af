"""Verification policies: (Features, Tree) → the law of the accepted length at every position.

DESIGN.md §2. Two policies are exact closed forms over the cached features:

* ``greedy`` (T = 0): a node is accepted iff its rank path equals the ranks
  (ρ_t, ρ_{t+1}, …) of the trajectory tokens under the draft, so the accepted
  depth of a call is a deterministic walk down a dense child table
  child[node, rank], done for all start positions at once;
* ``sample`` on chains (speculative sampling, Leviathan et al. 2023; Chen et al.
  2023): given the trajectory the acceptance indicators are independent
  Bernoulli(β_t), β_t = min(1, q_t(y_t) / p_t(y_t)), so P(A ≥ k | t) = Π_{j<k} β_{t+j}.

Everything else is registered by name and imported lazily from the module that
owns it: multi-draft sampling trees (``--multi-draft iid|swor``), model-free
drafts, lossy acceptance rules and adaptive speculation lengths. `POLICIES` is the
registry; `run_policy` is the one entry point the simulator calls.
numpy only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from specsim.errors import SpecError
from specsim.sim.engine import AcceptanceTable, TrajectoryStats, drafted_per_call
from specsim.trees import Tree

MULTI_DRAFT = ("iid", "swor")  # how a node's k candidates are drawn from q: i.i.d. (SpecInfer) or without replacement

# Policies implemented in other modules, imported on first use ("module:function").
_EXTERNAL = {
    "sample-tree": "specsim.sim.multidraft:sample_tree_table",
    "lossy": "specsim.sim.lossy:lossy_table",
    "adaptive": "specsim.sim.adaptive:adaptive_stats",
    "modelfree": "specsim.sim.modelfree:modelfree_table",
}


@dataclass(frozen=True)
class PolicySpec:
    """A verification policy as named on the command line."""

    name: str  # "greedy", "sample", "p>=q", "p>=lq", "typical", "adaptive-hf", "adaptive-history"
    multi_draft: str = "iid"  # candidate drawing for sampling trees: "iid" or "swor"
    params: tuple = ()  # numeric parameters after the colon, e.g. (0.5,) for "p>=lq:0.5"
    lossless: bool = True  # False for rules whose output is not distributed as p (numbers approximate)
    samples: int = 64  # Monte-Carlo samples per position for estimators that need them (sampling trees)

    @property
    def label(self) -> str:
        """The policy as written in tables ("p>=lq:0.5")."""
        return self.name + (":" + ",".join(f"{x:g}" for x in self.params) if self.params else "")


# name -> (number of parameters allowed, lossless, example)
_GRAMMAR: dict[str, tuple[tuple[int, ...], bool, str]] = {
    "greedy": ((0,), True, "greedy"),
    "sample": ((0,), True, "sample"),
    "p>=q": ((0,), False, "p>=q"),
    "p>=lq": ((1,), False, "p>=lq:0.5"),
    "typical": ((0, 2), False, "typical:0.09,0.3"),
    "adaptive-hf": ((0,), True, "adaptive-hf"),
    "adaptive-history": ((0, 2), True, "adaptive-history:0.8,0.4"),
}


def parse_policy(text: str, *, multi_draft: str = "iid", samples: int = 64) -> PolicySpec:
    """'greedy' | 'sample' | 'p>=q' | 'p>=lq:0.5' | 'typical[:eps,delta]' | 'adaptive-hf' | 'adaptive-history[:hi,lo]'."""
    if multi_draft not in MULTI_DRAFT:
        raise SpecError(f"multi-draft scheme {multi_draft!r} is not one of {', '.join(MULTI_DRAFT)}")
    name, sep, arg = str(text).strip().partition(":")
    name = name.strip().lower()
    if name not in _GRAMMAR:
        raise SpecError(f"{text!r} is not a policy; use one of " + ", ".join(g[2] for g in _GRAMMAR.values()))
    counts, lossless, example = _GRAMMAR[name]
    params: list[float] = []
    if sep:
        for i, part in enumerate(arg.split(","), start=1):
            try:
                params.append(float(part))
            except ValueError:
                raise SpecError(f"{text}: parameter #{i} is {part.strip()!r}, not a number (e.g. {example})") from None
    if len(params) not in counts:
        want = " or ".join(str(c) for c in counts)
        raise SpecError(f"{text}: {name} takes {want} parameter(s), got {len(params)} (e.g. {example})")
    if int(samples) < 2:
        raise SpecError(f"--samples must be at least 2 (a standard error needs two), got {samples}")
    return PolicySpec(name=name, multi_draft=multi_draft, params=tuple(params), lossless=lossless,
                      samples=int(samples))


def check_temperature(spec: PolicySpec, temperature: float) -> None:
    """SpecError when a policy cannot run on trajectories of this temperature."""
    if spec.name == "greedy" and temperature != 0:
        raise SpecError(
            f"policy greedy needs the greedy (T=0) trajectories, not T={temperature:g}; "
            "use --policy sample at T>0"
        )
    if spec.name in ("sample", "p>=q", "p>=lq", "typical") and temperature == 0:
        raise SpecError(
            f"policy {spec.label} samples, so it needs trajectories at a temperature > 0, not T=0; "
            "use --policy greedy at T=0"
        )


# -- the two closed forms ----------------------------------------------------------------------


def child_table(tree: Tree) -> np.ndarray:
    """(n_nodes, max_rank + 1) int32: child[node, r] = the node's rank-r child, or -1."""
    width = int(tree.ranks[1:].max()) + 1 if tree.budget else 1
    child = np.full((tree.n_nodes, width), -1, dtype=np.int32)
    child[tree.parents[1:], tree.ranks[1:]] = np.arange(1, tree.n_nodes, dtype=np.int32)
    return child


def greedy_lengths(rank: np.ndarray, remaining: np.ndarray, tree: Tree) -> np.ndarray:
    """(N,) accepted depth of a greedy call at every start position: walk child[node, ρ_{t+d-1}]."""
    N = rank.shape[0]
    if tree.budget and int(tree.n_children.max()) == 1 and not tree.ranks[1:].any():
        return _top1_chain_lengths(rank, remaining, tree.max_depth)
    child = child_table(tree)
    width = child.shape[1]
    length = np.zeros(N, dtype=np.int64)
    if not tree.budget:
        return length
    # depth 1 over every position without gathers; deeper levels follow only calls still accepting
    node = np.where(rank < width, child[0, np.minimum(rank, width - 1)], -1)
    t = np.flatnonzero((node >= 0) & (remaining >= 1))
    node = node[t]
    length[t] = 1
    for d in range(2, tree.max_depth + 1):
        keep = remaining[t] >= d  # the end cap: a call at t accepts at most n-1-t drafts
        t, node = t[keep], node[keep]
        r = rank[t + d - 1]  # rank of the token this depth proposes
        nxt = np.where(r < width, child[node, np.minimum(r, width - 1)], -1)
        keep = nxt >= 0
        t, node = t[keep], nxt[keep]
        length[t] = d
        if t.size == 0:
            break
    return length


def _top1_chain_lengths(rank: np.ndarray, remaining: np.ndarray, depth: int) -> np.ndarray:
    """Chains of the draft's top choice: the run of rank-0 tokens from t, capped by depth and the end."""
    N = rank.shape[0]
    miss = np.flatnonzero(rank != 0)
    next_miss = np.full(N, N, dtype=np.int64)  # first position >= t whose token is not the draft's top choice
    next_miss[miss] = miss
    next_miss = np.minimum.accumulate(next_miss[::-1])[::-1]
    return np.minimum(np.minimum(next_miss - np.arange(N), remaining), depth).astype(np.int64)


def greedy_table(features, tree: Tree, spec: PolicySpec, rng: np.random.Generator) -> AcceptanceTable:
    """Exact and deterministic: the accepted depth from the rank walk, as a one-hot law."""
    length = greedy_lengths(features.rank, features.remaining(), tree)
    p_len = np.zeros((features.n_positions, tree.max_depth + 1))  # (N, D+1)
    p_len[np.arange(features.n_positions), length] = 1.0
    return AcceptanceTable(p_len=p_len, drafted=drafted_per_call(tree, features.room()), exact=True, length=length)


def chain_acceptance(features) -> np.ndarray:
    """(N,) β_t = min(1, q_t(y_t) / p_t(y_t)): P(a one-token draft at t is accepted | y_t)."""
    return np.exp(np.minimum(0.0, features.logq - features.logp))


def chain_table(beta: np.ndarray, remaining: np.ndarray, depth: int) -> np.ndarray:
    """(N, depth+1) law of A for a chain of `depth` drafts with independent acceptances β, end-capped."""
    N = beta.shape[0]
    t = np.arange(N)
    surv = np.zeros((N, depth + 2))  # surv[:, k] = P(A >= k)
    surv[:, 0] = 1.0
    for k in range(1, depth + 1):
        ok = remaining >= k
        surv[:, k] = np.where(ok, surv[:, k - 1] * beta[np.minimum(t + k - 1, N - 1)], 0.0)
    return surv[:, :-1] - surv[:, 1:]


def sample_table(features, tree: Tree, spec: PolicySpec, rng: np.random.Generator) -> AcceptanceTable:
    """Speculative sampling: exact for chains; trees with branching go to the multi-draft estimator."""
    if tree.budget and int(tree.n_children.max()) > 1:
        return _external("sample-tree")(features, tree, spec, rng)
    p_len = chain_table(chain_acceptance(features), features.remaining(), tree.max_depth)
    return AcceptanceTable(p_len=p_len, drafted=drafted_per_call(tree, features.room()), exact=True)


# -- the registry ---------------------------------------------------------------------------------

PolicyFn = Callable[..., "AcceptanceTable | TrajectoryStats"]


def _external(kind: str) -> PolicyFn:
    module, attr = _EXTERNAL[kind].split(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ModuleNotFoundError, AttributeError):
        raise SpecError(f"{kind} policies need {_EXTERNAL[kind]}, which this install does not have yet") from None


def _lossy(features, tree, spec, rng):
    return _external("lossy")(features, tree, spec, rng)


POLICIES: dict[str, PolicyFn] = {
    "greedy": greedy_table,
    "sample": sample_table,
    "p>=q": _lossy,
    "p>=lq": _lossy,
    "typical": _lossy,
    # adaptive rules walk sequentially and return TrajectoryStats; they also take the cost model
    "adaptive-hf": lambda features, tree, spec, rng, cost_model: _external("adaptive")(features, tree, spec, rng, cost_model),
    "adaptive-history": lambda features, tree, spec, rng, cost_model: _external("adaptive")(
        features, tree, spec, rng, cost_model),
}


def run_policy(features, tree: Tree, spec: PolicySpec, rng: np.random.Generator, cost_model=None):
    """The acceptance table (or, for adaptive rules, the walk's totals) of one configuration."""
    check_temperature(spec, features.temperature)
    if spec.name.startswith("adaptive"):
        return POLICIES[spec.name](features, tree, spec, rng, cost_model)
    if features.model_free:
        if not spec.lossless:
            raise SpecError(f"policy {spec.label} compares p with q; model-free draft {features.draft} has no q")
        return _external("modelfree")(features, tree, spec, rng)
    return POLICIES[spec.name](features, tree, spec, rng)

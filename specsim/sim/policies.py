"""Verification policies: (Features, Tree) → the law of the accepted length at every position.

docs/design.md §2. Two policies are exact closed forms over the cached features:

* ``greedy`` (T = 0): a node is accepted iff its rank path equals the ranks
  (ρ_t, ρ_{t+1}, …) of the trajectory tokens under the draft, so the accepted
  depth of a call is a deterministic walk down a dense child table
  child[node, rank], done for all start positions at once;
* ``sample`` on chains (speculative sampling, Leviathan et al. 2023; Chen et al.
  2023): given the trajectory the acceptance indicators are independent
  Bernoulli(β_t), β_t = min(1, q_t(y_t) / p_t(y_t)), so P(A ≥ k | t) = Π_{j<k} β_{t+j}.

Everything else is named in `specsim.specs.POLICY_KINDS` and imported lazily from
the module that owns it: multi-draft sampling trees (``--multi-draft iid|swor``),
model-free drafts, lossy acceptance rules and adaptive speculation lengths.
`run_policy` returns the acceptance table of any rule with one; `run_adaptive` the walk's totals of a
rule whose chain length changes call by call (it has no single table).
numpy only.
"""

from __future__ import annotations


import numpy as np

from specsim.errors import SpecError
from specsim.sim.engine import AcceptanceTable, EngineTail, at_depth, drafted_per_call, leaves_above_full_depth
from specsim.specs import PolicySpec, load
from specsim.expansion import DynamicTree
from specsim.trees import Tree



def check_temperature(spec: PolicySpec, temperature: float) -> None:
    """SpecError when a policy cannot run on trajectories of this temperature."""
    needs = spec.kind.temperature
    if needs == "0" and temperature != 0:
        raise SpecError(
            f"policy {spec.label} needs the greedy (T=0) trajectories, not T={temperature:g}; "
            "use --policy sample at T>0"
        )
    if needs == ">0" and temperature == 0:
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


def greedy_lengths(rank: np.ndarray, remaining: np.ndarray, tree: Tree, *, ends: bool = False):
    """(N,) accepted depth of a greedy call at every start position: walk child[node, ρ_{t+d-1}].

    rank (N,), or (N, D) for a head draft: depth d reads column d - 1 (the law of the call's start).
    ends=True: also the (N,) node each call's accepted path ends on (0: the root, nothing accepted).
    """
    N = rank.shape[0]
    keyed = rank.ndim == 2
    if tree.is_chain and not keyed:
        length = _top1_chain_lengths(rank, remaining, tree.max_depth)
        return (length, length.copy()) if ends else length  # a chain's node d sits at depth d
    child = child_table(tree)
    width = child.shape[1]
    length = np.zeros(N, dtype=np.int64)
    end = np.zeros(N, dtype=np.int64)
    if not tree.budget:
        return (length, end) if ends else length
    # depth 1 over every position without gathers; deeper levels follow only calls still accepting
    first = at_depth(rank, 1, keyed)
    node = np.where(first < width, child[0, np.minimum(first, width - 1)], -1)
    t = np.flatnonzero((node >= 0) & (remaining >= 1))
    node = node[t]
    length[t] = 1
    end[t] = node
    for d in range(2, tree.max_depth + 1):
        keep = remaining[t] >= d  # the end cap: a call at t accepts at most n-1-t drafts
        t, node = t[keep], node[keep]
        r = at_depth(rank, d, keyed)[t + d - 1]  # rank of the token this depth proposes
        nxt = np.where(r < width, child[node, np.minimum(r, width - 1)], -1)
        keep = nxt >= 0
        t, node = t[keep], nxt[keep]
        length[t] = d
        end[t] = node
        if t.size == 0:
            break
    return (length, end) if ends else length


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
    features.check_depth(tree.max_depth, f"tree {tree.name or 'of this call'}")
    length, end = greedy_lengths(features.rank, features.remaining(), tree, ends=True)
    p_len = np.zeros((features.n_positions, tree.max_depth + 1))  # (N, D+1)
    p_len[np.arange(features.n_positions), length] = 1.0
    leaf_end = (length > 0) & (tree.n_children[end] == 0) if leaves_above_full_depth(tree) else None
    return AcceptanceTable(p_len=p_len, drafted=drafted_per_call(tree, features.room()), exact=True, length=length,
                           leaf_end=leaf_end)


def chain_table(beta: np.ndarray, remaining: np.ndarray, depth: int) -> np.ndarray:
    """(N, depth+1) law of A for a chain of `depth` drafts with independent acceptances β, end-capped.

    beta (N,), or (N, D) for a head draft (depth k reads column k - 1).
    """
    N = beta.shape[0]
    keyed = beta.ndim == 2
    surv = np.zeros((depth + 2, N))  # surv[k] = P(A >= k), depth-major: each step is contiguous rows
    surv[0] = 1.0
    for k in range(1, min(depth, N) + 1):
        n = N - k + 1  # a call at t >= n has remaining < k: its row stays 0
        np.multiply(surv[k - 1, :n], at_depth(beta, k, keyed)[k - 1 :], out=surv[k, :n])
        surv[k, :n] *= remaining[:n] >= k
    return (surv[:-1] - surv[1:]).T


def sample_table(features, tree: Tree, spec: PolicySpec, rng: np.random.Generator) -> AcceptanceTable:
    """Speculative sampling: exact for chains; trees with branching go to the multi-draft estimator."""
    features.check_depth(tree.max_depth, f"tree {tree.name or 'of this call'}")
    if tree.budget and int(tree.n_children.max()) > 1:
        return load("specsim.sim.multidraft:sample_tree_table")(features, tree, spec, rng)
    p_len = chain_table(features.acceptance(), features.remaining(), tree.max_depth)
    return AcceptanceTable(p_len=p_len, drafted=drafted_per_call(tree, features.room()), exact=True)


def block_table(features, tree: Tree, spec: PolicySpec, rng: np.random.Generator) -> AcceptanceTable:
    """Block verification of a chain drafted from q (docs/design.md 2f), from the target along the draft's proposals;
    at T = 0, where the drafts and the target are point masses, greedy verification (§2d), exactly.

    Given the output, a call starting at t keeps i < γ drafts with probability
    keep[t, i] · E[Π_{j=i+1..γ} (1 − h_j)], the expectation over the draft's continuation from where the call
    left the trajectory (t + i), and all γ with probability whole[t, γ] (`specsim.verify.block_path_factors`).
    The recording (`cache --expand-target K`) drew R chains from q at every position: their mean is an unbiased
    estimate of the expectation, and each call's law uses chains drawn at a position no other call of the same
    walk reads, so the walk's expected totals are unbiased too. The call drafts γ' = min(γ, room) as the live
    engine does; accepted lengths past the trajectory's end are its last (the row's complement there). Standard
    errors and the walk's jackknife are over the R chains.
    """
    from specsim.sim.adaptive import BLOCK_ON_CHAINS, check_chain

    check_chain(tree, rule=BLOCK_ON_CHAINS)
    if features.temperature == 0:  # drafts and target are point masses: greedy verification (§2d), exact
        return greedy_table(features, tree, spec, rng)
    keep, whole, tails = (features.recorded(name) for name in ("block_keep", "block_whole", "block_tails"))
    if keep is None:
        raise SpecError(f"block verification of drafts sampled from q needs the target along the draft's own "
                        f"proposals, which this cache did not record for {features.draft}: record it with "
                        "`specsim cache ... --expand-target K` (K >= the chain's drafts). For greedy-drafted chains "
                        "(vLLM's default draft_sample_method) its law is exactly greedy-draft's, which any cache "
                        "replays (docs/design.md, 2d)")
    gamma, K, R = tree.max_depth, keep.shape[1], tails.shape[1]
    if gamma > K:
        raise SpecError(f"tree {tree.name or ''} drafts {gamma} tokens; the cache recorded the target along the "
                        f"draft's proposals {K} deep (re-record with --expand-target {gamma})")
    N = features.n_positions
    drafts = np.minimum(gamma, features.room())  # γ' per call
    cap = np.minimum(drafts, features.remaining())
    est = np.zeros((N, R, gamma + 1))  # per chain: P(A = a | t)
    for i in range(gamma):
        rows = np.flatnonzero(i < cap)
        est[rows, :, i] = keep[rows, i, None] * tails[rows + i, :, i, drafts[rows] - 1]
    est[np.arange(N), :, cap] = 1.0 - est.sum(axis=2)  # the lengths past the cap, at the cap
    total = est.sum(axis=1)
    mean = est.mean(axis=1)
    per_chain = est @ np.arange(gamma + 1)  # (N, R) E[A | t] per chain
    return AcceptanceTable(
        p_len=mean, drafted=drafted_per_call(tree, features.room()), exact=False,
        se_len=per_chain.std(axis=1, ddof=1) / np.sqrt(R),
        jackknife=(total[None] - est.transpose(1, 0, 2)) / (R - 1))


# -- the one entry point ---------------------------------------------------------------------------


def run_policy(features, tree: Tree | DynamicTree, spec: PolicySpec, rng: np.random.Generator) -> AcceptanceTable:
    """The acceptance table of one configuration.

    The policy's function is the one `specsim.specs.POLICY_KINDS` names; model-free drafts use the
    candidate trie of `specsim.sim.modelfree` (point masses) under any lossless policy. An adaptive
    rule has no table (its chain length depends on the calls before): `run_adaptive` replays it.
    """
    _check(features, tree, spec)
    if spec.kind.adaptive:
        raise SpecError(f"{spec.label} changes the chain length call by call and has no acceptance table; "
                        "replay it with run_adaptive")
    if isinstance(tree, DynamicTree):
        if features.model_free:
            raise SpecError(f"a dynamic tree grows from a draft's expansion (a model or a head); {features.draft} is "
                            "model-free")
        fn = load("specsim.sim.dynamic:dynamic_table")
    elif features.model_free:
        if not spec.lossless:
            raise SpecError(f"policy {spec.label} compares p with q; model-free draft {features.draft} has no q")
        from specsim.specs import draft_kind

        return load(draft_kind(features.draft).table)(features, tree, spec, rng)  # counts its own tail
    else:
        fn = load(spec.kind.function)
    table = fn(features, tree, spec, rng)
    return with_engine_counts(table, features, tree, lambda tail: fn(tail, tree, spec, rng.spawn(1)[0]))


NO_OVERHANG = ("a lower bound at each request's last call: the cache records nothing past a trajectory's end, "
               "where vLLM also counts accepted drafts (record with `specsim cache --overhang K`)")


def overhang_note(features, depth: int) -> str | None:
    """Why the engine counters miss acceptance past the ends (None: they do not), for trees `depth` deep."""
    over = features.overhang()
    if depth < 1 or not over.size:
        return None
    if not over.any():
        return NO_OVERHANG
    if int(over.min()) < depth:
        return (f"a lower bound at each request's last call: the cache records {int(over.min())} positions past "
                f"some trajectory's end, a chain of {depth} drafts can be accepted {depth} past it")
    return None


def with_engine_counts(table: AcceptanceTable, features, tree: Tree, replay_tail) -> AcceptanceTable:
    """`table` with what vLLM's counters need: the drafts the engine proposes per call (the tree's nodes,
    uncapped by the output limit, unless the policy said otherwise) and, from the positions the cache
    recorded past each trajectory's end, the law past the end at the calls near it (`replay_tail` is
    the policy's table function on `Features.tail`)."""
    from dataclasses import replace

    drafted = table.engine_drafted if table.engine_drafted is not None else float(tree.budget)
    tail = features.tail(tree.max_depth) if tree.budget else None
    if tail is None:
        return replace(table, engine_drafted=drafted, engine_note=table.engine_note or overhang_note(
            features, tree.max_depth))
    reach = replay_tail(tail.features).reach()[tail.own_rows()]  # (M, D)
    return replace(table, engine_drafted=drafted, engine_tail=EngineTail(rows=tail.rows, reach=reach),
                   engine_note=table.engine_note or overhang_note(features, tree.max_depth))


def run_adaptive(features, trees: list[Tree], spec: PolicySpec, pricings: list) -> list:
    """The walk's totals (`TrajectoryStats`) of each chain in `trees` under the adaptive rule `spec`, starting at
    its length; pricings[i] (a `specsim.sim.pricing.Pricing`, or None for no speed columns) prices trees[i].
    Chains of the same cap are walked together, sharing one pass over the positions."""
    if not spec.kind.adaptive:
        raise SpecError(f"{spec.label} is not an adaptive rule; run_policy gives its acceptance table")
    for tree in trees:
        _check(features, tree, spec)
    return load(spec.kind.function)(features, trees, spec, pricings)


def _check(features, tree: Tree, spec: PolicySpec) -> None:
    """What every replay of `spec` on `features` needs: a temperature it accepts; head drafts replay
    lossless non-adaptive rules only (static trees from their depth-keyed laws, dynamic ones from their recorded
    expansion)."""
    check_temperature(spec, features.temperature)
    if features.depth is not None and (spec.kind.adaptive or not spec.lossless):
        what = "an adaptive rule" if spec.kind.adaptive else f"lossy rule {spec.label}"
        raise SpecError(f"{what} is not replayed for head draft {features.draft} (its laws are keyed by depth); "
                        "use greedy or sample")


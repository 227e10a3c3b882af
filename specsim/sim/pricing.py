"""How a replayed call is priced: the forwards the live engine runs for it, timed by a cost model.

docs/design.md §3. `Pricing` binds a cost model (a measured `ProfileCost`, an assumed
`AssumedCost`, or none) to one draft of a cache: the profile's name for it, and, bound to a
temperature, the work each step does outside the forwards. `Pricing.priced` gives, at every
position, the time of the call that starts there (the draft forwards of its tree cut to the
room, the target forward over the nodes it verifies), of the plain step it replaces, and the
extra root feed the next call pays after what it accepted. `priced_walk` walks one
configuration with those prices. numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specsim.cache.reader import CacheReader
from specsim.errors import SpecError
from specsim.sim.engine import walk
from specsim.sim.features import Features, FeatureSource
from specsim.sim.policies import run_adaptive, run_policy
from specsim.specs import (PolicySpec, drafts_in_one_pass, feeds_accepted, is_model_free,
                           prompt_fed_at_admission)
from specsim.expansion import DynamicTree
from specsim.trees import Tree


@dataclass(frozen=True)
class Pricing:
    """How one draft's calls are priced: the cost model and the profile's name for the draft."""

    model: object | None  # ProfileCost, AssumedCost or None (no speed columns)
    draft_key: str | None  # the profile's draft measured for this draft; None for model-free drafts
    basis: str  # the row's cost_basis text

    @classmethod
    def for_draft(cls, cost_model, reader: CacheReader, draft: str) -> "Pricing":
        if cost_model is None:
            return cls(None, None, "none (no --cost-profile or --cost)")
        free = is_model_free(draft)
        if not cost_model.measured:
            return cls(cost_model, None if free else draft, cost_model.describe())
        from specsim.sim.cost import check_profile

        check_profile(cost_model, reader.run.target_name, reader.run.target)
        key = None if free else cost_model.draft_for(draft, reader.run.drafts.get(draft))
        return cls(cost_model, key, cost_model.describe())

    def at_temperature(self, temperature: float) -> "Pricing":
        """This pricing with the per-step work outside the forwards that decoding at `temperature` does
        (`ProfileCost.for_temperature`; unchanged for a cost model that measured none)."""
        at = getattr(self.model, "for_temperature", None)
        if at is None:
            return self
        model = at(temperature, model_draft=self.draft_key is not None)
        return replace(self, model=model, basis=model.describe())

    def for_rule(self, rule: str) -> "Pricing":
        """This pricing charging verification rule `rule`'s own per-step work (`ProfileCost.for_rule`: block
        verification's walk in place of the token-wise one); unchanged for other rules and cost models."""
        at = getattr(self.model, "for_rule", None)
        model = self.model if at is None else at(rule)
        return self if model is self.model else replace(self, model=model, basis=model.describe())

    def within_range(self, features: Features, tree: Tree, unpriced: str = "skip") -> "Pricing":
        """This pricing, or (unpriced="keep") no pricing with the reason when the model cannot price `tree`.

        With unpriced="skip" the refusal surfaces later, as a SpecError that skips the configuration.
        """
        if self.model is None or unpriced == "skip":
            return self
        try:
            if isinstance(features, FeatureSource):
                self._check_range(features, tree)
            else:
                self.priced(features, tree)
        except SpecError as exc:
            return Pricing(None, None, f"none: {exc}")
        return self

    def _check_range(self, source: FeatureSource, tree: Tree) -> None:
        """SpecError where `priced` would refuse some position of `source` (its least and greatest context
        bound every lookup; a call at the least room drafts a subtree of the full one)."""
        from specsim.sim.cost import tree_by_room

        model, key = self.model, self.draft_key
        L = np.array(source.context_range(), dtype=np.float64)
        model.plain_s(1, L)
        one_pass = drafts_in_one_pass(source.draft)
        for shape in tree_by_room(tree, model_draft=key is not None, one_pass=one_pass):
            model.verify_s(1, shape.verify_tokens, L)
            for w in shape.draft_levels:
                model.draft_s(key, 1, w, L)
        if key is not None and tree.budget and not one_pass:
            every = feeds_accepted(source.draft, tree)
            for a in range(1, tree.max_depth + 1) if every else [tree.max_depth]:
                model.draft_s(key, 1, 1 + a if every else 2, L)

    def extrapolated(self, source, tree: Tree, batch: int = 1) -> bool | None:
        """Whether pricing `tree` on `source` at `batch` reads the profile past what it measured (None: no profile)."""
        if self.model is None or not getattr(self.model, "measured", False):
            return None
        from specsim.sim.cost import tree_by_room

        shape = tree_by_room(tree, model_draft=self.draft_key is not None, one_pass=drafts_in_one_pass(source.draft))[-1]
        widths = list(shape.draft_levels) + ([2] if self.draft_key is not None and tree.budget else [])
        if self.draft_key is not None and feeds_accepted(source.draft, tree):
            widths.append(1 + tree.max_depth)
        high = source.context_range()[1] if hasattr(source, "context_range") else float(source.contexts().max())
        return self.model.extrapolates(batch=batch, tokens=shape.verify_tokens, width=max(widths, default=1),
                                       context=high)

    def priced(self, features: Features, tree: Tree, batch: int = 1, drafted: np.ndarray | None = None,
               leaf: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(call cost, plain step cost, extra cost of the next call's root feed by accepted length) at every
        position: (N,), (N,) and (N, D+1) or None (`walk`'s next_feed_cost).

        `leaf` (N, D+1): P(a call's accepted path ends on a leaf | t, a) (`AcceptanceTable.leaf_given`).
        `drafted` (N,): the nodes each call proposed, for a model-free draft at batch 1, which
        verifies only those (an n-gram or suffix match fills part of the tree, or none of it; the
        live engine, like vLLM's variable-length drafts, sends the target only what was proposed).
        """
        from specsim.sim.cost import tree_by_room

        model, N = self.model, features.n_positions
        lead = getattr(model, "lead", ())  # leading axes of the model's times (its replicas, `AllReplicas`)
        contexts = features.contexts()
        model_draft = self.draft_key is not None
        if drafted is not None and not model_draft and batch == 1:
            tokens = 1 + np.asarray(drafted, dtype=np.int64)
            call = np.zeros((*lead, N))
            for k in np.unique(tokens):
                idx = np.flatnonzero(tokens == k)
                call[..., idx] = model.verify_s(batch, int(k), contexts[idx])
            return call, model.plain_s(batch, contexts), None
        one_pass = drafts_in_one_pass(features.draft)
        shapes = tree_by_room(tree, model_draft=model_draft, one_pass=one_pass)
        cut = np.minimum(features.room(), tree.max_depth)
        call = np.zeros((*lead, N))
        for m, shape in enumerate(shapes):
            idx = np.flatnonzero(cut == m)
            if idx.size:
                L = contexts[idx]
                if isinstance(tree, DynamicTree) and drafted is not None:  # the nodes each call kept within its room
                    seconds = model.verify_s(batch, 1 + np.asarray(drafted)[idx], L)
                else:
                    seconds = model.verify_s(batch, shape.verify_tokens, L)
                for w in shape.draft_levels:
                    seconds = seconds + model.draft_s(self.draft_key, batch, w, L)
                call[..., idx] = seconds
        feed = None
        if model_draft and tree.budget and not one_pass:
            feed = self._next_feed(features, tree, batch, contexts, cut, leaf)
            if prompt_fed_at_admission(features.draft):  # a request's first call feeds no root entry
                first = features.traj_start[cut[features.traj_start] >= 1]
                call[..., first] -= model.draft_s(self.draft_key, batch, 1, contexts[first])
        return call, model.plain_s(batch, contexts), feed

    def priced_replicas(self, features: Features, tree: Tree, batch: int = 1, drafted: np.ndarray | None = None,
                        leaf: np.ndarray | None = None) -> list[tuple]:
        """`priced` under each replica of the cost profile (`ProfileCost.replicas`; [] when it kept no rounds),
        all replicas in one pass (`AllReplicas`)."""
        from specsim.sim.cost import AllReplicas

        if not getattr(self.model, "replicas", ()):
            return []
        call, plain, feed = replace(self, model=AllReplicas(self.model)).priced(features, tree, batch, drafted, leaf)
        return [(call[r], plain[r], None if feed is None else feed[r]) for r in range(call.shape[0])]

    def _next_feed(self, features: Features, tree: Tree, batch: int, contexts: np.ndarray,
                   cut: np.ndarray, leaf: np.ndarray | None = None) -> np.ndarray:
        """(N, D+1) extra time the next call's root feed costs, over the one token priced in every call,
        when the call at t accepted a; priced at the next call's context, if it exists and drafts.

        A draft model feeds 2 tokens after a call whose accepted path ended on a leaf, a node it
        never fed: with `leaf` (N, D+1), P(that | t, a), else where the call
        accepted the whole depth (exact for trees whose inner depths all have children, e.g. chains).
        An EAGLE layer, and any draft of a dynamic tree (`feeds_accepted`), feeds the root and every
        accepted draft, 1 + a."""
        model, N, depth = self.model, features.n_positions, tree.max_depth
        every = feeds_accepted(features.draft, tree)
        ends = np.repeat(features.traj_start + features.traj_len, features.traj_len)
        out = np.zeros((*getattr(model, "lead", ()), N, depth + 1))
        leafy = not every and leaf is not None
        for a in range(1, depth + 1) if every or leafy else [depth]:
            nxt = np.arange(N) + a + 1
            ok = nxt < ends
            ok[ok] &= cut[nxt[ok]] >= 1
            L = contexts[np.minimum(nxt, N - 1)]
            extra = model.draft_s(self.draft_key, batch, 1 + a if every else 2, L) - model.draft_s(
                self.draft_key, batch, 1, L)
            out[..., a] = np.where(ok, extra * leaf[:, a], 0.0) if leafy else np.where(ok, extra, 0.0)
        return out


def proposed_nodes(features: Features, table, tree: Tree | None = None) -> np.ndarray | None:
    """The nodes each call proposed, where pricing verifies only those: model-free drafts, and dynamic trees
    (the N best of the expansion, those deeper than the room not verified)."""
    dynamic = isinstance(tree, DynamicTree)
    return table.drafted if features.model_free or dynamic else None


def priced_walk(features: Features, tree: Tree | DynamicTree, policy: PolicySpec, pricing: Pricing,
                rng: np.random.Generator):
    """The walk's totals of one configuration on `features` and its acceptance table (None for adaptive rules)."""
    if policy.kind.adaptive:
        return run_adaptive(features, [tree], policy, [pricing if pricing.model is not None else None])[0], None
    table = run_policy(features, tree, policy, rng)
    if pricing.model is not None:
        drafted = proposed_nodes(features, table, tree)
        leaf = table.leaf_given()
        call, plain, feed = pricing.priced(features, tree, drafted=drafted, leaf=leaf)
        return walk(table, features, call, plain_cost=plain, next_feed_cost=feed,
                    replicas=pricing.priced_replicas(features, tree, drafted=drafted, leaf=leaf)), table
    return walk(table, features), table

"""Live decoding against the simulator on the same cache: the simulator's ground-truth check.

DESIGN.md §5. Greedy: live output must equal the cached greedy trajectory, and
every live call must accept exactly what the simulator's replay of that trajectory
accepts at the same start position (`specsim.sim.policies` greedy table). Each
disagreement is classified from the cached logits:

* 'near-tie (target)' — live output left the cached trajectory at a position where
  the target's top-2 logits are within rounding of each other;
* 'near-tie (draft)'  — the call's acceptance differs at a position where the draft
  logit of the trajectory token is within rounding of another token's, so its rank
  (which decides which tree node it matches) is not determined by the data;
* 'draft ≠ cache'     — the draft, rerun one token at a time along the cached
  trajectory, ranks the trajectory token differently from the cached (teacher-forced,
  batched) draft logits: the draft's logits depend on how tokens are batched (e.g. a
  draft with dynamic activation quantisation turns float32 noise into rounding-step
  jumps), so the cache does not describe what a live draft computes;
* 'unexplained'       — anything else: a bug.

Rounding tolerance: the cache stores float16 logits (relative error 2^-11) and a
batched teacher-forced pass differs from one-token steps by float32 noise, so two
logits closer than `NEAR_TIE_ABS + NEAR_TIE_REL * |logit|` are a near-tie.

Sampling: live mean acceptance (fresh trajectories, `repeats` seeds per prompt)
and the simulated one on the cached trajectories, each with its 95% bootstrap
CI; they agree when the intervals overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.cache.store import CacheReader
from specsim.errors import CacheError
from specsim.live.runs import LivePrompt, LiveRun
from specsim.trees import Tree

NEAR_TIE_ABS = 1e-3  # float32 noise between batched and one-token forward passes, in logits
NEAR_TIE_REL = 2.0**-9  # 4x float16's relative rounding of a stored logit
MIN_AGREEMENT = 0.99  # greedy: share of identical steps required


@dataclass(frozen=True)
class CacheSetup:
    """What a cache says about how it was recorded: live reruns exactly this."""

    target: str  # target model spec
    drafts: tuple[str, ...]  # recorded draft columns
    dtype: str  # model dtype of the recording
    max_new_tokens: int  # generation limit of the recording
    temperatures: tuple[float, ...]  # recorded temperatures
    prompts: tuple[LivePrompt, ...]  # the cache's prompts with the token ids the target saw


def cache_setup(path) -> CacheSetup:
    with CacheReader(path) as reader:
        s = reader.meta.get("settings")
        if not isinstance(s, dict) or "target" not in s:
            raise CacheError(f"{path}: records no settings (target, max_new_tokens); cannot rerun it live")
        cats = reader.prompts["category"].to_list()
        prompts = tuple(LivePrompt(prompt_index=i, category=cats[i],
                                   token_ids=np.asarray(reader.prompt_token_ids(i), dtype=np.int64))
                        for i in range(len(cats)))
        return CacheSetup(target=s["target"], drafts=tuple(reader.spec.drafts), dtype=s.get("dtype", "float32"),
                          max_new_tokens=int(s["max_new_tokens"]), temperatures=tuple(reader.spec.temperatures),
                          prompts=prompts)


def near_tie_tolerance(logit: float) -> float:
    return NEAR_TIE_ABS + NEAR_TIE_REL * abs(logit)


def token_gap(logits: np.ndarray, token: int) -> float:
    """Distance from `token`'s logit to the nearest other token's logit (what can flip its rank)."""
    others = np.delete(logits.astype(np.float64), token)
    return float(np.abs(others - float(logits[token])).min())


def top2_gap(logits: np.ndarray) -> tuple[float, float]:
    """(top-1 minus top-2 logit, top-1 logit)."""
    top = np.sort(logits.astype(np.float64))[-2:]
    return float(top[1] - top[0]), float(top[1])


@dataclass(frozen=True)
class StepCheck:
    prompt_index: int  # which prompt
    start: int  # output position the call started at
    live: int  # drafts accepted live
    simulated: int  # drafts the simulator's replay accepts at this start
    verdict: str  # 'identical' | 'near-tie (draft)' | 'draft ≠ cache' | 'unexplained'
    position: int | None  # output position of the cause (a near-tie, a moved rank), else the smallest gap
    gap: float | None  # the draft logit gap of the trajectory token there, in logits
    draft_shift: float | None = None  # max |stepwise - cached| draft logit there, when rerun


@dataclass(frozen=True)
class Divergence:
    prompt_index: int  # which prompt
    position: int  # first output position where live != cached trajectory
    gap: float  # cached target top-1 minus top-2 logit there
    verdict: str  # 'near-tie (target)' | 'unexplained'
    steps_dropped: int  # live calls from there on, not comparable with the replay


@dataclass(frozen=True)
class GreedyAgreement:
    steps: tuple[StepCheck, ...]  # every comparable live call
    divergences: tuple[Divergence, ...]  # prompts whose live output left the cached trajectory
    min_agreement: float = MIN_AGREEMENT  # required share of identical steps

    @property
    def identical(self) -> int:
        return sum(s.verdict == "identical" for s in self.steps)

    @property
    def near_ties(self) -> int:
        return sum(s.verdict.startswith("near-tie") for s in self.steps) + sum(
            d.verdict.startswith("near-tie") for d in self.divergences)

    @property
    def draft_mismatches(self) -> int:
        return sum(s.verdict == "draft ≠ cache" for s in self.steps)

    @property
    def unexplained(self) -> int:
        return sum(s.verdict == "unexplained" for s in self.steps) + sum(
            d.verdict == "unexplained" for d in self.divergences)

    @property
    def agreement(self) -> float:
        return self.identical / max(len(self.steps), 1)

    @property
    def passed(self) -> bool:
        return bool(self.steps) and self.unexplained == 0 and self.agreement >= self.min_agreement


def stepwise_draft_logits(draft_model, prompt_ids: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """(n, V) the draft's logits along a trajectory, fed one token at a time over its KV cache."""
    from specsim.live.kv import SlotKV

    kv = SlotKV(draft_model)
    kv.start([np.asarray(prompt_ids[:-1], dtype=np.int64)])
    rows = [kv.feed_chains([np.asarray(prompt_ids[-1:], dtype=np.int64)])[0].cpu().numpy()]
    for token in np.asarray(tokens[:-1], dtype=np.int64):
        rows.append(kv.feed_chains([np.array([token])])[0].cpu().numpy())
    return np.stack(rows)  # (n, V)


def _rank(logits: np.ndarray, token: int) -> int:
    """Rank of `token` (0 = top), ties broken by the lower token id (as the simulator ranks)."""
    ahead = logits > logits[token]
    ahead[:token] |= logits[:token] == logits[token]
    return int(ahead.sum())


def greedy_agreement(run: LiveRun, cache_path, draft: str, tree: Tree, *, min_agreement: float = MIN_AGREEMENT,
                     draft_model=None) -> GreedyAgreement:
    """Compare every live call with the simulator's greedy replay of the cached trajectory.

    `draft_model` (optional): the live draft model, rerun one token at a time along a
    trajectory to tell 'draft ≠ cache' from 'unexplained' disagreements.
    """
    from specsim.sim.features import load_features
    from specsim.sim.policies import parse_policy, run_policy

    features = load_features(cache_path, draft, 0.0, progress=False)
    table = run_policy(features, tree, parse_policy("greedy"), np.random.default_rng(0))
    simulated = np.argmax(table.p_len, axis=1)  # (N,) greedy tables are one-hot
    traj_of = {int(p): i for i, p in enumerate(features.traj_prompt)}
    checks: list[StepCheck] = []
    divergences: list[Divergence] = []
    with CacheReader(cache_path) as reader:
        for traj in run.trajectories:
            i = traj_of.get(traj.prompt.prompt_index)
            if i is None:
                raise CacheError(f"{cache_path}: no greedy trajectory for prompt {traj.prompt.prompt_index}")
            lo, n, c0 = int(features.traj_start[i]), int(features.traj_len[i]), int(features.cache_start[i])
            cached = features.token[lo : lo + n]
            live = traj.live.tokens
            m = min(len(live), n)
            differ = np.flatnonzero(live[:m] != cached[:m])
            split = int(differ[0]) if differ.size else (m if len(live) != n else None)
            stepwise = None
            for step in traj.live.steps:
                if split is not None and step.start + step.accepted >= split:
                    break
                sim = int(simulated[lo + step.start])
                if sim == step.accepted:
                    checks.append(StepCheck(traj.prompt.prompt_index, step.start, step.accepted, sim,
                                            "identical", None, None))
                    continue
                # The ranks of y_t .. y_j all decide which node is reached: look for the cause along the path.
                j = step.start + min(sim, step.accepted)
                q_logits = reader.logits(draft, c0 + step.start, c0 + j + 1)  # (j - t + 1, V)
                path = cached[step.start : j + 1]
                gaps = np.array([token_gap(row, int(y)) for row, y in zip(q_logits, path)])
                ties = np.flatnonzero(gaps <= [near_tie_tolerance(row[y]) for row, y in zip(q_logits, path)])
                k = int(ties[0]) if ties.size else int(np.argmin(gaps))
                verdict, shift = ("near-tie (draft)" if ties.size else "unexplained"), None
                if not ties.size and draft_model is not None:
                    if stepwise is None:
                        stepwise = stepwise_draft_logits(draft_model, traj.prompt.token_ids, cached)
                    rerun = stepwise[step.start : j + 1]
                    moved = [_rank(a, int(y)) != _rank(b, int(y)) for a, b, y in zip(rerun, q_logits, path)]
                    if any(moved):
                        k = int(np.flatnonzero(moved)[0])
                        verdict = "draft ≠ cache"
                    shift = float(np.abs(rerun[k] - q_logits[k]).max())
                checks.append(StepCheck(traj.prompt.prompt_index, step.start, step.accepted, sim, verdict,
                                        step.start + k, float(gaps[k]), shift))
            if split is not None:
                dropped = sum(s.start + s.accepted >= split for s in traj.live.steps)
                if split < n:
                    gap, top = top2_gap(reader.logits("target", c0 + split, c0 + split + 1)[0])
                    verdict = "near-tie (target)" if gap <= near_tie_tolerance(top) else "unexplained"
                else:  # live ran past the cached end: an EOS the cache has and live did not take
                    gap, verdict = float("nan"), "unexplained"
                divergences.append(Divergence(traj.prompt.prompt_index, split, gap, verdict, dropped))
    return GreedyAgreement(steps=tuple(checks), divergences=tuple(divergences), min_agreement=min_agreement)


@dataclass(frozen=True)
class SamplingAgreement:
    metric: str  # the compared metric, e.g. "accept_rate"
    live: tuple[float, float, float]  # value, 95% CI low, high (bootstrap over live decodes)
    simulated: tuple[float, float, float]  # value, 95% CI low, high (bootstrap over cached prompts)
    live_decodes: int  # live decodes behind the live estimate
    simulated_positions: int  # cached positions behind the simulated estimate
    estimate: str  # the simulator's estimate kind: 'exact' or 'monte-carlo'

    @property
    def overlap(self) -> bool:
        return self.live[1] <= self.simulated[2] and self.simulated[1] <= self.live[2]


def sampling_agreement(live_row: dict, sim_row: dict, metric: str = "accept_rate") -> SamplingAgreement:
    """Whether the live and simulated 95% CIs of `metric` overlap (rows from live and simulate)."""
    pick = lambda r: (float(r[metric]), float(r[metric + "_lo"]), float(r[metric + "_hi"]))  # noqa: E731
    return SamplingAgreement(metric=metric, live=pick(live_row), simulated=pick(sim_row),
                             live_decodes=int(live_row["n_decodes"]), simulated_positions=int(sim_row["n_positions"]),
                             estimate=str(sim_row["estimate"]))

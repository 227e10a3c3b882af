"""Live decoding against the simulator on the same cache: the simulator's ground-truth check.

docs/design.md §5. Greedy: live output must equal the cached greedy trajectory, and
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

Sampling: live acceptance (fresh trajectories, `repeats` seeds per prompt) and
the simulated one on the cached trajectories, each with its 95% bootstrap CI, and
their difference paired by prompt with its 95% interval (`sim.metrics.
paired_by_prompt`); they agree when that interval holds 0 (`checks.
sampling_verdict`; a single prompt gives no interval: inconclusive).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specsim.cache.reader import CacheReader
from specsim.checks import Check, sampling_verdict
from specsim.errors import CacheError
from specsim.live.runs import LivePrompt, LiveRun
from specsim.trees import Tree

if TYPE_CHECKING:  # pragma: no cover
    from specsim.live.decoder import LiveConfig
    from specsim.sim.metrics import Estimate

UNCLASSIFIED = "unclassified (stats-only cache: no target logits)"
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
        s = reader.run.require_settings(path, "cannot rerun it live")
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
    from specsim.record.kv import SlotKV

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
                     draft_model=None, schedule: np.ndarray | None = None) -> GreedyAgreement:
    """Compare every live call with the simulator's greedy replay of the cached trajectory.

    `draft_model` (optional): the live draft model, rerun one token at a time along a
    trajectory to tell 'draft ≠ cache' from 'unexplained' disagreements.
    `schedule` (an adaptive rule's γ table, `LiveConfig.next_gamma`; `tree` its start chain): the
    replay's chain length is walked along each live trajectory (γ' = schedule[γ, accepted]), and a
    call's replayed acceptance is that of a chain of γ at its start, so a wrong γ shows as a
    disagreement.
    """
    from specsim.sim.features import load_features
    from specsim.sim.policies import run_policy
    from specsim.specs import parse_policy
    from specsim.trees import chain

    features = load_features(cache_path, draft, 0.0, progress=False)
    longest = tree if schedule is None else chain(str(schedule.shape[0] - 1))
    table = run_policy(features, longest, parse_policy("greedy"), np.random.default_rng(0))
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
            gamma = tree.max_depth
            for step in traj.live.steps:
                if split is not None and step.start + step.accepted >= split:
                    break
                sim = int(simulated[lo + step.start])
                if schedule is not None:  # a chain of γ accepts the first γ of what the longest accepts
                    sim, gamma = min(sim, gamma), int(schedule[gamma, step.accepted])
                if sim == step.accepted:
                    checks.append(StepCheck(traj.prompt.prompt_index, step.start, step.accepted, sim,
                                            "identical", None, None))
                    continue
                # The ranks of y_t .. y_j all decide which node is reached: look for the cause along the path.
                j = step.start + min(sim, step.accepted)
                path = cached[step.start : j + 1]
                if not reader.has_distributions:  # stats-only: the draft rerun stands in for the cached logits
                    if draft_model is None:
                        checks.append(StepCheck(traj.prompt.prompt_index, step.start, step.accepted, sim,
                                                "unexplained", step.start, None, None))
                        continue
                    if stepwise is None:
                        stepwise = stepwise_draft_logits(draft_model, traj.prompt.token_ids, cached)
                    checks.append(_stats_only_step(traj.prompt.prompt_index, step, sim, path,
                                                   stepwise[step.start : j + 1],
                                                   features.rank[lo + step.start : lo + j + 1]))
                    continue
                q_logits = reader.logits(draft, c0 + step.start, c0 + j + 1)  # (j - t + 1, V)
                k, gaps, verdict = _tie_along(q_logits, path)
                shift = None
                if verdict == "unexplained" and draft_model is not None:
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
                if split < n and not reader.has_distributions:  # no target logits kept to look for a tie
                    gap, verdict = float("nan"), UNCLASSIFIED
                elif split < n:
                    gap, top = top2_gap(reader.logits("target", c0 + split, c0 + split + 1)[0])
                    verdict = "near-tie (target)" if gap <= near_tie_tolerance(top) else "unexplained"
                else:  # live ran past the cached end: an EOS the cache has and live did not take
                    gap, verdict = float("nan"), "unexplained"
                divergences.append(Divergence(traj.prompt.prompt_index, split, gap, verdict, dropped))
    return GreedyAgreement(steps=tuple(checks), divergences=tuple(divergences), min_agreement=min_agreement)


def _tie_along(logits: np.ndarray, path: np.ndarray) -> tuple[int, np.ndarray, str]:
    """(row, gaps, verdict) for the draft's logits along a disagreeing call's path: the first row whose token
    is within a near tie of another ('near-tie (draft)'), else the closest row ('unexplained')."""
    gaps = np.array([token_gap(row, int(y)) for row, y in zip(logits, path)])
    ties = np.flatnonzero(gaps <= [near_tie_tolerance(row[y]) for row, y in zip(logits, path)])
    if ties.size:
        return int(ties[0]), gaps, "near-tie (draft)"
    return int(np.argmin(gaps)), gaps, "unexplained"


def _stats_only_step(prompt_index: int, step, sim: int, path: np.ndarray, rerun: np.ndarray,
                     cached_rank: np.ndarray) -> StepCheck:
    """A disagreement on a stats-only cache, classified from the draft rerun one token at a time: a rank the
    rerun moves is 'draft ≠ cache' (batched vs one-token float32), a near tie in the rerun is a near tie."""
    ranks = np.array([_rank(row, int(y)) for row, y in zip(rerun, path)])
    moved = np.flatnonzero(ranks != cached_rank)
    k, gaps, verdict = _tie_along(rerun, path)
    if moved.size:
        k, verdict = int(moved[0]), "draft ≠ cache"
    return StepCheck(prompt_index, step.start, step.accepted, sim, verdict, step.start + k, float(gaps[k]), None)


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


# -- the whole check: live decoding on a cache's own setup, compared with the replay -----------------




@dataclass
class ValidationReport:
    checks: list[Check]  # in run order
    steps: list[dict]  # greedy: every compared call
    device: str  # where live ran
    setup: CacheSetup  # what the cache recorded

    @property
    def failed(self) -> int:
        return sum(c.passed is False for c in self.checks)


@dataclass(frozen=True)
class ValidateConfig:
    """What `run_validation` checks."""

    trees: tuple[str, ...] = ("chain:4",)  # tree specs to decode live
    policies: tuple[str, ...] = ("greedy",)  # 'greedy' (T=0 trajectories) and/or 'sample' (each recorded T>0)
    drafts: tuple[str, ...] = ()  # recorded drafts or model-free ones; () = every recorded draft
    temperatures: tuple[float, ...] = ()  # recorded T>0 to check under 'sample'; () = all of them
    multi_draft: str = "iid"  # candidate drawing of sampling trees
    repeats: int = 4  # sampling: live decodes per prompt, each with its own seed
    min_agreement: float = MIN_AGREEMENT  # greedy: share of identical calls required
    seed: int = 0  # live sampling and bootstrap seed
    cost_profile: str | tuple[str, ...] | None = None  # a profile (or several of this machine, pooled: the drift
    #                                                    between them in the CI): compare predicted with live speedup
    batch: int = 1  # requests decoded together live (and predicted at)
    batching: str = "lockstep"  # 'lockstep' | 'continuous'
    speed_tolerance: float = 0.10  # |predicted / live - 1| allowed for a speedup check to pass


def _plan(setup: CacheSetup, config: ValidateConfig, cache) -> list[tuple[str, float]]:
    """(policy, T) pairs to decode: greedy at T = 0, sample at each wanted recorded T > 0, an adaptive schedule
    at both (it verifies greedily at T = 0)."""
    from specsim.specs import parse_policy

    plan: list[tuple[str, float]] = []
    for policy in dict.fromkeys(config.policies):
        rule = parse_policy(policy).kind.temperature
        cold = rule in ("0", "any") and 0.0 in setup.temperatures and (
            not config.temperatures or 0.0 in config.temperatures)
        hot = [t for t in setup.temperatures if t > 0 and rule in (">0", "any")]
        wanted = [t for t in hot if not config.temperatures or any(abs(t - w) < 1e-6 for w in config.temperatures)]
        if rule == "0" and not cold:
            raise CacheError(f"{cache}: greedy validation needs T=0 trajectories; recorded: "
                             + ", ".join(f"{t:g}" for t in setup.temperatures))
        if rule != "0" and not wanted and not cold:
            raise CacheError(f"{cache}: {policy} validation needs recorded "
                             + ("" if rule == "any" else "T>0 ") + "trajectories"
                             + (f" at {', '.join(f'{t:g}' for t in config.temperatures)}" if config.temperatures
                                else "") + "; recorded: " + ", ".join(f"{t:g}" for t in setup.temperatures))
        plan += [(policy, 0.0)] * cold + [(policy, t) for t in wanted]
    return plan


def run_validation(cache, config: ValidateConfig, *, device: str = "auto", threads: int | None = None,
                   progress: bool = False, echo=lambda line: None) -> ValidationReport:
    """Decode the cache's prompts live with its models and settings, and compare with the replay.

    Greedy: per-call agreement (`greedy_agreement`). Sampling: the acceptance rates' difference paired by prompt.
    With a cost profile: the predicted speedup (simulate with the profile, at the same batch
    size) beside the live one (plain decoding of the same requests in the same run).
    """
    from specsim.live.decoder import LiveConfig, Target
    from specsim.live.runs import build_drafter, device_label, load_target, run_live, summary_rows
    from specsim.record.models import eos_token_ids
    from specsim.sim.cost import load_cost_profiles
    from specsim.sim.sweep import SweepConfig, simulate, sweep
    from specsim.specs import check_batch, drafts_to_check, parse_tree

    setup = cache_setup(cache)
    drafts = drafts_to_check(cache, config.drafts, setup.drafts, "a model-free one (--draft ngram:3)")
    for d in drafts:
        check_batch(d, config.batch)
    parsed = [(spec, parse_tree(spec)) for spec in dict.fromkeys(config.trees)]
    plan = _plan(setup, config, cache)
    costs = None
    if config.cost_profile is not None:  # refuse a mismatched profile before loading any model
        paths = config.cost_profile if isinstance(config.cost_profile, tuple) else (config.cost_profile,)
        costs = load_cost_profiles(paths)
        simulate(cache, trees=[parsed[0][0]], drafts=drafts, policies=[plan[0][0]], temperatures=[plan[0][1]],
                 cost_profile=costs, batches=[config.batch], batching=config.batching, n_boot=0,
                 on_skip=lambda line: None)  # at the batch the checks price, so a batch it did not measure is refused
    loaded, device = load_target(setup.target, device=device, dtype=setup.dtype, threads=threads, echo=echo)
    target = Target(loaded.model, eos_token_ids(loaded))
    label = device_label(device)
    report = ValidationReport(checks=[], steps=[], device=label, setup=setup)
    timed = costs is not None
    # (policy, T) -> the plain run of the same requests, decoded once; with lockstep batching each run
    # times its own plain batches, alternating with the speculative ones (`run_live`)
    baselines: dict = {}
    for draft in drafts:
        drafter = build_drafter(draft, loaded, device=device, dtype=setup.dtype)
        for policy, T in plan:
            for spec, tree in parsed:
                live_config = LiveConfig.for_policy(tree, policy, T, multi_draft=config.multi_draft,
                                                    max_new_tokens=setup.max_new_tokens, batch=config.batch,
                                                    batching=config.batching)
                run = run_live(target, drafter, setup.prompts, live_config, target_name=loaded.name,
                               repeats=1 if T == 0 else config.repeats, seed=config.seed, device=label,
                               plain=timed, progress=progress,
                               baseline=None if config.batching == "lockstep" else baselines.get((policy, T)))
                if run.interrupted:
                    raise KeyboardInterrupt
                baselines[(policy, T)] = run.plain_run
                head = dict(draft=draft, tree=tree.name, policy=policy, temperature=T, batch=config.batch)
                live_row = summary_rows(run, by_category=False, seed=config.seed)[0]
                replay = sweep(cache, SweepConfig(
                    trees=[spec], drafts=[draft], policies=[policy], temperatures=[T], multi_draft=config.multi_draft,
                    cost_profile=costs, batches=[config.batch] if timed else None, batching=config.batching,
                    by_category=False, seed=config.seed), on_skip=lambda line: None)
                sim = replay.rows
                # priced rows at the live batch; unpriced, one row (acceptance does not depend on the batch)
                sim_row = (sim.filter(sim["batch"] == config.batch) if timed else sim).row(0, named=True)
                if T == 0:
                    report.checks.append(_greedy_check(head, run, cache, draft, tree, config, drafter, report,
                                                       live_config))
                else:
                    report.checks.append(_sampling_check(head, live_row, sim_row, _paired(run, replay.requests)))
                if timed:
                    report.checks.append(_speed_check(head, live_row, sim_row, config))
    return report


def _greedy_check(head: dict, run: LiveRun, cache, draft: str, tree: Tree, config: ValidateConfig, drafter,
                  report: ValidationReport, live_config: LiveConfig) -> Check:
    kv = getattr(drafter, "kv", None)
    g = greedy_agreement(run, cache, draft, tree, min_agreement=config.min_agreement,
                         draft_model=kv.model if kv is not None else None,
                         schedule=live_config.next_gamma() if live_config.schedule else None)
    report.steps += [{"draft": head["draft"], "tree": head["tree"], **s.__dict__} for s in g.steps]
    unclassified = sum(d.verdict == UNCLASSIFIED for d in g.divergences)
    diverged = (f"; {len(g.divergences)} outputs left the cached trajectory "
                f"({sum(d.verdict.startswith('near') for d in g.divergences)} near-tie"
                + (f", {unclassified} unclassified: a stats-only cache keeps no target logits" if unclassified else "")
                + ")" if g.divergences else "; output = cached trajectory")
    return Check(**head, kind="greedy calls",
                 comparison=f"{g.identical}/{len(g.steps)} calls identical ({g.agreement:.1%})",
                 detail=f"{g.near_ties} near-tie, {g.draft_mismatches} draft ≠ cache, {g.unexplained} "
                        f"unexplained{diverged}",
                 passed=g.passed, values={"calls": len(g.steps), "identical": g.identical,
                                          "agreement": g.agreement, "unexplained": g.unexplained})


def _paired(run: LiveRun, requests) -> Estimate | None:
    """The live acceptance rate minus the replay's, paired by prompt (`sim.metrics.paired_by_prompt`): the live run's
    decodes of a prompt against the replay of its cached trajectory."""
    from specsim.live.runs import trajectory_stats
    from specsim.sim.metrics import paired_by_prompt

    if not run.trajectories:
        return None
    stats, groups = trajectory_stats(run)
    return paired_by_prompt((groups.traj_prompt, stats.accepted, stats.drafted),
                            (requests["prompt_index"].to_numpy(), requests["accepted"].to_numpy(),
                             requests["drafted"].to_numpy()))


def _sampling_check(head: dict, live_row: dict, sim_row: dict, paired: Estimate | None = None) -> Check:
    """Live acceptance rate against the replay's, judged by `checks.sampling_verdict`: the paired difference's
    interval (`_paired`) holds 0; without one (no pairs), the two intervals overlap; with one prompt, neither side
    has an interval: inconclusive. Either way a difference over fewer than MIN_SAMPLING_PROMPTS cached prompts is
    inconclusive, not a failure."""
    a = sampling_agreement(live_row, sim_row)
    fmt = lambda v: f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"  # noqa: E731
    no_ci = any(x != x for x in (*a.live[1:], *a.simulated[1:]))
    passed, why = sampling_verdict(paired, None if no_ci else a.overlap, int(sim_row.get("n_prompts") or 0))
    judged = paired is not None and paired.lo == paired.lo
    shown = (f"CIs {'overlap' if a.overlap else 'DISJOINT'}; paired by prompt, live - sim {paired.value:+.3f} "
             f"[{paired.lo:+.3f}, {paired.hi:+.3f}]; verdict: {why}") if judged else why
    return Check(**head, kind="acceptance",
                 comparison=f"accept rate live {fmt(a.live)} vs sim {fmt(a.simulated)}",
                 detail=f"{a.live_decodes} live decodes, {a.simulated_positions} cached positions, sim "
                        f"{a.estimate}; {shown}",
                 passed=passed,
                 values={"accept_rate_live": a.live[0], "accept_rate_sim": a.simulated[0],
                         **({"paired_difference": paired.value, "paired_difference_lo": paired.lo,
                             "paired_difference_hi": paired.hi} if judged else {})})


def _speed_check(head: dict, live_row: dict, sim_row: dict, config: ValidateConfig) -> Check:
    predicted, live = float(sim_row["speedup"]), float(live_row["speedup"])
    ratio = predicted / live
    ok = abs(ratio - 1) <= config.speed_tolerance
    live_lo, live_hi = (float("nan" if live_row.get(end) is None else live_row[end])
                        for end in ("speedup_lo", "speedup_hi"))  # none without a plain baseline
    live_ci = f" [{live_lo:.3f}, {live_hi:.3f}]" if live_lo == live_lo else ""
    return Check(**head, kind="speedup",
                 comparison=f"predicted {predicted:.3f} [{sim_row['speedup_lo']:.3f}, {sim_row['speedup_hi']:.3f}] "
                            f"vs live {live:.3f}{live_ci}: ratio {ratio:.3f}",
                 detail=f"tok/s predicted {sim_row['tokens_per_s']:.1f} vs live {live_row['live_tokens_per_s']:.1f}; "
                        f"plain {sim_row['plain_tokens_per_s']:.1f} vs {live_row['plain_tokens_per_s']:.1f}; "
                        f"tolerance ±{config.speed_tolerance:.0%}",
                 passed=ok,
                 values={"speedup_predicted": predicted, "speedup_predicted_lo": sim_row["speedup_lo"],
                         "speedup_predicted_hi": sim_row["speedup_hi"], "speedup_live": live,
                         "speedup_live_lo": live_lo, "speedup_live_hi": live_hi, "ratio": ratio,
                         "tokens_per_s_predicted": sim_row["tokens_per_s"],
                         "tokens_per_s_live": live_row["live_tokens_per_s"],
                         "plain_tokens_per_s_predicted": sim_row["plain_tokens_per_s"],
                         "plain_tokens_per_s_live": live_row["plain_tokens_per_s"],
                         "tokens_per_call_sim": sim_row["tokens_per_call"],
                         "tokens_per_call_live": live_row["tokens_per_call"]})

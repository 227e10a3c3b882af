"""`specsim validate --engine vllm`: vLLM on a cache's prompts against the replay of the same configuration.

docs/design.md §6. For each draft, chain and policy the cache's prompts go to vLLM as token ids
with the cache's max_new_tokens, and the same configuration is replayed on the cache; the
replay's vLLM counters (`specsim.sim.engine.EngineTotals`) are what vLLM should report. The
untimed configurations of one model, policy and temperature run in one vLLM program, a child
process each (`specsim.engines.vllm.run_vllm`); timed ones (rounds > 0) in a program each.

* T = 0: vLLM's outputs must equal the cache's trajectories, and its counters (num_drafts,
  num_draft_tokens, num_accepted_tokens, per position) the replay's, exactly. Each request's
  calls are compared step by step (vLLM's `per_request_spec_decode_metrics="detailed"`), and
  a difference is classified: `float tie (target)` (vLLM's output left the cached trajectory
  where the target's top two logits are within rounding of each other; a stats-only cache keeps
  no logits to tell, and says so), `different proposal` (vLLM drafted another number of tokens
  at that step), `different acceptance` (the same number drafted, another number accepted: the
  draft model computes differently in vLLM than in the recording). Requests whose output left
  the cache are left out of the counter comparison, and the check says how many.
* T > 0: vLLM samples anew (`repeats` seeds per prompt), so its trajectories are not the
  cache's: its mean acceptance length and draft acceptance rate, with a 95% bootstrap interval
  over prompts, are shown beside the replay's interval over the cache's prompts; the verdict is
  their difference paired by prompt (`_paired`), whose 95% interval must hold 0: the prompts'
  own spread cancels there, so it tells a small difference that overlapping intervals let pass
  (`checks.sampling_verdict`, as for specsim's live check; one prompt gives no interval: inconclusive).
* Speed (rounds > 0): vLLM's speculative and plain decoding of the same requests at the same
  batch size, `rounds` timed `generate` calls each, alternating, in one vLLM process; the
  speedup is the median of plain / speculative time. At B > 1 the requests decode in waves of
  B (lockstep: a wave's B prompts are prefilled together before its first token, within vLLM's
  CPU token budget of 4,096), and what is timed is the sum of the waves' decode windows, as the
  replay's lockstep schedule prices them: with every request at once (continuous batching) the
  window holds the prompt passes of the requests that join mid-run, which the replay leaves out
  (they are the same with and without speculation), and pulled vLLM's speedup toward 1 (layers:20
  at B = 4: 0.402 live against 0.287 predicted, analyses/results/vllm-speed-cpu-2026-11-29).
  Beside it, specsim's prediction when a cost profile is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from specsim.cache.reader import CacheReader
from specsim.checks import Check, sampling_verdict
from specsim.errors import CacheError
from specsim.sim.cost import load_cost_profile
from specsim.specs import parse_tree

NEAR_TIE_ABS = 1e-3  # as `specsim.live.validate`: float32 noise between engines, in logits
NEAR_TIE_REL = 2.0**-9


@dataclass(frozen=True)
class EngineValidateConfig:
    """What `validate_with_vllm` checks."""

    trees: tuple[str, ...] = ("chain:4",)  # chains (vLLM's num_speculative_tokens)
    policies: tuple[str, ...] = ("greedy",)  # greedy (T=0); greedy-draft / sample at each recorded T>0
    drafts: tuple[str, ...] = ()  # recorded drafts or vllm-ngram:...; () = every recorded draft
    temperatures: tuple[float, ...] = ()  # recorded T>0 to check; () = all
    repeats: int = 4  # T > 0: vLLM decodes per prompt
    batch: int = 1  # vLLM's max_num_seqs
    rounds: int = 0  # > 0: also time speculative against plain decoding, this many rounds
    seed: int = 0
    cost_profile: str | None = None  # a specsim profile: print specsim's predicted speedup beside vLLM's
    threads: int | None = None  # OMP threads of vLLM's CPU worker
    log_dir: str | None = None  # keep vLLM's logs here
    fix_cpu_expand: bool = False  # run vLLM's CPU build with its T>0 temperature expand corrected (vllm_worker.py)
    speed_tolerance: float = 0.15  # |predicted / vLLM - 1| allowed when the prediction is priced with vLLM's costs


@dataclass
class EngineReport:
    checks: list[Check] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)  # T = 0: every compared vLLM step
    vllm_version: str = ""
    setup: dict = field(default_factory=dict)  # target, prompts, max_new_tokens

    @property
    def failed(self) -> int:
        return sum(c.passed is False for c in self.checks)


@dataclass(frozen=True)
class _Cache:
    path: Path
    target: str
    target_info: dict
    drafts_info: dict
    max_new_tokens: int
    prompts: tuple[tuple[int, ...], ...]
    temperatures: tuple[float, ...]
    drafts: tuple[str, ...]
    storage: str


def read_cache(cache) -> _Cache:
    with CacheReader(cache) as reader:
        run = reader.run
        settings = run.require_settings(cache, "cannot rerun it in vLLM")
        prompts = tuple(tuple(int(x) for x in reader.prompt_token_ids(i)) for i in range(reader.prompts.height))
        return _Cache(path=reader.path, target=settings["target"], target_info=dict(run.target),
                      drafts_info={k: dict(v) for k, v in run.drafts.items()},
                      max_new_tokens=int(settings["max_new_tokens"]),
                      prompts=prompts, temperatures=tuple(reader.spec.temperatures), drafts=tuple(reader.spec.drafts),
                      storage=reader.spec.storage)


def _plan(cache: _Cache, config: EngineValidateConfig) -> list[tuple[str, float]]:
    plan = []
    for policy in dict.fromkeys(config.policies):
        if policy == "greedy":
            if 0.0 not in cache.temperatures:
                raise CacheError(f"{cache.path}: greedy needs T=0 trajectories; recorded: "
                                 + ", ".join(f"{t:g}" for t in cache.temperatures))
            plan.append((policy, 0.0))
            continue
        hot = [t for t in cache.temperatures if t > 0 and (not config.temperatures or any(
            abs(t - w) < 1e-6 for w in config.temperatures))]
        if not hot:
            raise CacheError(f"{cache.path}: policy {policy} needs recorded T>0 trajectories; recorded: "
                             + ", ".join(f"{t:g}" for t in cache.temperatures))
        plan += [(policy, t) for t in hot]
    return plan


def validate_with_vllm(cache, config: EngineValidateConfig, *, echo: Callable[[str], None] = lambda line: None,
                       progress: bool = False) -> EngineReport:
    """Run every configuration of `config` in vLLM and replay it on `cache` (the module docstring); `progress`:
    a bar per vLLM program."""
    from specsim.engines.export import draft_directory, model_directory
    from specsim.engines.vllm import (VllmRun, run_vllm, speculative_config, vllm_has_suffix, vllm_python,
                                      vllm_version)
    from specsim.specs import draft_kind, drafts_to_check, is_model_free

    data = read_cache(cache)
    drafts = drafts_to_check(cache, config.drafts, data.drafts, "one vLLM runs, e.g. --draft vllm-ngram:min=2,max=3")
    trees = [parse_tree(spec) for spec in dict.fromkeys(config.trees)]
    plan = _plan(data, config)
    for d in drafts:  # refuse what vLLM cannot run before anything starts
        for tree in trees:
            for policy, _ in plan:
                speculative_config(d, tree, policy, draft_dir="?" if not is_model_free(d) else None)
    python = vllm_python()
    report = EngineReport(vllm_version=vllm_version(python))
    if any(draft_kind(d).name == "suffix" for d in drafts):
        vllm_has_suffix(python)
    report.setup = {"target": data.target, "prompts": len(data.prompts), "max_new_tokens": data.max_new_tokens}
    target_dir = model_directory(data.target, data.target_info)
    longest = max(len(p) for p in data.prompts)
    # every configuration in the order the report lists them, and each (model, policy, T): what one vLLM program
    # runs one after another
    jobs, groups = [], {}
    for draft in drafts:
        draft_dir = None if is_model_free(draft) else draft_directory(
            draft, data.target, target_info=data.target_info, draft_info=data.drafts_info.get(draft), echo=echo)
        # vLLM's mtp method drafts from the target's own checkpoint: an exported one holds the head too
        model = draft_dir if draft_kind(draft).name == "mtp" else target_dir
        for policy, T in plan:
            for tree in trees:
                jobs.append((draft, tree, policy, T))
                groups.setdefault((model, policy, T), []).append(
                    (draft, tree, speculative_config(draft, tree, policy, draft_dir=draft_dir).config))
    results = {}  # (draft, tree name, policy, T) -> vLLM's result with that configuration's run as "spec"
    for (model, policy, T), group in groups.items():
        # untimed: the group in one program (a child process per configuration, vLLM imported once); timed: a
        # program per configuration, its speculative and plain decoding alternating on one machine state
        for program in ([job] for job in group) if config.rounds else [group]:
            names = ["spec"] if config.rounds else [f"{draft} {tree.name}" for draft, tree, _ in program]
            configs = {name: engine for name, (_, _, engine) in zip(names, program)}
            if config.rounds:
                configs["plain"] = None
            run = VllmRun(model=model, prompts=data.prompts, max_tokens=data.max_new_tokens, configs=configs,
                          temperature=T, repeats=1 if T == 0 else config.repeats, batch=config.batch,
                          waves=bool(config.rounds) and config.batch > 1, rounds=config.rounds, seed=config.seed,
                          threads=config.threads,
                          max_model_len=longest + data.max_new_tokens + max(t.max_depth for _, t, _ in program) + 16,
                          fix_cpu_expand=config.fix_cpu_expand and T > 0)
            result = run_vllm(run, python=python, echo=echo, log=_log_path(config.log_dir, program, policy, T),
                              progress=progress)
            for name, (draft, tree, _) in zip(names, program):
                results[(draft, tree.name, policy, T)] = {**result, "runs": {**result["runs"],
                                                                             "spec": result["runs"][name]}}
    for draft, tree, policy, T in jobs:
        compare(data, draft, tree, policy, T, config, results[(draft, tree.name, policy, T)], report)
    return report


def compare(data: "_Cache", draft: str, tree, policy: str, T: float, config: EngineValidateConfig, result: dict,
            report: EngineReport) -> None:
    """Add to `report` the checks of one vLLM `result` (`run_vllm`) against the replay of the same configuration."""
    head = dict(draft=draft, tree=tree.name, policy=policy, temperature=T, batch=config.batch)
    replay = _replay(data.path, draft, tree.name, policy, T, config)
    if T == 0:
        report.checks += _greedy_checks(head, data, draft, tree, result["runs"]["spec"][0], replay, report)
    else:
        report.checks.append(_sampling_check(head, result, replay, config.seed))
    if config.rounds:
        report.checks.append(_speed_check(head, result, replay, config))


def _log_path(log_dir: str | None, program: list, policy: str, T: float) -> Path | None:
    """Where one vLLM program's log goes (None: a temporary file): named by its draft and tree where it runs one."""
    if not log_dir:
        return None
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    drafts, trees = dict.fromkeys(d for d, _, _ in program), dict.fromkeys(t.name for _, t, _ in program)
    parts = [*(map(_slug, drafts) if len(drafts) == 1 else ()), *(map(_slug, trees) if len(trees) == 1 else ())]
    return Path(log_dir) / ("-".join(["vllm", *parts, policy, f"T{T:g}"]) + ".log")


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)


@dataclass(frozen=True)
class _Replay:
    row: dict  # the simulate row ("all")
    requests: object  # polars frame: per trajectory, with its vLLM counters
    features: object  # Features of the draft at T
    table: object | None  # the acceptance table (point masses at T = 0)


def _replay(cache: Path, draft: str, tree_spec: str, policy: str, T: float, config: EngineValidateConfig) -> _Replay:
    from specsim.sim.sweep import SweepConfig, sweep
    from specsim.sim.features import load_features
    from specsim.sim.policies import run_policy
    from specsim.specs import parse_policy

    asked = SweepConfig(trees=[tree_spec], drafts=[draft], policies=[policy], temperatures=[T], by_category=False,
                        seed=config.seed, cost_profile=config.cost_profile,
                        batches=[config.batch] if config.cost_profile and config.batch > 1 else (),
                        batching="lockstep")  # vLLM's timed runs decode in waves of B (the module docstring)
    result = sweep(cache, asked, on_skip=lambda line: None)
    rows = result.rows.filter(result.rows["batch"] == config.batch) if config.cost_profile else result.rows
    features = load_features(cache, draft, T, progress=False)
    table = None
    if T == 0:
        table = run_policy(features, parse_tree(tree_spec), parse_policy(policy), np.random.default_rng(config.seed))
    return _Replay(row=rows.row(0, named=True), requests=result.requests, features=features, table=table)


# -- T = 0: identical outputs, equal counters, step by step -----------------------------------------------


def _near_tie_target(cache: _Cache, features, i_traj: int, position: int) -> str:
    """Why an engine's greedy output can leave the cached trajectory at `position`: a float tie or not."""
    if cache.storage == "stats":
        return "unclassified (stats-only cache: no target logits to tell a float tie)"
    with CacheReader(cache.path) as reader:
        row = int(features.cache_start[i_traj]) + position
        logits = reader.logits("target", row, row + 1)[0].astype(np.float64)
    top = np.sort(logits)[-2:]
    gap = float(top[1] - top[0])
    tie = gap <= NEAR_TIE_ABS + NEAR_TIE_REL * abs(float(top[1]))
    return f"float tie (target): top-2 logits {gap:.2g} apart" if tie else f"unexplained: top-2 gap {gap:.3g}"


def _greedy_checks(head: dict, cache: _Cache, draft: str, tree, run: dict, replay: _Replay,
                   report: EngineReport) -> list[Check]:
    from specsim.sim.engine import engine_calls

    features, table = replay.features, replay.table
    by_prompt = {int(p): i for i, p in enumerate(features.traj_prompt)}
    same, left = [], []
    steps_total = steps_equal = 0
    first_step_difference = None
    for prompt_index, request in enumerate(run["requests"]):
        i = by_prompt.get(prompt_index)
        if i is None:
            raise CacheError(f"{cache.path}: no T=0 trajectory for prompt {prompt_index}")
        lo, n = int(features.traj_start[i]), int(features.traj_len[i])
        cached = features.token[lo : lo + n].tolist()
        out = list(request["tokens"])
        if out != cached:
            m = min(len(out), n)
            where = next((j for j in range(m) if out[j] != cached[j]), m)
            left.append((prompt_index, where, _near_tie_target(cache, features, i, where) if where < n else
                         f"vLLM stopped at {len(out)}, the cache at {n}"))
            continue
        same.append(i)
        ours = [(t, d, a) for t, d, a in engine_calls(table, features, i) if d > 0]  # vLLM counts drafting steps
        spec = request.get("spec") or {}
        theirs = list(zip(spec.get("per_step_drafted", []), spec.get("per_step_accepted", [])))
        for k in range(max(len(ours), len(theirs))):
            o = ours[k] if k < len(ours) else None
            e = theirs[k] if k < len(theirs) else None
            verdict = "identical" if o is not None and e is not None and (o[1], o[2]) == e else (
                "different proposal" if o is None or e is None or o[1] != e[0] else "different acceptance")
            steps_total += 1
            steps_equal += verdict == "identical"
            if verdict != "identical" and first_step_difference is None:
                first_step_difference = (prompt_index, k, o, e, verdict)
            report.steps.append({"draft": draft, "tree": tree.name, "prompt_index": prompt_index, "step": k,
                                 "start": None if o is None else o[0],
                                 "replay_drafted": None if o is None else o[1],
                                 "replay_accepted": None if o is None else o[2],
                                 "vllm_drafted": None if e is None else e[0],
                                 "vllm_accepted": None if e is None else e[1], "verdict": verdict})
    checks = []
    ties = sum(w.startswith("float tie") for _, _, w in left)
    checks.append(Check(**head, kind="trajectories", comparison=f"{len(same)}/{len(run['requests'])} vLLM outputs "
                                                              "identical to the cached trajectories",
                        detail="; ".join(f"prompt {p} left at {j}: {w}" for p, j, w in left[:3])
                        + ("; ..." if len(left) > 3 else "") if left else "token for token",
                        passed=len(left) == ties, values={"identical_outputs": len(same), "outputs": len(
                            run["requests"]), "float_ties": ties}))
    if left:  # counters over the requests both decoded alike, summed per request on both sides
        ours = _counts([c for i in same for c in engine_calls(table, features, i)], tree.max_depth)
        theirs = _vllm_counters([run["requests"][int(features.traj_prompt[i])] for i in same], tree.max_depth)
    else:  # what `simulate` prints against what vLLM counted
        ours = {k: replay.row[f"vllm_{k}"] for k in COUNTERS}
        theirs = {k: run["counters"][k] for k in COUNTERS}
    exact = replay.row.get("vllm_counts")
    equal = ours == theirs
    metrics = run.get("metrics")
    agrees = ("; vLLM's metrics (get_metrics) report the same" if metrics == run["counters"] else
              f"; vLLM's metrics (get_metrics) report {_fmt(metrics)}") if metrics else ""
    detail = (f"replay {_fmt(ours)}; vLLM {_fmt(theirs)}" + (f" over the {len(same)} identical outputs"
                                                                 if left else "") + f"; replay: {exact}{agrees}")
    if not equal and exact != "exact":
        detail += " (the replay's counts are not exact here: see vllm_counts)"
    checks.append(Check(**head, kind="counters", comparison=("equal" if equal else "DIFFER")
                        + f": vLLM {_fmt(theirs)}",
                        detail=detail, passed=equal,
                        values={**{f"replay_{k}": v for k, v in ours.items()},
                                **{f"vllm_{k}": v for k, v in theirs.items()}}))
    if steps_total:
        detail = "every step" if steps_equal == steps_total else (
            "first difference: prompt {0}, step {1}: replay {2}, vLLM {3} ({4})".format(*first_step_difference))
        checks.append(Check(**head, kind="steps", comparison=f"{steps_equal}/{steps_total} vLLM steps identical "
                                                            "(drafted, accepted) to the replay's calls",
                            detail=detail, passed=steps_equal == steps_total,
                            values={"steps": steps_total, "identical_steps": steps_equal}))
    return checks


COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")


def _counts(calls: list[tuple[int, int, int]], depth: int) -> dict:
    """vLLM's counters of some (start, drafted, accepted) calls: a call that drafted nothing is no draft."""
    drafting = [(d, a) for _, d, a in calls if d > 0]
    return {"num_drafts": len(drafting), "num_draft_tokens": sum(d for d, _ in drafting),
            "num_accepted_tokens": sum(a for _, a in drafting),
            "num_accepted_tokens_per_pos": [sum(a >= k for _, a in drafting) for k in range(1, depth + 1)]}


def _vllm_counters(requests: list[dict], depth: int) -> dict:
    """vLLM's counters summed over its per-request records (`per_request_spec_decode_metrics`)."""
    hist = np.zeros(depth + 1, dtype=np.int64)
    drafted = 0
    for r in requests:
        spec = r.get("spec") or {}
        h = spec.get("acceptance_histogram", [])
        hist[: len(h)] += np.asarray(h, dtype=np.int64)[: depth + 1]
        drafted += int(spec.get("num_draft_tokens", 0))
    reach = np.cumsum(hist[::-1])[::-1][1:]  # calls accepting at least d, d = 1..depth
    return {"num_drafts": int(hist.sum()), "num_draft_tokens": drafted,
            "num_accepted_tokens": int((hist * np.arange(depth + 1)).sum()),
            "num_accepted_tokens_per_pos": [int(x) for x in reach]}


def _fmt(c: dict) -> str:
    return (f"{c['num_drafts']} drafts, {c['num_draft_tokens']} draft tokens, {c['num_accepted_tokens']} accepted "
            f"{list(c['num_accepted_tokens_per_pos'])}")


# -- T > 0: acceptance within intervals ------------------------------------------------------------------


CPU_EXPAND_BUG = ("vLLM's CPU build verifies at T>0 with uninitialised temperatures (vllm/utils/cpu_triton_utils.py "
                  "_expand_kernel_impl writes an int64 copy of the float buffer), so its acceptance is not its rule's: "
                  "not comparable; rerun with --fix-vllm-cpu (vLLM with that function corrected) or on a GPU build")


def _paired(accepted: np.ndarray, drafts: np.ndarray, replay: _Replay):
    """vLLM's mean acceptance length minus the replay's, paired by prompt (`accepted`, `drafts`: vLLM's per prompt,
    the cache's prompts in order, summed over repeats; the replay's trajectories carry their prompt index), with its
    interval over prompts (`sim.metrics.paired_by_prompt`): the sharper comparison, since the prompts' own spread
    cancels. None where no prompt pairs."""
    from specsim.sim.metrics import paired_by_prompt

    ours = replay.requests
    return paired_by_prompt((np.arange(len(accepted)), accepted, drafts),
                            (ours["prompt_index"].to_numpy(), ours["vllm_num_accepted_tokens"].to_numpy(),
                             ours["vllm_num_drafts"].to_numpy()))


def _sampling_check(head: dict, result: dict, replay: _Replay, seed: int) -> Check:
    """vLLM's mean acceptance length with a bootstrap interval over prompts (their repeats summed) vs the replay's, and
    their difference paired by prompt (`_paired`), judged by `checks.sampling_verdict` as specsim's live check is:
    the paired difference's interval holds 0 (over fewer than its minimum of prompts, one that excludes 0 is
    inconclusive); one prompt gives no interval at all: inconclusive."""
    from specsim.sim.metrics import ratio_estimates

    repeats = result["runs"]["spec"]
    per_request = [(r.get("spec") or {}) for run in repeats for r in run["requests"]]
    hist = [s.get("acceptance_histogram", []) for s in per_request]
    drafts = np.array([sum(h) for h in hist], dtype=np.float64)
    accepted = np.array([sum(j * c for j, c in enumerate(h)) for h in hist], dtype=np.float64)
    drafted = np.array([s.get("num_draft_tokens", 0) for s in per_request], dtype=np.float64)
    # per prompt, its repeats summed (per_request is run-major: every repeat decodes the cache's prompts in order),
    # and resampled by prompt: a prompt's repeats share its text, so they are not independent draws
    accepted, drafts, drafted = (x.reshape(len(repeats), -1).sum(0) for x in (accepted, drafts, drafted))
    length, rate = ratio_estimates(np.column_stack([accepted, accepted]), np.column_stack([drafts, drafted]),
                                   n_boot=1000, seed=seed)
    vllm = (1 + length.value, 1 + length.lo, 1 + length.hi)
    row = replay.row
    ours = (row["vllm_mean_acceptance_length"], row["vllm_mean_acceptance_length_lo"],
            row["vllm_mean_acceptance_length_hi"])
    overlap = not (vllm[2] < ours[1] or ours[2] < vllm[1])
    inside = ours[1] <= vllm[0] <= ours[2]
    paired = _paired(accepted, drafts, replay)
    no_ci = any(x != x for x in (*vllm[1:], *ours[1:]))
    passed, why = sampling_verdict(paired, None if no_ci else overlap, int(row["n_prompts"]))
    fmt = lambda v: f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"  # noqa: E731
    broken = bool(result.get("cpu_expand_broken"))
    fixed = "; vLLM ran with specsim's fix of its CPU expand kernel (--fix-vllm-cpu)" if result.get(
        "fix_cpu_expand") else ""
    return Check(**head, kind="acceptance",
                 comparison=f"mean acceptance length vLLM {fmt(vllm)} vs replay {fmt(ours)}",
                 detail=(CPU_EXPAND_BUG + "; " if broken else "")
                        + f"vLLM: {len(per_request)} decodes ({len(repeats)} per prompt), acceptance rate "
                        f"{rate.value:.3f}"
                        f"; replay: {row['n_prompts']} cached trajectories, {row['vllm_counts']}, rate "
                        f"{row['vllm_draft_acceptance_rate']:.3f}; intervals {'overlap' if overlap else 'DISJOINT'}"
                        f"{', vLLM inside the replay CI' if inside else ''}"
                        + ("" if paired is None else f"; paired by prompt, vLLM - replay {paired.value:+.3f} "
                           f"[{paired.lo:+.3f}, {paired.hi:+.3f}]")
                        + f"; verdict: {why}" + fixed,
                 passed=None if broken else passed,
                 values={"vllm_mean_acceptance_length": vllm[0], "vllm_mean_acceptance_length_lo": vllm[1],
                         "vllm_mean_acceptance_length_hi": vllm[2], "replay_mean_acceptance_length": ours[0],
                         "replay_mean_acceptance_length_lo": ours[1], "replay_mean_acceptance_length_hi": ours[2],
                         "vllm_draft_acceptance_rate": rate.value,
                         "replay_draft_acceptance_rate": row["vllm_draft_acceptance_rate"],
                         **({} if paired is None else {"paired_difference": paired.value,
                                                       "paired_difference_lo": paired.lo,
                                                       "paired_difference_hi": paired.hi})})


# -- speed -------------------------------------------------------------------------------------------------


def _speed_check(head: dict, result: dict, replay: _Replay, config: EngineValidateConfig) -> Check:
    """vLLM's own speedup over its plain decoding of the same requests, beside specsim's prediction. What is
    timed: at batch 1 the requests' decode steps (first to last token, one request after another), at B > 1 the
    decode windows of its waves of B requests, summed; whole generate calls (prefill included) beside."""
    rounds = result.get("timings", [])
    measure = "decode_s" if head["batch"] == 1 else "window_s"
    ratios = [t["plain"][measure] / t["spec"][measure] for t in rounds]
    whole = [t["plain"]["seconds"] / t["spec"]["seconds"] for t in rounds]
    speedup = float(np.median(ratios)) if ratios else float("nan")
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
    row = replay.row
    predicted = row.get("speedup")
    basis = str(row.get("cost_basis"))
    vllm_costs = bool(config.cost_profile) and load_cost_profile(config.cost_profile).engine.startswith("vllm")
    passed = None
    if predicted is not None and predicted == predicted:
        ratio = predicted / speedup
        comparison = (f"vLLM {speedup:.3f} (rounds {spread}) vs specsim predicted {predicted:.3f} "
                      f"[{row['speedup_lo']:.3f}, {row['speedup_hi']:.3f}]: ratio {ratio:.3f}")
        if vllm_costs:
            passed = abs(ratio - 1) <= config.speed_tolerance
            basis = f"predicted from vLLM's own step costs ({basis}); tolerance ±{config.speed_tolerance:.0%}"
        else:
            basis = f"predicted from {basis} (another engine's step costs: informational)"
    else:
        comparison = f"vLLM {speedup:.3f} (rounds {spread})"
        basis = "no prediction (give --cost-profile)"
    what = ("decode steps (first to last token per request)" if head["batch"] == 1 else
            f"decode windows of waves of {head['batch']} requests (lockstep), summed")
    return Check(**head, kind="speedup", comparison=comparison,
                 detail=f"{len(rounds)} timed rounds of each, alternating; vLLM timed on its {what}; whole generate "
                        f"calls (prefill included) give {float(np.median(whole)) if whole else float('nan'):.3f}; "
                        f"{basis}",
                 passed=passed,
                 values={"vllm_speedup": speedup, "vllm_speedup_min": min(ratios) if ratios else None,
                         "vllm_speedup_max": max(ratios) if ratios else None,
                         "vllm_speedup_whole_run": float(np.median(whole)) if whole else None,
                         "vllm_plain_s": float(np.median([t["plain"][measure] for t in rounds])) if rounds else None,
                         "vllm_spec_s": float(np.median([t["spec"][measure] for t in rounds])) if rounds else None,
                         "speedup_predicted": predicted, "speedup_predicted_lo": row.get("speedup_lo"),
                         "speedup_predicted_hi": row.get("speedup_hi")})

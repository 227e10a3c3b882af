"""From expected totals per trajectory to the numbers users read, with bootstrap CIs over prompts.

Every metric is a ratio of sums over the trajectories of a group (a prompt category,
or "all"): acceptance rate = accepted / drafted, tokens per call = tokens / calls, …
— the per-token averages a long run would measure, not means of per-prompt ratios.

Uncertainty from *which prompts* were cached is a percentile bootstrap (Efron &
Tibshirani 1993), expanded for few prompts (`expanded_tail`): resample the group's
trajectories with replacement B times and recompute each ratio. All B resamples are
one matrix product of multinomial counts (B, n) with the per-trajectory sums (n, K);
the counts depend only on the group size and the seed, so configurations of one sweep
share them (their CIs are comparable), and `summarize_many` resamples every configuration of a sweep in one product.
A Monte-Carlo policy's own estimation error is reported separately as a standard error.

Speed is priced by a cost profile whose timings scatter too. Where the profile kept its timed
rounds, each trajectory's time was also priced by every replica of the profile (rounds
resampled jointly, `sim.cost.ProfileCost.replicas`); prompt resample b then takes its times
from replica b mod R, so the speedup and tokens/s intervals cover both sources at once, and
each row says which it covers (`speedup_ci_covers`).

A configuration that drafts nothing (a model-free draft on contexts without a match)
has an undefined acceptance rate: it is reported as NaN, without numpy warnings, and
its tokens per call is exactly 1.
numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from specsim.sim.engine import TrajectoryStats

ALL = "all"  # the category label of the row over every prompt
CI_LEVEL = 0.95  # two-sided interval
METRICS = ("accept_rate", "accepted_per_call", "tokens_per_call", "calls_per_100_tokens", "drafted_per_call",
           "speedup", "tokens_per_s", "vllm_mean_acceptance_length", "vllm_draft_acceptance_rate")
# the ratio columns of a row, each with _lo and _hi
_TOTALS = ("accepted", "drafted", "calls", "tokens", "cost", "plain", "engine_drafts", "engine_drafted",
           "engine_accepted")  # the per-trajectory sums they are ratios of
# speedup = plain time / speculative time of the same trajectories; tokens_per_s = tokens / time (the
# cost model's unit: seconds when measured). Without a cost model both are NaN.
# vllm_*: vLLM's own ratios of its spec-decode counters (docs/design.md §6): mean acceptance length =
# 1 + num_accepted_tokens / num_drafts, draft acceptance rate = num_accepted_tokens / num_draft_tokens.
VLLM_COUNTERS = ("vllm_num_drafts", "vllm_num_draft_tokens", "vllm_num_accepted_tokens",
                 "vllm_num_accepted_tokens_per_pos")  # the counters' totals, beside the ratios


@dataclass(frozen=True)
class Estimate:
    value: float  # point estimate on the group's trajectories
    lo: float  # lower end of the 95% bootstrap interval (nan with fewer than 2 prompts)
    hi: float  # upper end


@lru_cache(maxsize=64)
def bootstrap_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) float64 multinomial resampling counts (each row sums to n)."""
    rng = np.random.default_rng([seed, n])
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)
    counts.flags.writeable = False
    return counts


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with 0/0 = NaN and no warning (a group or resample that drafted nothing)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


@lru_cache(maxsize=256)
def expanded_tail(n: int) -> float:
    """The percentile (in %) that bounds a two-sided CI_LEVEL interval from below over n resampled rows: the
    expanded percentile interval (Hesterberg, "What teachers should know about the bootstrap", The American
    Statistician 69(4), 2015), tail Φ(−√(n / (n − 1)) · t(n − 1)) instead of (1 − CI_LEVEL) / 2. A plain
    percentile interval is too narrow over few prompts: it knows neither that the prompts' spread is estimated nor
    the n / (n − 1) the bootstrap's variance lacks (analyses/results/paired-interval-cpu-2026-11-28/coverage.txt:
    a ratio of sums over 13 skewed prompts, 87% covered plainly, 91% expanded)."""
    from scipy.stats import norm, t as student_t

    if n < 2:
        return (1 - CI_LEVEL) / 2 * 100
    return float(100 * norm.cdf(-np.sqrt(n / (n - 1)) * student_t.ppf((1 + CI_LEVEL) / 2, n - 1)))


def _interval(boot: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Expanded percentile interval (`expanded_tail`) over axis 0 of resamples of n rows; NaN resamples are left out,
    all-NaN columns give NaN."""
    tail = expanded_tail(int(n))
    lo, hi = np.percentile(boot, [tail, 100 - tail], axis=0)
    some = np.isnan(boot).any(axis=0) & ~np.isnan(boot).all(axis=0)
    if some.any():
        lo[some], hi[some] = np.nanpercentile(boot[:, some], [tail, 100 - tail], axis=0)
    return lo, hi


def ratio_estimates(num: np.ndarray, den: np.ndarray, *, n_boot: int, seed: int) -> list[Estimate]:
    """Ratio-of-sums estimates Σnum[:, k] / Σden[:, k] with bootstrap CIs over rows (trajectories).

    num, den: (n, K). One matrix product covers every bootstrap resample of every ratio.
    """
    num, den = np.atleast_2d(num.T).T, np.atleast_2d(den.T).T  # (n, K)
    n = num.shape[0]
    point = _ratio(num.sum(axis=0), den.sum(axis=0))
    if n < 2 or n_boot < 1:
        return [Estimate(float(v), float("nan"), float("nan")) for v in point]
    W = bootstrap_counts(n, int(n_boot), int(seed))  # (B, n)
    K = num.shape[1]
    sums = W @ np.concatenate([num, den], axis=1)  # (B, 2K): every resample's sums in one product
    lo, hi = _interval(_ratio(sums[:, :K], sums[:, K:]), n)
    return [Estimate(float(v), float(a), float(b)) for v, a, b in zip(point, lo, hi)]


def ratio_difference(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray) -> Estimate:
    """Σnum_a / Σden_a − Σnum_b / Σden_b over paired rows (row i of a and of b: the same prompt), with a 95%
    interval over the rows: what differs from prompt to prompt cancels, which two intervals compared side by side
    do not let it do.

    The interval is the ratio estimator's linearisation (Cochran, *Sampling Techniques*, 1977, §6.4): row i
    contributes z_i = (num_a,i − R_a den_a,i) / mean(den_a) − (num_b,i − R_b den_b,i) / mean(den_b), and the
    difference ± t(n − 1) · sd(z) / √n. Not a percentile bootstrap: engine checks pair few prompts (13 at T > 0),
    where a percentile bootstrap covers 78–93% for a nominal 95% and this interval 93–97.5% (a simulation of replayed
    against sampled decodes at 3 to 46 prompts: analyses/results/paired-interval-cpu-2026-11-28/)."""
    from scipy.stats import t as student_t

    ab = np.column_stack([num_a, den_a, num_b, den_b]).astype(np.float64)  # (n, 4)
    n = len(ab)
    r_a, r_b = _ratio(ab[:, 0].sum(), ab[:, 1].sum()), _ratio(ab[:, 2].sum(), ab[:, 3].sum())
    point = float(r_a - r_b)
    if n < 2:
        return Estimate(point, float("nan"), float("nan"))
    z = (ab[:, 0] - r_a * ab[:, 1]) / ab[:, 1].mean() - (ab[:, 2] - r_b * ab[:, 3]) / ab[:, 3].mean()
    half = float(student_t.ppf((1 + CI_LEVEL) / 2, n - 1) * z.std(ddof=1) / np.sqrt(n))
    return Estimate(point, point - half, point + half)


def sums_by_prompt(prompt: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Rows (decodes) summed per prompt: (the prompt indices in order, the row where each first appears, each column's
    per-prompt sums, float64, of the column's shape past its first axis). A bootstrap over prompts resamples these:
    a prompt's decodes share its text, so they are not independent draws."""
    keys, first, inverse = np.unique(np.asarray(prompt).astype(np.int64), return_index=True, return_inverse=True)
    sums = []
    for column in columns:
        column = np.asarray(column, dtype=np.float64)
        total = np.zeros((len(keys), *column.shape[1:]))
        np.add.at(total, inverse, column)
        sums.append(total)
    return keys, first, sums


def paired_by_prompt(a: tuple[np.ndarray, np.ndarray, np.ndarray],
                     b: tuple[np.ndarray, np.ndarray, np.ndarray]) -> Estimate | None:
    """`ratio_difference` of two runs over the same prompts: a and b are (prompt index, numerator, denominator) per
    decode, several decodes of a prompt summed (`sums_by_prompt`). Only prompts both ran pair; None where none does."""
    def per_prompt(run):
        keys, _, (num, den) = sums_by_prompt(*run)
        return dict(zip(keys.tolist(), np.column_stack([num, den])))

    sa, sb = per_prompt(a), per_prompt(b)
    both = sorted(sa.keys() & sb.keys())
    if not both:
        return None
    ra, rb = np.array([sa[i] for i in both]), np.array([sb[i] for i in both])
    return ratio_difference(ra[:, 0], ra[:, 1], rb[:, 0], rb[:, 1])


def groups(categories: np.ndarray, by_category: bool) -> list[tuple[str, np.ndarray]]:
    """(label, trajectory indices): "all" first, then each category in sorted order."""
    out = [(ALL, np.arange(len(categories)))]
    if by_category:
        cats = sorted({str(c) for c in categories})
        if len(cats) > 1 or (cats and cats[0] != ALL):
            out += [(c, np.flatnonzero(categories == c)) for c in cats]
    return out


def _metrics(sums: np.ndarray) -> np.ndarray:
    """(..., len(METRICS)) the METRICS from (..., len(_TOTALS)) sums of the _TOTALS."""
    accepted, drafted, calls, tokens, cost, plain, e_drafts, e_drafted, e_accepted = np.moveaxis(sums, -1, 0)
    return np.stack([_ratio(accepted, drafted), accepted / calls, tokens / calls, 100 * calls / tokens,
                     drafted / calls, _ratio(plain, cost), _ratio(tokens, cost), 1 + _ratio(e_accepted, e_drafts),
                     _ratio(e_accepted, e_drafted)], axis=-1)


_COST, _PLAIN = _TOTALS.index("cost"), _TOTALS.index("plain")


def _covers(stats: TrajectoryStats) -> str:
    """What a row's speedup interval accounts for."""
    if stats.cost_replicas is None:
        return "prompts"
    return f"prompts and cost-profile rounds ({stats.cost_replicas.shape[0]} replicas)"


def _total(stats: TrajectoryStats, name: str) -> np.ndarray:
    if name.startswith("engine_"):
        value = None if stats.engine is None else getattr(stats.engine, name.removeprefix("engine_"))
    else:
        value = getattr(stats, name)
    return np.full(stats.tokens.shape, np.nan) if value is None else value


def vllm_counters(stats: TrajectoryStats, idx: np.ndarray) -> dict:
    """vLLM's spec-decode counters over trajectories `idx` (exact integers where the walk is deterministic,
    expectations otherwise), and what they are: "exact", "expected" or the note saying what they miss."""
    e = stats.engine
    if e is None:
        return {**dict.fromkeys(VLLM_COUNTERS), "vllm_counts": None}
    per_pos = e.reach[idx].sum(axis=0)
    exact = stats.exact and np.allclose(per_pos, np.round(per_pos))
    as_count = (lambda x: int(round(float(x)))) if exact else float  # noqa: E731
    return {"vllm_num_drafts": as_count(e.drafts[idx].sum()), "vllm_num_draft_tokens": as_count(e.drafted[idx].sum()),
            "vllm_num_accepted_tokens": as_count(per_pos.sum()),
            "vllm_num_accepted_tokens_per_pos": [as_count(x) for x in per_pos],
            "vllm_counts": e.note or ("exact" if exact else "expected (exact in distribution)" if stats.exact
                                      else "expected (Monte-Carlo)")}


def summarize(stats: TrajectoryStats, features, *, by_category: bool = True, n_boot: int = 1000,
              seed: int = 0) -> list[dict]:
    """One dict of metrics per group ("all", then categories)."""
    return summarize_many([stats], features, by_category=by_category, n_boot=n_boot, seed=seed)[0]


def summarize_many(stats_list: Sequence[TrajectoryStats], features, *, by_category: bool = True,
                   n_boot: int = 1000, seed: int = 0) -> list[list[dict]]:
    """`summarize` for several configurations on the same trajectories (one list of rows each).

    Every configuration of a group is resampled by the same bootstrap counts in one
    matrix product (B, n) @ (n, 5·C), so a sweep pays one product per group, not one
    per configuration; the numbers are those of `summarize` called one at a time.
    """
    C = len(stats_list)
    rows: list[list[dict]] = [[] for _ in range(C)]
    if not C:
        return rows
    K, M = len(_TOTALS), len(METRICS)
    totals = np.stack([np.column_stack([_total(s, name) for name in _TOTALS]) for s in stats_list],
                      axis=1).astype(np.float64)  # (n_traj, C, K)
    for label, idx in groups(features.traj_category, by_category):
        part = totals[idx]  # (n, C, K)
        sums = part.sum(axis=0)  # (C, K)
        with np.errstate(invalid="ignore", divide="ignore"):
            point = _metrics(sums)  # (C, M)
        lo = hi = np.full_like(point, np.nan)
        n = part.shape[0]
        if n >= 2 and n_boot >= 1:
            W = bootstrap_counts(n, int(n_boot), int(seed))  # (B, n)
            boot = (W @ part.reshape(n, C * K)).reshape(-1, C, K)  # (B, C, K) every resample's sums
            for c, stats in enumerate(stats_list):  # speed: resample b priced by profile replica b mod R
                if stats.cost_replicas is not None:
                    pick = np.arange(W.shape[0]) % stats.cost_replicas.shape[0]
                    boot[:, c, _COST] = (W * stats.cost_replicas[:, idx][pick]).sum(axis=1)
                    boot[:, c, _PLAIN] = (W * stats.plain_replicas[:, idx][pick]).sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                lo, hi = (x.reshape(C, M) for x in _interval(_metrics(boot).reshape(-1, C * M), n))
        n_prompts = int(len(np.unique(features.traj_prompt[idx])))
        for c, stats in enumerate(stats_list):
            accepted, drafted, calls, tokens, cost, plain = sums[c][:6]
            row = {"category": label, "n_prompts": n_prompts, "n_positions": int(tokens)}
            for k, name in enumerate(METRICS):
                if stats.engine is None and name.startswith("vllm_"):  # no counters (adaptive rules): null, not NaN
                    row[name] = row[name + "_lo"] = row[name + "_hi"] = None
                    continue
                row[name], row[name + "_lo"], row[name + "_hi"] = float(point[c, k]), float(lo[c, k]), float(hi[c, k])
            row["depth_accept"] = (stats.reach[idx].sum(axis=0) / calls).tolist()  # P(A >= d) per call, d = 1..D
            row["call_cost"] = float(cost / calls)
            row["speedup_ci_covers"] = _covers(stats)
            if stats.exact or stats.se_accepted is None:
                row["mc_se_accept_rate"] = row["mc_se_tokens_per_call"] = None
            else:
                se = float(np.sqrt((stats.se_accepted[idx] ** 2).sum()))  # SE of Σ accepted
                row["mc_se_accept_rate"] = se / float(drafted) if drafted > 0 else float("nan")
                row["mc_se_tokens_per_call"] = se * float(tokens) / float(calls) ** 2  # via calls = n - accepted
            row.update(vllm_counters(stats, idx))
            rows[c].append(row)
    return rows

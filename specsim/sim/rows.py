"""The rows a sweep returns: one per configuration and category, one per request, and batch rows.

A row is a configuration's description (tree, draft, policy, temperature, what its numbers
rest on: storage, cost basis, fit, samples) joined with `specsim.sim.metrics`' summary of
its per-trajectory totals (ratio-of-sums metrics with bootstrap CIs over prompts). Request
rows carry each trajectory's totals and its histogram of accepted lengths, as serving
engines export per request. numpy + polars only.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from specsim.cache.reader import CacheReader
from specsim.errors import SpecError
from specsim.sim.engine import TrajectoryStats
from specsim.sim.features import Features, FeatureSource
from specsim.sim.metrics import ALL, summarize_many
from specsim.sim.pricing import Pricing
from specsim.specs import PolicySpec, check_batch
from specsim.expansion import DynamicTree
from specsim.trees import Tree


def skip_line(features: Features, policy: PolicySpec, spec: str, exc: Exception) -> str:
    return (f"skipped {spec} x {features.draft} x {policy.label} at T={features.temperature:g}: {exc}")


def _samples_used(source: FeatureSource, tree: Tree | DynamicTree, policy: PolicySpec) -> int:
    """Monte-Carlo samples per position behind an estimate: block verification's chains drawn from q (`cache
    --expand-target`); for swor, the recording's own where it recorded π for the tree's fan-out
    (`multidraft.candidate_acceptance` reads those, not --samples), else `policy.samples`."""
    recorded = getattr(source, "recorded_stats", None)
    if policy.kind.name == "block" and getattr(recorded, "expand_target", None) is not None:
        return int(recorded.expand_target[1])  # the chains drawn from q per position
    fan_out = int(tree.n_children.max()) if tree.budget and isinstance(tree, Tree) else 0
    if recorded is not None and not source.model_free and fan_out <= getattr(recorded, "candidates", 0):
        return int(recorded.swor_samples)
    return policy.samples


def row_head(source: FeatureSource, tree: Tree | DynamicTree, policy: PolicySpec, pricing: Pricing, reader: CacheReader,
             stats: TrajectoryStats, *, fit: str | None, n_boot: int, seed: int) -> dict:
    """The row's description columns of one configuration."""
    storage = reader.spec.storage
    if isinstance(tree, DynamicTree):  # exact on the recorded expansion, a point-mass draft
        approximate, sampling_tree = not policy.lossless, False
    else:
        greedy_exact_tail = policy.kind.ranked and (not tree.budget or int(tree.ranks.max()) < reader.spec.top_k)
        approximate = (not policy.lossless) or (not source.exact_tail and not source.model_free and not greedy_exact_tail)
        sampling_tree = not policy.kind.ranked and tree.budget and int(tree.n_children.max()) > 1
    config = {
        "tree": tree.name, "budget": tree.budget, "depth": tree.max_depth, "draft": source.draft,
        "target": source.models["target"], "policy": policy.label, "temperature": source.temperature,
        "multi_draft": policy.multi_draft if sampling_tree else None, "batch": 1, "batching": None,
        "estimate": "exact" if stats.exact else "monte-carlo",
    }
    tail = {
        "lossless": policy.lossless, "storage": storage + (f":{reader.spec.top_k}" if storage == "topk" else ""),
        "approximate": bool(approximate), "cost_basis": pricing.basis,
        "cost_extrapolated": pricing.extrapolated(source, tree), "fit": fit,
        "context": round(source.mean_context(), 1),
        "cache": str(reader.path), "n_boot": n_boot, "seed": seed,
        "samples": _samples_used(source, tree, policy) if not stats.exact else None,
        **dict(stats.extra or {}),
    }
    return {"config": config, "tail": tail}


def config_rows(runs: list[tuple[dict, TrajectoryStats]], features: Features, *, by_category: bool, n_boot: int,
                seed: int) -> list[dict]:
    """Rows of several configurations on the same trajectories: one bootstrap product per group."""
    summaries = summarize_many([stats for _, stats in runs], features, by_category=by_category, n_boot=n_boot,
                               seed=seed)
    return [{**head["config"], **row, **head["tail"]} for (head, _), rows in zip(runs, summaries) for row in rows]


def request_rows(runs: list[tuple[dict, TrajectoryStats]], features: Features) -> list[pl.DataFrame]:
    """One row per configuration and trajectory: its totals and the expected histogram of accepted lengths
    (calls accepting 0, 1, ..., D drafts), as serving engines export per request. Built column-wise."""
    out = []
    for head, stats in runs:
        cfg = head["config"]
        reach = stats.reach  # (n_traj, D): expected calls with A >= d
        hist = np.concatenate([(stats.calls - (reach[:, 0] if reach.shape[1] else 0))[:, None],
                               reach[:, :-1] - reach[:, 1:], reach[:, -1:]], axis=1) if reach.shape[1] else \
            stats.calls[:, None]
        n = features.n_traj
        e = stats.engine
        none = np.full(n, np.nan)
        out.append(pl.DataFrame({
            **{k: pl.Series(k, [cfg[k]] * n, dtype=pl.String) for k in ("tree", "draft", "policy")},
            "temperature": np.full(n, float(cfg["temperature"])),
            "multi_draft": pl.Series("multi_draft", [cfg["multi_draft"]] * n, dtype=pl.String),
            "prompt_index": features.traj_prompt.astype(np.int64),
            "category": pl.Series("category", features.traj_category.astype(str), dtype=pl.String),
            "tokens": stats.tokens.astype(np.float64), "target_calls": stats.calls.astype(np.float64),
            "accepted": stats.accepted.astype(np.float64), "drafted": stats.drafted.astype(np.float64),
            "tokens_per_call": (stats.tokens / stats.calls).astype(np.float64),
            "accepted_length_histogram": pl.Series("h", np.ascontiguousarray(hist, dtype=np.float64)).cast(
                pl.List(pl.Float64)),
            "estimate": pl.Series("estimate", [cfg["estimate"]] * n, dtype=pl.String),
            "vllm_num_drafts": none if e is None else e.drafts.astype(np.float64),
            "vllm_num_draft_tokens": none if e is None else e.drafted.astype(np.float64),
            "vllm_num_accepted_tokens": none if e is None else e.accepted.astype(np.float64),
        }))
    return out


MAX_BOOT = 100_000  # bootstrap resamples allowed: each is a row of a (resamples x prompts) matrix


BATCH_BOOT = 200  # bootstrap replicates of a batch timeline (each replays the whole schedule)


def batch_rows(rows_b1: list[dict], tables: list, features: Features, pricing: Pricing, batch: int, batching: str,
               *, n_boot: int, seed: int, skipped: list[str], policy: PolicySpec) -> list[dict]:
    """One 'all' row per configuration at batch size `batch`: the B=1 row with the batch timeline's speed columns."""
    from specsim.sim.batch import simulate_batch

    out = []
    alls = [r for r in rows_b1 if r["category"] == ALL]
    for row, (tree, table) in zip(alls, tables):
        if table is None:
            skipped.append(skip_line(features, policy, tree.name, SpecError(
                "adaptive rules are replayed at batch 1 only (their γ differs per request)")))
            continue
        try:
            check_batch(features.draft, batch)  # a draft the live engine decodes one request at a time is not
            #                                     replayed in batches either: its history would not be the cache's
            est = simulate_batch(table, features, tree, pricing.model, pricing.draft_key, batch=batch,
                                 batching=batching, n_boot=min(n_boot, BATCH_BOOT), seed=seed)
        except SpecError as exc:
            skipped.append(skip_line(features, policy, f"{tree.name} at batch {batch}", exc))
            continue
        fit = row.get("fit")
        out.append({
            **row, "batch": batch, "batching": batching,
            "fit": fit and "in-sample: the batch timeline decodes with the tree fitted on all prompts",
            "speedup": est.speedup[0], "speedup_lo": est.speedup[1], "speedup_hi": est.speedup[2],
            "tokens_per_s": est.tokens_per_s[0], "tokens_per_s_lo": est.tokens_per_s[1],
            "tokens_per_s_hi": est.tokens_per_s[2],
            "plain_tokens_per_s": est.plain_tokens_per_s[0],
            "latency_per_token_ms": est.latency_per_token_ms,
            "plain_latency_per_token_ms": est.plain_latency_per_token_ms,
            "mean_batch": est.mean_batch, "mc_se_speedup": est.mc_se_speedup,
            "speedup_ci_covers": est.covers,
            "cost_extrapolated": pricing.extrapolated(features, tree, batch),
            "n_boot": min(n_boot, BATCH_BOOT),
            "estimate": row["estimate"] if est.exact else "monte-carlo",
        })
    return out


def finish_columns(df: pl.DataFrame, cost_model) -> pl.DataFrame:
    """Name the speed columns after their basis: measured `speedup`, `speedup_assumed`, or none at all."""
    speed = [c for c in df.columns if c.startswith(("speedup", "tokens_per_s", "plain_tokens_per_s", "latency",
                                                    "plain_latency", "mc_se_speedup", "mean_batch"))]
    if cost_model is None:
        return df.drop(speed + ["call_cost", "cost_extrapolated"])
    if "cost_basis" in df.columns:  # configurations the model could not price (unpriced="keep"): no speed
        unpriced = pl.col("cost_basis").str.starts_with("none")
        df = df.with_columns([pl.when(unpriced).then(None).otherwise(pl.col(c)).alias(c)
                              for c in speed + ["call_cost", "cost_extrapolated"] if c in df.columns])
    if not cost_model.measured:
        keep = {"speedup": "speedup_assumed", "speedup_lo": "speedup_assumed_lo", "speedup_hi": "speedup_assumed_hi"}
        return df.drop([c for c in speed if c not in keep]).rename({**keep, "call_cost": "call_cost_assumed"})
    if "plain_tokens_per_s" not in df.columns:  # batch-1 rows: plain rate from the same walk
        df = df.with_columns((pl.col("tokens_per_s") * pl.col("speedup").pow(-1)).alias("plain_tokens_per_s"))
    else:
        df = df.with_columns(pl.coalesce("plain_tokens_per_s", pl.col("tokens_per_s") / pl.col("speedup"))
                             .alias("plain_tokens_per_s"))
    return df.with_columns((1000 * pl.col("call_cost")).alias("call_ms")).drop("call_cost")

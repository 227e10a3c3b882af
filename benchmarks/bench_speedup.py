"""Predicted vs live speedup: measure a profile, record a cache, decode live, compare (one command).

    python -m benchmarks.bench_speedup                     # packaged SmolLM2-135M on CPU, ~10 minutes
    python -m benchmarks.bench_speedup --device cuda --batches 1,4,16 --out results.csv

In one run on this machine: (1) record a small cache with the target and the drafts,
(2) `specsim profile` the same models at the cache's contexts and the batch sizes,
(3) for every draft x tree x batch size, decode the cache's prompts live (speculatively,
and plainly with the same batching: the baseline) and predict the speedup from the cache
and the profile (`specsim validate --cost-profile`). Prints predicted / live per
configuration; the goal is every ratio within 1 ± 0.10 and the predicted CI (prompts and
the profile's rounds) covering live in at least 95% of them. Also prints the greedy per-call
agreement and, since the machine may be shared, CPU time and load average.

(4) With --profile-after, the profile is measured again once live decoding is done and every
prediction is made again from it (column `after`): the two bracket how far the machine drifted
while the benchmark ran, which no interval carries (a shared 2-core CPU: two profiles two minutes
apart differed by up to 15%, `analyses/results/bench-amx-cpu-2026-11-27/`).

(5) With --profiles N (N >= 2), N profiles are measured back to back before live decoding and
every prediction is made again from all of them pooled (`--cost-profile` given N times: their
times averaged, the CI carrying the drift between them; columns `*_pooled`), beside the first
profile's alone, so one run says what pooling bought.

(6) Every configuration decodes the same plain baseline beside its speculative run, so each run measures
that one quantity once per configuration: it prints their spread per batch size and writes each row's
plain tokens/s over their median (`plain_live_vs_median`), a part of the live speedup's own error.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafts", default="int8,layers:20")
    parser.add_argument("--tree", dest="trees", action="append",
                        help="repeatable  [default: chain:2, chain:4, kary:2,2]")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--batching", default="lockstep", choices=["lockstep", "continuous"])
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--categories", default="writing,coding,math_reasoning,rag,translation,summarization")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per profile entry")
    parser.add_argument("--workdir", default=None, help="keep the cache and profile here (default: a temp dir)")
    parser.add_argument("--out", default=None, help="write every check as CSV")
    parser.add_argument("--profile-after", action="store_true",
                        help="profile again after live decoding and predict from that profile too (the drift)")
    parser.add_argument("--profiles", type=int, default=1,
                        help="profiles measured back to back before live decoding; with 2 or more, predict from "
                             "them pooled too (the drift between them in the CI)")
    args = parser.parse_args(argv)

    import numpy as np
    import polars as pl
    import torch
    import transformers

    from specsim.attention.profile import ProfileConfig, measure_cost_profile, write_profile
    from specsim.cache.layout import CacheSpec
    from specsim.cache.reader import CacheReader
    from specsim.cache.writer import CacheWriter
    from specsim.live.validate import ValidateConfig, run_validation
    from specsim.prompts import load_prompts
    from specsim.record.models import load_draft, load_model
    from specsim.record.recorder import RecordConfig, build_meta, prompt_records, record, settings
    from specsim.sim.cost import step_shape
    from specsim.specs import parse_tree

    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-speedup-"))
    work.mkdir(parents=True, exist_ok=True)
    drafts = [d for d in args.drafts.split(",") if d]
    trees = args.trees or ["chain:2", "chain:4", "kary:2,2"]
    batches = [int(b) for b in args.batches.split(",")]
    started, load0, cpu0 = time.perf_counter(), os.getloadavg(), _cpu()

    # 1. record
    cache = work / "cache.h5"
    target = load_model(args.target, device=args.device, dtype=args.dtype)
    q = [load_draft(d, target, device=args.device, dtype=args.dtype) for d in drafts]
    prompts = load_prompts("spec-bench", categories=args.categories.split(","), per_category=args.per_category)
    config = RecordConfig(max_new_tokens=args.max_new_tokens, temperatures=(0.0,), seed=0)
    prompt_spec = {"spec": "spec-bench", "source": prompts.source, "categories": args.categories.split(","),
                   "per_category": args.per_category, "sha256": prompts.fingerprint()}
    run_settings = settings(target=target.name, drafts=drafts, prompt_spec=prompt_spec, config=config,
                            dtype=args.dtype, storage="full", top_k=0)
    meta = build_meta(target, q, prompt_spec, run_settings, device=args.device, batch_size=1)
    spec = CacheSpec(vocab_size=target.vocab_size, drafts=tuple(drafts), temperatures=(0.0,), meta=meta)
    with CacheWriter.create(cache, spec, prompt_records(prompts.prompts, target.tokenizer), overwrite=True) as w:
        stats = record(w, target, q, config, progress=False)
    with CacheReader(cache) as reader:
        lens = [len(reader.prompt_token_ids(i)) for i in range(len(reader.prompts))]
    lo, hi = min(lens), max(lens) + args.max_new_tokens
    print(f"recorded {stats.positions} positions ({len(lens)} prompts, contexts {lo}-{hi}) in {stats.seconds:.0f} s")

    # 2. profile at the cache's contexts, every N and w the trees need
    shapes = [step_shape(parse_tree(t)) for t in trees]
    contexts = tuple(sorted({max(8, lo // 16 * 16), (lo + hi) // 2 // 16 * 16, (hi + 15) // 16 * 16}))
    pconfig = ProfileConfig(batches=tuple(sorted(set(batches) | {1})), contexts=contexts,
                            max_tokens=max(2, max(s.verify_tokens for s in shapes)),
                            draft_widths=tuple(range(1, max(2, max(max(s.draft_levels) for s in shapes)) + 1)),
                            repeats=args.repeats, warmup=2)
    if args.profiles < 1:
        parser.error("--profiles: give 1 or more")
    profiles = []
    for k in range(args.profiles):
        t0 = time.perf_counter()
        profiles.append(write_profile(measure_cost_profile(target, q, config=pconfig, progress=False),
                                      work / ("profile.json" if k == 0 else f"profile-{k + 1}.json"), overwrite=True))
        print(f"profiled batches {pconfig.batches}, contexts {contexts}, N <= {pconfig.max_tokens} in "
              f"{time.perf_counter() - t0:.0f} s ({profiles[-1].name})")
    profile = profiles[0]
    del target, q

    # 3. live vs predicted, printed (and written) batch size by batch size
    checks = []
    print(f"\n{'draft':<10} {'tree':<9} {'B':>2} {'tok/call':>8} {'predicted [95% CI]':>24} {'live':>6} "
          f"{'ratio':>6} {'tok/s pred':>10} {'tok/s live':>10} {'greedy':>7}", flush=True)
    for batch in batches:
        report = run_validation(cache, ValidateConfig(trees=tuple(trees), drafts=tuple(drafts), batch=batch,
                                                      batching=args.batching, cost_profile=str(profile)),
                                device=args.device, threads=args.threads)
        greedy = {(c.draft, c.tree): c for c in report.checks if c.kind == "greedy calls"}
        for c in report.checks:
            if c.kind == "speedup":
                g = greedy[(c.draft, c.tree)]
                checks.append({"draft": c.draft, "tree": c.tree, "batch": batch, **c.values,
                               "greedy_agreement": g.values["agreement"], "device": report.device})
                r = checks[-1]
                ci = f"{r['speedup_predicted']:.3f} [{r['speedup_predicted_lo']:.2f}, {r['speedup_predicted_hi']:.2f}]"
                print(f"{r['draft']:<10} {r['tree']:<9} {r['batch']:>2} {r['tokens_per_call_live']:8.2f} {ci:>24} "
                      f"{r['speedup_live']:6.3f} {r['ratio']:6.3f} {r['tokens_per_s_predicted']:10.1f} "
                      f"{r['tokens_per_s_live']:10.1f} {r['greedy_agreement']:7.1%}", flush=True)
        if args.out:  # what is measured so far survives an interrupted run
            pl.DataFrame(checks).write_csv(args.out)
    table = pl.DataFrame(checks)
    if len(profiles) > 1:
        table = _predicted_pooled(table, cache, profiles, trees, drafts, batches, args)
    if args.profile_after:
        table = _predicted_after(table, cache, pconfig, work, trees, drafts, batches, args)
    table = plain_spread(table)
    worst = float(np.abs(table["ratio"].to_numpy() - 1).max())
    within = int((np.abs(table["ratio"].to_numpy() - 1) <= 0.10).sum())
    covered = int(((table["speedup_predicted_lo"] <= table["speedup_live"])
                   & (table["speedup_live"] <= table["speedup_predicted_hi"])).sum())
    print(f"\npredicted / live within 1 ± 0.10: {within} of {table.height}; worst |ratio - 1| = {worst:.3f}; "
          f"predicted 95% CI covers live: {covered} of {table.height}")
    print(f"on {checks[0]['device']}; wall {time.perf_counter() - started:.0f} s, CPU {_cpu() - cpu0:.0f} s; load "
          f"average {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}; cache and profile in {work}")
    if args.out:
        table.write_csv(args.out)
        print(f"wrote {args.out}")


def _with_predictions(table, cache, cost_profile, name: str, trees, drafts, batches, args, *, interval: bool):
    """`table` with `speedup_predicted_{name}` (and its `_lo`, `_hi` when `interval`) and `ratio_{name}`: every
    configuration predicted again at T = 0 from `cost_profile` (a path or a loaded profile)."""
    import polars as pl

    import specsim

    rows = specsim.simulate(cache, trees=trees, drafts=drafts, batches=batches, batching=args.batching,
                            cost_profile=cost_profile, by_category=False)
    col = f"speedup_predicted_{name}"
    bounds = [pl.col(f"speedup_{b}").alias(f"{col}_{b}") for b in ("lo", "hi")] if interval else []
    rows = rows.filter(pl.col("temperature") == 0).select("draft", "tree", "batch", pl.col("speedup").alias(col),
                                                          *bounds)
    return (table.join(rows, on=["draft", "tree", "batch"], how="left")
            .with_columns((pl.col(col) / pl.col("speedup_live")).alias(f"ratio_{name}")))


def _predicted_after(table, cache, pconfig, work: Path, trees, drafts, batches, args):
    """`table` with `speedup_predicted_after` and `ratio_after`: the predictions again from a profile measured now,
    after live decoding, with the same settings; prints how far the two profiles' predictions differ."""
    from specsim.attention.profile import measure_cost_profile, write_profile
    from specsim.record.models import load_draft, load_model

    target = load_model(args.target, device=args.device, dtype=args.dtype)
    q = [load_draft(d, target, device=args.device, dtype=args.dtype) for d in drafts]
    after = write_profile(measure_cost_profile(target, q, config=pconfig, progress=False),
                          work / "profile-after.json", overwrite=True)
    del target, q
    table = _with_predictions(table, cache, str(after), "after", trees, drafts, batches, args, interval=False)
    moved = (table["speedup_predicted_after"] / table["speedup_predicted"] - 1).abs()
    within = int(((table["ratio_after"] - 1).abs() <= 0.10).sum())
    print(f"\nprofiled again after live decoding: its predictions differ from the first profile's by "
          f"{moved.median():.1%} (median), {moved.max():.1%} (most); predicted / live within 1 ± 0.10 from it: "
          f"{within} of {table.height}")
    for r in table.iter_rows(named=True):
        print(f"{r['draft']:<10} {r['tree']:<9} {r['batch']:>2} predicted {r['speedup_predicted']:.3f} before, "
              f"{r['speedup_predicted_after']:.3f} after; live {r['speedup_live']:.3f}")
    return table


def _predicted_pooled(table, cache, profiles, trees, drafts, batches, args):
    """`table` with `speedup_predicted_pooled` (and `_lo`, `_hi`) and `ratio_pooled`: the predictions from all the
    profiles measured before live decoding, pooled (`specsim.sim.cost.pool_profiles`); prints how they did beside
    the first profile's alone."""
    from specsim.sim.cost import load_cost_profiles

    table = _with_predictions(table, cache, load_cost_profiles(profiles), "pooled", trees, drafts, batches, args,
                              interval=True)
    live = table["speedup_live"]
    for name, col in (("the first profile", "speedup_predicted"), (f"{len(profiles)} profiles pooled",
                                                                    "speedup_predicted_pooled")):
        within = int(((table[col] / live - 1).abs() <= 0.10).sum())
        covered = int(((table[f"{col}_lo"] <= live) & (live <= table[f"{col}_hi"])).sum())
        print(f"from {name}: within 1 ± 0.10 {within} of {table.height}, CI covers live {covered} of {table.height}, "
              f"median CI width {((table[f'{col}_hi'] - table[f'{col}_lo']) / table[col]).median():.1%} of the "
              "prediction")
    for r in table.iter_rows(named=True):
        print(f"{r['draft']:<10} {r['tree']:<9} {r['batch']:>2} predicted {r['speedup_predicted']:.3f} from the first, "
              f"{r['speedup_predicted_pooled']:.3f} [{r['speedup_predicted_pooled_lo']:.3f}, "
              f"{r['speedup_predicted_pooled_hi']:.3f}] pooled; live {r['speedup_live']:.3f}")
    return table


def plain_spread(table):
    """`table` with `plain_live_vs_median`: each row's live plain tokens/s over the median of the run's plain
    measurements at its batch size. Every configuration decodes the same plain baseline beside its own
    speculative run, so a run measures that one quantity once per configuration: their spread, printed per batch
    size, is part of a live speedup's own error, measured in the run itself (a ratio's miss of 1 +- 0.10 is
    read beside it; analyses/results/live-floor-cpu-2026-11-29/)."""
    import polars as pl

    median = pl.col("plain_tokens_per_s_live").median().over("batch")
    table = table.with_columns((pl.col("plain_tokens_per_s_live") / median).alias("plain_live_vs_median"))
    for (batch,), part in table.group_by(["batch"], maintain_order=True):
        plain = part["plain_tokens_per_s_live"]
        far = part.filter((pl.col("plain_live_vs_median") - 1).abs() > 0.05)
        print(f"plain decoding at B = {batch}, the same requests measured live {part.height} times in this run: "
              f"{plain.min():.1f}-{plain.max():.1f} tok/s (max/min {plain.max() / plain.min():.3f})"
              + ("; more than 5% from their median beside: "
                 + ", ".join(f"{d} {t} ({v:.3f})" for d, t, v in far.select("draft", "tree", "plain_live_vs_median")
                             .iter_rows()) if far.height else ""))
    return table


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()

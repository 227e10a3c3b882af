"""Predicted vs vLLM's own speedup: record, profile vLLM's steps, time vLLM, compare (one command).

    python -m benchmarks.bench_vllm                # packaged SmolLM2-135M, vLLM's CPU build (make vllm), ~35 min
    python -m benchmarks.bench_vllm --batches 1,4,16 --trees chain:3,chain:5 --out vllm-speed.csv   # on a GPU box

In one run on this machine: (1) record a small stats-only cache with the target and the model drafts
(`specsim cache --store stats`, with the positions past each end that vLLM counts); (2) `specsim profile
--engine vllm --for CACHE`: vLLM's own plain, fixed-length and draft-model steps at the cache's contexts and
the batch sizes, every call kept; (3) for every draft x tree x batch size, `specsim validate --engine vllm
--rounds R --cost-profile`: vLLM decodes the cache's prompts speculatively and plainly, alternating, R timed
rounds after a warm-up, in one program; its speedup (plain decode time over speculative) stands beside the
one specsim predicts from the replay priced with vLLM's step costs, whose CI resamples the prompts and the
profile's calls. At T = 0 vLLM's outputs and spec-decode counters are checked against the replay too.

Prints predicted / vLLM per configuration, how many are within 1 ± 0.10 and ± 0.15 (validate's tolerance for
vLLM), how many CIs cover vLLM's value, the CPU, CPU time and load.
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
    parser.add_argument("--drafts", default="vllm-ngram:min=2,max=3,layers:20", help="comma-separated, as the CLI's")
    parser.add_argument("--trees", default="chain:3", help="comma-separated chains, e.g. chain:2,chain:4")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--categories", default="writing,coding,math_reasoning,rag,translation,summarization")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds of vLLM per configuration")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per profile entry")
    parser.add_argument("--device", default="cpu", help="where specsim records (vLLM runs where it is built for)")
    parser.add_argument("--workdir", default=None, help="keep the cache, profile and vLLM's logs here")
    parser.add_argument("--out", default=None, help="write every configuration's check as CSV")
    args = parser.parse_args(argv)

    import polars as pl
    import torch

    from benchmarks.bench_speedup import _cpu
    from specsim.attention.bench import device_label
    from specsim.attention.profile import write_profile
    from specsim.cli._common import _split
    from specsim.engines.check import EngineValidateConfig, validate_with_vllm
    from specsim.engines.vllm_profile import measure_vllm_profile
    from specsim.record.run import RecordRequest, record_cache
    from specsim.sim.cost import batch_grid
    from specsim.specs import is_model_free, parse_tree

    drafts = _split(args.drafts)
    trees = _split(args.trees, specs=True)
    batches = [int(b) for b in args.batches.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    started, load0, cpu0 = time.perf_counter(), os.getloadavg(), _cpu()
    print(f"{device_label(torch.device('cpu'))}; work in {work}", flush=True)

    # 1. record
    cache = work / "cache.h5"
    model_drafts = tuple(d for d in drafts if not is_model_free(d))
    outcome = record_cache(cache, RecordRequest(target=args.target, drafts=model_drafts,
                                                categories=tuple(args.categories.split(",")),
                                                per_category=args.per_category, max_new_tokens=args.max_new_tokens,
                                                device=args.device, store="stats"), progress=False, overwrite=True)
    print(f"recorded {outcome.positions} positions ({outcome.total} prompts) in {outcome.seconds:.0f} s", flush=True)

    # 2. vLLM's step costs for those contexts, batch sizes and chain lengths
    t0 = time.perf_counter()
    longest = max(parse_tree(t).max_depth for t in trees)
    profile = write_profile(measure_vllm_profile(cache, model_drafts, batches=batches, max_tokens=longest + 1,
                                                 repeats=args.repeats, log=work / "vllm-profile.log",
                                                 progress=True), work / "vllm-profile.json", overwrite=True)
    print(f"profiled vLLM's steps (batches {batch_grid(batches)}, N <= {longest + 1}) in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)

    # 3. vLLM's speedup beside the prediction, batch size by batch size
    rows = []
    print(f"\n{'draft':<24} {'tree':<8} {'B':>2} {'predicted [95% CI]':>24} {'vLLM [rounds]':>22} {'ratio':>6} "
          f"{'counters':>8}", flush=True)
    for batch in batches:
        report = validate_with_vllm(cache, EngineValidateConfig(
            trees=tuple(trees), drafts=tuple(drafts), batch=batch, rounds=args.rounds, cost_profile=str(profile),
            log_dir=str(work / "logs")), progress=True)
        counters = {(c.draft, c.tree): c.passed for c in report.checks if c.kind == "counters"}
        for c in report.checks:
            if c.kind != "speedup":
                continue
            v = c.values
            spread = f"{v['vllm_speedup_min']:.3f}-{v['vllm_speedup_max']:.3f}"
            rows.append({"draft": c.draft, "tree": c.tree, "batch": batch, **v,
                         "ratio": v["speedup_predicted"] / v["vllm_speedup"], "vllm_rounds": spread,
                         "counters_equal": counters.get((c.draft, c.tree))})
            r = rows[-1]
            ci = (f"{r['speedup_predicted']:.3f} [{r['speedup_predicted_lo']:.3f}, "
                  f"{r['speedup_predicted_hi']:.3f}]")
            print(f"{r['draft']:<24} {r['tree']:<8} {batch:>2} {ci:>24} {r['vllm_speedup']:>7.3f} [{spread}] "
                  f"{r['ratio']:6.3f} {str(r['counters_equal']):>8}", flush=True)
        if args.out:  # what is measured so far survives an interrupted run
            pl.DataFrame(rows).write_csv(args.out)
    table = pl.DataFrame(rows)
    off = (table["ratio"] - 1).abs()
    covered = int(((table["speedup_predicted_lo"] <= table["vllm_speedup"])
                   & (table["vllm_speedup"] <= table["speedup_predicted_hi"])).sum())
    print(f"\npredicted / vLLM within 1 ± 0.10: {int((off <= 0.10).sum())} of {table.height}, within 1 ± 0.15: "
          f"{int((off <= 0.15).sum())}; worst |ratio - 1| = {off.max():.3f}; predicted 95% CI covers vLLM: "
          f"{covered} of {table.height}; counters equal at T = 0: {int(table['counters_equal'].sum())} of "
          f"{table.height}")
    print(f"wall {time.perf_counter() - started:.0f} s, CPU of this process {_cpu() - cpu0:.0f} s (vLLM's programs: "
          f"{_children_cpu():.0f} s); load average {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    if args.out:
        table.write_csv(args.out)
        print(f"wrote {args.out}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()

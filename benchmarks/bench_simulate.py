"""Simulator throughput: a 100-configuration sweep over ~100k cached positions.

    python -m benchmarks.bench_simulate [--prompts 400] [--length 250] [--vocab 32]

Builds a synthetic cache (random target logits, two noisy-copy drafts, T=0 and
T=1; small V so it builds in seconds), derives the features once (timed apart),
then times `specsim.simulate` on trees × budgets × drafts × policies = 100
configurations. The baseline, measured in the same run, is a plain Python loop
decoding greedy chains position by position (what one would write first); the
ratios say how much the vectorised walk buys. Goal: 100 configurations ≤ 10 s
on a 2-core machine once features exist. Wall and CPU seconds are both printed,
with the machine's load average: on a shared machine the wall time alone
says little.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

TREES = ["chain", "kary:2", "kary:3", "kary:4", "optimal"]
BUDGETS = [1, 2, 4, 8, 16]
POLICIES = ["greedy", "sample"]
DRAFTS = ["good", "poor"]


def python_loop_greedy_chain(rank: np.ndarray, lens: np.ndarray, gamma: int) -> float:
    """Baseline: decode each trajectory call by call in Python; returns tokens per call."""
    calls = 0
    start = 0
    for n in lens.tolist():
        t = 0
        while t < n:
            a = 0
            while a < min(gamma, n - 1 - t) and rank[start + t + a] == 0:
                a += 1
            calls += 1
            t += a + 1
        start += n
    return float(lens.sum()) / calls


def main(argv: list[str]) -> None:
    from tests.synthetic import random_cache

    import specsim
    from specsim.sim.features import load_features

    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_simulate")
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--length", type=int, default=330)  # lengths uniform in [length/2, length]: ~100k positions
    ap.add_argument("--vocab", type=int, default=32)
    ap.add_argument("--n-boot", type=int, default=1000)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "bench.h5"
        t0 = time.perf_counter()
        random_cache(cache, n_prompts=args.prompts, length=args.length, vocab=args.vocab, drafts=DRAFTS,
                     noise=0.7, categories=("code", "chat", "math", "writing"))
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        feats = {(d, T): load_features(cache, d, T, progress=False) for d in DRAFTS for T in (0.0, 1.0)}
        t_features = time.perf_counter() - t0
        n_pos = feats[DRAFTS[0], 0.0].n_positions
        print(f"cache: {args.prompts} prompts, {n_pos} positions per (draft, T), V={args.vocab}, built in "
              f"{t_build:.1f} s; features for {len(feats)} (draft, T) pairs derived in {t_features:.1f} s")

        load = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        df = specsim.simulate(cache, trees=TREES, budgets=BUDGETS, drafts=DRAFTS, policies=POLICIES,
                              n_boot=args.n_boot)
        t_sweep, c_sweep = time.perf_counter() - t0, time.process_time() - c0
        n_configs = df.filter(df["category"] == "all").height
        print(f"sweep: {n_configs} configurations ({len(TREES)} trees x {len(BUDGETS)} budgets x "
              f"{len(DRAFTS)} drafts x {len(POLICIES)} policies), {df.height} rows with {args.n_boot} bootstrap "
              f"resamples: {t_sweep:.2f} s wall, {c_sweep:.2f} s CPU  ({n_configs / t_sweep:.1f} configs/s, "
              f"{n_configs * n_pos / t_sweep:,.0f} config-positions/s); goal <= 10 s for 100")
        print(f"  machine: {os.cpu_count()} CPUs, load average {load:.2f} before the sweep, "
              f"{os.getloadavg()[0]:.2f} after")

        # Same-run baseline: greedy chain:4 decoded by a Python loop vs the vectorised path.
        f = feats[DRAFTS[0], 0.0]
        t0 = time.perf_counter()
        base_tpc = python_loop_greedy_chain(f.rank, f.traj_len, 4)
        t_loop = time.perf_counter() - t0
        t0 = time.perf_counter()
        one = specsim.simulate(cache, trees=["chain:4"], drafts=[DRAFTS[0]], n_boot=0, by_category=False)
        t_vec = time.perf_counter() - t0
        # The walk computes the expectation the loop samples once (greedy: deterministic, so equal).
        assert abs(one["tokens_per_call"][0] - base_tpc) < 1e-9, (one["tokens_per_call"][0], base_tpc)
        print(f"baseline (python loop, greedy chain:4, {n_pos} positions): {t_loop * 1e3:.0f} ms, "
              f"{n_pos / t_loop:,.0f} positions/s; simulate (incl. opening the cache, features cached): "
              f"{t_vec * 1e3:.0f} ms; ratio {t_loop / t_vec:.1f}x")
        print(f"  the sweep per configuration: {t_sweep / n_configs * 1e3:.0f} ms = {t_loop * n_configs / t_sweep:.1f}x "
              "the python loop's time for one greedy chain (the sweep includes optimal:N fits, multi-draft "
              "estimators and bootstrap CIs, which the loop does not)")
        # The same configuration without the table plumbing: acceptance table + walk only.
        from specsim.sim.engine import walk
        from specsim.sim.policies import run_policy
        from specsim.specs import parse_policy
        from specsim.specs import parse_tree

        t0 = time.perf_counter()
        stats = walk(run_policy(f, parse_tree("chain:4"), parse_policy("greedy"), np.random.default_rng(0)), f, 1.0)
        t_core = time.perf_counter() - t0
        assert abs(stats.tokens.sum() / stats.calls.sum() - base_tpc) < 1e-9
        print(f"  table + walk alone: {t_core * 1e3:.0f} ms; ratio vs python loop {t_loop / t_core:.1f}x")
        # Where the sweep's time goes: closed forms (greedy trees, sampling chains) vs estimators.
        t0 = time.perf_counter()
        closed = specsim.simulate(cache, trees=["chain", "kary:2", "kary:3", "kary:4"], budgets=BUDGETS,
                                  drafts=DRAFTS, policies=["greedy"], n_boot=args.n_boot)
        closed2 = specsim.simulate(cache, trees=["chain"], budgets=BUDGETS, drafts=DRAFTS, policies=["sample"],
                                   n_boot=args.n_boot)
        t_closed = time.perf_counter() - t0
        n_closed = (closed["category"] == "all").sum() + (closed2["category"] == "all").sum()
        print(f"  closed forms only ({n_closed} configs: greedy chain/kary trees, sampling chains): "
              f"{t_closed:.2f} s = {t_closed / n_closed * 100:.1f} s per 100 configs; the rest of the sweep "
              "(optimal:N and multi-draft sampling trees) is the estimators' time")
        for (T, policy) in ((0.0, "greedy"), (1.0, "sample")):
            sub = df.filter((df["category"] == "all") & (df["policy"] == policy) & (df["draft"] == DRAFTS[0])
                            & (df["tree"] == "optimal:16"))
            if sub.height:
                r = sub.row(0, named=True)
                print(f"  e.g. optimal:16 {policy} T={T:g}: tokens/call {r['tokens_per_call']:.3f} "
                      f"[{r['tokens_per_call_lo']:.3f}, {r['tokens_per_call_hi']:.3f}]")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])

"""Replay at scale: a 100-configuration sweep over a million-position stats cache, and memory at 1k, 100k and 1M positions.

    python -m benchmarks.bench_scale                  # ~2-4 min on a 2-core CPU (builds a ~1 GB cache in /tmp)
    python -m benchmarks.bench_scale --positions 200000
    python -m benchmarks.bench_scale --workers 4      # the sweep in one process, then in 4

Builds a `--store stats` cache directly with `CacheWriter` (no model): two temperatures
(greedy and T = 0.7) of `--positions` positions each, trajectories of 256 tokens, the
header of a 151,936-token vocabulary (Qwen2.5) and synthetic statistics shaped like a
good draft's (rank 0 three times in four, β = min(1, q/p) skewed to 1, π_i decreasing in
i, swor replicates scattered around their means, lossy α and TV). Statistics are what
replay reads, so the vocabulary only changes what a recording would have cost.

Then times, in one process: reading the statistics once (features), and one sweep of
100 configurations — greedy chains, k-ary and data-optimal trees, sampling chains and
trees with i.i.d. and without-replacement candidates, three lossy rules and both
adaptive rules — reporting configuration-positions per second (goal: 10^7, i.e. 100
configurations of 1M positions in <= 10 s), in one process and then in `--workers` worker
processes (default 2; the rows are the same). The baseline in the same run is the same
sweep's closed-form greedy chains alone, per configuration. Finally the peak RSS of the
same sweep in fresh processes on caches of 1k, 100k and `--positions` positions. Bounded in
the number of positions means flat once the cache is larger than the sweep's block and fit sample
(so also at `--positions`), growing only with the per-trajectory results.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LENGTH = 256  # tokens per trajectory
VOCAB = 151_936  # Qwen2.5's vocabulary: the header's V (statistics do not grow with it)
BUDGETS = [1, 2, 4, 8, 16]
SWEEP = [  # (trees, policies, temperature, multi_draft): 100 configurations
    (["chain", "kary:2", "kary:3", "optimal"], ["greedy"], 0.0, "iid"),  # 20
    (["chain"], ["adaptive-hf", "adaptive-history"], 0.0, "iid"),  # 10
    (["chain", "kary:2", "kary:3", "optimal"], ["sample"], 0.7, "iid"),  # 20
    (["chain", "kary:2", "kary:3", "optimal"], ["sample"], 0.7, "swor"),  # 20
    (["chain"], ["adaptive-hf", "adaptive-history"], 0.7, "iid"),  # 10
    (["chain", "kary:2"], ["p>=q"], 0.7, "iid"),  # 10
    (["chain"], ["p>=lq:0.5", "typical:0.09,0.3"], 0.7, "iid"),  # 10
]


def build(path: Path, positions: int, seed: int = 0) -> int:
    """A stats-only cache of `positions` positions per temperature; returns the file size."""
    from specsim.cache.stats import StatsSpec
    from specsim.cache.layout import CacheSpec, PromptRecord
    from specsim.cache.writer import CacheWriter

    rng = np.random.default_rng(seed)
    stats_spec = StatsSpec()
    n_prompts = max(2, positions // LENGTH)
    categories = ("coding", "math", "writing", "qa")
    prompts = [PromptRecord(i, categories[i % 4], f"synthetic prompt {i}", np.arange(20 + i % 50, dtype=np.int32))
               for i in range(n_prompts)]
    meta = {"settings": {"target": "synthetic-151k", "drafts": ["draft"], "max_new_tokens": LENGTH},
            "target": {"spec": "synthetic-151k"}}
    spec = CacheSpec(vocab_size=VOCAB, drafts=("draft",), temperatures=(0.0, 0.7), storage="stats", meta=meta,
                     stats=stats_spec)
    K, G, R = stats_spec.candidates, stats_spec.swor_groups, len(stats_spec.lossy)
    with CacheWriter.create(path, spec, prompts, overwrite=True) as writer:
        for i in range(n_prompts):
            for T in (0.0, 0.7):
                n = LENGTH
                tokens = rng.integers(0, VOCAB, n)
                logp = np.log(rng.uniform(0.05, 1.0, n))
                rank = np.where(rng.random(n) < 0.75, 0, rng.geometric(0.35, n)).astype(np.int32)
                beta = np.clip(rng.beta(2.0, 0.6, n), 1e-4, 1.0)
                pi = np.zeros((n, K))
                left = 1.0 - beta
                pi[:, 0] = beta
                for j in range(1, K):
                    share = rng.uniform(0.1, 0.6, n)
                    pi[:, j] = left * share
                    left = left * (1 - share)
                groups = np.clip(pi[:, None, :] * rng.normal(1.0, 0.05, (n, G, K)), 0, 1)
                stats = {
                    "target": {"logprob": logp, "top_id": tokens.astype(np.int32)},
                    "draft": {
                        "rank": rank, "logprob": logp + np.log(beta), "overlap": beta,
                        "top_ids": rng.integers(0, VOCAB, (n, stats_spec.top_ids)).astype(np.int32),
                        "pi_iid": pi.astype(np.float32), "pi_swor": groups.mean(axis=1).astype(np.float32),
                        "pi_swor_groups": groups.astype(np.float16),
                        "lossy_alpha": rng.uniform(0.6, 1.0, (n, R)).astype(np.float32),
                        "lossy_tv": rng.uniform(0.0, 0.2, (n, R)).astype(np.float32),
                    },
                }
                if T == 0:
                    for name in ("pi_iid", "pi_swor", "pi_swor_groups", "lossy_alpha", "lossy_tv"):
                        stats["draft"][name] = np.full_like(stats["draft"][name], np.nan)
                writer.append_trajectory(prompt_index=i, temperature=T, seed=i, tokens=tokens,
                                         stop_reason="max_new_tokens", stats=stats)
    return path.stat().st_size


def sweep(cache: Path, n_boot: int, workers: int = 1) -> tuple[int, float, float]:
    """Run the 100-configuration sweep; (configurations, wall seconds, CPU seconds of this process and its
    worker processes, which are stopped at the end so their time is counted)."""
    import specsim
    from specsim.sim.replay import shutdown_pools

    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu()
    n = 0
    for trees, policies, T, multi_draft in SWEEP:
        df = specsim.simulate(cache, trees=trees, budgets=BUDGETS, policies=policies, temperatures=[T],
                              multi_draft=multi_draft, n_boot=n_boot, by_category=False, workers=workers)
        n += df.height
    wall = time.perf_counter() - t0
    shutdown_pools()
    return n, wall, time.process_time() - c0 + _children_cpu() - k0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _child(cache: str, n_boot: int) -> None:
    """Run the sweep in this (fresh) process and print its peak RSS."""
    from specsim.sim.features import load_features

    for T in (0.0, 0.7):
        load_features(cache, "draft", T, progress=False)
    n, wall, _ = sweep(Path(cache), n_boot)
    print(json.dumps({"configs": n, "seconds": wall, "peak_rss_mb": _peak_rss_mb()}))


def _greedy_adaptive(cache: Path) -> None:
    """Greedy adaptive chains: the deterministic lockstep walk against the Markov forward pass it replaced."""
    from specsim.sim.adaptive import deterministic_walk, markov_walk, next_gamma_table
    from specsim.sim.features import load_features

    features = load_features(cache, "draft", 0.0, progress=False)
    beta = features.acceptance()
    for gamma in (4, 16):
        cap = max(16, 2 * gamma)
        nxt = next_gamma_table("adaptive-hf", cap)
        cost = np.ones((features.n_positions, cap + 1))
        t0 = time.perf_counter()
        fast = deterministic_walk(beta, features, gamma, nxt, cost)
        t1 = time.perf_counter()
        slow = markov_walk(beta, features, gamma, nxt, cost)
        t2 = time.perf_counter()
        same = all(np.allclose(fast[k], slow[k]) for k in fast)
        print(f"greedy adaptive-hf from chain:{gamma}: deterministic walk {t1 - t0:.2f} s, Markov forward pass "
              f"{t2 - t1:.2f} s ({(t2 - t1) / (t1 - t0):.0f}x), totals equal: {same}")


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux carries that across fork + exec,
    so a child started by a large parent would report the parent's size."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_scale")
    ap.add_argument("--positions", type=int, default=1_000_000, help="positions per temperature")
    ap.add_argument("--n-boot", type=int, default=200, help="bootstrap resamples over prompts per row")
    ap.add_argument("--workers", type=int, default=2,
                    help="also time the sweep with this many worker processes (simulate's workers=)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.n_boot)
        return
    from specsim.sim.features import load_features

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "scale.h5"
        t0 = time.perf_counter()
        size = build(cache, args.positions)
        t_build = time.perf_counter() - t0
        print(f"stats cache: {args.positions:,} positions x 2 temperatures, header V={VOCAB:,}, "
              f"{size / 1e6:.0f} MB ({size / (2 * args.positions):.0f} bytes/position), built in {t_build:.0f} s")
        t0 = time.perf_counter()
        for T in (0.0, 0.7):
            load_features(cache, "draft", T, progress=False)
        print(f"features (statistics read once per temperature): {time.perf_counter() - t0:.1f} s")
        for workers in sorted({1, args.workers}):
            load = os.getloadavg()[0]
            n, wall, cpu = sweep(cache, args.n_boot, workers)
            print(f"sweep, {workers} process{'es' if workers > 1 else ''}: {n} configurations x {args.positions:,} "
                  f"positions ({args.n_boot} bootstrap resamples each): {wall:.1f} s wall, {cpu:.1f} s CPU, load "
                  f"{load:.2f} -> {os.getloadavg()[0]:.2f}; {n * args.positions / wall:,.0f} configuration-positions/s "
                  "(goal 10,000,000)")
            if workers == 1:
                wall1 = wall
        if args.workers > 1:
            print(f"  {args.workers} worker processes against one, same run: {wall1 / wall:.2f}x")
        import specsim

        t0 = time.perf_counter()
        base = specsim.simulate(cache, trees=["chain"], budgets=BUDGETS, policies=["greedy"], temperatures=[0.0],
                                n_boot=args.n_boot, by_category=False)
        t_base = time.perf_counter() - t0
        print(f"baseline in the same run, greedy chains only ({base.height} configurations): {t_base / base.height:.2f} s "
              f"per configuration; the one-process sweep averages {wall1 / n:.2f} s per configuration "
              f"({wall1 / n / (t_base / base.height):.1f}x)")
        _greedy_adaptive(cache)

        rows = []
        for positions in (1_000, 100_000, args.positions):
            small = cache if positions == args.positions else Path(tmp) / f"rss-{positions}.h5"
            if positions != args.positions:
                build(small, positions)
            out = subprocess.run([sys.executable, "-m", "benchmarks.bench_scale", "--child", str(small),
                                  "--n-boot", str(args.n_boot)], capture_output=True, text=True, check=True)
            rows.append((positions, json.loads(out.stdout.strip().splitlines()[-1])))
        for positions, r in rows:
            print(f"peak RSS of the sweep in a fresh process, {positions:>9,} positions per temperature: "
                  f"{r['peak_rss_mb']:.0f} MB ({r['configs']} configurations, {r['seconds']:.1f} s)")
        for (p1, r1), (p2, r2) in zip(rows, rows[1:]):
            print(f"  growth {p1:,} -> {p2:,}: {(r2['peak_rss_mb'] - r1['peak_rss_mb']) * 1024 / (2 * (p2 - p1)):.3f} KB "
                  "per position (both temperatures' positions counted)")
        from specsim.sim.replay import BLOCK_POSITIONS, FIT_POSITIONS

        print(f"  (the sweep replays {BLOCK_POSITIONS:,} positions at a time and fits optimal trees on at most "
              f"{FIT_POSITIONS:,}: memory grows with positions up to those, then only per trajectory)")

if __name__ == "__main__":
    main(sys.argv[1:])

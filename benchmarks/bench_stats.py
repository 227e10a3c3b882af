"""The per-position statistics a recording computes for each draft column (`specsim.record.statistics`): a CPU's
cache-sized pieces against whole blocks (how every device computed them before), same inputs and seed, same run.

    python -m benchmarks.bench_stats                  # V = 49,152 (SmolLM2), 700 positions, about 1 minute
    python -m benchmarks.bench_stats --vocab 151936 --positions 300 --rounds 3

The inputs are random logits of the given vocabulary, a draft's a noisy copy of the target's, and tokens sampled
from the target at `--temperature`. At T > 0 the statistics are those of sampling (i.i.d. and without-replacement
acceptance, the lossy rules); at T = 0 the few greedy ones. Each round times blocks (pieces as large as a block,
`CHUNK_ELEMENTS`), then pieces (`CPU_CHUNK_ELEMENTS`), alternating, and the two must agree bit for bit: the
Monte-Carlo columns' uniforms are drawn per block either way. Prints each way's best time per position and the
ratio (above 1: pieces are faster), with the CPU and its load.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch


def main(argv: list[str] | None = None) -> None:
    from specsim.cache.stats import StatsSpec
    from specsim.record import statistics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--positions", type=int, default=700)
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.7, 0.0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n, V = args.positions, args.vocab
    p = torch.randn(n, V) * 3
    q = p + torch.randn(n, V) * 1.5
    spec = StatsSpec()
    piece_size = statistics.CPU_CHUNK_ELEMENTS
    print(f"{n} positions x V = {V}, {spec.candidates} candidates, {spec.swor_samples} swor samples, lossy "
          f"{', '.join(spec.lossy)}; {platform.processor() or platform.machine()}, {args.threads} threads, "
          f"load {os.getloadavg()[0]:.2f}")
    for T in args.temperature:
        y = torch.distributions.Categorical(logits=p / (T or 1.0)).sample()
        best, outs = {}, {}
        for _ in range(args.rounds):
            for way, piece in (("blocks", statistics.CHUNK_ELEMENTS), ("pieces", piece_size)):
                statistics.CPU_CHUNK_ELEMENTS = piece
                start = time.perf_counter()
                outs[way] = statistics.draft_stats(p, q, y, T, spec, torch.Generator().manual_seed(1))
                best[way] = min(best.get(way, float("inf")), time.perf_counter() - start)
        statistics.CPU_CHUNK_ELEMENTS = piece_size
        same = all(np.array_equal(outs["blocks"][k], outs["pieces"][k], equal_nan=True) for k in outs["blocks"])
        print(f"T = {T:g}: blocks of {statistics.CHUNK_ELEMENTS // V} positions {1e3 * best['blocks'] / n:.2f} ms "
              f"per position, pieces of {piece_size // V} {1e3 * best['pieces'] / n:.2f} ms: "
              f"{best['blocks'] / best['pieces']:.2f}x; bit-identical: {same}")
        if not same:
            raise SystemExit("pieces and blocks disagree")


if __name__ == "__main__":
    main()

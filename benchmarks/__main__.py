"""Run every benchmark: `python -m benchmarks [NAME ...]` (names: cache, simulate, attention, live, speedup, scale,
train, stats, vllm; vllm needs vLLM's environment, `make vllm`).

Each benchmark prints its figures as ratios against a baseline measured in the
same run, so numbers from a loaded or different machine stay comparable.
"""

import importlib
import sys

BENCHMARKS = {
    "cache": "benchmarks.bench_cache",
    "simulate": "benchmarks.bench_simulate",
    "attention": "benchmarks.bench_attention",
    "live": "benchmarks.bench_live",
    "speedup": "benchmarks.bench_speedup",
    "scale": "benchmarks.bench_scale",
    "train": "benchmarks.bench_train",
    "stats": "benchmarks.bench_stats",
    "vllm": "benchmarks.bench_vllm",
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}", file=sys.stderr)
        return 2
    for name in names:
        print(f"\n=== benchmark: {name} ===", flush=True)
        module = importlib.import_module(BENCHMARKS[name])
        module.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Tree attention speed: each implementation against per-branch, and the best against plain causal.

    python -m benchmarks.bench_attention            # ~30 s on a 2-core CPU
    python -m benchmarks.bench_attention --device cuda --batch 16 --context 4096

For every tree size N it prints time(impl) / time(per_branch) on the same tree
(below 1 is faster), and time(best tree implementation) / time(causal attention
over N tokens): the price of a tree over a plain chain of the same token count.
All ratios come from medians measured in this run, after each implementation
passed the equality check against the reference.
"""

from __future__ import annotations

import argparse

import polars as pl
import torch

from specsim.attention.bench import SweepConfig, resolve_device, run_sweep


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--sizes", default="4,16,64")
    parser.add_argument("--shape", default="kary2", help="branching tree family (kary2, kary4, widths, star)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    config = SweepConfig(
        batch_sizes=(args.batch,), context_lens=(args.context,), tree_sizes=tuple(int(n) for n in args.sizes.split(",")),
        shapes=("chain", args.shape), device=str(device), dtype="bfloat16" if device.type == "cuda" else "float32",
        compile_flex=device.type == "cuda", repeats=args.repeats,
    )
    table = run_sweep(config, progress=False)
    failed = table.filter(~pl.col("check_passed"))
    first = table.row(0, named=True)
    print(f"{first['device']} | {first['dtype']} | B={args.batch} L={args.context} | heads {first['heads']}/"
          f"{first['kv_heads']} x {first['head_dim']} | median of {args.repeats} | tree shape {args.shape}")
    if not failed.is_empty():
        print("FAILED the equality check (not timed):", failed.select("impl", "N", "shape", "note").rows())
    tree_impls = [i for i in ("dense", "flex", "lse_merge") if i in set(table["impl"])]
    print(f"{'N':>4} {'per_branch ms':>14} " + " ".join(f"{i + '/pb':>13}" for i in tree_impls)
          + f" {'best':>10} {'best/causal':>12}")
    for n in config.tree_sizes:
        tree = {r["impl"]: r["median_ms"] for r in table.filter((pl.col("N") == n) & (pl.col("shape") == args.shape))
                .iter_rows(named=True)}
        causal = table.filter((pl.col("N") == n) & (pl.col("impl") == "causal"))["median_ms"].item()
        per_branch = tree["per_branch"]
        timed = {i: tree[i] for i in tree_impls if tree.get(i) is not None}
        best = min(timed, key=timed.get)
        print(f"{n:>4} {per_branch:>14.3f} " + " ".join(
            f"{tree[i] / per_branch:>13.3f}" if tree.get(i) is not None else f"{'n/a':>13}" for i in tree_impls
        ) + f" {best:>10} {timed[best] / causal:>12.3f}")


if __name__ == "__main__":
    main()

"""The sign of bench_speedup's errors on this CPU model: every committed three-run check since batch intervals last
changed (10 runs x 12 configurations, first profile), predicted / live, and which side the prediction gets wrong:
the speculative throughput (predicted / live tokens per second) or the plain one.

    .venv/bin/python analyses/results/speed-error-cpu-2026-11-28/bias.py > bias.txt
"""

from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
FOLDERS = ("bench-amx-cpu-2026-11-27", "bench-pooled-amx-cpu-2026-11-27", "bench-cpu-2026-11-28")


def main() -> None:
    runs = [pl.read_csv(f).with_columns(pl.lit(f"{f.parent.name}/{f.name}").alias("run"))
            .select("run", "draft", "tree", "batch", "ratio",
                    (pl.col("tokens_per_s_predicted") / pl.col("tokens_per_s_live")).alias("speculative"),
                    (pl.col("plain_tokens_per_s_predicted") / pl.col("plain_tokens_per_s_live")).alias("plain"))
            for folder in FOLDERS for f in sorted((HERE.parent / folder).glob("bench-run*.csv"))]
    table = pl.concat(runs)
    print(f"{table.height} configurations in {len(runs)} runs; predicted / live above 1: {(table['ratio'] > 1).sum()}; "
          f"median {table['ratio'].median():.3f}; within 1 +- 0.10: {((table['ratio'] - 1).abs() <= 0.10).sum()}")
    print("predicted over live throughput, medians (speculative, plain) and the speedup's ratio:")
    with pl.Config(tbl_rows=40, tbl_hide_dataframe_shape=True, float_precision=3, fmt_str_lengths=60):
        print(table.group_by("run").agg(pl.col("speculative", "plain", "ratio").median()).sort("run"))
        print(table.group_by("draft", "batch").agg(pl.col("speculative", "plain", "ratio").median())
              .sort("draft", "batch"))


if __name__ == "__main__":
    main()

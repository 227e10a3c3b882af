"""Run 2's four configurations predicted again from other vLLM profiles of the same cache (no vLLM run): which
batch sizes the profile measured moves the B = 4 prediction?

    .venv/bin/python analyses/results/vllm-speed-cpu-2026-11-29/repredict.py CACHE LIVE_CSV PROFILE [PROFILE ...]
"""

import sys

import polars as pl

import specsim


def main(cache: str, live_csv: str, profiles: list[str]) -> None:
    live = pl.read_csv(live_csv).select("draft", "tree", "batch", "vllm_speedup")
    for profile in profiles:
        rows = []
        for batch in (1, 4):
            got = specsim.simulate(cache, trees=["chain:3"], drafts=["vllm-ngram:min=2,max=3", "layers:20"],
                                   batches=[batch] if batch > 1 else (), batching="lockstep", cost_profile=profile,
                                   by_category=False, seed=0)
            rows.append(got.filter((pl.col("batch") == batch) & (pl.col("temperature") == 0))
                        .select("draft", "tree", "batch", "speedup", "speedup_lo", "speedup_hi"))
        table = pl.concat(rows).join(live, on=["draft", "tree", "batch"])
        table = table.with_columns((pl.col("speedup") / pl.col("vllm_speedup")).alias("ratio"))
        print(f"\n{profile}")
        for r in table.iter_rows(named=True):
            print(f"{r['draft']:<24} {r['tree']:<8} B={r['batch']}  predicted {r['speedup']:.3f} "
                  f"[{r['speedup_lo']:.3f}, {r['speedup_hi']:.3f}]  vLLM {r['vllm_speedup']:.3f}  ratio {r['ratio']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])

"""Each bench_speedup run's predictions recomputed from its own cache and profile (kept in its work dir) with this
checkout's simulate, against the same run's live speedups (its CSV)."""
import sys, polars as pl, specsim
runs = [(sys.argv[i], sys.argv[i + 1]) for i in range(1, len(sys.argv), 2)]  # (work dir, csv)
tot_cov = tot_in = tot = 0
for work, csv in runs:
    live = pl.read_csv(csv)
    cov = within = 0
    for r in live.iter_rows(named=True):
        rows = specsim.simulate(f"{work}/cache.h5", trees=[r["tree"]], drafts=[r["draft"]], policies=["greedy"],
                                temperatures=[0.0], cost_profile=f"{work}/profile.json", batches=[r["batch"]],
                                batching="lockstep", by_category=False, seed=0)
        row = rows.filter(pl.col("batch") == r["batch"]).row(0, named=True)
        ok = row["speedup_lo"] <= r["speedup_live"] <= row["speedup_hi"]
        same = abs(row["speedup"] - r["speedup_predicted"]) < 1e-9
        cov += ok; within += abs(row["speedup"] / r["speedup_live"] - 1) <= 0.10
        print(f"{csv.split('/')[-1]} {r['draft']:9} {r['tree']:8} B={r['batch']} predicted {row['speedup']:.3f} "
              f"[{row['speedup_lo']:.3f}, {row['speedup_hi']:.3f}] (before [{r['speedup_predicted_lo']:.3f}, "
              f"{r['speedup_predicted_hi']:.3f}]{'' if same else ', point differs'}) live {r['speedup_live']:.3f} "
              f"{'covered' if ok else 'MISSED'}")
    print(f"{csv}: covered {cov} of {live.height}, within 10% {within} of {live.height}")
    tot_cov += cov; tot_in += within; tot += live.height
print(f"all runs: covered {tot_cov} of {tot}, within 10% {tot_in} of {tot}")

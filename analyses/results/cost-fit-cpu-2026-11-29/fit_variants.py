"""Would a cost model fitted to the profile's medians predict live speedups better than the medians themselves?

    .venv/bin/python analyses/results/cost-fit-cpu-2026-11-29/fit_variants.py OUT.csv
    .venv/bin/python analyses/results/cost-fit-cpu-2026-11-29/fit_variants.py --summary OUT.csv   # the tables only

For each of the seven `bench_speedup` runs of 2026-11-29 on the AVX2-only EPYC (their caches were left in
/tmp/bench-speedup-*, 95 MB each, not committed; their profiles are: see `profiles_of`),
every profile of the run (the first, the second where measured, the one after live decoding) is replaced by a
fitted one, every configuration is predicted again at T = 0 with `specsim.simulate`, exactly as bench_speedup
predicts, and compared with the run's live speedup (its CSV). A fit replaces each entry's median by the fitted value
and scales its rounds by the same factor (so the profile's own spread is kept). Fits, per table (the target's
verification over N tokens, each draft's step over w tokens) and batch size B, on the medians:

  line    per N (or w): a straight line in the context L (relative least squares over the 3 contexts)
  struct  a_x + (c + d x) L: one context slope shared across N (or w), growing linearly with it (least squares
          on relative residuals): attention over x new tokens reads L cached ones
  robust  struct with a soft-L1 loss (scale 5%): a single entry far off the structure counts less
  iso     monotone non-decreasing in N (or w) at each L, then in L at each N (isotonic regression)

and a suffix -verify or -draft fits that table only. (a record of this folder's numbers, at commit 8a9e655)
"""

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import polars as pl
from scipy.optimize import isotonic_regression, least_squares

RESULTS = Path(__file__).resolve().parents[1]
C = RESULTS / "bench-avx2-cpu-2026-11-29c"
RUNS = [("29/run1", "/tmp/bench-speedup-6y2q5cob", RESULTS / "bench-avx2-cpu-2026-11-29/bench-run1.csv", None),
        ("29/run2", "/tmp/bench-speedup-ocj8x3wh", RESULTS / "bench-avx2-cpu-2026-11-29/bench-run2.csv", None),
        ("29/run3", "/tmp/bench-speedup-ckkx14rh", RESULTS / "bench-avx2-cpu-2026-11-29/bench-run3.csv", None),
        ("29b/run1", "/tmp/bench-speedup-enhmthby", RESULTS / "bench-avx2-cpu-2026-11-29b/bench-run1.csv", None),
        ("29c/run1", "/tmp/bench-speedup-p3qvuulm", C / "bench-run1.csv", "run1"),
        ("29c/run2", "/tmp/bench-speedup-fcpjpt83", C / "bench-run2.csv", "run2"),
        ("29c/run3", "/tmp/bench-speedup-a7wco80t", C / "bench-run3.csv", "run3")]
MODES = ["median", "line", "struct", "robust", "iso", "line-draft", "line-verify", "robust-draft", "iso-draft",
         "iso-verify"]


def profiles_of(name: str, tag: str | None) -> dict:
    """The run's profiles: the last three runs' in ../bench-avx2-cpu-2026-11-29c/profiles/, the first four's
    (first, second, after) copied, gzipped, into this folder's profiles/."""
    if tag:
        return {"first": C / "profiles" / f"{tag}-profile.json", "after": C / "profiles" / f"{tag}-profile-after.json"}
    here = Path(__file__).resolve().parent / "profiles" / name.replace("/", "-")
    return {"first": Path(f"{here}-profile.json.gz"), "second": Path(f"{here}-profile-2.json.gz"),
            "after": Path(f"{here}-profile-after.json.gz")}


def read(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def fitted(m: np.ndarray, L: np.ndarray, x: np.ndarray, mode: str) -> np.ndarray:
    """m: (contexts, x) medians -> fitted values of the same shape."""
    if mode == "iso":
        out = np.array([isotonic_regression(row).x for row in m])
        return np.array([isotonic_regression(col).x for col in out.T]).T
    if mode == "line":
        A = np.stack([np.ones_like(L), L], 1)
        return np.stack([A @ np.linalg.lstsq(A / m[:, k:k + 1], np.ones(len(L)), rcond=None)[0]
                         for k in range(m.shape[1])], 1)

    def model(p):
        return p[None, :len(x)] + (p[len(x)] + p[len(x) + 1] * x[None, :]) * L[:, None]
    res = least_squares(lambda p: (model(p) / m - 1).ravel(), np.concatenate([m[0], [0.0, 0.0]]),
                        loss="linear" if mode == "struct" else "soft_l1", f_scale=0.05)
    return model(res.x)


def smoothed(path: Path, mode: str, out: Path) -> Path:
    data = read(path)
    base, _, only = mode.partition("-")
    tables = [] if base == "median" else (([] if only == "draft" else [data["target_verify_s"]])
              + ([] if only == "verify" else [data["draft_step_s"][d] for d in data["drafts"]]))
    for table in tables:
        for by_context in table.values():
            Ls = sorted(by_context, key=float)
            xs = sorted(by_context[Ls[0]], key=float)
            m = np.array([[by_context[L][x]["median"] for x in xs] for L in Ls])
            fit = fitted(m, np.array(Ls, dtype=float), np.array(xs, dtype=float), base)
            for j, L in enumerate(Ls):
                for k, x in enumerate(xs):
                    cell = by_context[L][x]
                    scale = fit[j, k] / cell["median"]
                    cell["median"] = float(fit[j, k])
                    cell["runs"] = [r * scale for r in cell.get("runs", [])]
    out.write_text(json.dumps(data))
    return out


def main(out_csv: str) -> None:
    import tempfile

    import specsim

    rows, scratch = [], Path(tempfile.mkdtemp(prefix="cost-fit-"))
    for name, work, csv, tag in RUNS:
        live = pl.read_csv(csv).select("draft", "tree", "batch", "speedup_live")
        for which, path in profiles_of(name, tag).items():
            for mode in MODES:
                profile = smoothed(path, mode, scratch / f"{mode}.json")
                sim = specsim.simulate(Path(work) / "cache.h5",
                                       trees=live["tree"].unique(maintain_order=True).to_list(),
                                       drafts=live["draft"].unique(maintain_order=True).to_list(), batches=[1, 4],
                                       batching="lockstep", cost_profile=str(profile), by_category=False)
                sim = sim.filter(pl.col("temperature") == 0).select("draft", "tree", "batch", "speedup")
                for r in live.join(sim, on=["draft", "tree", "batch"]).iter_rows(named=True):
                    rows.append({"run": name, "profile": which, "fit": mode, **r,
                                 "ratio": r["speedup"] / r["speedup_live"]})
        print("done", name, flush=True)
    table = pl.DataFrame(rows)
    table.write_csv(out_csv)
    summary(table)


def summary(table: pl.DataFrame) -> None:
    """Per fit: predictions within 10% of live and the mean |log(predicted / live)|; the configurations the medians
    missed by more than 8% under each fit; each fit's mean |log ratio| minus the medians', prediction by prediction,
    with a 95% interval that resamples the seven runs (a run's predictions share its live measurements)."""
    scored = table.with_columns(((pl.col("ratio") - 1).abs() <= 0.10).alias("within"),
                                pl.col("ratio").log().abs().alias("abs_log_ratio"))
    with pl.Config(tbl_rows=60, tbl_cols=12, tbl_width_chars=160):
        print(scored.group_by("fit").agg(pl.len().alias("predictions"), pl.col("within").sum(),
                                         pl.col("abs_log_ratio").mean().alias("mean |log ratio|"),
                                         pl.col("abs_log_ratio").max().alias("max |log ratio|"))
              .sort("mean |log ratio|"))
        print(scored.filter(pl.col("profile") == "first")
              .pivot(on="fit", index=["run", "draft", "tree", "batch"], values="ratio")
              .filter((pl.col("median") - 1).abs() > 0.08).select("run", "draft", "tree", "batch", *MODES[:5]))
    wide = scored.pivot(on="fit", index=["run", "profile", "draft", "tree", "batch"], values="abs_log_ratio")
    rng, runs = np.random.default_rng(0), sorted(wide["run"].unique().to_list())
    for mode in MODES[1:]:
        diff = (wide[mode] - wide["median"]).to_numpy()
        by_run = {r: diff[wide["run"].to_numpy() == r] for r in runs}
        boot = [np.concatenate([by_run[r] for r in rng.choice(runs, len(runs))]).mean() for _ in range(4000)]
        print(f"{mode:12s} mean |log ratio| minus the medians' {diff.mean():+.4f}  95% CI (the {len(runs)} runs "
              f"resampled) [{np.percentile(boot, 2.5):+.4f}, {np.percentile(boot, 97.5):+.4f}]")

if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(pl.read_csv(sys.argv[2]))
    else:
        main(sys.argv[1])

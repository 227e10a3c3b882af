"""Compare warmups.py's four profiles: each entry's median, same-variant pairs (A1-A2, B1-B2) against
cross-variant pairs, and the demo's predictions (simulate on the demo cache) from each.

    .venv/bin/python analyses/results/demo-warmups-cpu-2026-11-28/compare.py CACHE
"""
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
NAMES = ("A1", "B1", "A2", "B2")


def medians(body: dict) -> dict:
    out = {}
    for B, by_L in body["target_verify_s"].items():
        for L, row in by_L.items():
            out.update({("target", B, L, n): c["median"] for n, c in row.items()})
    for d, table in body["draft_step_s"].items():
        for B, by_L in table.items():
            for L, row in by_L.items():
                out.update({(d, B, L, w): c["median"] for w, c in row.items()})
    return out


def main(cache: str) -> None:
    m = {n: medians(json.loads((HERE / f"profile-{n}.json").read_text())) for n in NAMES}
    keys = sorted(m["A1"])
    print(f"{len(keys)} entries (target N and draft w at B = 1-4, L = 64, 832); |log ratio| of medians, as %:")
    for a, b in itertools.combinations(NAMES, 2):
        r = np.abs(np.log([m[b][k] / m[a][k] for k in keys])) * 100
        kind = "same variant " if a[0] == b[0] else "cross variant"
        mean_ratio = np.exp(np.mean(np.log([m[b][k] / m[a][k] for k in keys])))
        print(f"  {a}-{b} ({kind}): median {np.median(r):.1f}%, 90th {np.percentile(r, 90):.1f}%, "
              f"max {r.max():.1f}%; geometric mean {b}/{a} {mean_ratio:.3f}")
    for n in NAMES:
        out = subprocess.run([sys.executable, "-m", "specsim", "simulate", cache, "--tree", "chain:2", "--tree",
                              "chain:4", "--tree", "kary:2,2", "--policy", "greedy", "--batch", "1", "--batch", "4",
                              "--cost-profile", str(HERE / f"profile-{n}.json"), "--cost-extrapolate", "--quiet",
                              "--out", "-", "--format", "ndjson"], capture_output=True, text=True, check=True).stdout
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        rows = [r for r in rows if r.get("category", "all") == "all"]
        print(f"{n}: speedup " + ", ".join(f"{r['tree']} B={r.get('batch', 1)} {r['speedup']:.3f}" for r in rows))


if __name__ == "__main__":
    main(sys.argv[1])

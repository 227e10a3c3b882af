"""Compare two recordings of the same prompts and settings (on two devices, say): tokens and statistics.

    python -m benchmarks.compare_caches cache/study-smollm2.h5 cache/study-smollm2-h100.h5

Per temperature: how many trajectories are token-identical. On the common prefix of each
pair of trajectories (the positions where both saw the same context), per column and
statistic: how many positions are bit-identical and the largest absolute difference.
Also both files' content fingerprints (equal fingerprints: equal committed contents).
"""
import sys
from collections import defaultdict

import numpy as np

from specsim.cache.reader import CacheReader


def main(a_path, b_path):
    with CacheReader(a_path) as a, CacheReader(b_path) as b:
        print(f"A {a_path}: {a.n_positions} positions, fingerprint {a.fingerprint}")
        print(f"B {b_path}: {b.n_positions} positions, fingerprint {b.fingerprint}")
        rows_b = {(r.prompt_index, r.temperature): r for r in b.iter_trajectories()}
        same = defaultdict(lambda: [0, 0, 0])  # T -> [trajectories, identical, positions on common prefixes]
        stat = defaultdict(lambda: [0, 0, 0.0])  # (column, name) -> [positions, bit-identical, max |diff|]
        names = {c: a.stat_names(c) for c in a.spec.columns}
        for r in a.iter_trajectories():
            s = rows_b.get((r.prompt_index, r.temperature))
            entry = same[r.temperature]
            entry[0] += 1
            if s is None:
                continue
            ta, tb = a.tokens(r.start, r.stop), b.tokens(s.start, s.stop)
            if len(ta) == len(tb) and np.array_equal(ta, tb):
                entry[1] += 1
                n = len(ta)
            else:
                m = min(len(ta), len(tb))
                n = int(np.argmax(ta[:m] != tb[:m])) if np.any(ta[:m] != tb[:m]) else m
            entry[2] += n  # positions on the common prefix (the same context in both)
            if n == 0:
                continue
            for c, ns in names.items():
                for name in ns:
                    x, y = a.stats(c, name, r.start, r.start + n), b.stats(c, name, s.start, s.start + n)
                    k = stat[(c, name)]
                    eq = (x == y) | (np.isnan(x) & np.isnan(y)) if x.dtype.kind == "f" else (x == y)
                    eq = eq.reshape(n, -1).all(axis=1)
                    k[0] += n
                    k[1] += int(eq.sum())
                    if x.dtype.kind in "fiu":
                        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
                        d = d[np.isfinite(d)]
                        k[2] = max(k[2], float(d.max()) if d.size else 0.0)
        for t, (n, ident, pos) in sorted(same.items()):
            print(f"T={t:g}: {ident}/{n} trajectories token-identical; {pos} positions on common prefixes")
        print(f"{'column':28s} {'statistic':22s} {'bit-identical':>16s} {'max |diff|':>12s}")
        for (c, name), (n, eq, d) in sorted(stat.items()):
            print(f"{c:28s} {name:22s} {eq:>7d}/{n:<7d} {d:12.3g}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m benchmarks.compare_caches A.h5 B.h5")
    main(*sys.argv[1:3])

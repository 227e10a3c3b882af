"""Adversarial search: is min_A [p(A) + 1 - Q_swor(all j draws in A)] always at a prefix of ascending p/q?"""
import itertools, sys
import numpy as np

def q_all_in(q, A_mask, j):
    # exact probability that j draws without replacement from q all land in A (enumerate ordered tuples)
    V = len(q)
    idx = np.flatnonzero(A_mask)
    total = 0.0
    for t in itertools.permutations(idx, j):
        pr, left = 1.0, 1.0
        for a in t:
            pr *= q[a] / left
            left -= q[a]
        total += pr
    return total

def check(p, q, j):
    V = len(p)
    masks = np.array(list(itertools.product([0, 1], repeat=V)), dtype=bool)
    vals = np.array([p[m].sum() + 1 - q_all_in(q, m, j) for m in masks])
    order = np.argsort(p / q, kind="stable")
    pref = []
    for k in range(V + 1):
        m = np.zeros(V, bool); m[order[:k]] = True
        pref.append(p[m].sum() + 1 - q_all_in(q, m, j))
    return vals.min(), min(pref), masks[vals.argmin()]

if __name__ == "__main__":
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    worst = 0
    for trial in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2000):
        V = rng.integers(3, 8)
        j = int(rng.integers(2, min(V, 4) + 1))
        a1, a2 = rng.choice([0.05, 0.2, 1, 5]), rng.choice([0.05, 0.2, 1, 5])
        p = rng.dirichlet(np.full(V, a1)); q = rng.dirichlet(np.full(V, a2))
        p = np.maximum(p, 1e-12); q = np.maximum(q, 1e-12); p /= p.sum(); q /= q.sum()
        best, prefix, m = check(p, q, j)
        gap = prefix - best
        if gap > worst + 1e-12:
            worst = gap
            print(f"trial {trial} V={V} j={j} gap {gap:.3e} p={np.round(p,4).tolist()} q={np.round(q,4).tolist()} best set {m.astype(int).tolist()} order {np.argsort(p/q).tolist()}", flush=True)
    print("worst gap", worst)

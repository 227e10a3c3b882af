import numpy as np, sys
from prefix_search import check
rng = np.random.default_rng(int(sys.argv[1]))
worst = 0
for trial in range(int(sys.argv[2])):
    V = int(rng.integers(3, 8)); j = int(rng.integers(2, min(V, 4) + 1))
    kind = trial % 3
    if kind == 0:   # one dominant draft token, many small
        q = rng.dirichlet(np.full(V, 0.3)); q[0] += rng.uniform(1, 20); q /= q.sum()
        p = rng.dirichlet(np.full(V, rng.choice([0.1, 1, 5])))
    elif kind == 1:  # p close to q: near-ties in the p/q order
        q = rng.dirichlet(np.full(V, rng.choice([0.2, 1, 5])))
        p = q * np.exp(rng.normal(0, rng.choice([0.05, 0.3]), V)); p /= p.sum()
    else:            # p confident where q is not
        p = rng.dirichlet(np.full(V, 0.1)); q = rng.dirichlet(np.full(V, 3.0))
    p = np.maximum(p, 1e-12); q = np.maximum(q, 1e-12); p /= p.sum(); q /= q.sum()
    best, prefix, m = check(p, q, j)
    if prefix - best > worst + 1e-12:
        worst = prefix - best
        print(trial, V, j, worst, p.round(4).tolist(), q.round(4).tolist(), m.astype(int).tolist(), flush=True)
print("worst gap", worst, "over", sys.argv[2])

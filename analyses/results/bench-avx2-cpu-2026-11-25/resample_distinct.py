"""Bootstrap replicates of a lockstep B=4 speedup vs how many distinct prompts each resample holds."""
import sys, numpy as np
from pathlib import Path
from specsim.sim.batch import timeline
from specsim.sim.cost import load_cost_profile
from specsim.sim.features import load_features
from specsim.sim.policies import run_policy
from specsim.specs import parse_policy, parse_tree
work = Path(sys.argv[1])
model = load_cost_profile(work / "profile.json").for_temperature(0.0, model_draft=True)
for draft in ("int8", "layers:20"):
    f = load_features(work / "cache.h5", draft, 0.0, progress=False)
    for spec in ("chain:2", "chain:4", "kary:2,2"):
        tree = parse_tree(spec)
        table = run_policy(f, tree, parse_policy("greedy"), np.random.default_rng(0))
        n = f.n_traj
        rng = np.random.default_rng(1)
        orders = np.concatenate([np.arange(n)[None], np.sort(rng.integers(0, n, size=(400, n)), axis=1)])
        key = model.draft_for(draft, None) if False else draft
        spec_t = timeline(table.length, f, tree, model, key, batch=4, batching="lockstep", orders=orders,
                          leaf=table.leaf_given())
        base = timeline(None, f, tree, model, key, batch=4, batching="lockstep", orders=orders, plain=True)
        s = base.seconds / spec_t.seconds
        distinct = np.array([len(set(o)) for o in orders[1:]])
        by = {d: float(np.median(s[1:][distinct == d])) for d in sorted(set(distinct))}
        q = np.percentile(s[1:], [2.5, 50, 97.5])
        print(f"{draft:9} {spec:8} point {s[0]:.3f}  replicates 2.5/50/97.5%: {q[0]:.3f} {q[1]:.3f} {q[2]:.3f}  "
              f"median by distinct prompts: " + ", ".join(f"{d}: {v:.3f} (n={int((distinct == d).sum())})" for d, v in by.items()))

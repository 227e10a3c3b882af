"""Plain decoding's time in each split run, live against the profiles before and after: the B = 1 plain step of
every position of the six trajectories (their lengths from the benchmark's cache) summed, over live's plain time
(`specsim live`'s plain_tokens_per_s). Usage: python plain.py CACHE (run from this folder)."""
import sys

import polars as pl

from specsim.cache.reader import CacheReader
from specsim.sim.cost import load_cost_profile

with CacheReader(sys.argv[1]) as r:
    plen = [len(r.prompt_token_ids(i)) for i in range(len(r.prompts))]
    rows = list(zip(r.trajectories["prompt_index"], r.trajectories["length"]))
tokens = sum(int(n) for _, n in rows)
for run in (1, 2, 3):
    for tree in ("kary2x2", "chain4"):
        live = tokens / pl.read_csv(f"run{run}/live-{tree}.csv")["plain_tokens_per_s"][0]
        said = []
        for name in ("before", "after"):
            m = load_cost_profile(f"run{run}/profile-{name}.json")
            pred = sum(float(m.plain_s(1, plen[int(p)] + t)) for p, n in rows for t in range(int(n)))
            said.append(f"profile-{name}/live {pred / live:.3f}")
        print(f"run {run} {tree}: live plain {1000 * live / tokens:.1f} ms/token; " + ", ".join(said))

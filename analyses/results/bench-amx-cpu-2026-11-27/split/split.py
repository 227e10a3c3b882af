"""Draft and verify time per call, live against the profile, in one process run (int8 draft, B = 1):
a profile of B = 1, then live kary:2,2 and chain:4 (`specsim live --steps-out`), then the profile again.
Each live call is priced with the profile's entries for the forwards it ran: the root feed (1 token, or 2 after
a call that accepted a leaf), one forward per inner level, and the target over all drafted nodes + the root."""
import subprocess, sys, time, json, os
from pathlib import Path
import numpy as np
import polars as pl
import torch
from specsim.attention.profile import ProfileConfig, measure_cost_profile, write_profile
from specsim.cache.reader import CacheReader
from specsim.record.models import load_draft, load_model
from specsim.sim.cost import load_cost_profile

out = Path(sys.argv[1]); out.mkdir(exist_ok=True)
cache = sys.argv[2]  # bench_speedup's cache of the same prompts (prompt lengths)
torch.set_num_threads(2)
with CacheReader(cache) as r:
    plen = [len(r.prompt_token_ids(i)) for i in range(len(r.prompts))]
contexts = (48, 432, 832)
def profile(name):
    t = load_model("smollm2-135m"); q = [load_draft("int8", t)]
    body = measure_cost_profile(t, q, config=ProfileConfig(batches=(1,), contexts=contexts, max_tokens=7,
                                                           draft_widths=(1, 2), repeats=5, warmup=2), progress=False)
    return load_cost_profile(write_profile(body, out / f"{name}.json", overwrite=True))
LEAF = {"kary:2,2": 2, "chain:4": 4}
models = [profile("profile-before")]
for tree in LEAF:
    subprocess.run([sys.executable, "-m", "specsim", "live", "--target", "smollm2-135m", "--draft", "int8", "--tree", tree,
                    "--categories", "writing,coding,math_reasoning,rag,translation,summarization", "--per-category", "1",
                    "--max-new-tokens", "48", "--threads", "2", "--quiet", "--out", str(out / f"live-{tree}.csv"),
                    "--overwrite", "--steps-out", str(out / f"steps-{tree}.csv")], check=True, capture_output=True)
models.append(profile("profile-after"))
for tree, leaf in LEAF.items():
    s = pl.read_csv(out / f"steps-{tree}.csv").sort("prompt_index", "step")
    widths = {"kary:2,2": [2], "chain:4": [1, 1, 1]}[tree]
    live_d, live_v = s["draft_ms"].sum(), s["verify_ms"].sum()
    for name, m in zip(("before", "after"), models):
        pd = pv = 0.0
        prev = None
        for row in s.iter_rows(named=True):
            L = plen[row["prompt_index"]] + row["start"]
            feed = 1 if row["step"] == 0 or prev is None or prev["prompt_index"] != row["prompt_index"] else (2 if prev["accepted"] == leaf else 1)
            pd += 1000 * (float(m.draft_s("int8", 1, feed, L)) + sum(float(m.draft_s("int8", 1, w, L)) for w in widths))
            pv += 1000 * float(m.verify_s(1, row["drafted"] + 1, L))
            prev = row
        print(f"{tree}: {s.height} calls; draft live {live_d/s.height:.1f} ms/call, profile-{name} {pd/s.height:.1f} "
              f"(live/profile {live_d/pd:.3f}); verify live {live_v/s.height:.1f}, profile-{name} {pv/s.height:.1f} "
              f"(live/profile {live_v/pv:.3f})", flush=True)

"""Rows of a broad sweep, written to OUT_DIR as parquet (run once per checkout; compare the frames)."""
import sys
from pathlib import Path

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
import specsim
from tests.toy_markov import random_prompts, record_dynamic_cache, sticky_pair
from tests.synthetic import random_cache

data = Path("/tmp/vx/rows/data"); data.mkdir(exist_ok=True)
dyn = data / "d.h5"
if not dyn.exists():
    target, draft = sticky_pair(8, order=2, stay=0.9, seed=3)
    record_dynamic_cache(dyn, target, draft, random_prompts(8, 3, 12, seed=5), 24, topk=2, depth=3)
syn = data / "s.h5"
if not syn.exists():
    random_cache(syn, n_prompts=8, length=40, vocab=24, drafts=("small", "big"), overhang=4)

runs = {
  "dyn": (dyn, dict(trees=["dynamic:topk=2,depth=3,tokens=2", "dynamic:topk=2,depth=3,tokens=6", "dynamic:topk=2,depth=2,tokens=4",
                           "chain:3", "kary:2,2"], policies=["greedy", "sample"], n_boot=200, cost="c=0.1")),
  "syn": (syn, dict(trees=["chain:2", "chain:4", "kary:2,2", "widths:3,2,1", "optimal:6"],
                    policies=["greedy", "sample", "p>=q", "typical", "adaptive-hf", "adaptive-history:0.8,0.4"],
                    drafts=["small", "big", "ngram:3", "prompt-lookup:2", "suffix"], n_boot=200, cost="c=0.2",
                    by_category=True)),
  "swor": (syn, dict(trees=["kary:3,2", "widths:2,2,2"], policies=["sample"], multi_draft="swor", drafts=["small"],
                     n_boot=100, cost="c=0.1")),
}
for name, (cache, kw) in runs.items():
    df = specsim.simulate(cache, **kw)
    df.drop([c for c in df.columns if c == "cache"]).write_parquet(out / f"{name}.parquet")
    print(name, df.shape)

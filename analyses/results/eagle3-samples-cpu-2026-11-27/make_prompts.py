"""prompts.jsonl for run.sh: the 97 prompts the data curve's quarter head trained on (its config's `trained_on`), in
the order of ../eagle3-scale-cpu-2026-11-26's train_prompts.jsonl, then the first prompt that run held out (index 97:
`--holdout-every 98` holds out it alone, so the head trains on exactly the quarter's prompts).

    PYTHONPATH=. python analyses/results/eagle3-samples-cpu-2026-11-27/make_prompts.py /work/e3big /work/curve47/head97
"""

import json
import sys
from pathlib import Path

from specsim.cache.reader import CacheReader
from specsim.record.train_data import held_out, recorded_prompts

e3big, quarter_head = Path(sys.argv[1]), Path(sys.argv[2])
recorded = recorded_prompts(e3big / "train.h5")
with CacheReader(e3big / "train.h5") as reader:
    qids = reader.prompts["question_id"].to_list()
trained_on = json.loads((quarter_head / "config.json").read_text())["training"]["trained_on"]
quarter = {p["question_id"] for p in trained_on["prompts"]}
first_held = next(qids[i] for i in recorded if held_out(i, 10))
lines = [json.loads(line) for line in (e3big / "train_prompts.jsonl").read_text().splitlines()]
chosen = [line for line in lines if line["question_id"] in quarter] + [
    next(line for line in lines if line["question_id"] == first_held)]
assert len(chosen) == len(quarter) + 1
Path("prompts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in chosen))
print(f"prompts.jsonl: {len(quarter)} training prompts, then held-out question {first_held}")

"""The held-out split of the EAGLE-3 and MTP runs: the first Spec-Bench prompt of each of the 13 categories goes to
eval_prompts.jsonl, the other 467 to train_prompts.jsonl (written in the current folder)."""
import importlib.resources as r
import json

seen = set()
with open("train_prompts.jsonl", "w") as train, open("eval_prompts.jsonl", "w") as ev:
    for line in (r.files("specsim") / "data" / "spec_bench_questions.jsonl").read_text().splitlines():
        q = json.loads(line)
        (ev if q["category"] not in seen else train).write(line + "\n")
        seen.add(q["category"])

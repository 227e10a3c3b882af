"""The training prompts of the device run: Spec-Bench's 467 training prompts (the first of each category held out for
evaluation, as since eagle3-cpu-2026-11-25), then the generated ones with question ids from 100,000 on (no clash
with Spec-Bench's). Usage: python combine.py SPEC_BENCH.jsonl GENERATED.jsonl OUT.jsonl"""
import json
import sys

spec, generated, out = sys.argv[1:4]
rows = [json.loads(line) for line in open(spec)]
rows += [dict(json.loads(line), question_id=100_000 + k) for k, line in enumerate(open(generated))]
with open(out, "w") as f:
    for row in rows:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
print(f"{len(rows)} prompts to {out}")

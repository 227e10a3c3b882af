"""The generated prompts of the device run: the 603 SmolLM2 wrote in eagle3-written-prompts-cpu-2026-11-27 and the
1,400 of eagle3-gpu-h200-2026-11-27b, each text once, with question ids from 200,000 on (no clash with Spec-Bench's).
Usage: python prompts.py OUT.jsonl GENERATED.jsonl..."""
import json
import sys

out, sources = sys.argv[1], sys.argv[2:]
seen, rows = set(), []
for source in sources:
    for line in open(source):
        text = json.loads(line)["prompt"]
        if text not in seen:
            seen.add(text)
            rows.append({"prompt": text, "category": "generated", "question_id": 200_000 + len(rows)})
with open(out, "w") as f:
    for row in rows:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
print(f"{len(rows)} prompts ({sum(1 for s in sources for _ in open(s)) - len(rows)} repeated left out) to {out}")

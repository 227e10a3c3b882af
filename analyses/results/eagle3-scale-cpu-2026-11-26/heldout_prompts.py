"""Writes heldout46_prompts.jsonl in the current folder: the training recording's prompts that `train-draft
--holdout-every 10` holds out (index % 10 == 9 in train_prompts.jsonl), which the head never trained on, beside the 13
of eval_prompts.jsonl (the first Spec-Bench prompt of each category, held out since eagle3-cpu-2026-11-25). Run it
after ../eagle3-cpu-2026-11-25/split_prompts.py."""
from pathlib import Path

train = Path("train_prompts.jsonl").read_text().splitlines()
held = [line for i, line in enumerate(train) if i % 10 == 9]
Path("heldout46_prompts.jsonl").write_text("\n".join(held) + "\n")
print(f"{len(held)} held-out prompts")

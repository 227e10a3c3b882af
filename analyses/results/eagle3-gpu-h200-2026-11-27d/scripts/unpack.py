"""Rebuild a head packed by pack.py: join its parts, put back the LM head (the target's LM head rows of the draft
vocabulary, as train-draft froze them), check every sha256 pack.py recorded (the parts, the LM head's bytes, the
whole checkpoint), and write HEAD_DIR/model.safetensors and config.json.
Usage: python unpack.py NAME FROM_DIR LOGS_DIR TARGET HEAD_DIR"""
import hashlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load, save_file

from specsim.record.models import load_model

name, src, logs, target, head = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
sums = json.loads((logs / f"{name}-sums.json").read_text())
parts = sorted(src.glob(f"{name}.trained.part*"), key=lambda p: int(p.name.rsplit("part", 1)[1]))
blob = b"".join(p.read_bytes() for p in parts)
assert hashlib.sha256(blob).hexdigest() == sums["trained.safetensors"], "the parts do not join to what was packed"
tensors = load(blob)
lm = load_model(target).model.get_output_embeddings().weight.detach()
ids = torch.arange(len(tensors["d2t"])) + tensors["d2t"]
tensors["lm_head.weight"] = lm[ids].contiguous()
assert hashlib.sha256(tensors["lm_head.weight"].numpy().tobytes()).hexdigest() == sums["lm_head.weight"], \
    "the target's LM head rows differ from the head's"
head.mkdir(parents=True, exist_ok=True)
save_file(tensors, head / "model.safetensors")
(head / "config.json").write_text((logs / f"{name}-config.json").read_text())
same = hashlib.sha256((head / "model.safetensors").read_bytes()).hexdigest() == sums["model.safetensors"]
print(f"{name}: {len(parts)} parts, LM head rebuilt from {target} (sha256 matches); model.safetensors "
      f"{'byte for byte the one trained' if same else 'differs in bytes from the one trained (tensors equal)'}")

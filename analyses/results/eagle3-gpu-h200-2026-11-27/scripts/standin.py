"""A stand-in for SmolLM2-135M-Instruct of its exact shape (its config.json and tokenizer, random weights): the
training step's timing depends on the shapes alone, and the real weights take two device calls to carry."""
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

src, out = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32)
model.save_pretrained(out)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    shutil.copy(src / name, out / name)
print(f"stand-in: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, random, at {out}")

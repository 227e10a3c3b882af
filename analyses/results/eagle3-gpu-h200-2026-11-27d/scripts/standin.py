"""A SmolLM2-135M-shaped stand-in with random weights (its config and tokenizer, no weights to carry): every
trajectory runs its full length, the worst case for a recording's speed. Usage: python standin.py FILES_DIR OUT_DIR"""
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

src, out = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32)
model.save_pretrained(out)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if (src / name).exists():
        shutil.copy(src / name, out / name)
print(f"stand-in: {sum(p.numel() for p in model.parameters()):,} parameters in {out}")

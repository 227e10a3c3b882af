"""The int8 draft of SmolLM2-135M with each kernel, on 16 token ids: how far its logits move with the kernel, and
how often its argmax is the target's.

    ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python analyses/results/int8-kernel-cpu-2026-11-28/harm.py
"""
import os

import numpy as np
import torch

from specsim.record import models
from specsim.record.models import load_draft, load_model

target = load_model("smollm2-135m")
ids = torch.tensor([[1, 17, 42, 99, 5, 7, 60, 61, 200, 13, 14, 150, 2000, 3000, 4000, 5000]])
out = {}
for kernel in ("int32", "float32"):
    models._CPU_KERNEL[:] = [kernel]
    with torch.no_grad():
        out[kernel] = load_draft("int8", target).model(ids).logits[0].double().numpy()
with torch.no_grad():
    top = target.model(ids).logits[0].double().numpy().argmax(-1)
a, b = out["int32"], out["float32"]
print(f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}: max |int32 - float32| logit "
      f"{np.abs(a - b).max():.3f}; argmaxes differing {int((a.argmax(-1) != b.argmax(-1)).sum())} of {len(top)}; "
      f"argmax = target's: int32 {int((a.argmax(-1) == top).sum())}, float32 {int((b.argmax(-1) == top).sum())}")

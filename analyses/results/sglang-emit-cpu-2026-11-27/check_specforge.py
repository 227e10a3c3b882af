"""The EAGLE-3 head of ../eagle3-dynamic-cpu-2026-11-27 (SmolLM2-135M, draft vocabulary 16,384), written out for
SGLang by `specsim simulate --emit sglang`, read into SpecForge's LlamaForCausalLMEagle3 (tests/head_writers.py
--load, in vLLM's environment) and run on random fused states and tokens: each training-time-test step's logits
against specsim's own for the head it came from. Usage: python check_specforge.py HEAD_DIR SGLANG_DIR"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from specsim.engines.vllm import vllm_python
from specsim.record.head_checkpoints import load_heads
from specsim.record.head_unroll import unroll
from specsim.record.models import load_model

head_dir, sglang_dir = sys.argv[1], sys.argv[2]
root = Path(__file__).resolve().parents[3]
target = load_model("smollm2-135m")
rng = np.random.default_rng(0)
m, steps = 32, 4
hidden = rng.standard_normal((m, 3 * 576)).astype(np.float32)
ids = rng.integers(0, 49152, m)
np.savez("inputs.npz", hidden=hidden, ids=ids)
subprocess.run([vllm_python(), str(root / "tests" / "head_writers.py"), "specforge", target.info["path"], "specforge",
                "inputs.npz", "--ttt-steps", str(steps), "--load", sglang_dir], check=True, capture_output=True)
print("SpecForge loading:", (Path("specforge") / "loading.json").read_text())
head = load_heads(f"eagle3:{head_dir}", target)
with torch.no_grad():
    feats = unroll(head.forward, torch.as_tensor(hidden), torch.as_tensor(ids), torch.arange(m), steps)
    ours = np.stack([head.logits(f).numpy() for f in feats])
ref = np.load(Path("specforge") / "reference.npz")
print(f"{m} positions, random fused states (N(0, 1)) and tokens; SpecForge's vocabulary = specsim's draft vocabulary:",
      bool(np.array_equal(np.sort(ref["vocab"]), np.flatnonzero(ours[0, 0] > -1e8))))
for s in range(steps):
    a, b = ours[s, : m - s][..., ref["vocab"]], ref["logits"][s, : m - s]
    print(f"TTT step {s + 1}: max |specsim - SpecForge| = {np.abs(a - b).max():.2e} (logits up to {np.abs(b).max():.1f});"
          f" top-1 equal at {int((a.argmax(-1) == b.argmax(-1)).sum())}/{m - s} positions")
print(json.dumps({"head": head_dir, "sglang_dir": sglang_dir}))

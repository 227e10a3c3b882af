"""vLLM 0.32's own rejection sampler (its GPU worker's Triton kernels: token-wise rejection and block verification,
with the draft's laws and with one-hot drafts; run by Triton's interpreter in vLLM's environment) against
specsim's rules fed vLLM's own uniforms and Gumbel noise, at more chains than the test (tests/test_vllm_verify.py,
whose helpers this uses). Run from the repository root:
PYTHONPATH=. .venv/bin/python analyses/results/vllm-verify-cpu-2026-11-28/compare.py ROWS"""
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specsim.engines.vllm import vllm_python
from tests import test_vllm_verify as t

rows = int(sys.argv[1])
python = vllm_python()
print(f"{rows} random chains per length and draft kind, vocabulary 10; rows with a uniform within {t.GAP} of a "
      f"threshold, or an emitted token decided by a noise gap under {t.GAP}, are not compared")
print("gamma  drafts    rule        compared  agree  kept 0..gamma (vLLM)        block differs from: token-wise  "
      "block without eta")
for g in (1, 2, 3, 4, 5):
    for one_hot in (False, True):
        c = t._chains(np.random.default_rng(200 + g), rows, g)
        if one_hot:
            c["q"] = np.eye(c["p"].shape[-1])[c["drafts"]]
        start = time.time()
        got = t.run_script(python, "vllm_kernels.py", {"c": t._inputs(dict(c, q=None) if one_hot else c)},
                           Path(tempfile.mkdtemp()), timeout=900)["c"]
        seconds = time.time() - start
        seen = t.compare(c, got)
        for key in ("token_wise", "block"):
            hist = np.bincount(got[f"{key}_kept"], minlength=g + 1).tolist()
            extra = f"{seen['block vs token-wise']:>10}  {seen['block without eta']:>16}" if key == "block" else ""
            print(f"{g:>5}  {'one-hot' if one_hot else 'laws':<8}  {key:<10}  {seen[key][0]:>8}  {seen[key][1]:>5}  "
                  f"{str(hist):<26}  {extra}")
        print(f"       (vLLM's sampler, both rules: {seconds:.1f} s)", flush=True)

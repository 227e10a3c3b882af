"""SGLang 0.5.23's chain verification kernel (token-wise rejection sampling and block verification, run by
Triton's interpreter in vLLM's environment) against specsim's rules on the same uniforms, at more chains than the
test (tests/test_sglang_verify.py, whose helpers this uses). Run from the repository root:
PYTHONPATH=. .venv/bin/python analyses/results/sglang-verify-cpu-2026-11-28/compare.py ROWS"""
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specsim.engines.vllm import vllm_python
from tests import test_sglang_verify as t

rows = int(sys.argv[1])
python = vllm_python()
print(f"{rows} random chains per length, vocabulary 10; margin {t.MARGIN} (rows with a uniform that close to a "
      "threshold are not compared)")
print("gamma  rule        compared  agree  kept 0..gamma (kernel)         differs from: token-wise  block without eta")
for g in (1, 2, 3, 4, 5):
    c = t._chains(np.random.default_rng(100 + g), rows, g)
    start = time.time()
    got = t.run_script(python, "sglang_kernels.py", {"c": c}, Path(tempfile.mkdtemp()))["c"]
    seconds = time.time() - start
    for key, rule in (("token_wise", t._token_wise), ("block", t._block)):
        compared = agree = 0
        for r in range(rows):
            kept, token, margin = rule(c, r)
            if margin < t.MARGIN:
                continue
            compared += 1
            agree += (got[f"{key}_kept"][r], got[f"{key}_token"][r]) == (kept, token)
        hist = np.bincount(got[f"{key}_kept"], minlength=g + 1).tolist()
        extra = ""
        if key == "block":
            tw = sum(got["block_kept"][r] != t._token_wise(c, r)[0] for r in range(rows))
            eta = sum(got["block_kept"][r] != t._block(c, r, eta=False)[0] for r in range(rows))
            extra = f"{tw:>10}  {eta:>16}"
        print(f"{g:>5}  {key:<10}  {compared:>8}  {agree:>5}  {str(hist):<28}  {extra}")
    print(f"       (kernel run, both rules: {seconds:.1f} s)")

"""Each int8 kernel against the exact product, and the kernel specsim chooses, with oneDNN held to each ISA.

    for isa in "" AVX2 AVX512_CORE AVX2_VNNI AVX512_CORE_VNNI; do
        ONEDNN_MAX_CPU_ISA=$isa .venv/bin/python analyses/results/int8-kernel-cpu-2026-11-28/probe.py; done
"""
import os

import torch

from specsim.record import models

x, w, _ = models._probe_operands()
exact = (x.double() @ w.double()).to(torch.int64)
got = torch._int_mm(x, w)
random_rows = int((got[:-1].long() - exact[:-1]).abs().max())
print(f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}: torch._int_mm off by up to "
      f"{random_rows:,} on the random rows, {int((got.long() - exact).abs().max()):,} with the extreme row; "
      f"int8_kernels_here {models.int8_kernels_here()}; chosen: {models.cpu_int8_kernel()}")

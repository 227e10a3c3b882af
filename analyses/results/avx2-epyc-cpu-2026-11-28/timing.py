"""The two int8 kernels' speed on the probe's operands, 2 threads (run after probe.py; appended to probe.txt)."""
import time

import torch

from specsim.record import models

x, w, wf = models._probe_operands()
torch.set_num_threads(2)


def seconds(f):
    f()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < 2:
        f()
        n += 1
    return (time.perf_counter() - start) / n


a, b = seconds(lambda: torch._int_mm(x, w)), seconds(lambda: models.int8_matmul_float(x, wf))
print(f"probe operands {tuple(x.shape)} @ {tuple(w.shape)}, 2 threads: torch._int_mm {a * 1e3:.2f} ms, "
      f"float32 kernel {b * 1e3:.2f} ms ({a / b:.1f}x faster)")

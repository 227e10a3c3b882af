"""SpecForge's RMSNorm as it runs it (torch.compile(dynamic=True)) against eager, on three shapes; run in vLLM's
environment with and without ATEN_CPU_CAPABILITY=avx2:

    ATEN_CPU_CAPABILITY=avx2 .venv-vllm/bin/python analyses/results/int8-kernel-cpu-2026-11-28/inductor_avx2.py
"""
import torch
@torch.compile(dynamic=True)
def rms(x, w):
    h = x.to(torch.float32)
    v = h.pow(2).mean(-1, keepdim=True)
    return w * (h * torch.rsqrt(v + 1e-6))
torch.manual_seed(0)
for shape in [(1, 24, 64), (1, 24, 192), (1, 7, 64)]:
    x = torch.randn(shape); w = torch.rand(shape[-1]) + 0.5
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    y = rms(x, w)
    print(shape, "nan", bool(torch.isnan(y).any()), "maxdiff", float((y - ref).abs().nan_to_num(999).max()))
from torch._inductor import cpu_vec_isa
print("isa", cpu_vec_isa.pick_vec_isa(), torch.backends.cpu.get_cpu_capability())

import time, torch
torch.set_num_threads(2)
def bench(f, n=20):
    f(); t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e3
for rows in (1, 9, 36, 128):
  for (k, o) in ((576, 576), (576, 1536), (1536, 576), (576, 49152)):
    x = torch.randint(-127, 128, (rows, k), dtype=torch.int8)
    w = torch.randint(-127, 128, (k, o), dtype=torch.int8)
    wf = w.float(); wd = w.double(); xf = x.float()
    a = torch._int_mm(x, w) if rows > 0 else None
    def chunked():
        acc = None
        for s in range(0, k, 1024):
            part = (xf[:, s:s+1024] @ wf[s:s+1024]).to(torch.int32)
            acc = part if acc is None else acc + part
        return acc
    assert torch.equal(chunked(), a)
    assert torch.equal((x.double() @ wd).to(torch.int32), a)
    print(rows, k, o, "int_mm %.3f  fp32chunk %.3f  fp64 %.3f  fp32 %.3f ms" % (
        bench(lambda: torch._int_mm(x, w)), bench(chunked), bench(lambda: x.double() @ wd), bench(lambda: xf @ wf)), flush=True)

import time, numpy as np, torch
torch.set_num_threads(2)
from specsim.attention.profile import _Bench, _tree_layout, verify_tree_parents
from specsim.record.models import load_model
m = load_model("smollm2-135m", device="cpu", dtype="float32")
rng = np.random.default_rng(0)
pick = lambda l: l.argmax(-1)
with torch.inference_mode():
    for p in range(3):
        for B, L in ((1, 64), (4, 832), (1, 832)):
            depth, attend = _tree_layout(verify_tree_parents(5))
            once = _Bench(m.model, B, L, rng).run(depth, attend, pick)
            t = []
            for _ in range(5):
                s = time.perf_counter(); once(); t.append(time.perf_counter() - s)
            print(f"pass {p} B={B} L={L}: first {t[0]*1e3:.1f} ms, rest median {np.median(t[1:])*1e3:.1f} ms, ratio {t[0]/np.median(t[1:]):.2f}", flush=True)

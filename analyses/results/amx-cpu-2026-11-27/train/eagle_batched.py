"""EAGLE-1/2 training steps one at a time vs batched, same data and seed, one run each (this CPU)."""
import os
import tempfile
from pathlib import Path
import torch
torch.set_num_threads(2)
from specsim.record.models import load_model
from specsim.record.run import RecordRequest, record_cache
from specsim.record.train import TrainConfig, train
target = load_model("smollm2-135m")
with tempfile.TemporaryDirectory() as tmp:
    cache = Path(tmp) / "t.h5"
    record_cache(cache, RecordRequest(target="smollm2-135m", prompts="spec-bench", per_category=2, max_new_tokens=48,
                                      temperatures=(0.0,), store="stats", hidden=("last",)), progress=False)
    out = {}
    for batched in (False, True):
        cfg = TrainConfig(kind="eagle", steps=30, batch=8, lr=1e-3, holdout_every=5, save_every=31, batched=batched)
        train(cache, target, Path(tmp) / f"w{batched}", TrainConfig(**{**cfg.__dict__, "steps": 2, "save_every": 3}), progress=False)
        out[batched] = train(cache, target, Path(tmp) / str(batched), cfg, progress=False)
print(f"EAGLE head for smollm2-135m on cpu (2 threads), 30 steps of 8 trajectories; load average {os.getloadavg()[0]:.2f}")
for batched, o in out.items():
    print(f"{'batched' if batched else 'one at a time':<14} {o.seconds / o.steps:.3f} s/step  held-out loss {o.after['loss']:.4f}")
print(f"batched / one at a time: {out[False].seconds / out[True].seconds:.2f}x steps per second")

"""Why a profiled plain step can differ from a live one: one B = 1 plain step timed four ways in one process.

(a) live: `plain_decode` of one prompt, seconds per engine step (the engine's own clock);
(b) the profile's way: `_Bench` at the same context, synchronised before and after, alone in its rounds;
(c) (b) interleaved with the other entries a profile times at that (B, L) (N = 1..7), as `measure_cost_profile` does;
(d) (b) back to back, synchronised only at the end (launches overlap the GPU's work).
"""
import sys
import time

import numpy as np
import torch

from specsim.attention.profile import _Bench, _round_times, _tree_layout, verify_tree_parents
from specsim.live.decoder import Target, plain_decode
from specsim.record.models import load_model

path, device = sys.argv[1], sys.argv[2]
model = load_model(path, device=device, dtype="float32")
dev = torch.device(device)
prompt = np.array(model.tokenizer("Write a short story about a lighthouse keeper who finds a message in a bottle.")
                  ["input_ids"], dtype=np.int64)
pick = lambda logits: logits.argmax(dim=-1).cpu()  # noqa: E731
rng = np.random.default_rng(0)
with torch.inference_mode():
    for rep in range(3):
        out = plain_decode(Target(model.model, set()), prompt, temperature=0.0, max_new_tokens=64, rng=rng)
    steps = np.array([s.verify_s for s in out.steps])
    live = out.seconds / len(out.steps)
    L = len(prompt) + 32
    bench = _Bench(model.model, 1, L, rng)
    runs = {}
    for n in range(1, 8):
        depth, attend = _tree_layout(verify_tree_parents(n))
        runs[n] = bench.run(depth, attend, pick)
    alone = float(np.median(_round_times({1: runs[1]}, dev, warmup=3, repeats=30, rng=rng)[1]))
    mixed = float(np.median(_round_times(runs, dev, warmup=2, repeats=30, rng=rng)[1]))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(30):
        runs[1]()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    overlapped = (time.perf_counter() - t0) / 30
print(f"B=1 plain step, context ~{L}, {device}:")
print(f"  (a) live plain_decode: {live * 1e3:.2f} ms/step (verify_s median {np.median(steps) * 1e3:.2f} ms, "
      f"{len(out.steps)} steps)")
print(f"  (b) profile entry alone, synchronised: {alone * 1e3:.2f} ms  ({alone / live:.3f} x live)")
print(f"  (c) profile entry among N=1..7, random order: {mixed * 1e3:.2f} ms  ({mixed / live:.3f} x live)")
print(f"  (d) back to back, one sync: {overlapped * 1e3:.2f} ms  ({overlapped / live:.3f} x live)")

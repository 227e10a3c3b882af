"""Paired comparison of the two heads on the same 83 held-out trajectories: top-1 agreement per depth, each head
with the context it was trained with, and a 95% bootstrap CI of the difference over trajectories (2,000
resamples, seed 0). Run in the folder run.sh ran in (train.h5, head-context, head-none)."""

import numpy as np
import torch

from specsim.record import train as training
from specsim.record.head_checkpoints import load_heads
from specsim.record.models import load_model

target = load_model("smollm2-135m")
hits = {}
for use in ("context", "none"):
    head = load_heads(f"eagle3:head-{use}", target)
    seqs = training.load_sequences("train.h5", target, head.config.hidden_layers, use)
    _, held = training.split(seqs, 5)
    rows = []
    with torch.no_grad():
        for seq in held:
            depths = training.terms("eagle3", head.module, target, seq, 4).depths
            rows.append([(int((q.argmax(-1) == y).sum()), int(y.shape[0])) for q, _, y in depths])
    hits[use] = np.asarray(rows)  # (trajectories, depth, [hits, count])

a, b = hits["context"], hits["none"]
assert np.array_equal(a[..., 1], b[..., 1])  # the same positions
rng = np.random.default_rng(0)
picks = rng.integers(0, len(a), size=(2000, len(a)))
print(f"{len(a)} held-out trajectories, {int(a[:, 0, 1].sum())} positions at depth 1")
for d in range(a.shape[1]):
    top = lambda h, idx=slice(None): h[idx, d, 0].sum(-1) / h[idx, d, 1].sum(-1)  # noqa: E731
    diff = np.array([top(a, p) - top(b, p) for p in picks])
    lo, hi = np.percentile(diff, [2.5, 97.5])
    print(f"depth {d + 1}: context {top(a):.4f}, none {top(b):.4f}, difference {top(a) - top(b):+.4f} "
          f"[{lo:+.4f}, {hi:+.4f}]")

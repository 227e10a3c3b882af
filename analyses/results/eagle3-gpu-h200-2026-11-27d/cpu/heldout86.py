"""Training-time-test agreement of EAGLE-3 heads on the same held-out trajectories: loss, top-1 and overlap per depth
on the 86 held-out trajectories of ../../eagle3-scale-cpu-2026-11-26's train.h5 (every 10th recorded prompt, T = 0 and
0.7: 43 of the 46 held-out Spec-Bench prompts of the paired replays), the prompt as context, one
trajectory at a time (`train_loss.evaluate`, what train-draft reports at its end). ../../eagle3-samples-cpu-2026-11-27's
heldout86.py with today's API (the cache's prompt indices read directly).

    PYTHONPATH=. python analyses/results/eagle3-gpu-h200-2026-11-27d/cpu/heldout86.py /work/e3big/train.h5 HEAD_DIR...
"""

import sys

import torch

from specsim.cache.reader import CacheReader
from specsim.record.head_checkpoints import load_heads
from specsim.record.models import load_model
from specsim.record.train import TrainConfig
from specsim.record.train_data import held_out, load_sequences
from specsim.record.train_loss import evaluate

cache, heads = sys.argv[1], sys.argv[2:]
torch.set_num_threads(2)
target = load_model("smollm2-135m")
loaded = [load_heads(f"eagle3:{h}", target) for h in heads]
layers = {head.module.config.hidden_layers for head in loaded}
assert len(layers) == 1, layers
with CacheReader(cache) as reader:
    held_ids = {row.prompt_index for row in reader.iter_trajectories() if held_out(row.prompt_index, 10)}
held = [s for _, s in load_sequences(cache, target, layers.pop(), "context", prompts=held_ids)]
print(f"{cache}: {len(held)} held-out trajectories of {len(held_ids)} prompts, "
      f"{sum(int(s.tokens.shape[0]) - s.context for s in held)} generated positions")
config = TrainConfig(kind="eagle3", batch=8, holdout_every=10, ttt_steps=4)
for path, head in zip(heads, loaded):
    head.module.eval()
    out = evaluate("eagle3", head.module, target, held, config, together=False)
    print(f"{path}: loss {out['loss']:.3f}; top-1 " + " / ".join(f"{v:.3f}" for v in out["top1"].values())
          + "; overlap " + " / ".join(f"{v:.3f}" for v in out["overlap"].values()))

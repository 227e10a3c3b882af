"""Held-out evaluation of the full-data EAGLE-3 head of ../eagle3-scale-cpu-2026-11-26 one trajectory at a time
and config.batch = 8 at a time (`evaluate(..., together=)`), in one run, alternating, on its 86 held-out
trajectories (every 10th prompt of its train.h5): seconds and the numbers, which must agree.

    PYTHONPATH=. python analyses/results/eagle3-data-curve-cpu-2026-11-27/eval_timing.py /work/e3big
"""

import sys
import time
from pathlib import Path

import torch

from specsim.record.head_checkpoints import load_heads
from specsim.record.models import load_model
from specsim.record.train import TrainConfig
from specsim.record.train_data import load_sequences, recorded_prompts
from specsim.record.train_loss import evaluate

where = Path(sys.argv[1])
torch.set_num_threads(2)
target = load_model("smollm2-135m")
head = load_heads(f"eagle3:{where / 'head'}", target)
config = TrainConfig(kind="eagle3", batch=8, holdout_every=10, ttt_steps=4, draft_vocab=16384)
held_ids = {i for i in recorded_prompts(where / "train.h5") if i % 10 == 9}
seqs = load_sequences(where / "train.h5", target, head.module.config.hidden_layers, "context", prompts=held_ids)
held = [s for _, s in seqs]  # every trajectory loaded is held out
print(f"{len(held)} held-out trajectories, {sum(int(s.tokens.shape[0]) - s.context for s in held)} generated "
      f"positions; torch threads {torch.get_num_threads()}")
head.module.eval()
for rep in range(2):
    for batched in (False, True):
        started = time.perf_counter()
        out = evaluate("eagle3", head.module, target, held, config, together=batched)
        seconds = time.perf_counter() - started
        print(f"round {rep + 1}, {'batched, 8 at a time' if batched else 'one at a time'}: {seconds:.1f} s; loss "
              f"{out['loss']:.5f}, top-1 " + ", ".join(f"{v:.4f}" for v in out["top1"].values())
              + "; overlap " + ", ".join(f"{v:.4f}" for v in out["overlap"].values()))

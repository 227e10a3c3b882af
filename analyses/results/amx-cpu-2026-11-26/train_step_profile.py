"""Where a training step's time goes, float32 against bfloat16 autocast: SmolLM2's EAGLE-3 head on the AMX
session's recording (train_precision.sh's train.h5), each precision twice in turn: 3 warm-up steps, then 10 steps
under torch.profiler (self CPU time by op). The steps are train-draft's (`terms`, `loss`, AdamW) on a head built
as train-draft builds it (its LM head the target's first 16,384 rows: the timing, not the fit, is measured). Run
from the repository root: PYTHONPATH=. .venv/bin/python analyses/results/amx-cpu-2026-11-26/train_step_profile.py
OUTDIR/train.h5"""
import sys
import time

import numpy as np
import torch

from specsim.record.head_checkpoints import build, head_config_for
from specsim.record.models import load_model
from specsim.record.train import TrainConfig
from specsim.record.train_data import load_sequences, split
from specsim.record.train_loss import loss, terms

cache = sys.argv[1]
target = load_model("smollm2-135m")
config = TrainConfig(kind="eagle3", ttt_steps=4, batch=4)
hc = head_config_for("eagle3", target, aux_layers=(2, 15, 27), draft_vocab_size=16384)
seqs = load_sequences(cache, target, hc.hidden_layers)
train_seqs, _ = split(seqs, 5)
module = build(hc)
lm = target.model.get_output_embeddings().weight.detach()
with torch.no_grad():
    module.lm_head.weight.copy_(lm[:16384])
    module.d2t.zero_()
module.lm_head.weight.requires_grad_(False)
for p in target.model.parameters():
    p.requires_grad_(False)
opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-3)
rng = np.random.default_rng(0)
batches = [rng.choice(len(train_seqs), size=4, replace=False) for _ in range(13)]


def step(batch, precision):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
        total = sum(loss(terms("eagle3", module, target, train_seqs[i], 4, full=False,
                               loss_from=train_seqs[i].loss_from(config)), config) for i in batch) / 4
    total.backward()
    opt.step()


module.train()
for precision in ("float32", "bfloat16", "float32", "bfloat16"):
    for b in batches[:3]:
        step(b, precision)
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for b in batches[3:]:
            step(b, precision)
    wall = time.perf_counter() - t0
    print(f"== {precision}: 10 steps {wall:.2f} s (profiled)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))

"""Router loads of a DeepSeek-V3 MTP layer trained with and without DeepSeek-V3's bias balancing
(`RouterBalance`), on the tiny DeepSeek-V3 target of tests/test_mtp.py: the share of routed tokens per expert over
every recorded trajectory, after STEPS training steps at γ = 0, 0.001 and 0.01. Run from the repository root:
PYTHONPATH=. .venv/bin/python analyses/results/amx-cpu-2026-11-26/router_probe.py STEPS"""

import json
import sys
import tempfile
from pathlib import Path

import torch

from specsim.record.head_checkpoints import load_heads
from specsim.record.models import load_model
from specsim.record.run import RecordRequest, record_cache
from specsim.record.train import TrainConfig, train
from specsim.record.train_data import load_sequences
from specsim.record.train_loss import terms
from tests.conftest import TINY_PROMPTS
from tests.test_mtp import build_deepseek_target

d = Path(tempfile.mkdtemp())
t = build_deepseek_target(d / "t")
prompts = d / "p.jsonl"
prompts.write_text("".join(json.dumps(p) + "\n" for p in TINY_PROMPTS * 3))
record_cache(d / "train.h5", RecordRequest(target=str(t), prompts=str(prompts), max_new_tokens=48, device="cpu",
                                           hidden=("last",)), progress=False)
target = load_model(str(t))
for speed in (0.0, 0.001, 0.01):
    out = d / f"h{speed}"
    config = TrainConfig(kind="mtp", steps=int(sys.argv[1]), lr=1e-2, batch=2, holdout_every=4, ttt_steps=2,
                         router_bias_speed=speed)
    oc = train(d / "train.h5", target, out, config, progress=False)
    head = load_heads(f"mtp:{out}", target).module
    router = head.layers[0].mlp.gate
    loads = torch.zeros(router.e_score_correction_bias.numel())
    def count(m, i, o):
        loads.add_(torch.bincount(o[2].reshape(-1), minlength=loads.numel()))
    router.register_forward_hook(count)
    seqs = load_sequences(d / "train.h5", target, ("last",))
    with torch.no_grad():
        for _, s in seqs:
            terms("mtp", head, target, s, 2)
    share = loads / loads.sum()
    print(f"speed {speed}: held-out loss {oc.after['loss']:.3f} top-1 d1 {oc.after['top1'][1]:.3f}; bias "
          f"{[round(b, 3) for b in router.e_score_correction_bias.tolist()]}; token share per expert "
          f"{[round(x, 3) for x in share.tolist()]} (max {share.max():.3f}, balanced {1 / len(share):.3f})")

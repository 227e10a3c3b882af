"""Where an EAGLE-3 training step's time goes on the device, for the next session's call A (the 11-28 session
measured the GPU 60-63% busy while training at batch 64 and 128, with the process at 255% CPU: host-bound).

    python3 profile_train.py TARGET CACHE OUT_DIR [BATCH] [STEPS] [VOCAB]

Three short trainings on CACHE, the same settings as call B's (`--draft-vocab 16384 --ttt-steps 4`, `--hidden-batch
65536`), BATCH trajectories a step (default 64), STEPS steps each (default 12), a draft vocabulary of VOCAB
(default 16384):
1. the 11-28 step (`train_loss_1128.py` beside this script: specsim/record/train_loss.py at 71cf563, which
   `payload.sh` writes there) with the trajectories in host memory, as the 11-28 run trained: each step copied
   them over and read lengths and rows back from the device;
2. the same step with the trajectories moved to the device once (the copies in a step become no-ops);
3. train-draft's step now: moved once (`to_device`) and nothing read back before the loss (tests/test_train_sync.py).
For each: seconds per step over the last STEPS - 2 (after warm-up, synchronised; all under the profiler), and
torch.profiler's table of the heaviest operators by host time and by device time over those steps.
OUT_DIR/profile_train.txt (the heads go to a temporary folder).
"""
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from specsim.record import train as T
from specsim.record.models import load_model

target_path, cache, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
batch = int(sys.argv[4]) if len(sys.argv) > 4 else 64
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 12
vocab = int(sys.argv[6]) if len(sys.argv) > 6 else 16384
device = "cuda" if torch.cuda.is_available() else "cpu"
target = load_model(target_path, device=device)
spec = importlib.util.spec_from_file_location("train_loss_1128", Path(__file__).with_name("train_loss_1128.py"))
old = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = old  # its dataclasses look their module up
spec.loader.exec_module(old)
real_move, real_loss = T.to_device, T.batch_loss
lines = [f"device {device}; batch {batch}; {steps} steps per run, the first 2 not timed"]

variants = (("11-28's step, trajectories in host memory (as 11-28 trained)", lambda seqs, dev: (seqs, None),
             old.batch_loss),
            ("11-28's step, trajectories moved to the device once", real_move, old.batch_loss),
            ("train-draft now: moved once, nothing read back before the loss", real_move, real_loss))
for name, move, step_loss in variants:
    stamps = []

    def timed_loss(*args, **kwargs):
        if device == "cuda":
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        return step_loss(*args, **kwargs)

    T.to_device, T.batch_loss = move, timed_loss
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    tables = []

    def ready(p):  # the tables of the active steps, taken when their cycle ends (after it they are gone)
        tables.append(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
        if device == "cuda":
            tables.append(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=12))

    prof = profile(activities=activities, schedule=torch.profiler.schedule(wait=0, warmup=2, active=steps - 2),
                   on_trace_ready=ready)
    real_step = torch.optim.AdamW.step

    def stepping(self, *a, **k):  # the profiler's schedule advances with each optimiser step
        result = real_step(self, *a, **k)
        prof.step()
        return result

    torch.optim.AdamW.step = stepping
    config = T.TrainConfig(kind="eagle3", steps=steps, batch=batch, lr=1e-3, holdout_every=10, save_every=10_000,
                           ttt_steps=4, draft_vocab=vocab)
    with prof:
        T.train(cache, target, Path(tempfile.mkdtemp()) / "head", config, progress=False, hidden_batch=65536)
    torch.optim.AdamW.step = real_step
    per_step = (stamps[-1] - stamps[2]) / (len(stamps) - 3) if len(stamps) > 3 else float("nan")
    lines += ["", f"== {name}: {per_step:.4f} s a step (steps 3..{len(stamps)}, synchronised)"]
    lines += tables
T.to_device, T.batch_loss = real_move, real_loss
out.mkdir(parents=True, exist_ok=True)
(out / "profile_train.txt").write_text("\n".join(lines) + "\n")
print("\n".join(line for line in lines if line.startswith(("device", "=="))))

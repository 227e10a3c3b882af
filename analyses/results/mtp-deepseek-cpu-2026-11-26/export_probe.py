"""A layer train-draft writes for the test's DeepSeek-V3 target, written out by `validate --engine vllm` as the
target's model.layers.2 and run by vLLM's mtp method: counters and steps against the replay. OUT: a scratch
folder (a probe_variants.py OUT, whose target it reuses, or a new one). Run from the repository root:
PYTHONPATH=. .venv/bin/python analyses/results/mtp-deepseek-cpu-2026-11-26/export_probe.py OUT"""

import os
import sys
from pathlib import Path

out = Path(sys.argv[1]).resolve()
os.environ["SPECSIM_HOME"] = str(out / "home")  # where the written-out checkpoint goes

from specsim.engines.check import EngineValidateConfig, validate_with_vllm  # noqa: E402
from specsim.record.models import load_model  # noqa: E402
from specsim.record.run import RecordRequest, record_cache  # noqa: E402
from specsim.record.train import TrainConfig, train  # noqa: E402
from tests.conftest import TINY_PROMPTS, write_prompts  # noqa: E402
from tests.test_mtp import build_deepseek_target  # noqa: E402

target = out / "target"
if not target.is_dir():
    build_deepseek_target(target)
prompts = write_prompts(out / "prompts.jsonl")
train_prompts = write_prompts(out / "train-prompts.jsonl", [dict(p, question_id=10 + i) for i, p in
                                                             enumerate(TINY_PROMPTS * 2)])
(out / "train.h5").unlink(missing_ok=True)
record_cache(out / "train.h5", RecordRequest(target=str(target), prompts=str(train_prompts), max_new_tokens=24,
                                             device="cpu", hidden=("last",)), progress=False)
outcome = train(out / "train.h5", load_model(str(target)), out / "head",
                TrainConfig(kind="mtp", steps=60, lr=1e-2, batch=4, holdout_every=4, ttt_steps=3, ttt_decay=0.6),
                progress=False)
print("held-out before:", outcome.before)
print("held-out after: ", outcome.after)
draft = f"mtp:{out / 'head'}"
(out / "eval.h5").unlink(missing_ok=True)
record_cache(out / "eval.h5", RecordRequest(target=str(target), drafts=(draft,), prompts=str(prompts),
                                            max_new_tokens=24, device="cpu", store="stats", overhang=8),
             progress=False)
report = validate_with_vllm(out / "eval.h5", EngineValidateConfig(trees=("chain:3",), drafts=(draft,)))
for check in report.checks:
    print(check.kind, "PASS" if check.passed else "FAIL", getattr(check, "detail", ""))

"""Device smoke: record with EAGLE-3's states and train an EAGLE-3 head, on a tiny random model (no weights to carry),
through the same commands the real job runs."""
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import build_tiny_model

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
work = Path(tempfile.mkdtemp())
tiny = build_tiny_model(work / "tiny", hidden=64, layers=8)
config = json.loads((tiny / "config.json").read_text())
config["max_position_embeddings"] = 8192  # byte-level prompts are long
(tiny / "config.json").write_text(json.dumps(config))
prompts = work / "p.jsonl"
prompts.write_text("".join(Path(".gpu/train_prompts.jsonl").read_text().splitlines(keepends=True)[::12]))
t0 = time.perf_counter()
run = [sys.executable, "-m", "specsim"]
subprocess.run(run + ["cache", "--target", str(tiny), "--prompts", str(prompts), "--max-new-tokens", "12",
                      "--temperature", "0,0.7", "--hidden-states", "last,2,4,5", "--store", "stats", "--batch-size",
                      "32", "--device", device, "--out", str(work / "t.h5"), "--quiet"], check=True)
subprocess.run(run + ["train-draft", "--kind", "eagle3", "--target", str(tiny), "--from", str(work / "t.h5"),
                      "--ttt-steps", "4", "--steps", "30", "--batch", "16", "--holdout-every", "10",
                      "--save-every", "10", "--device", device, "--out", str(work / "head"), "--quiet"], check=True)
print(sorted(p.name for p in (work / "head").iterdir()))
print(f"smoke ok in {time.perf_counter() - t0:.0f} s")

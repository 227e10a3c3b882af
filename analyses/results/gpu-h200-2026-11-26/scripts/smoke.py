"""Device smoke: bench_speedup end to end on a tiny random model (no weights to carry)."""
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import build_tiny_model

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
tiny = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", hidden=64, layers=4)
import json  # noqa: E402

config = json.loads((tiny / "config.json").read_text())
config["max_position_embeddings"] = 8192  # byte-level prompts are long
(tiny / "config.json").write_text(json.dumps(config))
t0 = time.perf_counter()
from benchmarks import bench_speedup  # noqa: E402

bench_speedup.main(["--target", str(tiny), "--device", device, "--batches", "1,4", "--drafts", "int8,layers:2",
                    "--categories", "writing,coding,math_reasoning,rag", "--per-category", "1",
                    "--max-new-tokens", "8", "--tree", "chain:2", "--tree", "kary:2,2", "--repeats", "2"])
print(f"smoke ok in {time.perf_counter() - t0:.0f} s")

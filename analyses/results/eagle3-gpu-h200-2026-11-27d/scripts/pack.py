"""Pack an EAGLE-3 head for the trip back from the device (files back are limited to 16 MiB each, 64 MiB in all):
its trained tensors without the LM head, which train-draft copies frozen from the target's LM head rows of the draft
vocabulary (rebuilt here by unpack.py, and checked against the sha256 of its bytes recorded below), split into
15 MB parts, and the config. Usage: python pack.py HEAD_DIR NAME OUT_DIR"""
import hashlib
import json
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

head, name, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
if not (head / "model.safetensors").exists():
    print(f"{head}: no model.safetensors", file=sys.stderr)
    sys.exit(0)
tensors = load_file(head / "model.safetensors")
lm = tensors.pop("lm_head.weight")
sums = {"model.safetensors": hashlib.sha256((head / "model.safetensors").read_bytes()).hexdigest(),
        "lm_head.weight": hashlib.sha256(lm.contiguous().numpy().tobytes()).hexdigest(),
        "lm_head.shape": list(lm.shape)}
trained = head.parent / f"{name}.trained.safetensors"
save_file(tensors, trained)
blob = trained.read_bytes()
sums["trained.safetensors"] = hashlib.sha256(blob).hexdigest()
part = 15 * 1000 * 1000
for k in range(0, len(blob), part):
    (out / f"{name}.trained.part{k // part}").write_bytes(blob[k:k + part])
(head.parent / f"{name}-sums.json").write_text(json.dumps(sums, indent=1))
(head.parent / f"{name}-config.json").write_text((head / "config.json").read_text())
print(f"{name}: {len(blob):,} bytes in {-(-len(blob) // part)} parts; sums {sums}")

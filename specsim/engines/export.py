"""Drafts as model directories an engine loads: what vLLM's `draft_model` method is given.

A draft that is a model already (a packaged short name, a local directory, a GGUF converted
into the model store, a hub id) is given as it is. A derived draft, `layers:K` (the target's
first K decoder layers, final norm and LM head), is written out once as a Hugging Face
directory (safetensors, the target's tokenizer and generation config) into the model store,
`<specsim home>/models/exported/<target>-layers-K`, and reused while the target's weights are
the same (a marker file records their sha256). It is written into a temporary directory and
renamed into place, so a crash leaves no half-written model under that name. `int8` has no
such form: it is specsim's own batch-invariant W8A8 module.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Callable

from specsim.errors import EngineError

MARKER = "specsim-export.json"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def model_directory(spec: str, info: dict | None = None) -> str:
    """Where an engine loads model `spec` from: a directory, or a hub id; `info` is the cache's record of it."""
    from specsim.record import packaged

    info = info or {}
    if spec in packaged.PACKAGED:
        if not packaged.is_installed(spec):
            raise EngineError(f"packaged model {spec} is not installed; run: specsim models fetch {spec}")
        return str(packaged.hf_dir(spec))
    for key in ("converted", "path"):
        if info.get(key) and Path(info[key]).is_dir():
            return str(info[key])
    path = Path(spec).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if spec.lower().endswith(".gguf"):
        raise EngineError(f"{spec}: convert the GGUF first (`specsim cache` does, into the model store)")
    return info.get("id") or spec  # a hub id: the engine resolves it


def draft_directory(draft: str, target: str, *, target_info: dict | None = None, draft_info: dict | None = None,
                    echo: Callable[[str], None] = lambda line: None) -> str:
    """A directory (or hub id) holding `draft`, a draft of `target`, as vLLM's draft_model method loads it."""
    m = re.fullmatch(r"layers:(\d+)", draft)
    if m:
        return str(export_layers(target, int(m.group(1)), target_info=target_info, echo=echo))
    if draft == "int8":
        raise EngineError("draft int8 is specsim's batch-invariant W8A8 module; no engine loads it: use layers:K or "
                          "a draft model directory")
    return model_directory(draft, draft_info)


def export_layers(target: str, k: int, *, target_info: dict | None = None, out: Path | None = None,
                  echo: Callable[[str], None] = lambda line: None) -> Path:
    """`layers:k` of `target` as a Hugging Face model directory (the module docstring); its path."""
    from specsim.record import packaged

    sha = (target_info or {}).get("sha256") or _weights_sha(target)
    out = Path(out) if out is not None else packaged.model_store() / "exported" / f"{_safe(target)}-layers-{k}"
    marker = out / MARKER
    want = {"target": target, "layers": k, "target_sha256": sha}
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == want:
                return out
        except (OSError, ValueError):
            pass
    echo(f"writing draft layers:{k} of {target} as a model directory: {out}")
    from specsim.record.models import load_draft, load_model

    loaded = load_model(target, device="cpu", dtype="float32")
    draft = load_draft(f"layers:{k}", loaded)
    tmp = out.with_name(out.name + ".writing")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        draft.model.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(want))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EngineError(f"cannot write {out} ({exc.strerror or exc})") from None
    return out


def _weights_sha(target: str) -> str | None:
    """sha256 of a packaged target's weights (None for other targets: the export is then keyed by name only)."""
    from specsim.record import packaged

    if target in packaged.PACKAGED and packaged.is_installed(target):
        return packaged.installed_info(target).get("sha256")
    return None

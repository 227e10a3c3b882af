"""Drafts as model directories an engine loads: what vLLM's `draft_model` method is given.

A draft that is a model already (a packaged short name, a local directory, a GGUF converted
into the model store, a hub id) is given as it is. A derived draft, `layers:K` (the target's
first K decoder layers, final norm and LM head), is written out once as a Hugging Face
directory (safetensors, the target's tokenizer and generation config) into the model store,
`<specsim home>/models/exported/<target>-layers-K`, and reused while the target's weights are
the same (a marker file records their sha256). It is written into a temporary directory and
renamed into place, so a crash leaves no half-written model under that name. `int8` has no
such form: it is specsim's own batch-invariant W8A8 module.

Heads `train-draft` wrote are written out the same way in the layout each engine loads: `eagle:`
as vLLM's eagle layout, and for SGLang as EAGLE's layout under SGLang's class name
(`export_eagle_sglang`); `eagle3:` as the EAGLE-3 reference layout SGLang's EAGLE3 algorithm loads
(`sglang_directory`; vLLM loads `train-draft`'s own speculators layout as it is), `mtp:` as a
target checkpoint with the head as its MTP layer.
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
    draft = recorded_head(draft, draft_info)
    m = re.fullmatch(r"layers:(\d+)", draft)
    if m:
        return str(export_layers(target, int(m.group(1)), target_info=target_info, echo=echo))
    if draft == "int8":
        raise EngineError("draft int8 is specsim's batch-invariant W8A8 module; no engine loads it: use layers:K or "
                          "a draft model directory")
    if draft.startswith("eagle:"):
        return str(export_eagle(draft, target, target_info=target_info, echo=echo))
    if draft.startswith("mtp:"):
        return mtp_directory(draft, target, target_info=target_info, echo=echo)
    if draft.startswith("eagle3:"):  # speculators' layout (what train-draft writes) or the reference one: as it is
        where = Path(draft.partition(":")[2]).expanduser()
        return str(where.resolve()) if where.is_dir() else model_directory(draft.partition(":")[2])
    return model_directory(draft, draft_info)


MTP_EXPORTS = {("mimo", "qwen2"), ("deepseek", "deepseek_v3")}  # (train-draft's style, target) vLLM runs


def mtp_directory(draft: str, target: str, *, target_info: dict | None = None, out: Path | None = None,
                  echo: Callable[[str], None] = lambda line: None) -> str:
    """`mtp:DIR` as vLLM's mtp method runs it: from the target's own checkpoint, with the MTP layers inside.

    DIR is the target's directory (native MTP layers): used as it is. DIR is a head `train-draft --kind mtp`
    wrote, MiMo-style for a Qwen2 target or DeepSeek-style for a DeepSeek-V3 target: the target is written out
    once into the model store as a checkpoint with that MTP layer inside (its own weights and tokenizer, the
    head's `model.mtp_layers.0.*` with config.json naming MiMoForCausalLM, or `model.layers.{L}.*` with the
    target's LM head as the layer's `shared_head.head`; num_nextn_predict_layers 1), which vLLM loads as the
    target and the draft both — the same target weights, so the same outputs. Anything else is refused with the
    reason."""
    from specsim.record.head_checkpoints import WEIGHTS

    where = Path(draft.partition(":")[2]).expanduser()
    target_dir = Path(model_directory(target, target_info))
    if where.is_dir() and target_dir.is_dir() and where.resolve() == target_dir.resolve():
        return str(where.resolve())
    try:
        raw = json.loads((where / "config.json").read_text()) if (where / "config.json").is_file() else {}
        target_config = json.loads((target_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"draft {draft}: cannot read its or the target's config.json ({exc})") from None
    if raw.get("speculators_model_type") == "mtp":
        raise EngineError(f"draft {draft}: speculators' MTP layout has no loader in vLLM 0.32 (its "
                          "speculators configs are EAGLE-3, P-EAGLE and DFlash); specsim replays and decodes it itself")
    head = raw.get("specsim")
    if not head or head.get("kind") != "mtp":
        raise EngineError(f"draft {draft}: vLLM's mtp method runs the MTP layers inside the target's checkpoint; "
                          f"give mtp:{target_dir} (a target with num_nextn_predict_layers) or a head train-draft "
                          "--kind mtp wrote")
    style = head.get("mtp_style")
    if (style, target_config.get("model_type")) not in MTP_EXPORTS:
        raise EngineError(f"draft {draft}: vLLM runs a trained MTP layer as MiMo's (a Qwen2 target, --mtp-style "
                          f"mimo) or DeepSeek-V3's (a DeepSeek-V3 target); this one is {style}-style on a "
                          f"{target_config.get('model_type')} target, which no vLLM model class runs")
    weights = where / WEIGHTS["mtp"]

    def fill(tmp: Path) -> None:
        from safetensors.torch import load_file, save_file

        from specsim.record.models import load_model

        loaded = load_model(str(target_dir), device="cpu", dtype="float32")
        loaded.model.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)
        state = {**load_file(str(tmp / "model.safetensors")), **load_file(str(weights))}
        config = json.loads((tmp / "config.json").read_text())
        if "lm_head.weight" not in state:  # tied: vLLM's MTP layers load their LM head by name, so write it out
            state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
            config["tie_word_embeddings"] = False
        if style == "deepseek":  # vLLM's DeepSeek MTP layer has an LM head of its own: the target's, as trained
            shared_head = f"model.layers.{head['mtp_index']}.shared_head.head.weight"
            state.setdefault(shared_head, state["lm_head.weight"].clone())
            config.setdefault("topk_method", "noaux_tc")  # DeepSeek-V3's router, which vLLM reads from the config
            config.setdefault("scoring_func", "sigmoid")
        else:
            config["architectures"] = ["MiMoForCausalLM"]
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config.update(num_nextn_predict_layers=1)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return str(_write_head(where, weights, target, style, out, fill, echo,
                           f"{target} with MTP head {where} as a {style} checkpoint vLLM's mtp method runs"))


def eagle_config(head: dict, target_config: dict) -> dict:
    """config.json of an EAGLE-1 head as vLLM's `eagle` method reads it (vllm/transformers_utils/configs/eagle.py
    renames the architecture LlamaForCausalLM to EagleLlamaForCausalLM, model_executor/models/llama_eagle.py):
    a one-layer Llama of the target's shape. `head` is the head's HeadConfig (specsim's config.json "specsim")."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": head["hidden_size"], "intermediate_size": head["intermediate_size"],
            "num_attention_heads": head["num_attention_heads"], "num_key_value_heads": head["num_key_value_heads"],
            "head_dim": head["head_dim"], "num_hidden_layers": head["layers"], "rms_norm_eps": head["rms_norm_eps"],
            "rope_theta": head["rope_theta"], "rope_scaling": None, "vocab_size": head["vocab_size"],
            "attention_bias": head["attention_bias"], "mlp_bias": False, "hidden_act": "silu",
            "max_position_embeddings": int(target_config.get("max_position_embeddings", 8192)),
            "tie_word_embeddings": False, "torch_dtype": "float32",
            "bos_token_id": target_config.get("bos_token_id"), "eos_token_id": target_config.get("eos_token_id")}


def export_eagle(draft: str, target: str, *, target_info: dict | None = None, out: Path | None = None,
                 echo: Callable[[str], None] = lambda line: None) -> Path:
    """`eagle:DIR` as the directory vLLM's eagle method loads; its path.

    A published EAGLE-1/2 checkpoint (a config.json with a model_type) is given as it is. A head
    `specsim train-draft` wrote (config.json {"specsim": ...}) is written out once, into the model
    store, with the weights as they are (fc.weight, layers.0.*: EAGLE's own names, which vLLM's
    loader prefixes with "model.") and a Llama config (`eagle_config`); vLLM shares the target's
    embeddings and LM head where the head has none, as specsim does.
    """
    from specsim.record.head_checkpoints import WEIGHTS

    where, raw = _local_head(draft)
    if where is None:
        return model_directory(draft.partition(":")[2])  # a hub id: vLLM resolves it
    if "specsim" not in raw:
        if "model_type" not in raw:
            raise EngineError(f"{where}: its config.json has no model_type; vLLM's eagle method cannot load it")
        return where.resolve()
    head = raw["specsim"]
    if head.get("kind") != "eagle":
        raise EngineError(f"{where} holds {head.get('kind')} heads: vLLM's eagle method loads EAGLE heads")
    if head.get("fc_bias"):
        raise EngineError(f"{where}: its fc has a bias, which vLLM's EAGLE (llama_eagle.py) does not load")
    weights = where / WEIGHTS["eagle"]

    def fill(tmp: Path) -> None:
        shutil.copyfile(weights, tmp / "model.safetensors")
        config = eagle_config(head, _target_config(target, target_info))
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return _write_head(where, weights, target, "eagle", out, fill, echo, f"EAGLE head {where} as vLLM's eagle layout")


def sglang_directory(draft: str, target: str, *, target_info: dict | None = None, draft_info: dict | None = None,
                     echo: Callable[[str], None] = lambda line: None) -> str:
    """A directory (or hub id) holding `draft` as SGLang's `--speculative-draft-model-path` loads it: an EAGLE-3
    head in the reference layout (`export_eagle3_sglang`), an EAGLE-1/2 head in EAGLE's layout under SGLang's
    architecture (`export_eagle_sglang`), any other draft as vLLM's draft_model method has it."""
    draft = recorded_head(draft, draft_info)
    if draft.startswith("eagle3:"):
        return str(export_eagle3_sglang(draft, target, target_info=target_info, echo=echo))
    if draft.startswith("eagle:"):
        return str(export_eagle_sglang(draft, target, target_info=target_info, echo=echo))
    return draft_directory(draft, target, target_info=target_info, draft_info=draft_info, echo=echo)


SGLANG_EAGLE = "LlamaForCausalLMEagle"  # SGLang's EAGLE-1/2 class (srt/models/llama_eagle.py), picked by name


def export_eagle_sglang(draft: str, target: str, *, target_info: dict | None = None, out: Path | None = None,
                        echo: Callable[[str], None] = lambda line: None) -> Path:
    """`eagle:DIR` as the directory SGLang's EAGLE algorithm loads; its path.

    SGLang 0.5.23 (`srt/models/llama_eagle.py`) runs EAGLE-1/2 heads in EAGLE's own layout (SafeAILab/EAGLE
    `eagle/model/cnets.py`, the `eagle-llm` package: `fc.*` over cat(embedding, feature), `layers.*` with no input
    norm in layer 0, no final norm), which its loader prefixes with "model.", and shares the target's embeddings
    and LM head (`set_embed_and_head`). It picks the class by config.json's `architectures`, with no renaming for
    drafts, so the config must say `LlamaForCausalLMEagle`; and its fc always has a bias (`nn.Linear` by default),
    so a head without one gets a zero bias, which computes what the head computes (a bias missing from the file
    would keep its random initial value). A directory that already names SGLang's class, or a hub id, is given as
    it is; any other (a head `train-draft` wrote, a published EAGLE checkpoint under `LlamaForCausalLM`) is
    written out once, into the model store, with its weights as they are.
    """
    from specsim.record.head_checkpoints import read_head_weights

    where, raw = _local_head(draft)
    if where is None:
        return model_directory(draft.partition(":")[2])  # a hub id: SGLang resolves it
    if raw.get("architectures") == [SGLANG_EAGLE]:
        return where.resolve()
    head = raw.get("specsim")
    if head is not None and head.get("kind") != "eagle":
        raise EngineError(f"{where} holds {head.get('kind')} heads: SGLang's EAGLE algorithm loads EAGLE-1/2 heads")
    weights = read_head_weights(where, "eagle")
    fc = weights[1].get("fc.weight")
    if fc is None or fc.ndim != 2 or fc.shape[1] != 2 * fc.shape[0]:
        raise EngineError(f"{where}: {'no fc.weight' if fc is None else f'fc.weight of shape {tuple(fc.shape)}'}, "
                          "not EAGLE-1/2's fc over [embedding, feature] (H x 2H); an EAGLE-3 head is eagle3:DIR")

    def fill(tmp: Path) -> None:
        from safetensors.torch import save_file

        state = dict(weights[1])
        if "fc.bias" not in state:
            state["fc.bias"] = state["fc.weight"].new_zeros(state["fc.weight"].shape[0])
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        if head is not None:
            config = eagle_config(head, _target_config(target, target_info))
        else:  # a published config: a Llama layer's, which SGLang's class is
            config = {"model_type": "llama", **raw}
        config["architectures"] = [SGLANG_EAGLE]
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return _write_head(where, weights[0], target, "eagle-sglang", out, fill, echo,
                       f"EAGLE head {where} in the layout SGLang's EAGLE loads", layout="sglang")


def export_eagle3_sglang(draft: str, target: str, *, target_info: dict | None = None, out: Path | None = None,
                         echo: Callable[[str], None] = lambda line: None) -> Path:
    """`eagle3:DIR` as the directory SGLang's EAGLE3 algorithm loads; its path.

    SGLang (`srt/models/llama_eagle3.py`, `LlamaForCausalLMEagle3`) loads the EAGLE-3 reference layout,
    which SpecForge, SGLang's trainer, writes: a Llama config.json with `architectures:
    ["LlamaForCausalLMEagle3"]` (SGLang picks the draft's class by it and knows no speculators
    config) and `draft_vocab_size`, weights `midlayer.*` (SGLang 0.5.23 maps them to its `layers.0`;
    older versions read `midlayer.*` only and skipped other names without a word), `fc.weight`,
    `norm.weight`, `lm_head.weight` and `d2t` (SGLang's hot token ids are d2t + arange). A head
    `train-draft` wrote (speculators' layout, `layers.0.*`) is written out once, into the model
    store; a reference-layout directory or a hub id is given as it is. SGLang replaces the draft's
    embeddings by the target's (`set_embed`), as specsim's heads use them, so none are written; a
    head without its own LM head gets `draft_vocab_size: null`, on which SGLang takes the target's
    (`load_lm_head_from_target`). Refused: what SGLang's layer does not compute (a residual of the
    normed feature, a normed fed-back feature, norms before fc, biases, more than one layer) and
    target layers other than the default (2, L // 2, L - 3): SGLang reads the config's
    `eagle_config.eagle_aux_hidden_state_layer_ids` as layer outputs (it captures id + 1), vLLM 0.32
    as layer inputs, so only the default, which the config then leaves out, means one thing to both.
    """
    from specsim.record.head_checkpoints import WEIGHTS, default_aux_layers

    where, raw = _local_head(draft)
    if where is None:
        return model_directory(draft.partition(":")[2])  # a hub id: SGLang resolves it
    if "specsim" not in raw:
        if raw.get("speculators_model_type"):
            raise EngineError(f"{where} is in speculators' layout, whose config SGLang's EAGLE3 does not read (it "
                              "picks LlamaForCausalLMEagle3 by architectures); specsim writes out only heads "
                              "train-draft wrote")
        return where.resolve()
    head = raw["specsim"]
    if head.get("kind") != "eagle3":
        raise EngineError(f"{where} holds {head.get('kind')} heads: SGLang's EAGLE3 algorithm loads EAGLE-3 heads")
    unlike = [what for what, present in [
        ("more than one layer", int(head.get("layers", 1)) != 1),
        ("the feature's residual normed (norm_before_residual)", head.get("norm_before_residual")),
        ("the normed output fed back (norm_output)", head.get("norm_output")),
        (f"norms before fc ({head.get('fc_input_norm')})", head.get("fc_input_norm")),
        ("attention biases", head.get("attention_bias")), ("an fc bias", head.get("fc_bias")),
        ("q/k norms", head.get("qk_norm"))] if present]
    if unlike:
        raise EngineError(f"{where}: {', '.join(unlike)}: SGLang's EAGLE-3 layer (llama_eagle3.py) computes none of "
                          "this")
    target_config = _target_config(target, target_info)
    if "num_hidden_layers" not in target_config:
        raise EngineError(f"{model_directory(target, target_info)}: no readable config.json with num_hidden_layers, "
                          "so the head's target layers cannot be checked against SGLang's default")
    default = default_aux_layers(int(target_config["num_hidden_layers"]))
    if tuple(head.get("aux_layers") or ()) != default:
        raise EngineError(f"{where} fuses target layers {list(head.get('aux_layers') or ())}, not the default "
                          f"{list(default)}: SGLang reads a config's layer ids one layer later than vLLM does, so "
                          "specsim writes SGLang's layout only for heads on the default layers")
    weights = where / WEIGHTS["eagle3"]

    def fill(tmp: Path) -> None:
        from safetensors.torch import load_file, save_file

        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
                 for k, v in load_file(str(weights)).items()}
        save_file(state, str(tmp / "model.safetensors"))
        config = eagle_config(head, target_config)
        config.update(architectures=["LlamaForCausalLMEagle3"],
                      draft_vocab_size=int(state["lm_head.weight"].shape[0]) if "lm_head.weight" in state else None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return _write_head(where, weights, target, "eagle3-sglang", out, fill, echo,
                       f"EAGLE-3 head {where} in the reference layout SGLang loads", layout="sglang")


def recorded_head(draft: str, draft_info: dict | None) -> str:
    """A head draft `KIND:DIR` whose DIR is no directory from here (a cache recorded in another folder, with a
    relative path) as the directory the cache recorded it from, when that one exists; otherwise `draft` as it is
    (a hub id, or a directory found from here)."""
    from specsim.specs import is_head_draft

    kind, _, where = draft.partition(":")
    if not is_head_draft(draft) or Path(where).expanduser().is_dir():
        return draft
    path = (draft_info or {}).get("path")
    return f"{kind}:{path}" if path and Path(path).is_dir() else draft


def _target_config(target: str, target_info: dict | None) -> dict:
    """The target's config.json ({} when it has none to read: the export then takes the head's own sizes)."""
    try:
        return json.loads((Path(model_directory(target, target_info)) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _local_head(draft: str) -> tuple[Path | None, dict]:
    """(directory, its config.json) of a head draft `KIND:DIR`; (None, {}) when DIR is no directory (a hub id)."""
    where = Path(draft.partition(":")[2]).expanduser()
    if not where.is_dir():
        return None, {}
    try:
        return where, json.loads((where / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"{where / 'config.json'}: not readable ({exc})") from None


def export_layers(target: str, k: int, *, target_info: dict | None = None, out: Path | None = None,
                  echo: Callable[[str], None] = lambda line: None) -> Path:
    """`layers:k` of `target` as a Hugging Face model directory (the module docstring); its path."""
    from specsim.record import packaged

    sha = (target_info or {}).get("sha256") or _weights_sha(target)
    out = Path(out) if out is not None else packaged.model_store() / "exported" / f"{_safe(target)}-layers-{k}"
    want = {"target": target, "layers": k, "target_sha256": sha}
    if _reusable(out, want):
        return out
    echo(f"writing draft layers:{k} of {target} as a model directory: {out}")
    from specsim.record.models import load_draft, load_model

    loaded = load_model(target, device="cpu", dtype="float32")
    draft = load_draft(f"layers:{k}", loaded)

    def fill(tmp: Path) -> None:
        draft.model.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)

    return _write_directory(out, want, fill)


def _write_head(where: Path, weights: Path, target: str, tag: str, out: Path | None, fill: Callable[[Path], None],
                echo: Callable[[str], None], what: str, **keys) -> Path:
    """A head's directory for an engine, written once (`fill`) into the model store as `<target>-<tag>-<sha>` (or
    `out`) and reused while the head's weights file is the same: the marker records its sha256, the head's
    directory, the target and `keys`. `what` says what is written, in the line announcing it."""
    import hashlib

    from specsim.record import packaged

    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    out = Path(out) if out is not None else packaged.model_store() / "exported" / f"{_safe(target)}-{tag}-{sha[:12]}"
    want = {"head": str(where.resolve()), "weights_sha256": sha, "target": target, **keys}
    if _reusable(out, want):
        return out
    echo(f"writing {what}: {out}")
    return _write_directory(out, want, fill)


def _reusable(out: Path, want: dict) -> bool:
    """Whether `out` holds an export of exactly `want` (its marker file says so)."""
    try:
        return json.loads((out / MARKER).read_text()) == want
    except (OSError, ValueError):
        return False


def _write_directory(out: Path, want: dict, fill: Callable[[Path], None]) -> Path:
    """Write a model directory: `fill` a temporary one, add the marker, rename it into place (no half-written
    directory is ever left under `out`)."""
    tmp = out.with_name(out.name + ".writing")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
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

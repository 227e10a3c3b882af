"""Write a head draft with the library that defines its layout, and run that library's own forward.

Run in vLLM's environment (`make vllm` installs speculators, SpecForge's and Medusa's model code
there), not specsim's:

    .venv-vllm/bin/python tests/head_writers.py LIBRARY TARGET_DIR OUT_DIR INPUTS.npz \
        --aux 1,2,3 --draft-vocab 200 --ttt-steps 3 --seed 0
    .venv-vllm/bin/python tests/head_writers.py --jobs JOBS.json    # a list of such argument lists

* `speculators`: `speculators.models.eagle3.Eagle3DraftModel` (config.json with
  `speculators_model_type: eagle3`, `layers.0.*`), its embeddings and LM head from the target (as
  its `load_verifier_weights`), a draft vocabulary mapped through d2t/t2d; the library's training
  forward (`ttt_steps` steps of training-time test), each step's LM-head output captured.
* `specforge`: `specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3` (the EAGLE-3
  reference layout SGLang serves: a Llama config with `draft_vocab_size` and the fused layers in
  `eagle_config`, `midlayer.*`); its trainer's loop (`algorithms/eagle3/model.py`:
  `project_hidden_states`, then per step `backbone` with its `cache_hidden` attention, the output
  fed back, `compute_logits`, the token ids shifted left). With `--load DIR` it writes nothing: it
  reads DIR (a head specsim wrote out for SGLang) into that class and runs the same loop.

* `medusa`: `medusa.model.medusa_model.MedusaModel` on the target (Medusa-1, the `medusa-llm`
  package: heads of ResBlocks, each with its own LM head initialised from the target's), saved as
  Medusa's trainer saves it (`torch.save(medusa_head.state_dict(), "medusa_lm_head.pt")`, and its
  `MedusaConfig`); `--ttt-steps` heads, run on the first H columns of `hidden` (the target's last
  state); `logits` (heads, m, V).

* `eagle`: EAGLE-1/2's `eagle.model.cnets.Model` (the `eagle-llm` package, SafeAILab/EAGLE's own
  code: `fc` over cat(embedding, feature) with a bias, `layers.*` with no input norm in layer 0),
  saved as EAGLE's published heads are (config.json, `pytorch_model.bin` without the embeddings);
  its forward on the first H columns of `hidden` and `ids`, through the target's LM head. With
  `--load DIR` it reads DIR (a head specsim wrote out for SGLang's EAGLE) into that class instead.

* `mtp`: `speculators.models.mtp.MTPDraftModel` (speculators' MTP layout: config.json with
  `speculators_model_type: mtp` and a Qwen3 `transformer_layer_config`, `mtp_layers.0.*`; the
  target's embedding and LM head loaded by its `load_verifier_weights`, not saved); its
  teacher-forced training forward over `--ttt-steps` steps on `hidden` (m, H: the target's last
  layer before its final norm) and `ids`, each step's LM-head output captured.

All get random weights (large enough that the laws differ from the target's), are saved with
`save_pretrained`, and run on INPUTS.npz's `hidden` (m, 3H: the target layers' states side by side)
and `ids` (m,); OUT_DIR/reference.npz holds `logits` (steps, m, draft vocabulary) and `vocab` (the
draft tokens' target ids).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch


def _layer_config(args):
    from transformers import AutoConfig, LlamaConfig

    t = AutoConfig.from_pretrained(args.target)
    return t, LlamaConfig(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                          num_hidden_layers=1, num_attention_heads=t.num_attention_heads,
                          num_key_value_heads=t.num_key_value_heads, rms_norm_eps=t.rms_norm_eps,
                          max_position_embeddings=t.max_position_embeddings, tie_word_embeddings=False)


def _target_embed_and_head(args):
    """The target's embeddings and LM head (the tiny target ties its LM head to its embeddings)."""
    from safetensors.torch import load_file

    target = load_file(str(Path(args.target) / "model.safetensors"))
    embed = target["model.embed_tokens.weight"]
    return embed, target.get("lm_head.weight", embed)


def speculators(args, out: Path, hidden, ids):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    t, layer = _layer_config(args)
    layer._attn_implementation = "eager"  # the dense-mask path: flex attention's block masks want a GPU
    V = t.vocab_size
    draft_vocab = args.draft_vocab or V
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=draft_vocab,
        norm_before_residual=args.norm_before_residual,
        eagle_aux_hidden_state_layer_ids=[int(k) for k in args.aux.split(",")],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=args.ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=args.target, architectures=["LlamaForCausalLM"])))
    model = Eagle3DraftModel(config)
    if draft_vocab != V:  # a draft vocabulary: a random subset of the target's, ascending
        vocab = torch.sort(torch.randperm(V)[:draft_vocab]).values
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[vocab] = True
        model.load_vocab_mappings(t2d, vocab - torch.arange(draft_vocab))
    else:
        vocab = torch.arange(V)
    model.load_verifier_weights()  # embed_tokens and lm_head (the draft vocabulary's rows) from the target
    steps = _randomized_saved_run(model, ("layers.", "fc."), out, hidden_states=hidden, input_ids=ids,
                                  document_ids=torch.zeros_like(ids), ttt_steps=args.ttt_steps)
    return steps, vocab


def _randomized_saved_run(model, trained: tuple[str, ...], out: Path, **inputs) -> list:
    """Give a speculators model random weights (its `trained` matrices, every norm), save it to `out`, and run its
    forward on `inputs`: each LM-head output, in order."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(trained) and param.dim() == 2:
                param.normal_(0.0, 0.2)
            elif name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    model.eval()
    model.save_pretrained(str(out))
    steps: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda module, args, output: steps.append(output.detach()))
    with torch.no_grad():
        model(**inputs)
    hook.remove()
    return steps


def mtp(args, out: Path, hidden, ids):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.mtp import MTPDraftModel, MTPSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig, Qwen3Config

    t = AutoConfig.from_pretrained(args.target)
    layer = Qwen3Config(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                        num_hidden_layers=1, num_attention_heads=t.num_attention_heads,
                        num_key_value_heads=t.num_key_value_heads, head_dim=t.hidden_size // t.num_attention_heads,
                        rms_norm_eps=t.rms_norm_eps, max_position_embeddings=t.max_position_embeddings,
                        tie_word_embeddings=False)
    layer._attn_implementation = "eager"
    config = MTPSpeculatorConfig(
        transformer_layer_config=layer,
        speculators_config=SpeculatorsConfig(
            algorithm="mtp", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=args.ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=args.target, architectures=["LlamaForCausalLM"])))
    model = MTPDraftModel(config)
    model.load_verifier_weights()  # embed_tokens and lm_head from the target
    return _randomized_saved_run(model, ("mtp_layers.",), out, input_ids=ids, hidden_states=hidden), \
        torch.arange(t.vocab_size)


def specforge(args, out: Path, hidden, ids):
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

    if args.load:
        return _specforge_loaded(args, out, hidden, ids)
    t, config = _layer_config(args)
    V, Vd = t.vocab_size, args.draft_vocab
    config.draft_vocab_size = Vd
    config.rope_theta = 10000.0
    config.rope_scaling = None
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": [int(k) for k in args.aux.split(",")]}
    config.architectures = ["LlamaForCausalLMEagle3"]
    model = LlamaForCausalLMEagle3(config, attention_backend="sdpa")
    embed, lm = _target_embed_and_head(args)
    vocab = torch.sort(torch.randperm(V)[:Vd]).values
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(("midlayer.", "fc.")) and param.dim() == 2:
                param.normal_(0.0, 0.2)
            elif name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
        model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(lm[vocab])
        model.d2t.copy_(vocab - torch.arange(Vd))
        model.t2d.zero_()
        model.t2d[vocab] = True
    model.eval()
    model.save_pretrained(str(out))
    return _specforge_steps(model, args, hidden, ids), vocab


def _specforge_loaded(args, out: Path, hidden, ids):
    """`--load DIR`: a directory in the reference layout (SGLang's) read into SpecForge's LlamaForCausalLMEagle3
    from its own config.json and weights, the target's embeddings set as SGLang's `set_embed` does; which keys
    were missing or left over goes to OUT/loading.json."""
    import json

    from safetensors.torch import load_file
    from transformers import LlamaConfig

    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

    config = LlamaConfig.from_pretrained(args.load)
    model = LlamaForCausalLMEagle3(config, attention_backend="sdpa")
    missing, unexpected = model.load_state_dict(load_file(str(Path(args.load) / "model.safetensors")), strict=False)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(_target_embed_and_head(args)[0])
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    (out / "loading.json").write_text(json.dumps({"missing": sorted(missing), "unexpected": sorted(unexpected),
                                                  "architectures": config.architectures,
                                                  "draft_vocab_size": config.draft_vocab_size}))
    vocab = model.d2t + torch.arange(model.d2t.shape[0])  # SGLang's hot token ids
    return _specforge_steps(model, args, hidden, ids), vocab


def _specforge_steps(model, args, hidden, ids) -> list:
    """SpecForge's training loop (`algorithms/eagle3/model.py`): each training-time-test step's logits."""
    m = ids.shape[1]
    steps = []
    with torch.no_grad():
        states = model.project_hidden_states(hidden)
        mask = model.prepare_decoder_attention_mask(torch.ones(1, m, dtype=torch.bool), states, 1, m, 0)
        cache = [[], []]
        positions = torch.arange(m)[None]
        for _ in range(args.ttt_steps):
            states = model.backbone(model.embed_input_ids(ids), states, cache, mask, positions)
            steps.append(model.compute_logits(states))
            ids = torch.cat([ids[:, 1:], ids.new_zeros(1, 1)], dim=1)  # specforge's padding(left=False)
    return steps


def medusa(args, out: Path, hidden, ids):
    from transformers import AutoModelForCausalLM

    from medusa.model.medusa_model import MedusaConfig, MedusaModel

    base = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32)
    model = MedusaModel(base, medusa_num_heads=args.ttt_steps, medusa_num_layers=1,
                        base_model_name_or_path=args.target)
    with torch.no_grad():  # Medusa starts its ResBlocks at zero (identity): move them so the heads differ
        for name, param in model.medusa_head.named_parameters():
            if ".linear." in name:
                param.normal_(0.0, 0.2)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.medusa_head.state_dict(), out / "medusa_lm_head.pt")  # as medusa/train/train.py saves
    MedusaConfig(medusa_num_heads=args.ttt_steps, medusa_num_layers=1,
                 base_model_name_or_path=args.target).save_pretrained(str(out))
    states = hidden[0, :, : base.config.hidden_size]
    with torch.no_grad():
        steps = [model.medusa_head[k](states)[None] for k in range(args.ttt_steps)]
    return steps, torch.arange(base.config.vocab_size)


def _unscaled(config):
    """EAGLE 1.2.1's attention reads `rope_scaling["type"]` whenever the field is set, and transformers 5 fills it
    from rope_parameters; None selects its plain rotary embedding (base 10,000, as the test heads' targets)."""
    config.rope_scaling = None
    return config


def eagle(args, out: Path, hidden, ids):
    """EAGLE-1/2 in EAGLE's own layout: `eagle.model.cnets.Model` (the `eagle-llm` package, SafeAILab/EAGLE), fc with
    its default bias, saved as EAGLE's published heads are (config.json, pytorch_model.bin). With `--load DIR` it
    writes nothing: it reads DIR (a head specsim wrote out for SGLang) into that class. Either way its forward on
    `hidden` (the target's last states) and `ids`, through the target's LM head."""
    import json

    from safetensors.torch import load_file

    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig

    embed, lm = _target_embed_and_head(args)
    if args.load:
        config = _unscaled(EConfig.from_pretrained(args.load))
        model = Model(config)
        missing, unexpected = model.load_state_dict(load_file(str(Path(args.load) / "model.safetensors")),
                                                    strict=False)
        out.mkdir(parents=True, exist_ok=True)
        (out / "loading.json").write_text(json.dumps({"missing": sorted(missing), "unexpected": sorted(unexpected),
                                                      "architectures": config.architectures}))
    else:
        from transformers import AutoConfig

        t = AutoConfig.from_pretrained(args.target)
        config = EConfig(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                         num_hidden_layers=1, num_attention_heads=t.num_attention_heads,
                         num_key_value_heads=t.num_key_value_heads, rms_norm_eps=t.rms_norm_eps,
                         max_position_embeddings=t.max_position_embeddings)
        model = Model(_unscaled(config))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.startswith(("layers.", "fc.")):
                    param.normal_(0.0, 0.2) if param.dim() == 2 else param.uniform_(0.5, 1.5) if "norm" in name \
                        else param.normal_(0.0, 0.1)
        out.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(str(out))
        torch.save({k: v for k, v in model.state_dict().items() if k != "embed_tokens.weight"},
                   out / "pytorch_model.bin")
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)  # as SGLang's set_embed_and_head and EAGLE's load_emb
        model.eval()
        features = model(hidden[..., : config.hidden_size], ids)
    return [features @ lm.T], torch.arange(config.vocab_size)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("library", choices=["speculators", "specforge", "medusa", "mtp", "eagle"])
    parser.add_argument("target")
    parser.add_argument("out")
    parser.add_argument("inputs")
    parser.add_argument("--aux", default="1,2,3")
    parser.add_argument("--draft-vocab", type=int, default=0)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--norm-before-residual", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", default=None, help="specforge, eagle: read this directory (in the layout SGLang "
                                                      "loads) instead of writing a random head")
    return parser


def write(args) -> None:
    """One head, as the command line's arguments describe it."""
    torch.manual_seed(args.seed)
    data = np.load(args.inputs)
    hidden = torch.as_tensor(data["hidden"], dtype=torch.float32)[None]
    ids = torch.as_tensor(data["ids"], dtype=torch.long)[None]
    out = Path(args.out)
    steps, vocab = {"speculators": speculators, "specforge": specforge, "medusa": medusa,
                    "mtp": mtp, "eagle": eagle}[args.library](args, out, hidden, ids)
    np.savez(out / "reference.npz", logits=torch.cat(steps).float().numpy(), vocab=vocab.numpy())


def main() -> None:
    """One head from the arguments, or with `--jobs FILE.json` (a list of argument lists) every head in it, in
    one process (the libraries' imports take most of a run)."""
    import json
    import sys

    if sys.argv[1:2] == ["--jobs"]:
        for argv in json.loads(Path(sys.argv[2]).read_text()):
            write(_parser().parse_args([str(a) for a in argv]))
    else:
        write(_parser().parse_args())


if __name__ == "__main__":
    main()

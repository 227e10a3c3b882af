"""Write an EAGLE-3 head with `speculators` (the library that defines its layout) and run its own forward.

Run in vLLM's environment (`make vllm` installs speculators there), not specsim's:

    .venv-vllm/bin/python tests/speculators_eagle3.py TARGET_DIR OUT_DIR INPUTS.npz \\
        --aux 1,2,3 --draft-vocab 200 --ttt-steps 3 --seed 0

It builds `speculators.models.eagle3.Eagle3DraftModel` for the target (a one-layer Llama
decoder of the target's shape), gives it random weights (its embeddings and LM head come from
the target, as speculators' `load_verifier_weights` does; a draft vocabulary of the given size
maps into the target's through d2t/t2d), saves it with `save_pretrained` — config.json with
`speculators_model_type: eagle3` and `model.safetensors` — and runs the library's training
forward (`ttt_steps` steps of training-time test) on INPUTS.npz's `hidden` (m, 3H: the target
layers' states side by side) and `ids` (m,), writing each step's draft-vocabulary logits to
OUT_DIR/reference.npz (`logits`: (ttt_steps, m, draft_vocab)) and the draft vocabulary's target
ids (`vocab`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("out")
    parser.add_argument("inputs")
    parser.add_argument("--aux", default="1,2,3")
    parser.add_argument("--draft-vocab", type=int, default=0)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--norm-before-residual", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers import AutoConfig, LlamaConfig

    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    torch.manual_seed(args.seed)
    t = AutoConfig.from_pretrained(args.target)
    layer = LlamaConfig(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                        num_hidden_layers=1, num_attention_heads=t.num_attention_heads,
                        num_key_value_heads=t.num_key_value_heads, rms_norm_eps=t.rms_norm_eps,
                        max_position_embeddings=t.max_position_embeddings, tie_word_embeddings=False)
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
    with torch.no_grad():  # random weights large enough that the draft's laws differ from the target's
        for name, param in model.named_parameters():
            if name.startswith(("layers.", "fc.")) and param.dim() == 2:
                param.normal_(0.0, 0.2)
            elif name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    model.eval()
    out = Path(args.out)
    model.save_pretrained(str(out))

    data = np.load(args.inputs)
    hidden = torch.as_tensor(data["hidden"], dtype=torch.float32)[None]
    ids = torch.as_tensor(data["ids"], dtype=torch.long)[None]
    steps: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda module, inputs, output: steps.append(output.detach()))
    with torch.no_grad():
        model(hidden_states=hidden, input_ids=ids, document_ids=torch.zeros_like(ids), ttt_steps=args.ttt_steps)
    hook.remove()
    np.savez(out / "reference.npz", logits=torch.cat(steps).float().numpy(), vocab=vocab.numpy())


if __name__ == "__main__":
    main()

"""Write an EAGLE-3 head with SpecForge (the EAGLE-3 reference layout: `midlayer.*`) and run its own TTT steps.

Run in vLLM's environment (`make vllm` installs specforge there without its dependencies: only
its draft-model module is used), not specsim's:

    .venv-vllm/bin/python tests/specforge_eagle3.py TARGET_DIR OUT_DIR INPUTS.npz --aux 1,2,3 \\
        --draft-vocab 200 --ttt-steps 3 --seed 0

It builds `specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3` for the target (a Llama
config with `draft_vocab_size`; the fused layers in `eagle_config`, as SGLang reads them), gives it
random weights (embeddings and LM head rows from the target), saves it with `save_pretrained`,
then runs SpecForge's training-time test as its trainer does (`algorithms/eagle3/model.py`:
`project_hidden_states`, then per step `backbone` with its `cache_hidden` attention, the output
fed back, `compute_logits`, the token ids shifted left) on INPUTS.npz's `hidden` and `ids`, and
writes OUT_DIR/reference.npz (`logits` (steps, m, draft_vocab), `vocab`: the draft tokens' ids).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("out")
    parser.add_argument("inputs")
    parser.add_argument("--aux", default="1,2,3")
    parser.add_argument("--draft-vocab", type=int, default=200)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from safetensors.torch import load_file
    from transformers import AutoConfig, LlamaConfig

    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

    torch.manual_seed(args.seed)
    t = AutoConfig.from_pretrained(args.target)
    V, Vd = t.vocab_size, args.draft_vocab
    config = LlamaConfig(vocab_size=V, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                         num_hidden_layers=1, num_attention_heads=t.num_attention_heads,
                         num_key_value_heads=t.num_key_value_heads, rms_norm_eps=t.rms_norm_eps,
                         max_position_embeddings=t.max_position_embeddings, tie_word_embeddings=False)
    config.draft_vocab_size = Vd
    config.rope_theta = 10000.0
    config.rope_scaling = None
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": [int(k) for k in args.aux.split(",")]}
    config.architectures = ["LlamaForCausalLMEagle3"]
    model = LlamaForCausalLMEagle3(config, attention_backend="sdpa")
    target = load_file(str(Path(args.target) / "model.safetensors"))
    embed = target["model.embed_tokens.weight"]
    lm = target.get("lm_head.weight", embed)  # the tiny target ties its LM head to its embeddings
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
    out = Path(args.out)
    model.save_pretrained(str(out))

    data = np.load(args.inputs)
    hidden = torch.as_tensor(data["hidden"], dtype=torch.float32)[None]
    ids = torch.as_tensor(data["ids"], dtype=torch.long)[None]
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
    np.savez(out / "reference.npz", logits=torch.cat(steps).float().numpy(), vocab=vocab.numpy())
    (out / "written_by.json").write_text(json.dumps({"library": "specforge", "class": "LlamaForCausalLMEagle3"}))


if __name__ == "__main__":
    main()

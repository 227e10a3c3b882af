"""A random tiny DeepSeek-V3 (latent attention 512 + 64, 16 heads, dense layers), saved to OUT, and transformers'
log-probabilities of the prompt's tokens. Run with specsim's environment: python random_deepseek.py OUT"""

import sys

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

PROMPT = [1, 5, 9, 30, 40, 2]
config = DeepseekV3Config(vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=16, num_key_value_heads=16, first_k_dense_replace=3, kv_lora_rank=512,
                          q_lora_rank=96, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
                          initializer_range=0.2, tie_word_embeddings=False)
torch.manual_seed(0)
model = DeepseekV3ForCausalLM(config).eval()
model.save_pretrained(sys.argv[1])
with torch.no_grad():
    logp = model(torch.tensor([PROMPT])).logits[0].log_softmax(-1)
print("transformers", [round(logp[i - 1, PROMPT[i]].item(), 4) for i in range(1, len(PROMPT))],
      "next", int(logp[-1].argmax()))

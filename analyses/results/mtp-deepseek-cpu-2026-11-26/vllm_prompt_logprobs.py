"""vLLM's log-probabilities of the prompt's tokens on MODEL, with its custom ops as given (CUSTOM_OPS, e.g.
"all,-rotary_embedding"; unset: vLLM's default). Run with vLLM's environment: python vllm_prompt_logprobs.py MODEL"""

import os
import sys

PROMPT = [1, 5, 9, 30, 40, 2]

if __name__ == "__main__":
    from vllm import LLM, SamplingParams

    ops = os.environ.get("CUSTOM_OPS")
    llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=256, skip_tokenizer_init=True,
              compilation_config={"custom_ops": ops.split(",")} if ops else None)
    out = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0, detokenize=False))
    logp = out[0].prompt_logprobs
    print(f"vLLM custom_ops={ops or 'default'}", [round(logp[i][PROMPT[i]].logprob, 4) for i in range(1, len(PROMPT))],
          "next", out[0].outputs[0].token_ids[0])

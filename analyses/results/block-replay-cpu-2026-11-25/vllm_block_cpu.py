import os, sys, time
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("OMP_NUM_THREADS", "2")
def main():
    from vllm import LLM, SamplingParams
    method = sys.argv[1]
    llm = LLM(model="/root/.cache/specsim/models/smollm2-135m", dtype="float32", enforce_eager=True, seed=0, disable_log_stats=False,
              speculative_config={"method": "draft_model", "model": "/root/.cache/specsim/models/exported/smollm2-135m-layers-20",
                                  "num_speculative_tokens": 3, "draft_sample_method": "probabilistic",
                                  "rejection_sample_method": method})
    prompts = [{"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8 + i]} for i in range(4)]
    t = time.time()
    llm.generate(prompts, SamplingParams(temperature=0.7, max_tokens=32, ignore_eos=True, seed=1))
    print("TIME", time.time() - t)
    for m in llm.get_metrics():
        if "spec_decode" in m.name:
            print("METRIC", m.name, getattr(m, "value", None) or getattr(m, "values", None))
if __name__ == "__main__":
    main()

import os, sys, time
t0 = time.perf_counter()
if __name__ == "__main__":
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    t1 = time.perf_counter()
    model = sys.argv[1]
    n = int(sys.argv[2])
    engines = []
    times = []
    for i in range(n):
        s = time.perf_counter()
        llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=1,
                  disable_log_stats=False, enable_prefix_caching=False,
                  speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3})
        times.append(time.perf_counter() - s)
        engines.append(llm)
    s = time.perf_counter()
    prompts = [TokensPrompt(prompt_token_ids=list(range(100, 160))) for _ in range(4)]
    for llm in engines:
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    g = time.perf_counter() - s
    m = engines[-1].get_metrics()
    print(f"import {t1-t0:.1f}s engines {[round(x,1) for x in times]} generate {g:.1f}s total {time.perf_counter()-t0:.1f}s", flush=True)
    print([ (x.name, getattr(x, 'value', None)) for x in m if 'spec_decode_num_drafts' in x.name])

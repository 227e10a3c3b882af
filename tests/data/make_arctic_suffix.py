"""Write arctic_suffix.json: ArcticInference's own suffix proposals, the golden cases of tests/test_suffix.py.

Run with a Python that imports `arctic_inference` (vLLM's suffix method; `make vllm-suffix`
installs it into .venv-vllm):

    .venv-vllm/bin/python tests/data/make_arctic_suffix.py tests/data/arctic_suffix.json

Each case drives one `SuffixDecodingCache` as vLLM's SuffixDecodingProposer does: requests one
after another (start_request with the prompt, add_active_response with each step's tokens,
speculate on the last max_tree_depth tokens in path mode, stop_request), over a small vocabulary
so that counts tie often, with small depths and cache sizes so that truncation and FIFO eviction
happen. It records every proposal. Deterministic (seeded).
"""

import json
import sys

import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache


def case(rng: np.random.Generator) -> dict:
    vocab = int(rng.integers(2, 6))
    depth = int(rng.integers(2, 10))
    requests = int(rng.choice([1, 2, 3, 100]))
    k = int(rng.integers(1, 7))
    factor = float(rng.choice([0.5, 1.0, 2.0]))
    offset = float(rng.choice([0.0, 1.0]))
    prob = float(rng.choice([0.0, 0.1, 0.3]))
    cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=requests)
    out = []
    for rid in range(int(rng.integers(1, 6))):
        prompt = rng.integers(0, vocab, size=int(rng.integers(1, 15))).tolist()
        output = rng.integers(0, vocab, size=int(rng.integers(1, 30))).tolist()
        cache.start_request(rid, np.array(prompt, dtype=np.int32))
        steps, t = [], 0
        while t < len(output):
            step = int(rng.integers(1, 4))  # tokens a step emits
            cache.add_active_response(rid, output[t : t + step])
            t += step
            context = (prompt + output[:t])[-depth:]
            draft = cache.speculate(rid, np.array(context, dtype=np.int32), max_spec_tokens=k,
                                    max_spec_factor=factor, max_spec_offset=offset, min_token_prob=prob)
            steps.append([t, [int(x) for x in draft.token_ids], float(draft.score)])
        cache.stop_request(rid)
        out.append({"prompt": prompt, "output": output, "steps": steps})
    return {"depth": depth, "requests": requests, "k": k, "factor": factor, "offset": offset, "prob": prob,
            "requests_run": out}


if __name__ == "__main__":
    rng = np.random.default_rng(20261124)
    cases = [case(rng) for _ in range(300)]
    with open(sys.argv[1], "w") as f:
        json.dump({"source": "arctic_inference 0.3.0 SuffixDecodingCache (path mode)", "cases": cases}, f)
    print(len(cases), "cases,", sum(len(r["steps"]) for c in cases for r in c["requests_run"]), "proposals")

"""How much of a live step is work the profile does not time (the accepted KV entries committed, the drafter's
accept, the layout's ancestor masks, the output bookkeeping)? cProfile of live greedy int8 decoding of 4 Spec-Bench
prompts x 32 tokens on the packaged SmolLM2, at B = 1 and 4 (after one untimed decode of the same requests).

    .venv/bin/python analyses/results/cost-fit-cpu-2026-11-29/step_glue.py 'chain:4;kary:2,2'

Prints cumulative seconds under cProfile, summed over every function of each name. (a record of this folder's
numbers, at commit 8a9e655)
"""

import cProfile
import pstats
import sys
import time

import numpy as np
import torch

from specsim.live.decoder import LiveConfig, Target, decode
from specsim.live.runs import build_drafter, live_prompts, load_target
from specsim.prompts import load_prompts
from specsim.record.models import eos_token_ids
from specsim.specs import parse_tree

PARTS = [":_step", "kv.py:forward", "kv.py:commit", ":accept", ":propose", ":verify_tree", ":ancestor_mask", ":_finish"]


def main(trees: str) -> None:
    torch.set_num_threads(2)
    loaded, _ = load_target("smollm2-135m", device="cpu")
    target = Target(loaded.model, eos_token_ids(loaded))
    drafter = build_drafter("int8", loaded, device="cpu", dtype="float32")
    prompts = load_prompts("spec-bench", categories=["writing", "coding", "math_reasoning", "rag"], per_category=1)
    ids = [p.token_ids for p in live_prompts(loaded, prompts.prompts)]
    for tree in trees.split(";"):
        for B in (1, 4):
            config = LiveConfig.for_policy(parse_tree(tree), "greedy", 0.0, max_new_tokens=32, batch=B,
                                           batching="lockstep")
            decode(target, drafter, ids[:B], [np.random.default_rng(0)] * B, config)  # warm
            profiler = cProfile.Profile()
            profiler.enable()
            started = time.perf_counter()
            decode(target, drafter, ids[:B], [np.random.default_rng(0) for _ in range(B)], config)
            total = time.perf_counter() - started
            profiler.disable()
            cumulative = {f"{f.split('/')[-1]}:{name}": v[3]
                          for (f, _, name), v in pstats.Stats(profiler).stats.items()}
            seconds = {part: sum(v for k, v in cumulative.items() if k.endswith(part)) for part in PARTS}
            parts = "; ".join(f"{k.lstrip(':')} {v:.3f}" for k, v in seconds.items())
            print(f"{tree} B={B}: total {total:.2f}s; {parts}")


if __name__ == "__main__":
    main(sys.argv[1])

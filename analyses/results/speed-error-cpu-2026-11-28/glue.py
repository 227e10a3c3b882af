"""The work of a live step outside what the profile prices, measured inside the live engine.

The profile prices a step's forwards (the target's, with the argmax and the greedy walk; the draft's) but not the
rest of the engine's step: building the tree layout and mask, picking the draft's children, committing KV entries,
Python. This decodes the bench prompts live with the forwards and walks timed (wrapped, nothing else changed) and
reports, per step, what the step took beyond them, for plain decoding and for speculative configurations. What
matters for a speedup is the difference between the two shares.

    .venv/bin/python analyses/results/speed-error-cpu-2026-11-28/glue.py > glue.txt
"""

import collections
import time

import numpy as np

import specsim.live.decoder as decoder
from specsim.live.decoder import ROOT_ONLY, LiveConfig, Target
from specsim.live.runs import build_drafter, live_prompts, load_target
from specsim.prompts import load_prompts
from specsim.record.kv import SlotKV
from specsim.record.models import eos_token_ids
from specsim.specs import parse_tree

CATEGORIES = ("writing", "coding", "math_reasoning", "rag", "translation", "summarization")
CONFIGS = [("int8", "chain:2"), ("int8", "chain:4"), ("layers:20", "chain:2"), ("layers:20", "kary:2,2")]

spent: dict = collections.defaultdict(float)


def _timed(kind, f):
    def wrapped(*args, **kwargs):
        started = time.perf_counter()
        out = f(*args, **kwargs)
        spent[kind(*args)] += time.perf_counter() - started
        return out
    return wrapped


def main() -> None:
    loaded, _ = load_target("smollm2-135m", device="cpu", threads=2)
    prompts = [p.token_ids for p in live_prompts(loaded, load_prompts("spec-bench", categories=CATEGORIES,
                                                                           per_category=1).prompts)]
    target = Target(loaded.model, eos_token_ids(loaded))

    def forward_kind(kv, tokens, *_):  # prompts (admission) apart from the steps' forwards
        who = "target" if kv is target.kv else "draft"
        return f"{who} prefill" if np.asarray(tokens).shape[1] > 16 else f"{who} forward"

    SlotKV.forward = _timed(forward_kind, SlotKV.forward)
    decoder.verify_tree = _timed(lambda *_: "walk", decoder.verify_tree)
    print("per step, ms: the step (draft + verify, as the engine times it), its forwards and walks, the rest")
    for B in (1, 4):
        for draft, tree in [(None, "plain")] + CONFIGS:
            drafter = None if draft is None else build_drafter(draft, loaded, device="cpu", dtype="float32")
            config = LiveConfig(tree=ROOT_ONLY if draft is None else parse_tree(tree), policy="greedy",
                                max_new_tokens=48, batch=B)
            spent.clear()
            run = decoder.decode(target, drafter, prompts, [np.random.default_rng(0) for _ in prompts], config)
            n = len(run.steps)
            step = sum(s.draft_s + s.verify_s for s in run.steps)
            priced = spent["target forward"] + spent["draft forward"] + spent["walk"]
            print(f"B = {B} {draft or '':<9} {tree:<9} {n:4d} steps: step {step / n * 1e3:6.1f}, forwards + walks "
                  f"{priced / n * 1e3:6.1f}, rest {(step - priced) / n * 1e3:4.2f} ({(step - priced) / step:.1%} of "
                  "the step)", flush=True)


if __name__ == "__main__":
    main()

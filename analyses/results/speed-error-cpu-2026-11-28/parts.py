"""Where a predicted speedup's error comes from on this CPU: profiles and live runs of one configuration in one
process, in a given order (e.g. PLLLP), every live run priced part by part with every profile.

For each (live run, profile): priced / live seconds of the draft forwards, of the verification (target forward and
walk, which the profile prices; the layout, argmax and commits it does not), of plain decoding, and the predicted
over the live speedup that follows. Repeated live runs against one profile show how much a live measurement moves
by itself; repeated profiles against one live run show how much a profile does.

    .venv/bin/python analyses/results/speed-error-cpu-2026-11-28/parts.py int8 chain:4 PLLLP > parts-int8-chain4.txt

Prompts: the first Spec-Bench prompt of six categories (bench_speedup's), 48 new tokens, greedy, batch 1, 2 threads.
Profile: batch 1, contexts 48/432/832 (the prompts' range), N <= 5, draft widths 1-2, 5 rounds (bench_speedup's
settings at B = 1).
"""

import os
import sys
import time
from pathlib import Path
from tempfile import mkdtemp

import numpy as np
import torch

from specsim.attention.profile import ProfileConfig, measure_cost_profile, write_profile
from specsim.live.decoder import LiveConfig, Target
from specsim.live.runs import build_drafter, live_prompts, load_target, run_live
from specsim.prompts import load_prompts
from specsim.record.models import eos_token_ids, load_draft
from specsim.sim.cost import load_cost_profiles
from specsim.specs import parse_tree

CATEGORIES = ("writing", "coding", "math_reasoning", "rag", "translation", "summarization")


def main(draft: str, tree: str, order: str) -> None:
    batch = 1
    work = Path(mkdtemp(prefix="speed-error-"))
    loaded, _ = load_target("smollm2-135m", device="cpu", threads=2)
    q = load_draft(draft, loaded)
    config = ProfileConfig(batches=(batch,), contexts=(48, 432, 832), max_tokens=max(2, parse_tree(tree).n_nodes),
                           draft_widths=(1, 2), repeats=5, warmup=2)
    prompts = live_prompts(loaded, load_prompts("spec-bench", categories=CATEGORIES, per_category=1).prompts)
    target = Target(loaded.model, eos_token_ids(loaded))
    drafter = build_drafter(draft, loaded, device="cpu", dtype="float32")
    live = LiveConfig(tree=parse_tree(tree), policy="greedy", max_new_tokens=48, batch=batch)
    print(f"{draft} {tree}, B = {batch}, order {order}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    profiles, runs, t0 = [], [], time.perf_counter()
    for i, what in enumerate(order):
        t = time.perf_counter()
        if what == "P":
            profiles.append(write_profile(measure_cost_profile(loaded, [q], config=config, progress=False),
                                          work / f"p{i}.json"))
        else:
            runs.append(run_live(target, drafter, prompts, live, target_name="smollm2-135m", progress=False))
        k = (len(profiles) if what == "P" else len(runs)) - 1
        print(f"{what}{k} at {t - t0:4.0f} s, {time.perf_counter() - t:3.0f} s, load average {os.getloadavg()[0]:.2f}",
              flush=True)
    print("\npriced / live seconds (d: draft forwards, v: verification, p: plain steps) and predicted / live speedup")
    for j, run in enumerate(runs):
        spec = [(len(p.token_ids) + s.start, s.draft_s, s.verify_s) for d, p in zip(run.spec_run.decoded, prompts)
                for s in d.steps]
        plain = [(len(p.token_ids) + s.start, s.draft_s + s.verify_s) for d, p in zip(run.plain_run.decoded, prompts)
                 for s in d.steps]
        steps = run.spec_run.steps  # at batch 1, one engine step per request step, in request order
        L = np.array([c for c, _, _ in spec], float)
        live_d, live_v = sum(d for _, d, _ in spec), sum(v for _, _, v in spec)
        live_p = sum(s for _, s in plain)
        cells = []
        for k, path in enumerate(profiles):
            cost = load_cost_profiles([path]).for_temperature(0.0, model_draft=True)
            d = sum(float(cost.draft_s(draft, 1, w, c)) for s, c in zip(steps, L) for w in s.draft_levels)
            v = sum(float(cost.verify_s(1, s.verified, c)) for s, c in zip(steps, L))
            p = float(cost.plain_s(1, np.array([c for c, _ in plain], float)).sum())
            ratio = (p / live_p) / ((d + v) / (live_d + live_v))
            cells.append(f"P{k}: d {d / live_d:.3f} v {v / live_v:.3f} p {p / live_p:.3f} -> {ratio:.3f}")
        print(f"L{j}: " + " | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])

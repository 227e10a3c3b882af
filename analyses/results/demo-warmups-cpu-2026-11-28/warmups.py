"""Do the demo profile's later passes need a warm-up run per entry, or does one untimed forward per model and
(B, L) block (after its context is refilled) give the same medians? Four profiles of the demo's grid in one
process, alternating: A (as `specsim profile` runs it) and B (later passes: one untimed run of each model's first
entry per block instead of one of every entry), A, B. Writes the four profiles beside this script.

    .venv/bin/python -m analyses.results.demo-warmups-cpu-2026-11-28.warmups   (or run the file directly)
"""
import sys
import time
from pathlib import Path

import torch

from specsim.attention import profile as prof
from specsim.record.models import load_draft, load_model

HERE = Path(__file__).parent
CONFIG = prof.ProfileConfig(batches=(1, 4), contexts=(64, 832), max_tokens=9, draft_widths=(1, 2, 3, 4),
                            repeats=3, warmup=1, passes=3, seed=0)
original_round_times, original_warmups = prof._round_times, prof.ProfileConfig.warmups


def block_warmup_round_times(runs, device, *, warmup, repeats, rng, tick=lambda: None, lead_in=None):
    """Later passes (warmup 0 here): one untimed run of each model's first entry, then the rounds."""
    if warmup == 0:
        firsts = {}
        for key in runs:
            firsts.setdefault(key[0], key)
        for key in firsts.values():
            runs[key]()
    return original_round_times(runs, device, warmup=warmup, repeats=repeats, rng=rng, tick=tick, lead_in=lead_in)


def main():
    torch.set_num_threads(2)
    target = load_model("smollm2-135m")
    drafts = [load_draft("int8", target)]
    for name in ("A1", "B1", "A2", "B2"):
        block = name.startswith("B")
        prof._round_times = block_warmup_round_times if block else original_round_times
        prof.ProfileConfig.warmups = ((lambda self, p: self.warmup if p == 0 else 0) if block else original_warmups)
        started = time.perf_counter()
        body = prof.measure_cost_profile(target, drafts, config=CONFIG)
        seconds = time.perf_counter() - started
        prof.write_profile(body, HERE / f"profile-{name}.json", overwrite=True)
        print(f"{name}: {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())

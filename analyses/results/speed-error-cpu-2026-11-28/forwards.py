"""Does a forward cost what the profile measured in the order and layout live decoding runs it?

Two differences between how `specsim profile` times the target's N-token forward and how live decoding runs it:
- order: the profile times every entry of a (B, L) once per round in random order; live decoding runs a
  verification right after the draft's forwards (the int8 draft's own weights, 135 MB, in between), and a plain
  step after a plain step. Timed here: the verification and the draft step in a loop of their own (hot) and in the
  engine's order, and the plain step after plain steps and right after a speculative step.
- layout: the profile lays the N tokens out as a binary tree cut to N nodes; a chain verifies them causally.
- the plain step: the profile times it among every other entry in random order; plain decoding back to back.

    .venv/bin/python analyses/results/speed-error-cpu-2026-11-28/forwards.py > forwards.txt
"""

import time

import numpy as np
import torch

from specsim.attention.profile import _Bench, _round_times, _tree_layout, verify_tree_parents
from specsim.record.models import load_draft, load_model

K = 4  # chain:4: four draft forwards, a 5-token verification


def _time(f) -> float:
    started = time.perf_counter()
    f()
    return time.perf_counter() - started


def order(target, draft_name: str, B: int, L: int, rounds: int = 30) -> None:
    draft = load_draft(draft_name, target)
    rng = np.random.default_rng(0)
    tb, db = _Bench(target.model, B, L, rng), _Bench(draft.model, B, L, rng)
    pick = lambda logits: logits.argmax(-1)  # noqa: E731
    verify = tb.run(*_tree_layout(verify_tree_parents(K + 1)), pick)
    plain = tb.run(*_tree_layout(verify_tree_parents(1)), pick)
    step = db.run(np.ones(1, np.int64), np.eye(1, dtype=bool), pick)
    t = {k: [] for k in ("verification, hot", "verification after the drafts", "draft step, hot",
                         "draft step after the verification", "plain step, hot", "plain step after a spec step")}
    for f in (verify, step, plain):
        f(), f()
    for _ in range(rounds):
        t["verification, hot"] += [_time(verify) for _ in range(3)]
        t["draft step, hot"] += [_time(step) for _ in range(3)]
        for _ in range(3):
            t["draft step after the verification"].append(_time(step))
            for _ in range(K - 1):
                step()
            t["verification after the drafts"].append(_time(verify))
        t["plain step, hot"] += [_time(plain) for _ in range(3)]
        step(), step(), verify()
        t["plain step after a spec step"].append(_time(plain))
    for k, v in t.items():
        v = np.array(v) * 1e3
        print(f"{draft_name:<9} B = {B} L = {L}: {k:<34} median {np.median(v):6.1f} ms (quartiles "
              f"{np.quantile(v, .25):.1f}-{np.quantile(v, .75):.1f}, {len(v)} runs)", flush=True)


def layout(target, L: int, rounds: int = 25) -> None:
    rng = np.random.default_rng(1)
    bench = _Bench(target.model, 1, L, rng)
    pick = lambda logits: logits.argmax(-1)  # noqa: E731
    runs = {}
    for N in (2, 3, 5):
        runs[f"tree N={N}"] = bench.run(*_tree_layout(verify_tree_parents(N)), pick)
        runs[f"chain N={N}"] = bench.run(np.arange(N), np.tril(np.ones((N, N), bool)), pick)
    t = _round_times(runs, torch.device("cpu"), warmup=2, repeats=rounds, rng=rng)  # as the profile times them
    print(f"B = 1 L = {L}: " + ", ".join(f"{k} {np.median(v) * 1e3:.1f}" for k, v in t.items()) + " ms (medians)",
          flush=True)


def mixed(target, draft_name: str, L: int, rounds: int = 25) -> None:
    """The plain step (N = 1) timed as the profile times it, once per round among every entry in random order,
    and back to back as plain decoding runs it."""
    draft = load_draft(draft_name, target)
    rng = np.random.default_rng(2)
    tb, db = _Bench(target.model, 1, L, rng), _Bench(draft.model, 1, L, rng)
    pick = lambda logits: logits.argmax(-1)  # noqa: E731
    runs = {f"N={n}": tb.run(*_tree_layout(verify_tree_parents(n)), pick) for n in range(1, K + 2)}
    runs |= {f"w={w}": db.run(np.ones(w, np.int64), np.eye(w, dtype=bool), pick) for w in (1, 2)}
    t = _round_times(runs, torch.device("cpu"), warmup=2, repeats=rounds, rng=rng)  # as the profile times them
    back = [_time(runs["N=1"]) for _ in range(rounds * 2)]
    print(f"{draft_name:<9} B = 1 L = {L}: plain step in the profile's random order "
          f"{np.median(t['N=1']) * 1e3:.1f} ms, back to back {np.median(back) * 1e3:.1f} ms (medians of {rounds} "
          f"and {2 * rounds} runs)", flush=True)


def main() -> None:
    torch.set_num_threads(2)
    target = load_model("smollm2-135m")
    with torch.inference_mode():
        for draft, B in (("int8", 1), ("layers:20", 1), ("int8", 4)):
            order(target, draft, B, 432)
        for L in (48, 432, 832):
            layout(target, L)
        for draft in ("int8", "layers:20"):
            for L in (48, 432, 832):
                mixed(target, draft, L)


if __name__ == "__main__":
    main()

"""Paired differences in tokens per call between heads replayed on the same prompts: `simulate --per-request` CSVs of
one configuration each, matched by prompt index; tokens per call is Σ tokens / Σ target calls over the prompts, and
the 95% interval of a difference resamples the prompts jointly for both heads (10,000 resamples, seed 0).

    python analyses/results/eagle3-samples-cpu-2026-11-27/paired.py NAME=FILE.csv NAME=FILE.csv ...

Prints each head's tokens per call and every later head minus the first.
"""

import csv
import sys

import numpy as np


def load(path: str) -> dict[int, tuple[float, float]]:
    with open(path) as f:
        return {int(r["prompt_index"]): (float(r["tokens"]), float(r["target_calls"])) for r in csv.DictReader(f)}


named = [arg.split("=", 1) for arg in sys.argv[1:]]
runs = {name: load(path) for name, path in named}
prompts = sorted(set.intersection(*(set(r) for r in runs.values())))
assert all(len(r) == len(prompts) for r in runs.values()), "the heads were replayed on different prompts"
tokens = {n: np.array([runs[n][p][0] for p in prompts]) for n in runs}
calls = {n: np.array([runs[n][p][1] for p in prompts]) for n in runs}
assert all(np.array_equal(tokens[n], tokens[named[0][0]]) for n in runs), "different trajectories"
rng = np.random.default_rng(0)
picks = rng.integers(0, len(prompts), size=(10_000, len(prompts)))


def per_call(name, rows=None):
    t, c = (tokens[name], calls[name]) if rows is None else (tokens[name][rows], calls[name][rows])
    return t.sum(-1) / c.sum(-1)


first = named[0][0]
print(f"{len(prompts)} prompts, {int(tokens[first].sum())} tokens; 95% intervals over 10,000 paired resamples of "
      "prompts")
for name, _ in named:
    lo, hi = np.percentile(per_call(name, picks), [2.5, 97.5])
    print(f"{name}: {per_call(name):.3f} [{lo:.3f}, {hi:.3f}]")
for name, _ in named[1:]:
    diff = per_call(name, picks) - per_call(first, picks)
    lo, hi = np.percentile(diff, [2.5, 97.5])
    print(f"{name} - {first}: {per_call(name) - per_call(first):+.3f} [{lo:+.3f}, {hi:+.3f}]")

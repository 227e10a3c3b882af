"""`specsim profile --engine vllm --for CACHE`: vLLM's own step times, written as a specsim cost profile.

To predict vLLM's speedup, price the replay with what vLLM's steps cost, not what specsim's own
engine's do. vLLM is timed as it runs (`vllm_worker.py`, action "profile"): B random prompts of L
tokens decode `steps` greedy tokens (EOS ignored); a request's step time is its decode time,
first to last token on the engine's own clock, over its steps; the median over requests is one
call's time, and every one of the `repeats` calls is kept (`runs`, their median the entry's
time), so the predictions' intervals resample them (the profile's own error). The step shapes
are forced:

* plain decoding: N = 1 (the plain step);
* a fixed proposer (vLLM's `custom_class` method, proposing k copies of the last token: almost
  never accepted) verifies exactly k drafts every step: N = k + 1 tokens per request;
* a draft model at the largest k: each step is k draft forwards plus the N = k + 1 verification,
  so one draft forward costs (its step - the fixed proposer's step) / k, call r against call r
  of the fixed proposer, entered at w = 1.

So every cost is vLLM's whole step (scheduling, sampling, the rejection sampler, bookkeeping
included), at the batch sizes (every one up to 8, as a lockstep batch shrinks through them:
`specsim.sim.cost.batch_grid`) and contexts the cache's replay prices: contexts run from the
cache's shortest prompt to its longest prompt plus output (each entry is stored at its decode
window's mean context). The profile names the cache's target and drafts (their architecture
fingerprints), so `simulate --cost-profile` accepts it for that cache, and says it was measured in
vLLM; `validate --engine vllm` then holds the prediction to ±15% of vLLM's measured speedup.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from specsim.errors import EngineError

STEPS = 16  # decode steps timed per generate call


def profile_plan(cache, drafts: Sequence[str], *, max_tokens: int, steps: int = STEPS) -> dict:
    """The worker request's runs, contexts and model for profiling `drafts` on `cache` (no vLLM started)."""
    from specsim.engines.check import read_cache
    from specsim.engines.export import draft_directory, model_directory
    from specsim.specs import is_model_free

    data = read_cache(cache)
    lengths = [len(p) for p in data.prompts]
    # windows of `steps` decode steps, labelled at their mean context: the last one's mean is the cache's longest
    # context, so no call of the replay lies past what was measured
    contexts = sorted({min(lengths), max(max(lengths) + data.max_new_tokens - steps // 2, min(lengths) + 1)})
    runs = [{"name": "plain"}] + [{"name": f"fixed{k}", "fixed": k} for k in range(1, max_tokens)]
    models = {}
    for d in drafts:
        if is_model_free(d):
            continue  # no draft forwards to time
        if d not in data.drafts:
            raise EngineError(f"{cache}: no draft named {d!r}; recorded drafts: {', '.join(data.drafts) or 'none'}")
        path = draft_directory(d, data.target, target_info=data.target_info, draft_info=data.drafts_info.get(d))
        runs.append({"name": f"draft:{d}", "speculative_config": {"method": "draft_model", "model": str(path),
                                                                   "num_speculative_tokens": max_tokens - 1}})
        models[d] = {"name": d, **data.drafts_info.get(d, {})}
    return {"model": model_directory(data.target, data.target_info), "runs": runs, "contexts": contexts,
            "steps": steps, "max_model_len": max(contexts) + steps + max_tokens + 16, "target": data.target,
            "target_info": data.target_info, "drafts": models}


def measure_vllm_profile(cache, drafts: Sequence[str], *, batches: Sequence[int], max_tokens: int,
                         steps: int = STEPS, repeats: int = 3, max_repeats: int | None = None, warmup: int = 1,
                         seed: int = 0, threads: int | None = None, python: Path | None = None,
                         log: Path | None = None, echo: Callable[[str], None] = lambda line: None,
                         progress: bool = False) -> dict:
    """Time vLLM's steps for `cache`'s target and `drafts` (the module docstring); the profile JSON body.
    `max_repeats` (default 2 x repeats + 1): the most calls an entry with a stalled call gets (`vllm_worker.STALL`).
    `progress`: a bar of the engines started and generate calls done, with the time left."""
    from specsim.engines.vllm import run_worker, vllm_version
    from specsim.sim.cost import batch_grid

    if max_tokens < 2:
        raise EngineError(f"--max-tokens {max_tokens}: at least 2 (N = 1 is the plain step)")
    batches = batch_grid([int(b) for b in batches])  # every B up to 8: the lockstep schedule visits each
    max_repeats = max(repeats, 2 * repeats + 1 if max_repeats is None else max_repeats)
    plan = profile_plan(cache, drafts, max_tokens=max_tokens, steps=steps)
    version = vllm_version(python)
    # SmolLM2-135M on a 2-core CPU (2026-11-29: 634 s measured against 577 estimated, 767 against 696): about 20 s
    # an engine's start, 0.2 x (1 + B / 4) s a step of B requests, 0.7 ms a prompt token
    call_s = sum(steps * 0.2 * (1 + B / 4) + 0.0007 * B * L for B in batches for L in plan["contexts"])
    echo(f"timing vLLM {version}: {len(plan['runs'])} engines (plain, a fixed proposer of 1..{max_tokens - 1} "
         f"drafts{', ' + ', '.join(plan['drafts']) if plan['drafts'] else ''}) x batch {batches} x context "
         f"{plan['contexts']} x {warmup + repeats} calls of {steps} steps (up to {warmup + max_repeats} where one "
         f"stalls); about {len(plan['runs']) * (20 + (warmup + repeats) * call_s):.0f} s for SmolLM2-135M on a "
         "2-core CPU")
    request = {"action": "profile", "model": plan["model"], "runs": plan["runs"], "batches": batches,
               "contexts": plan["contexts"], "steps": steps, "repeats": repeats, "max_repeats": max_repeats,
               "warmup": warmup, "seed": seed, "threads": threads, "max_model_len": plan["max_model_len"]}
    result = run_worker(request, python=python, log=log, progress=progress)
    return profile_body(plan, result, batches=batches, max_tokens=max_tokens, steps=steps, repeats=repeats,
                        warmup=warmup, version=version, max_repeats=max_repeats)


def profile_body(plan: dict, result: dict, *, batches: Sequence[int], max_tokens: int, steps: int, repeats: int,
                 warmup: int, version: str, max_repeats: int | None = None) -> dict:
    """A specsim-cost-profile (v2) body from the worker's step times."""
    times = result["steps_s"]
    mid = steps // 2  # a call's entries sit at its decode window's mean context
    contexts = [L + mid for L in plan["contexts"]]
    cell = lambda xs: {"median": statistics.median(xs), "q25": min(xs), "q75": max(xs), "runs": xs}  # noqa: E731
    verify, draft, spread = {}, {d: {} for d in plan["drafts"]}, []
    K = max_tokens - 1
    for B in batches:
        for L, Lc in zip(plan["contexts"], contexts):
            row = {"1": cell(times["plain"][str(B)][str(L)])}
            for k in range(1, max_tokens):
                row[str(k + 1)] = cell(times[f"fixed{k}"][str(B)][str(L)])
            verify.setdefault(str(B), {})[str(Lc)] = row
            spread += [(c["q75"] - c["q25"]) / c["median"] for c in row.values()]
            for d in plan["drafts"]:
                # round r's forward: the draft-model step of its r-th call minus the fixed proposer's r-th, over k;
                # kept per round, so that the predictions' intervals resample them with the target's entries
                draft_steps = times[f"draft:{d}"][str(B)][str(L)]
                runs = [max((s - f) / K, 1e-6) for s, f in zip(draft_steps, row[str(K + 1)]["runs"])]
                one = {"median": statistics.median(runs), "runs": runs, "step_s": statistics.median(draft_steps),
                       "k": K}  # per forward, whatever its width (below)
                draft[d].setdefault(str(B), {})[str(Lc)] = {str(w): dict(one) for w in range(1, max_tokens + 1)}
    return {
        "format": "specsim-cost-profile", "version": 2, "engine": f"vllm {version}",
        "device": f"cpu ({result.get('threads') or 'vLLM default'} OMP threads)", "device_type": "vllm",
        "dtype": "float32", "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "target": {"name": plan["target"], **plan["target_info"]}, "drafts": plan["drafts"],
        "batches": list(batches), "contexts": contexts, "sizes": list(range(1, max_tokens + 1)),
        "widths": list(range(1, max_tokens + 1)),
        "timing": {"warmup": warmup, "repeats": repeats, "max_repeats": max_repeats or repeats, "statistic": "median",
                   "spread": "min/max of repeats",
                   "clock": "vLLM's engine clock: a request's first to last token over its steps", "steps": steps,
                   "tokens": "random ids, greedy, EOS ignored",
                   "shapes": "N = k + 1 by a fixed proposer of k drafts (custom_class); draft forwards from "
                             f"draft_model steps at k = {K} minus the fixed proposer's, round by round, per forward: "
                             "every width w carries that one time (vLLM's first draft forward takes the tokens "
                             "the last step accepted; its width is not varied here)"},
        "target_verify_s": verify, "draft_step_s": draft,
        "fit": {"max_relative_error": max(spread) if spread else None,
                "method": "spread (max - min) / median of the repeated vLLM runs of each entry"},
    }

"""Run vLLM on given token ids and report what it generated and counted: a program of its own.

specsim drives vLLM as a separate program (docs/design.md §6): vLLM pins its own torch and
transformers, so it lives in its own virtual environment (`make vllm`), and specsim runs this
file there, by path, with that environment's Python:

    .venv-vllm/bin/python specsim/engines/vllm_worker.py REQUEST.json RESULT.json

It imports the standard library and vLLM only (never specsim). The request names the model,
the prompts as token ids (so vLLM sees exactly the cache's inputs), the sampling settings and
one or more runs, each with its own `speculative_config` (or none: plain decoding); the result
holds, per run and repeat, every request's output tokens, vLLM's spec-decode counters over the
run (the `vllm:spec_decode_*` metrics of `LLM.get_metrics()`, as differences across the run),
each request's own per-step accepted and proposed counts (`per_request_spec_decode_metrics=
"detailed"`), and the wall time of the `generate` call. With `rounds` > 1 every run is timed that
many times, the runs alternating, after one untimed warm-up each, so that their speed compares
within one process on the same machine state.

The result is written to a temporary file and renamed into place: a reader sees all of it or none.
"""

from __future__ import annotations

import json
import os
import sys
import time

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")


def _counters(llm) -> dict:
    """The spec-decode counters so far (cumulative over the engine's life), zeros when it has none."""
    out: dict = {name: 0 for name in COUNTERS[:3]}
    out[COUNTERS[3]] = []
    for metric in llm.get_metrics():
        if metric.name in COUNTERS:
            value = getattr(metric, "values", None)
            out[metric.name] = list(value) if value is not None else getattr(metric, "value", 0)
    return out


def _minus(after: dict, before: dict) -> dict:
    out = {name: after[name] - before[name] for name in COUNTERS[:3]}
    a, b = after[COUNTERS[3]], before[COUNTERS[3]]
    b = list(b) + [0] * (len(a) - len(b))
    out[COUNTERS[3]] = [x - y for x, y in zip(a, b)]
    return {name.removeprefix("vllm:spec_decode_"): value for name, value in out.items()}


def _request_record(output) -> dict:
    completion = output.outputs[0]
    metrics = getattr(completion, "spec_decode_metrics", None)
    stats = getattr(output, "metrics", None)
    record = {"tokens": list(completion.token_ids), "finish_reason": completion.finish_reason,
              "spec": metrics.to_dict() if metrics is not None else None}
    if stats is not None and getattr(stats, "first_token_ts", 0) and getattr(stats, "last_token_ts", 0):
        record["decode_s"] = float(stats.last_token_ts - stats.first_token_ts)
    return record


def main(request_path: str, result_path: str) -> None:
    with open(request_path) as f:
        request = json.load(f)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(request.get("kv_cache_space_gib", 2)))
    if request.get("threads"):
        os.environ.setdefault("OMP_NUM_THREADS", str(request["threads"]))
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(map(int, ids))) for ids in request["prompts"]]
    engines = {}
    for run in request["runs"]:
        kwargs = dict(model=request["model"], tokenizer=request.get("tokenizer") or request["model"],
                      dtype=request.get("dtype", "float32"), enforce_eager=True, seed=int(request.get("seed", 0)),
                      max_model_len=int(request["max_model_len"]), max_num_seqs=int(request.get("batch", 1)),
                      disable_log_stats=False, per_request_spec_decode_metrics="detailed")
        if run.get("speculative_config"):
            kwargs["speculative_config"] = run["speculative_config"]
        engines[run["name"]] = LLM(**kwargs)

    temperature = float(request.get("temperature", 0.0))
    repeats = int(request.get("repeats", 1))
    rounds = max(1, int(request.get("rounds", 1)))

    def params(repeat: int) -> list:
        base = int(request.get("seed", 0))
        return [SamplingParams(temperature=temperature, max_tokens=int(request["max_tokens"]),
                               seed=None if temperature == 0 else base * 1_000_003 + repeat * 10_007 + i,
                               ignore_eos=bool(request.get("ignore_eos", False)))
                for i in range(len(prompts))]

    def generate(name: str, repeat: int) -> dict:
        llm = engines[name]
        before = _counters(llm)
        started = time.perf_counter()
        outputs = llm.generate(prompts, params(repeat), use_tqdm=False)
        seconds = time.perf_counter() - started
        return {"repeat": repeat, "seconds": seconds, "counters": _minus(_counters(llm), before),
                "requests": [_request_record(o) for o in outputs]}

    result = {"vllm": vllm.__version__, "runs": {run["name"]: [] for run in request["runs"]}, "timings": []}
    if rounds > 1:  # timing: warm up each engine, then alternate
        for name in engines:
            generate(name, 0)
        for r in range(rounds):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            result["timings"].append({name: generate(name, 0)["seconds"] for name in order})
    for name in engines:
        for repeat in range(repeats):
            result["runs"][name].append(generate(name, repeat))
    tmp = result_path + ".partial"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)


if __name__ == "__main__":  # vLLM spawns its engine processes: nothing runs at import
    # Run by path, Python puts this folder first on sys.path, where specsim's own vllm.py would shadow vLLM.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    if len(sys.argv) != 3:
        sys.exit("usage: python vllm_worker.py REQUEST.json RESULT.json")
    main(sys.argv[1], sys.argv[2])

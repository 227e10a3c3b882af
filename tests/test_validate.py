"""`specsim validate`: live decoding on a cache's own setup agrees with the simulator.

The tiny recorded cache (conftest: tiny Llama, drafts layers:2 and int8, T=0 and
T=1, 4 prompts x 12 tokens) is small enough to rerun live in seconds; the packaged
SmolLM2 check is marked slow.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from specsim.cli import main
from specsim.live.runs import LiveRun, LiveTrajectory
from specsim.live.validate import greedy_agreement, near_tie_tolerance, token_gap, top2_gap
from specsim.specs import parse_tree


def _validate(*args: str):
    return CliRunner().invoke(main, ["validate", *args, "--quiet", "--threads", "1"], env={"COLUMNS": "400"})


def _shifted(run: LiveRun) -> LiveRun:
    """The same live run with every call's accepted length shifted by one (mod 4): a wrong replay."""
    from specsim.live.decoder import Decoded, StepRecord

    return LiveRun(config=run.config, target=run.target, draft=run.draft, trajectories=[
        LiveTrajectory(t.prompt, t.repeat, t.seed, Decoded(
            tokens=t.live.tokens, seconds=t.live.seconds, stop_reason=t.live.stop_reason,
            steps=tuple(StepRecord(s.start, (s.accepted + 1) % 4, s.path, s.drafted, s.draft_s, s.verify_s)
                        for s in t.live.steps)), t.plain)
        for t in run.trajectories])


def _live_layers2(cache, model_dir):
    """Live chain:3 decoding of the cache's prompts with the tiny model and its layers:2 draft."""
    from specsim.live.drafting import ModelDrafter
    from specsim.live.decoder import LiveConfig, Target
    from specsim.live.runs import run_live
    from specsim.live.validate import cache_setup
    from specsim.record.models import eos_token_ids, load_draft, load_model

    setup = cache_setup(cache)
    target = load_model(str(model_dir))
    tree = parse_tree("chain:3")
    draft = load_draft("layers:2", target)
    run = run_live(Target(target.model, eos_token_ids(target)), ModelDrafter(draft.model, "layers:2"), setup.prompts,
                   LiveConfig(tree=tree, max_new_tokens=setup.max_new_tokens), target_name="tiny", progress=False)
    return run, tree, draft


def test_greedy_validation_passes_on_the_tiny_cache(tiny_cache, tmp_path):
    steps = tmp_path / "steps.csv"
    result = _validate(str(tiny_cache), "--tree", "chain:3", "--tree", "widths:2,2,1", "--draft", "layers:2",
                       "--steps-out", str(steps))
    assert result.exit_code == 0, result.output
    assert result.output.count("PASS") == 2
    assert "output = cached trajectory" in result.output
    assert "all 2 checks passed" in result.output
    frame = pl.read_csv(steps)
    assert set(frame["tree"]) == {"chain:3", "widths:2,2,1"}
    assert (frame["live"] == frame["simulated"]).mean() >= 0.99
    assert frame["simulated"].sum() > 0  # the draft got something accepted: the comparison is not all zeros


def test_sampling_validation_on_four_prompts_reports_the_paired_difference(tiny_cache):
    """4 cached prompts x 8 live decodes: both intervals and the paired difference are printed; over 4 prompts a
    paired interval that excludes 0 (this cache's does: -0.077 [-0.146, -0.008]) is inconclusive, not a failure."""
    result = _validate(str(tiny_cache), "--tree", "chain:3", "--policy", "sample", "--draft", "int8",
                       "--repeats", "8")
    assert result.exit_code == 0, result.output
    assert "32 live decodes" in result.output  # 4 prompts x 8 repeats
    assert "paired by prompt, live - sim" in result.output
    assert "over 4 prompts, too few to hold its level" in result.output and "inconclusive" in result.output


def test_sampling_validation_judges_the_difference_paired_by_prompt(tiny_model_dir, tmp_path):
    """24 prompts at T = 1: live decoding with the int8 draft against its replay passes, with a paired difference
    near 0; against the replay of another draft (a wrong replay: acceptance 0.3 instead of 0.9) the same live run
    fails, and so does a live rate moved by about 0.08 against the right replay."""
    import dataclasses

    import torch

    from specsim.live.decoder import LiveConfig, Target
    from specsim.live.drafting import ModelDrafter
    from specsim.live.runs import run_live, summary_rows
    from specsim.live.validate import _paired, _sampling_check, cache_setup
    from specsim.record.models import eos_token_ids, load_draft, load_model
    from specsim.sim.sweep import SweepConfig, sweep

    torch.set_num_threads(1)
    words = "the cat sat on a mat while birds sang far from home".split()
    rng = np.random.default_rng(0)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "x", "turns": [
        " ".join(rng.choice(words, 6))]}) + "\n" for i in range(24)))
    cache = tmp_path / "t1.h5"
    rec = CliRunner().invoke(main, ["cache", "--target", str(tiny_model_dir), "--draft", "int8,layers:2",
                                    "--prompts", str(prompts), "--max-new-tokens", "24", "--temperature", "1",
                                    "--device", "cpu", "--out", str(cache), "--quiet"])
    assert rec.exit_code == 0, rec.output
    setup = cache_setup(cache)
    target = load_model(str(tiny_model_dir))
    config = LiveConfig.for_policy(parse_tree("chain:3"), "sample", 1.0, max_new_tokens=setup.max_new_tokens)
    run = run_live(Target(target.model, eos_token_ids(target)), ModelDrafter(load_draft("int8", target).model, "int8"),
                   setup.prompts, config, target_name="tiny", repeats=2, plain=False, progress=False)
    live_row = summary_rows(run, by_category=False)[0]
    head = dict(draft="int8", tree="chain:3", policy="sample", temperature=1.0, batch=1)

    def check(draft, live=run):
        replay = sweep(cache, SweepConfig(trees=["chain:3"], drafts=[draft], policies=["sample"], temperatures=[1.0],
                                          by_category=False), on_skip=lambda line: None)
        return _sampling_check(head, live_row, replay.rows.row(0, named=True), _paired(live, replay.requests))

    right = check("int8")
    assert right.passed is True and abs(right.values["paired_difference"]) < 0.03, right.detail
    assert "verdict: the paired interval holds 0" in right.detail
    wrong = check("layers:2")
    assert wrong.passed is False and wrong.values["paired_difference_lo"] > 0.4, wrong.detail
    # a live run accepting one draft token less in every fourth call: about 0.08 below the replay
    moved = dataclasses.replace(run, trajectories=[dataclasses.replace(t, live=dataclasses.replace(
        t.live, steps=[dataclasses.replace(s, accepted=max(s.accepted - (i % 4 == 0), 0))
                       for i, s in enumerate(t.live.steps)])) for t in run.trajectories])
    shifted = check("int8", moved)
    assert shifted.passed is False and shifted.values["paired_difference_hi"] < 0, shifted.detail


def test_a_wrong_replay_is_an_unexplained_failure(tiny_cache, tiny_model_dir):
    """Shift every live acceptance by one: the check must call it a bug, not a near-tie."""
    import torch

    torch.set_num_threads(1)
    run, tree, draft = _live_layers2(tiny_cache, tiny_model_dir)
    good = greedy_agreement(run, tiny_cache, "layers:2", tree)
    assert good.passed and good.agreement == 1.0
    broken = _shifted(run)
    bad = greedy_agreement(broken, tiny_cache, "layers:2", tree)
    assert not bad.passed and bad.unexplained > 0
    # Rerunning the draft stepwise reproduces the cache, so it excuses none of them.
    rerun = greedy_agreement(broken, tiny_cache, "layers:2", tree, draft_model=draft.model)
    assert rerun.unexplained == bad.unexplained and rerun.draft_mismatches == 0


def test_near_tie_helpers():
    logits = np.array([1.0, 3.0, 3.0004, -2.0])
    assert token_gap(logits, 1) == pytest.approx(0.0004)
    assert token_gap(logits, 0) == pytest.approx(2.0)
    gap, top = top2_gap(logits)
    assert gap == pytest.approx(0.0004) and top == pytest.approx(3.0004)
    assert gap <= near_tie_tolerance(top) < 0.1


def test_validate_refuses_what_the_cache_cannot_check(tiny_cache, tmp_path):
    result = _validate(str(tiny_cache), "--draft", "layers:9")
    assert result.exit_code == 1
    assert "no draft named 'layers:9'; recorded drafts: layers:2, int8" in result.output
    result = _validate(str(tiny_cache), "--policy", "sample", "--temperature", "0.5")
    assert result.exit_code == 1 and "at 0.5; recorded: 0, 1" in result.output
    result = _validate(str(tmp_path / "missing.h5"))
    assert result.exit_code == 2 and "does not exist" in result.output


def test_validate_compares_predicted_and_live_speedup(tiny_cache, tiny_profile, tmp_path):
    out = tmp_path / "checks.csv"
    # a tiny model's steps take milliseconds: timing noise is large, so this checks the plumbing, not the ratio
    result = _validate(str(tiny_cache), "--tree", "chain:3", "--draft", "int8", "--cost-profile", str(tiny_profile),
                       "--batch", "2", "--speed-tolerance", "10", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "speedup: predicted from" in result.output and "batch 2 lockstep" in result.output
    frame = pl.read_csv(out)
    assert {"speedup_predicted", "speedup_live", "ratio", "tokens_per_s_live"} <= set(frame.columns)
    speed = frame.filter(pl.col("check") == "speedup").row(0, named=True)
    assert speed["ratio"] == pytest.approx(speed["speedup_predicted"] / speed["speedup_live"])
    assert speed["batch"] == 2 and speed["speedup_live"] > 0 and speed["verdict"] == "PASS"
    assert speed["speedup_live_lo"] < speed["speedup_live_hi"]  # the live side's own interval, beside the prediction
    assert f"vs live {speed['speedup_live']:.3f} [{speed['speedup_live_lo']:.3f}, {speed['speedup_live_hi']:.3f}]" \
        in result.output
    drift = speed["plain_tokens_per_s_live"] / speed["plain_tokens_per_s_predicted"]  # the machine since profiling
    assert f"plain decoding ran live at {drift:.3f}x the tokens/s the profile predicts (1 plain run)" in result.output
    assert frame.filter(pl.col("check") == "greedy calls")["verdict"].to_list() == ["PASS"]
    # the check can fail: no prediction is within a millionth of a measured speedup
    strict = _validate(str(tiny_cache), "--tree", "chain:3", "--draft", "int8", "--cost-profile", str(tiny_profile),
                       "--batch", "2", "--speed-tolerance", "0.000001", "--out", str(tmp_path / "strict.csv"))
    assert strict.exit_code != 0 and "FAIL" in strict.output
    verdicts = pl.read_csv(tmp_path / "strict.csv").filter(pl.col("check") == "speedup")["verdict"].to_list()
    assert verdicts == ["FAIL"]


def test_validate_predicts_from_several_profiles_pooled(tiny_cache, tiny_profile, tmp_path):
    """--cost-profile twice: the prediction is simulate's from the two pooled (their times averaged), not either
    one's, and the output says which profiles it pooled; vLLM's check takes one and says so."""
    import json

    import specsim
    from specsim.sim.cost import load_cost_profiles

    body = json.loads(tiny_profile.read_text())
    for table in body["draft_step_s"].values():  # the second profile found every draft forward 3x slower
        for by_context in table.values():
            for cells in by_context.values():
                for cell in cells.values():
                    cell["median"] *= 3
                    cell["runs"] = [3 * r for r in cell["runs"]]
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(body))
    out = tmp_path / "checks.csv"
    result = _validate(str(tiny_cache), "--tree", "chain:3", "--draft", "int8", "--cost-profile", str(tiny_profile),
                       "--cost-profile", str(slow), "--speed-tolerance", "10", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"predicted from {tiny_profile}, {slow} pooled" in result.output
    predicted = pl.read_csv(out).filter(pl.col("check") == "speedup")["speedup_predicted"][0]
    expect = lambda cost: specsim.simulate(tiny_cache, trees=["chain:3"], drafts=["int8"], cost_profile=cost,  # noqa: E731
                                           by_category=False).filter(pl.col("temperature") == 0)["speedup"][0]
    assert predicted == pytest.approx(expect(load_cost_profiles([tiny_profile, slow])))
    assert expect(slow) < predicted < expect(tiny_profile)
    vllm = _validate(str(tiny_cache), "--engine", "vllm", "--cost-profile", str(tiny_profile), "--cost-profile",
                     str(slow))
    assert vllm.exit_code != 0 and "compares with one --cost-profile" in vllm.output


def test_validate_refuses_a_profile_of_other_models_before_loading_any(tiny_cache, tmp_path):
    import json

    from tests.test_cost import profile_body

    other = tmp_path / "other.json"
    other.write_text(json.dumps(profile_body(target={"name": "someone-else"})))
    result = _validate(str(tiny_cache), "--draft", "int8", "--cost-profile", str(other))
    assert result.exit_code == 2 and "measured for target someone-else, not for this cache's target" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_validate_checks_a_batch_without_a_cost_profile(tiny_cache):
    """--batch 2 and no profile: the call-for-call check of every request (it used to crash looking for a priced row of
    batch 2 among the unpriced replay's)."""
    result = _validate(str(tiny_cache), "--tree", "chain:3", "--draft", "int8", "--batch", "2",
                       "--batching", "continuous")
    assert result.exit_code == 0, result.output
    assert "calls identical (100.0%)" in result.output and "PASS" in result.output


def test_validate_refuses_a_batch_the_profile_did_not_measure_before_decoding(tiny_cache, tiny_profile, monkeypatch):
    """--batch 8 with a profile of batches 1-2: one line, before any model loads (it used to decode every prompt live
    first, then fail while pricing)."""
    import specsim.live.runs as runs

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(runs, "load_target", never)
    result = _validate(str(tiny_cache), "--tree", "chain:3", "--draft", "int8", "--cost-profile", str(tiny_profile),
                       "--batch", "8")
    assert result.exit_code == 2 and "batch 8 is beyond what it measured (1-2" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_validate_on_the_packaged_model(tmp_path):
    """SmolLM2-135M with the int8 and an early-exit draft: record a short cache, then validate greedy chain +
    tree with both, and sampling with the int8 draft (an early-exit draft's live decoding costs three times the
    int8's here, and its sampling adds nothing the int8's does not check). The int8 draft is batch-invariant, so
    its calls agree with the replay too."""
    cache = tmp_path / "v.h5"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"question_id": 1, "category": "qa", "turns": ["Name three colours."]}\n'
                       '{"question_id": 2, "category": "math", "turns": ["What is 7 times 6?"]}\n')
    rec = CliRunner().invoke(main, ["cache", "--target", "smollm2-135m", "--draft", "layers:20", "--draft", "int8",
                                    "--prompts", str(prompts),
                                    "--max-new-tokens", "12", "--temperature", "0", "--temperature", "0.7",
                                    "--device", "cpu", "--out", str(cache), "--quiet"])
    assert rec.exit_code == 0, rec.output
    trees = ("--tree", "chain:4", "--tree", "widths:2,2,1")
    result = _validate(str(cache), *trees, "--policy", "greedy", "--device", "cpu")
    assert result.exit_code == 0, result.output
    greedy = [line for line in result.output.splitlines() if "greedy calls" in line]
    assert len(greedy) == 4 and all("PASS" in line for line in greedy), result.output  # 2 drafts x 2 trees
    result = _validate(str(cache), *trees, "--draft", "int8", "--policy", "sample", "--repeats", "1", "--device",
                       "cpu")
    assert result.exit_code == 0, result.output
    sampling = [line for line in result.output.splitlines() if " acceptance " in line]
    assert len(sampling) == 2, result.output  # 2 trees
    # over 2 prompts a paired interval that excludes 0 is inconclusive: never a FAIL, and said so
    assert all("paired by prompt" in line and "FAIL" not in line for line in sampling), result.output


def test_suffix_draft_validates_call_for_call(tiny_model_dir, tiny_cache, tmp_path):
    """The global tree carries earlier outputs: live decodes the prompts in cache order, one at a time. The
    second request repeats the first, so the suffix draft is accepted there (the comparison is not of zeros)."""
    from tests.cli_helpers import record

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"category": "qa", "turns": ["Name three colours."]}\n' * 2
                       + '{"category": "qa", "turns": ["What is 7 times 6?"]}\n')
    cache = tmp_path / "repeat.h5"
    record("--target", tiny_model_dir, "--draft", "int8", "--prompts", prompts, "--max-new-tokens", "12",
           "--temperature", "0", "--device", "cpu", "--out", cache)
    steps = tmp_path / "steps.csv"
    result = _validate(str(cache), "--tree", "chain:3", "--tree", "widths:2,1", "--draft", "suffix:prob=0",
                       "--steps-out", str(steps))
    assert result.exit_code == 0, result.output
    assert result.output.count("PASS") == 2 and "output = cached trajectory" in result.output
    frame = pl.read_csv(steps)
    assert (frame["live"] == frame["simulated"]).all()
    assert frame["live"].sum() > 0  # drafts were accepted on the repeated request
    batched = _validate(str(tiny_cache), "--tree", "chain:3", "--draft", "suffix", "--batch", "2")
    assert batched.exit_code != 0 and "one request at a time (--batch 1)" in batched.output


def test_greedy_validation_on_a_stats_only_cache(tiny_model_dir, tiny_prompts_file, tmp_path):
    """A stats-only cache keeps no logits: disagreements are classified from the draft rerun instead, and a
    wrong replay is still an unexplained failure."""
    from tests.cli_helpers import record

    stats = tmp_path / "stats.h5"
    record("--target", tiny_model_dir, "--draft", "layers:2", "--prompts", tiny_prompts_file, "--max-new-tokens", 12,
           "--temperature", 0, "--store", "stats", "--out", stats)
    result = _validate(str(stats), "--tree", "chain:3", "--draft", "layers:2")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output and "output = cached trajectory" in result.output

    run, tree, draft = _live_layers2(stats, tiny_model_dir)
    broken = _shifted(run)
    bad = greedy_agreement(broken, stats, "layers:2", tree, draft_model=draft.model)
    assert not bad.passed and bad.unexplained > 0 and bad.draft_mismatches == 0
    assert {s.verdict for s in bad.steps} <= {"identical", "unexplained", "near-tie (draft)"}


def test_adaptive_schedules_validate_call_for_call_and_by_acceptance(tiny_cache, tmp_path):
    """An adaptive chain decoded live: at T = 0 every call's acceptance equals the replay's for the chain the
    replayed schedule gives at that call; at T = 1 the acceptance CIs overlap."""
    steps = tmp_path / "steps.csv"
    result = _validate(str(tiny_cache), "--tree", "chain:2", "--policy", "adaptive-hf,adaptive-history:0.6,0.2",
                       "--draft", "layers:2", "--repeats", "8", "--steps-out", str(steps))
    assert result.exit_code == 0, result.output
    assert result.output.count("PASS") == 4, result.output  # 2 schedules x (T = 0 calls, T = 1 acceptance)
    assert "adaptive-history:0.6,0.2" in result.output and "CIs overlap" in result.output
    frame = pl.read_csv(steps)
    assert (frame["live"] == frame["simulated"]).all() and frame["simulated"].sum() > 0


def test_a_wrong_schedule_fails_the_call_check(tiny_cache, tiny_model_dir):
    """The check replays γ itself: a live run under adaptive-hf compared against a frozen schedule's γ table
    (adaptive-history:1,0 keeps γ = 2) disagrees on the calls that accepted more than two drafts."""
    import torch

    from specsim.live.decoder import LiveConfig, Target
    from specsim.live.runs import run_live
    from specsim.live.validate import cache_setup
    from specsim.live.drafting import ModelDrafter
    from specsim.record.models import eos_token_ids, load_draft, load_model

    torch.set_num_threads(1)
    setup = cache_setup(tiny_cache)
    target = load_model(str(tiny_model_dir))
    tree = parse_tree("chain:2")
    config = LiveConfig.for_policy(tree, "adaptive-hf", 0.0, max_new_tokens=setup.max_new_tokens)
    run = run_live(Target(target.model, eos_token_ids(target)),
                   ModelDrafter(load_draft("int8", target).model, "int8"), setup.prompts, config,
                   target_name="tiny", progress=False)
    right = greedy_agreement(run, tiny_cache, "int8", tree, schedule=config.next_gamma())
    assert right.passed and right.agreement == 1.0
    other = LiveConfig.for_policy(tree, "adaptive-history:1,0", 0.0, max_new_tokens=setup.max_new_tokens)
    wrong = greedy_agreement(run, tiny_cache, "int8", tree, schedule=other.next_gamma())
    assert any(step.live > 2 for step in right.steps), [step.live for step in right.steps]
    assert not wrong.passed and wrong.unexplained > 0


@pytest.mark.parametrize("prompts,overlap,verdict", [
    (13, False, "FAIL"), (4, False, "inconclusive"), (4, True, "PASS"), (13, True, "PASS"),
])
def test_disjoint_acceptance_on_few_cached_prompts_is_inconclusive(prompts, overlap, verdict):
    """A bootstrap over a handful of cached prompts understates the replay's error: disjoint CIs there say
    so instead of failing; with enough prompts they fail."""
    from specsim.checks import MIN_SAMPLING_PROMPTS
    from specsim.live.validate import _sampling_check

    assert 4 < MIN_SAMPLING_PROMPTS <= 13
    live = {"accept_rate": 0.29, "accept_rate_lo": 0.27, "accept_rate_hi": 0.31, "n_decodes": 256}
    sim = {"accept_rate": 0.17 if not overlap else 0.28, "accept_rate_lo": 0.11 if not overlap else 0.2,
           "accept_rate_hi": 0.23 if not overlap else 0.35, "n_positions": 48, "n_prompts": prompts,
           "estimate": "exact"}
    check = _sampling_check(dict(draft="d", tree="chain:1", policy="sample", temperature=1.0, batch=1), live, sim)
    assert check.verdict == verdict
    if verdict == "inconclusive":
        assert f"bootstrap over {prompts} cached prompts" in check.detail

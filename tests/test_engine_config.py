"""How specsim drives vLLM, without vLLM: its environment, the speculative_config a configuration maps to,
what it refuses, and the layers:K draft written out as a model directory."""

import json
import stat

import numpy as np
import pytest

from specsim.engines.vllm import EngineDraft, speculative_config, vllm_python, vllm_version
from specsim.errors import EngineError
from specsim.specs import parse_tree


def test_the_mapping_to_vllms_speculative_config():
    assert speculative_config("vllm-ngram:min=2,max=3", parse_tree("chain:4"), "greedy") == EngineDraft(
        "ngram", {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 3, "num_speculative_tokens": 4})
    got = speculative_config("layers:20", parse_tree("chain:3"), "greedy", draft_dir="/m/d")
    assert got.config == {"method": "draft_model", "model": "/m/d", "num_speculative_tokens": 3}
    # T > 0: vLLM's draft_sample_method, named for the rule it runs
    assert speculative_config("layers:20", parse_tree("chain:3"), "greedy-draft",
                              draft_dir="/m/d").config["draft_sample_method"] == "greedy"
    assert speculative_config("layers:20", parse_tree("chain:3"), "sample",
                              draft_dir="/m/d").config["draft_sample_method"] == "probabilistic"
    # an EAGLE head: vLLM's eagle method on the head's directory in its layout (engines.export.export_eagle)
    assert speculative_config("eagle:heads/e", parse_tree("chain:2"), "greedy", draft_dir="/m/e").config == {
        "method": "eagle", "model": "/m/e", "num_speculative_tokens": 2}


@pytest.mark.parametrize("draft,tree,policy,why", [
    ("int8", "chain:3", "greedy", "int8 is specsim's batch-invariant W8A8"),
    ("ngram:3", "chain:3", "greedy", "SGLang's n-gram rule; vLLM's is vllm-ngram:min=A,max=B"),
    ("prompt-lookup:2", "chain:3", "greedy", "Hugging Face's prompt lookup"),
    ("layers:20", "kary:2,2", "greedy", "vLLM drafts chains"),
    ("layers:20", "widths:1,1,2", "greedy", "vLLM drafts chains"),
    ("layers:20", "chain:3", "p>=q", "not lossy or adaptive rules"),
    ("layers:20", "chain:3", "block", "V1 runner, which has no block rule"),
    ("medusa:heads/m", "chain:3", "greedy", "specsim checks EAGLE heads against vLLM"),
])
def test_what_vllm_cannot_run_is_refused_with_the_reason(draft, tree, policy, why):
    with pytest.raises(EngineError, match=why):
        speculative_config(draft, parse_tree(tree), policy, draft_dir="/m/d")


def test_a_missing_or_broken_vllm_environment_says_how_to_create_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSIM_VLLM_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(EngineError, match=r"no such Python; create it with `make vllm`"):
        vllm_python()
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named vllm' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SPECSIM_VLLM_PYTHON", str(broken))
    with pytest.raises(EngineError, match=r"is broken \(ModuleNotFoundError: No module named vllm\); recreate it"):
        vllm_version()
    monkeypatch.delenv("SPECSIM_VLLM_PYTHON")
    monkeypatch.chdir(tmp_path)
    import specsim.engines.vllm as engine

    monkeypatch.setattr(engine, "__file__", str(tmp_path / "a" / "b" / "vllm.py"))
    with pytest.raises(EngineError, match=r"no vLLM environment \(.*\.venv-vllm.* missing\); create it with"):
        vllm_python()


def test_the_cli_prints_one_line_without_vllm(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from specsim.cli import main
    from tests.synthetic import random_cache

    cache = random_cache(tmp_path / "c.h5", temperatures=(0.0,), max_new_tokens=24)
    monkeypatch.setenv("SPECSIM_VLLM_PYTHON", str(tmp_path / "none"))
    result = CliRunner().invoke(main, ["validate", str(cache), "--engine", "vllm", "--draft",
                                       "vllm-ngram:min=2,max=3", "--tree", "chain:3"])
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1].startswith("Error: ")
    assert "make vllm" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["validate", str(cache), "--engine", "vllm", "--draft", "small", "--tree",
                                       "kary:2,2"])
    assert result.exit_code == 1 and "vLLM drafts chains" in result.output.strip().splitlines()[-1]


def test_layers_k_is_written_once_as_a_model_directory_with_the_target_tokenizer(tiny_model_dir, tmp_path):
    import torch

    from specsim.engines.export import MARKER, export_layers
    from specsim.record.models import load_draft, load_model

    out = export_layers(str(tiny_model_dir), 2, out=tmp_path / "d")
    assert json.loads((out / MARKER).read_text())["layers"] == 2
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert export_layers(str(tiny_model_dir), 2, out=tmp_path / "d") == out  # kept, not rewritten
    assert (out / "model.safetensors").stat().st_mtime_ns == before
    written = load_model(str(out))
    derived = load_draft("layers:2", load_model(str(tiny_model_dir)))
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.inference_mode():
        np.testing.assert_array_equal(written.model(ids).logits.numpy(), derived.model(ids).logits.numpy())
    assert written.info["tokenizer_sha256"] == derived.info["tokenizer_sha256"]
    assert not any(p.name.endswith(".writing") for p in tmp_path.iterdir())


# each entry's three calls: its median times these (the draft model's calls slow where the others' are fast)
FACTORS = {"plain": (0.9, 1.0, 1.2), "fixed1": (0.9, 1.0, 1.2), "fixed2": (0.9, 1.0, 1.2),
           "draft:small": (1.2, 1.0, 0.9)}


def test_vllms_step_times_become_a_profile_the_cache_accepts(tmp_path):
    """`profile --engine vllm`'s arithmetic, without vLLM: N = k + 1 from the fixed proposer, a draft forward
    from the draft model's step minus the fixed proposer's at the same k, over k; contexts at the window's mean."""
    import specsim
    from specsim.cache.reader import CacheReader
    from specsim.engines.vllm_profile import profile_body
    from specsim.sim.cost import load_cost_profile
    from tests.synthetic import random_cache

    cache = random_cache(tmp_path / "c.h5", temperatures=(0.0,), drafts=("small",), max_new_tokens=30)
    with CacheReader(cache) as r:
        info = dict(r.meta["target"])
    plan = {"target": "synthetic-target", "target_info": info, "drafts": {"small": {"name": "small"}},
            "contexts": [8, 40]}
    step = lambda base, B, L: base * (1 + 0.1 * B) * (1 + L / 100)  # noqa: E731
    times = {"plain": {}, "fixed1": {}, "fixed2": {}, "draft:small": {}}
    for B in (1, 4):
        for L in (8, 40):
            for name, base in (("plain", 0.010), ("fixed1", 0.012), ("fixed2", 0.014), ("draft:small", 0.020)):
                times[name].setdefault(str(B), {})[str(L)] = [base * f * step(1, B, L) for f in FACTORS[name]]
    body = profile_body(plan, {"steps_s": times, "threads": None}, batches=[1, 4], max_tokens=3, steps=16, repeats=3,
                        warmup=1, version="0.32.0")
    assert body["contexts"] == [16, 48] and body["sizes"] == [1, 2, 3] and body["widths"] == [1, 2, 3]
    assert body["target_verify_s"]["4"]["48"]["3"]["median"] == pytest.approx(step(0.014, 4, 40))
    assert body["draft_step_s"]["small"]["1"]["16"]["1"]["median"] == pytest.approx(
        (step(0.020, 1, 8) - step(0.014, 1, 8)) / 2)
    # call r of the draft model against call r of the fixed proposer: its rounds, kept for the intervals
    assert body["draft_step_s"]["small"]["4"]["48"]["2"]["runs"] == pytest.approx(
        [(0.020 * g - 0.014 * f) * step(1, 4, 40) / 2 for f, g in zip(FACTORS["fixed2"], FACTORS["draft:small"])])
    assert body["fit"]["max_relative_error"] == pytest.approx(0.3)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(body))
    profile = load_cost_profile(path)
    assert "engine vllm 0.32.0" in profile.describe() and float(profile.plain_s(1, 16)) == pytest.approx(
        step(0.010, 1, 8))
    assert profile.rounds == 3 and len(profile.replicas) > 0  # a model draft's prediction carries the profile's error
    rows = specsim.simulate(cache, trees=["chain:2"], drafts=["vllm-ngram:min=1,max=2"], cost_profile=path, n_boot=0,
                            by_category=False)
    assert "engine vllm 0.32.0" in rows["cost_basis"][0] and rows["speedup"][0] > 0
    for table in body["draft_step_s"]["small"].values():  # the same profile without the draft's rounds
        for cell in table.values():
            for entry in cell.values():
                entry.pop("runs")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(body))
    width = {}
    for name, p in (("rounds", path), ("bare", bare)):
        row = specsim.simulate(cache, trees=["chain:2"], drafts=["small"], cost_profile=p, n_boot=200,
                               by_category=False).row(0, named=True)
        width[name] = row["speedup_hi"] - row["speedup_lo"]
    assert load_cost_profile(bare).rounds == 0 and width["rounds"] > 1.2 * width["bare"], width


def test_the_speed_check_takes_the_tolerance_given_and_reads_the_profiles_engine(tmp_path):
    """--speed-tolerance reaches the vLLM speed check (it was a fixed 15%), and whose step costs priced the
    prediction is read from the profile's `engine` field, not from its description."""
    from specsim.engines.check import EngineValidateConfig, _Replay, _speed_check
    from tests.test_cost import profile_body

    vllm, ours = tmp_path / "vllm.json", tmp_path / "ours.json"
    vllm.write_text(json.dumps(profile_body(engine="vllm 0.32.0")))
    ours.write_text(json.dumps(profile_body()))
    times = {"plain": {"decode_s": 1.2, "window_s": 1.2, "seconds": 1.3},
             "spec": {"decode_s": 1.0, "window_s": 1.0, "seconds": 1.1}}  # vLLM's speedup 1.2
    slower = {**times, "spec": {"decode_s": 1.5, "window_s": 1.5, "seconds": 1.6}}  # a round at 0.8
    result = {"timings": [times, times, slower]}
    replay = _Replay(row={"speedup": 1.32, "speedup_lo": 1.2, "speedup_hi": 1.4, "cost_basis": "a profile"},
                     requests=None, features=None, table=None)  # predicted / live = 1.10
    head = dict(draft="d", tree="chain:2", policy="greedy", temperature=0.0, batch=1)
    check = _speed_check(head, result, replay, EngineValidateConfig(cost_profile=str(vllm)))
    assert check.passed  # ±15% default
    assert (check.values["vllm_speedup"], check.values["vllm_speedup_min"], check.values["vllm_speedup_max"]) == \
        pytest.approx((1.2, 0.8, 1.2)) and "(rounds 0.800-1.200)" in check.comparison  # the median and the rounds
    strict = _speed_check(head, result, replay, EngineValidateConfig(cost_profile=str(vllm), speed_tolerance=0.05))
    assert strict.passed is False and "±5%" in strict.detail
    other = _speed_check(head, result, replay, EngineValidateConfig(cost_profile=str(ours)))
    assert other.passed is None and "informational" in other.detail  # specsim's own engine's costs


def _sampling_runs(rates: np.ndarray, repeats: int, steps: int, rng) -> dict:
    """vLLM's result at T > 0 for one-draft chains: per repeat, per prompt, an acceptance histogram of `steps`
    draft steps whose drafts are accepted with the prompt's rate."""
    runs = []
    for _ in range(repeats):
        kept = rng.binomial(steps, rates)
        runs.append({"requests": [{"spec": {"acceptance_histogram": [int(steps - a), int(a)],
                                            "num_draft_tokens": steps}} for a in kept]})
    return {"runs": {"spec": runs}}


def test_the_t_above_0_check_judges_vllm_minus_the_replay_paired_by_prompt():
    """Prompts whose acceptance differs widely: a vLLM 15% below the replay's rule still overlaps the replay's interval
    over prompts, but the difference paired by prompt excludes 0, and the check fails; a vLLM running the same rule
    passes."""
    import polars as pl

    from specsim.engines.check import _Replay, _sampling_check
    from specsim.sim.metrics import ratio_estimates

    rng = np.random.default_rng(3)
    rates = rng.uniform(0.05, 0.9, 24)  # 24 prompts
    steps = 60
    kept = rng.binomial(steps, rates)  # the cached trajectories' counts: one per prompt
    (length,) = ratio_estimates(kept.astype(float), np.full(24, float(steps)), n_boot=1000, seed=0)
    row = {"vllm_mean_acceptance_length": 1 + length.value, "vllm_mean_acceptance_length_lo": 1 + length.lo,
           "vllm_mean_acceptance_length_hi": 1 + length.hi, "n_prompts": 24, "vllm_counts": "exact",
           "vllm_draft_acceptance_rate": length.value}
    requests = pl.DataFrame({"prompt_index": np.arange(24), "vllm_num_accepted_tokens": kept.astype(float),
                             "vllm_num_drafts": np.full(24, float(steps))})
    replay = _Replay(row=row, requests=requests, features=None, table=None)
    head = dict(draft="d", tree="chain:1", policy="greedy-draft", temperature=1.0, batch=1)
    same = _sampling_check(head, _sampling_runs(rates, 4, steps, rng), replay, seed=0)
    low = _sampling_check(head, _sampling_runs(0.85 * rates, 4, steps, rng), replay, seed=0)
    for check in (same, low):  # the intervals overlap either way
        assert not (check.values["vllm_mean_acceptance_length_hi"] < row["vllm_mean_acceptance_length_lo"])
        assert "intervals overlap" in check.detail and "verdict: the paired interval" in check.detail
    assert same.values["paired_difference_lo"] <= 0 <= same.values["paired_difference_hi"]
    assert "excludes 0" not in same.detail and same.passed is True
    assert low.values["paired_difference_hi"] < 0 and "excludes 0" in low.detail and low.passed is False
    # the paired interval is narrower than either side's own: the prompts' spread cancels
    width = low.values["paired_difference_hi"] - low.values["paired_difference_lo"]
    assert width < row["vllm_mean_acceptance_length_hi"] - row["vllm_mean_acceptance_length_lo"]


@pytest.mark.parametrize("lo,hi,prompts,passed,words", [
    (-0.02, 0.03, 13, True, "holds 0"), (0.01, 0.05, 13, False, "excludes 0"),
    (-0.09, -0.01, 4, None, "over 4 prompts, too few"), (-0.09, 0.01, 4, True, "holds 0"),
])
def test_the_paired_verdict_fails_only_over_enough_prompts(lo, hi, prompts, passed, words):
    from specsim.checks import MIN_SAMPLING_PROMPTS, paired_verdict

    assert 4 < MIN_SAMPLING_PROMPTS <= 13
    verdict, why = paired_verdict(lo, hi, prompts)
    assert verdict is passed and words in why


def test_vllms_own_interval_resamples_prompts_not_their_repeats():
    """Four copies of each decode are no more evidence about the prompts than one: vLLM's interval over prompts is the
    same for both (an interval over requests was half as wide for the copies)."""
    import polars as pl

    from specsim.engines.check import _Replay, _sampling_check

    rng = np.random.default_rng(5)
    rates = rng.uniform(0.05, 0.9, 16)
    once = _sampling_runs(rates, 1, 60, rng)
    copies = {"runs": {"spec": once["runs"]["spec"] * 4}}
    row = {"vllm_mean_acceptance_length": 1.4, "vllm_mean_acceptance_length_lo": 1.3,
           "vllm_mean_acceptance_length_hi": 1.5, "n_prompts": 16, "vllm_counts": "exact",
           "vllm_draft_acceptance_rate": 0.4}
    requests = pl.DataFrame({"prompt_index": np.arange(16), "vllm_num_accepted_tokens": np.full(16, 24.0),
                             "vllm_num_drafts": np.full(16, 60.0)})
    replay = _Replay(row=row, requests=requests, features=None, table=None)
    head = dict(draft="d", tree="chain:1", policy="greedy-draft", temperature=1.0, batch=1)
    one, four = (_sampling_check(head, runs, replay, seed=0).values for runs in (once, copies))
    for end in ("", "_lo", "_hi"):
        assert four["vllm_mean_acceptance_length" + end] == pytest.approx(one["vllm_mean_acceptance_length" + end])
    assert one["vllm_mean_acceptance_length_hi"] > one["vllm_mean_acceptance_length_lo"]


def test_both_t_above_0_checks_fall_back_to_the_same_rule_without_a_paired_interval():
    """One verdict for specsim's live check and vLLM's: without a paired interval, one prompt (no CI) is
    inconclusive, not a pass; disjoint intervals over few prompts are inconclusive, over enough they fail."""
    from types import SimpleNamespace

    from specsim.checks import sampling_verdict

    none = SimpleNamespace(lo=float("nan"), hi=float("nan"))
    assert sampling_verdict(none, None, 1) == (None, "no CI (n = 1 prompt)")
    assert sampling_verdict(None, False, 4)[0] is None and "bootstrap over 4 cached prompts" in \
        sampling_verdict(None, False, 4)[1]
    assert sampling_verdict(None, False, 13) == (False, "CIs DISJOINT")
    assert sampling_verdict(None, True, 13) == (True, "CIs overlap")
    # a paired interval decides when there is one, whatever the overlap
    assert sampling_verdict(SimpleNamespace(lo=0.01, hi=0.05), True, 13) == (False, "the paired interval excludes 0")


@pytest.mark.parametrize("rounds", [0, 2])
def test_validate_runs_its_untimed_configurations_in_one_vllm_program_each_compared_with_its_own(
        tiny_cache, tmp_path, monkeypatch, rounds):
    """`validate --engine vllm` with two drafts x two chains: untimed, one vLLM program runs all four (it forks a
    child per configuration, vLLM imported once) and each configuration is checked against its own run, in the
    report's draft-major order; timed (--rounds), a program per configuration, its speculative and plain decoding
    alternating in it. Logs go one per program, named by draft and tree where it runs one."""
    import specsim.engines.check as check
    import specsim.engines.vllm as engine

    drafts, trees = ("vllm-ngram:min=2,max=3", "vllm-ngram:min=1,max=2"), ("chain:2", "chain:3")
    programs, compared = [], []

    def fake_run(run, *, python=None, echo=None, log=None, progress=False):
        programs.append((run, log))
        return {"runs": {name: [{"marker": (name, config and config["num_speculative_tokens"])}]
                         for name, config in run.configs.items()}}

    def fake_compare(data, draft, tree, policy, T, config, result, report):
        compared.append((draft, tree.name, result["runs"]["spec"][0]["marker"]))

    monkeypatch.setattr(engine, "run_vllm", fake_run)
    monkeypatch.setattr(engine, "vllm_python", lambda: tmp_path / "python")
    monkeypatch.setattr(engine, "vllm_version", lambda python: "0.32.0")
    monkeypatch.setattr(check, "compare", fake_compare)
    check.validate_with_vllm(tiny_cache, check.EngineValidateConfig(trees=trees, drafts=drafts, rounds=rounds,
                                                                    log_dir=str(tmp_path / "logs")))
    assert [(d, t) for d, t, _ in compared] == [(d, t) for d in drafts for t in trees]  # draft-major
    if rounds:
        assert len(programs) == 4 and all(set(run.configs) == {"spec", "plain"} for run, _ in programs)
        assert all(marker == ("spec", int(t[-1])) for _, t, marker in compared)
        slug = lambda text: "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)  # noqa: E731
        assert [log.name for _, log in programs] == [f"vllm-{slug(d)}-{slug(t)}-greedy-T0.log"
                                                     for d in drafts for t in trees]
    else:
        (run, log), = programs
        assert list(run.configs) == [f"{d} {t}" for d in drafts for t in trees] and run.rounds == 0
        assert all(marker == (f"{d} {t}", int(t[-1])) for d, t, marker in compared)  # each its own run
        assert log.name == "vllm-greedy-T0.log" and log.parent.is_dir()


def test_vllms_cpu_kv_cache_is_sized_to_the_run_unless_the_user_sized_it(tmp_path, monkeypatch):
    """SmolLM2-135M's shape (30 layers, 3 key-value heads of 64, float32: 46,080 bytes a token) with a 20-layer
    draft: one request of 1,000 tokens needs far under 1 GiB; 16 requests of 2,048 with a draft as large as the
    target (unreadable) need 16 x 2,048 x 92,160 x 1.25 bytes = 3.52 GiB -> 4. VLLM_CPU_KVCACHE_SPACE set by the
    user is what vLLM gets."""
    from transformers import LlamaConfig

    import specsim.engines.vllm as engine
    from specsim.engines.vllm import KV_CACHE_GIB, VllmRun, kv_cache_gib, run_worker

    shape = dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536)
    LlamaConfig(num_hidden_layers=30, **shape).save_pretrained(tmp_path / "target")
    LlamaConfig(num_hidden_layers=20, **shape).save_pretrained(tmp_path / "draft")
    model = lambda d: {"method": "draft_model", "model": str(d), "num_speculative_tokens": 3}  # noqa: E731
    run = lambda **kw: VllmRun(model=str(tmp_path / "target"), prompts=((1, 2),), max_tokens=8, **kw)  # noqa: E731
    small = run(configs={"spec": model(tmp_path / "draft"), "plain": None}, max_model_len=1000)
    large = run(configs={"spec": model(tmp_path / "nowhere")}, max_model_len=2048, batch=16)
    assert engine._kv_bytes_per_token(str(tmp_path / "target"), "float32") == 2 * 30 * 3 * 64 * 4
    assert (kv_cache_gib(small), kv_cache_gib(large)) == (1, 4)
    assert kv_cache_gib(run(configs={"spec": model(tmp_path / "nowhere")}, max_model_len=2048, batch=16,
                            dtype="bfloat16")) == 2  # half the bytes a token
    assert kv_cache_gib(VllmRun(model="org/hub-id", prompts=((1,),), max_tokens=8, configs={})) == KV_CACHE_GIB

    seen = []

    class FakeWorker:  # subprocess.Popen of the worker: writes an empty result and ends
        def __init__(self, args, stdout, stderr, env):
            seen.append(env["VLLM_CPU_KVCACHE_SPACE"])
            with open(args[-1], "w") as f:
                f.write("{}")

        def wait(self, timeout=None):
            return 0
    monkeypatch.setattr(engine.subprocess, "Popen", FakeWorker)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    run_worker(large.request(), python=tmp_path / "python")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")
    run_worker(large.request(), python=tmp_path / "python")
    assert seen == ["4", "7"]


FAKE_VLLM = '''
"""A stand-in for vLLM's offline API, enough for vllm_worker.py: each request decodes 4 tokens in 10 ms."""
import time
from types import SimpleNamespace

__version__ = "0.0-fake"


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class LLM:
    def __init__(self, **kwargs):
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: 1000),
                                          engine_core=SimpleNamespace(shutdown=lambda: None))

    def generate(self, prompts, params, use_tqdm=False):
        now = time.time()
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1, 2, 3, 4], finish_reason="length",
                                                         spec_decode_metrics=None)],
                                metrics=SimpleNamespace(first_token_ts=now, last_token_ts=now + 0.01))
                for _ in prompts]

    def get_metrics(self):
        return []
'''


def _worker_on_a_stand_in(tmp_path, request: dict, vllm: str = FAKE_VLLM) -> dict:
    """vllm_worker.py's result for `request`, run with `vllm` (the source of a stand-in package) as its vLLM."""
    import os
    import subprocess
    import sys

    from specsim.engines.vllm import WORKER

    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(vllm)
    (tmp_path / "vllm" / "inputs.py").write_text("TokensPrompt = dict\n")
    (tmp_path / "vllm" / "platforms.py").write_text("from types import SimpleNamespace\n"
                                                    "current_platform = SimpleNamespace(is_cpu=lambda: True)\n")
    (tmp_path / "request.json").write_text(json.dumps(request))
    subprocess.run([sys.executable, str(WORKER), str(tmp_path / "request.json"), str(tmp_path / "result.json")],
                   check=True, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120, capture_output=True)
    return json.loads((tmp_path / "result.json").read_text())


@pytest.mark.parametrize("kind", ["untimed", "timed-1", "timed-2", "profile"])
def test_the_worker_counts_its_work_as_it_declares_and_times_one_round(tmp_path, kind):
    """vllm_worker.py run on a stand-in vLLM: its progress file declares a total and then reports exactly that
    many units done (engine starts and generate calls; forked children included), and `rounds` = 1 times one
    round (it once decoded untimed and reported no speed at all)."""
    runs = [{"name": "spec", "speculative_config": None}, {"name": "plain"}]
    request = {"model": "m", "prompts": [[1, 2], [3, 4, 5]], "max_tokens": 4, "max_model_len": 64, "repeats": 1,
               "progress_path": str(tmp_path / "progress.jsonl")}
    if kind == "profile":
        request.update(action="profile", runs=[{"name": "plain"}, {"name": "fixed1", "fixed": 1}], batches=[1, 4],
                       contexts=[8, 16], steps=4, repeats=2, warmup=1)
    else:
        request.update(runs=runs, rounds={"untimed": 0, "timed-1": 1, "timed-2": 2}[kind],
                       fork_each=kind == "untimed")
    result = _worker_on_a_stand_in(tmp_path, request)
    lines = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert "total" in lines[0] and all("done" in line and line["t"] > 0 for line in lines[1:])
    assert len(lines) - 1 == lines[0]["total"] == {"untimed": 4, "timed-1": 6, "timed-2": 8, "profile": 26}[kind]
    if kind != "profile":
        assert len(result["timings"]) == request["rounds"]
        assert all(set(t) == {"spec", "plain"} and t["spec"]["decode_s"] > 0 for t in result["timings"])


def test_the_progress_bar_reads_the_workers_file_as_it_grows(tmp_path):
    """A line still being written waits for the next poll; every complete `done` line advances the bar once."""
    from specsim.engines.vllm import _WorkerBar

    path = tmp_path / "progress.jsonl"
    with _WorkerBar(str(path), "profile") as bar:
        bar.poll()  # no file yet
        assert bar.bar is None
        path.write_text('{"total": 3, "t": 1}\n{"done": "plain: engine started", "t": 2}\n{"done": "pla')
        bar.poll()
        assert (bar.bar.total, bar.bar.n, bar.bar.desc) == (3, 1, "vLLM profile")
        with open(path, "a") as f:
            f.write('in: B = 1, L = 8", "t": 3}\n')
        bar.poll()
        assert bar.bar.n == 2 and bar.bar.postfix == "plain: B = 1, L = 8"


def test_timed_runs_at_a_batch_decode_in_waves_and_sum_their_windows(tmp_path):
    """With `waves`, 5 prompts at batch 2 decode in 3 generate calls (2, 2, 1), each wave's decode window timed on
    its own and summed (the stand-in decodes each call in 10 ms: 3 windows of 10 ms, not one); the last timed
    decode is the engine's repeat 0."""
    request = {"model": "m", "prompts": [[1, 2]] * 5, "max_tokens": 4, "max_model_len": 64, "repeats": 1,
               "runs": [{"name": "spec", "speculative_config": None}, {"name": "plain"}], "rounds": 1, "batch": 2,
               "waves": True}
    result = _worker_on_a_stand_in(tmp_path, request)
    [timing] = result["timings"]
    assert [len(run[0]["windows"]) for run in result["runs"].values()] == [3, 3]
    assert timing["spec"]["window_s"] == pytest.approx(0.03, abs=1e-6)
    assert result["runs"]["spec"][0]["windows"] == pytest.approx([0.01] * 3, abs=1e-6)


def test_a_vllm_profile_entry_with_a_stalled_call_gets_more_calls(tmp_path):
    """The stand-in stalls the second call of every entry at B = 4 (ten times as long): those entries get further
    calls, one at a time, until none is over 1.5x its median or they have `max_repeats` (5); the others keep their
    3; the progress file says each call more before it runs, so the bar's total grows to what is done."""
    stalling = FAKE_VLLM.replace("        now = time.time()\n", "        now = time.time()\n"
                                 "        self.calls = getattr(self, 'calls', 0) + 1\n"
                                 "        slow = 10 if len(prompts) == 4 and self.calls % 4 == 3 else 1\n"
                                 ).replace("last_token_ts=now + 0.01", "last_token_ts=now + 0.01 * slow")
    assert stalling != FAKE_VLLM
    request = {"action": "profile", "model": "m", "runs": [{"name": "plain"}], "batches": [1, 4], "contexts": [8],
               "steps": 4, "repeats": 3, "max_repeats": 5, "warmup": 1, "seed": 0, "max_model_len": 64,
               "progress_path": str(tmp_path / "progress.jsonl")}
    result = _worker_on_a_stand_in(tmp_path, request, vllm=stalling)
    times = result["steps_s"]["plain"]
    assert len(times["1"]["8"]) == 3 and len(times["4"]["8"]) == 5, times
    lines = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    done, more = sum("done" in x for x in lines), sum(x.get("more", 0) for x in lines)
    assert more == 2 and done == lines[0]["total"] + more


def test_a_worker_past_its_timeout_is_killed_and_named_in_one_line(tmp_path, monkeypatch):
    """run_worker with a timeout: the worker that has not ended by then is killed and waited for, and the error
    says so with its log."""
    import subprocess

    import specsim.engines.vllm as engine

    killed = []

    class Hung:  # subprocess.Popen of a worker that never ends
        def __init__(self, args, stdout, stderr, env):
            self.args = args

        def wait(self, timeout=None):
            if killed:
                return -9
            raise subprocess.TimeoutExpired(self.args, timeout)

        def kill(self):
            killed.append(True)
    monkeypatch.setattr(engine.subprocess, "Popen", Hung)
    with pytest.raises(EngineError, match=r"vLLM did not finish within 0 s \(log: "):
        engine.run_worker({"action": "run"}, python=tmp_path / "python", timeout=0.01)
    assert killed == [True]

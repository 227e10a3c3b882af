"""vLLM itself on the packaged SmolLM2: its outputs and spec-decode counters equal the replay's, exactly, at T = 0.

Runs vLLM in its own environment (`make vllm`, which `make test` runs first). Where that
environment is missing the tests skip, except under CI ($CI set), where they fail: the check
must never be silently skipped where it counts. Two heads (EAGLE-1/2 and EAGLE-3) are trained for a
few steps on the same prompts; then one short recording (4 Spec-Bench prompts x 24 tokens, greedy,
overhang 8) of every draft and one vLLM program running each draft's configuration in turn (ngram,
draft_model, eagle, eagle3) are shared by the checks.
"""


import pytest

from specsim.record import packaged

pytestmark = pytest.mark.slow

CATEGORIES = "coding,extraction,translation,math"  # text that repeats itself: n-gram matches happen
NGRAM, CHAIN = "vllm-ngram:min=2,max=3", "chain:3"
TOKENS = 24  # per prompt, in the recording and in vLLM


@pytest.fixture(scope="module")
def python():
    from tests.conftest import vllm_or_skip

    found = vllm_or_skip()
    if not packaged.is_installed("smollm2-135m"):
        pytest.skip("smollm2-135m is not in the model store (make setup fetches it)")
    return found


EAGLE_STEPS = 40  # a short training: enough for a head to agree with the target now and then


@pytest.fixture(scope="module")
def heads(python, tmp_path_factory):
    """An EAGLE-1/2 head and an EAGLE-3 head (the states of SmolLM2's layers 2, 15 and 27 fused, an 8,192-token
    draft vocabulary) that `train-draft` makes, briefly, from a recording of the check's own prompts: an equality
    check needs heads that agree with the target now and then, not held-out ones, and one short recording costs
    a third of one of other prompts. Both recordings decode their 4 prompts as one batch (as `make demo` does):
    the same greedy tokens as one at a time, in half the time."""
    from specsim.record.models import load_model
    from specsim.record.run import RecordRequest, record_cache
    from specsim.record.train import TrainConfig, train

    folder = tmp_path_factory.mktemp("heads")
    record_cache(folder / "train.h5", RecordRequest(target="smollm2-135m", categories=tuple(CATEGORIES.split(",")),
                                                   per_category=1, max_new_tokens=TOKENS, store="stats",
                                                   hidden=("last", "2", "15", "27"), batch_size=4), progress=False)
    target = load_model("smollm2-135m")
    configs = {"eagle": TrainConfig(kind="eagle", steps=EAGLE_STEPS, lr=3e-3, batch=2, holdout_every=3),
               "eagle3": TrainConfig(kind="eagle3", steps=EAGLE_STEPS, lr=3e-3, batch=2, holdout_every=3,
                                     ttt_steps=3, draft_vocab=8192)}
    for kind, config in configs.items():
        train(folder / "train.h5", target, folder / kind, config, progress=False)
    return {kind: f"{kind}:{folder / kind}" for kind in configs}


@pytest.fixture(scope="module")
def cache(python, heads, tmp_path_factory):
    """The check's recording: every draft the module runs in vLLM, on the same prompts."""
    from specsim.record.run import RecordRequest, record_cache

    out = tmp_path_factory.mktemp("vllm") / "v.h5"
    record_cache(out, RecordRequest(target="smollm2-135m", drafts=("layers:20", heads["eagle"], heads["eagle3"]),
                                    categories=tuple(CATEGORIES.split(",")), per_category=1, max_new_tokens=TOKENS,
                                    store="stats", overhang=8, batch_size=4), progress=False)
    return out


@pytest.fixture(scope="module")
def runs(cache, heads, python):
    """One vLLM program over the recording's prompts, an engine at a time: ngram with an emitted per-batch-size
    schedule (k = 3 at batch 1, the CHAIN replayed; 2 beyond), the layers:20 draft model, and the two heads run
    by vLLM's eagle and eagle3 methods from the directories specsim gives it (EAGLE-3's in speculators' layout,
    read by vLLM as it is). Returns the cache's data and vLLM's result."""
    from specsim.engines import emit
    from specsim.engines.check import read_cache
    from specsim.engines.export import draft_directory, model_directory
    from specsim.engines.vllm import VllmRun, run_vllm, speculative_config
    from specsim.specs import is_model_free, parse_tree

    data = read_cache(cache)
    configs = {}
    for draft in (NGRAM, "layers:20", heads["eagle"], heads["eagle3"]):
        draft_dir = None if is_model_free(draft) else draft_directory(draft, data.target, target_info=data.target_info)
        configs[draft] = speculative_config(draft, parse_tree(CHAIN), "greedy", draft_dir=draft_dir).config
    configs[NGRAM] = emit.vllm_config(configs[NGRAM], {1: 3, 8: 2})  # what `optimize --emit vllm` writes
    run = VllmRun(model=model_directory(data.target, data.target_info), prompts=data.prompts, max_tokens=TOKENS,
                  configs=configs, max_model_len=max(map(len, data.prompts)) + 64)
    return data, run_vllm(run, python=python)


def _checks(data, draft, result):
    """The engine check's verdicts on the run of `draft` (the name of its configuration in `result`)."""
    from specsim.engines.check import EngineReport, EngineValidateConfig, compare
    from specsim.specs import parse_tree

    report = EngineReport()
    compare(data, draft, parse_tree(CHAIN), "greedy", 0.0, EngineValidateConfig(),
            {**result, "runs": {"spec": result["runs"][draft]}}, report)
    return {c.kind: c for c in report.checks}


def _agreed(runs, draft) -> dict:
    """vLLM's counters of one configuration's run, after checking that its outputs, counters and steps equal the
    replay's and that its counters are what its metrics (get_metrics) report."""
    checks = _checks(runs[0], draft, runs[1])
    assert checks["trajectories"].passed, checks["trajectories"].comparison
    assert checks["counters"].passed, checks["counters"].detail
    assert checks["steps"].passed, checks["steps"].detail
    counters = runs[1]["runs"][draft][0]["counters"]  # sums of vLLM's per-request counters
    assert runs[1]["runs"][draft][0]["metrics"] == counters  # each engine's own metrics, one engine at a time
    return counters


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_head_counts_the_same_in_vllm_and_in_the_replay(kind, runs, heads):
    """vLLM's eagle method (EAGLE-1/2) and its eagle3 method (the target's layers 2, 15, 27 fused, the head's own
    LM head over 8,192 draft tokens) draft what the replay's recorded laws say, step for step, and their
    per-position acceptance counts equal the replay's."""
    counters = _agreed(runs, heads[kind])
    assert counters["num_drafts"] >= 40 and counters["num_draft_tokens"] == 3 * counters["num_drafts"]
    assert counters["num_accepted_tokens"] > 0, counters  # the head agrees sometimes: equal counts are not zeros


@pytest.mark.parametrize("draft", [NGRAM, "layers:20"])
def test_vllm_outputs_counters_and_steps_equal_the_replay(draft, runs):
    counters = _agreed(runs, draft)
    assert counters["num_drafts"] >= (3 if draft == NGRAM else 40)  # a check of something, not of nothing
    if draft == "layers:20":  # vLLM drafts k every step, whatever the output limit
        assert counters["num_draft_tokens"] == 3 * counters["num_drafts"]


def test_the_check_rejects_sglangs_ngram_rule_in_place_of_vllms(runs, monkeypatch):
    """The same vLLM run compared with a replay that proposes by SGLang's rule (the most recent occurrence of
    the last N tokens, `ngram:N`) must fail: the counters are the rule's, not a coincidence."""
    import numpy as np

    import specsim.sim.modelfree as modelfree

    def sglang(context, n_min, n_max, k):
        starts = modelfree._match_starts(np.asarray(context, dtype=np.int64), n_max)
        if not starts.size:
            return np.asarray(context, dtype=np.int64)[:0]
        s = int(starts[-1]) + n_max
        return np.asarray(context, dtype=np.int64)[s : s + k]

    monkeypatch.setattr(modelfree, "vllm_ngram", sglang)
    data, result = runs
    checks = _checks(data, NGRAM, result)
    assert not checks["counters"].passed and not checks["steps"].passed


def test_vllm_accepts_what_specsim_emits(cache, python):
    """vLLM's own validation (EngineArgs.create_engine_config) of every config the emitters write. vLLM's CPU
    build accepts the synthetic rejection sampler here but cannot run it ("Synthetic acceptance not supported
    with CPU sampling"): a GPU build runs it."""
    from specsim.engines import emit
    from specsim.engines.check import read_cache
    from specsim.engines.export import draft_directory, model_directory
    from specsim.engines.vllm import VllmRun, check_configs, speculative_config
    from specsim.specs import parse_tree

    data = read_cache(cache)
    layers = speculative_config("layers:20", parse_tree(CHAIN), "greedy-draft",
                                draft_dir=draft_directory("layers:20", data.target, target_info=data.target_info))
    ngram = speculative_config(NGRAM, parse_tree(CHAIN), "greedy").config
    configs = {"schedule": emit.vllm_config(layers.config, {1: 3, 4: 2, 16: 0}),
               "synthetic": emit.vllm_synthetic(ngram, [30, 12, 4], 60),
               "bad": {**ngram, "synthetic_acceptance_rates": [0.1, 0.5, 0.2], "rejection_sample_method": "synthetic"}}
    run = VllmRun(model=model_directory(data.target, data.target_info), prompts=data.prompts[:1], max_tokens=8,
                  configs=configs, batch=16)
    verdicts = check_configs(run, python=python)
    assert verdicts["schedule"] is None and verdicts["synthetic"] is None, verdicts
    assert "non-increasing" in verdicts["bad"]  # the check can fail: vLLM refuses an increasing rate


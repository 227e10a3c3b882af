"""vLLM itself on the packaged SmolLM2: its outputs and spec-decode counters equal the replay's, exactly, at T = 0.

Runs vLLM in its own environment (`make vllm`, which `make test` runs first). Where that
environment is missing the tests skip, except under CI ($CI set), where they fail: the check
must never be silently skipped where it counts. One short recording (4 Spec-Bench prompts x 48
tokens, greedy, overhang 8) and one vLLM run per draft (ngram, draft_model) are shared; the EAGLE
check trains a head for a few steps on other prompts first.
"""


import pytest

from specsim.record import packaged

pytestmark = pytest.mark.slow

CATEGORIES = "coding,extraction,rag,summarization"  # text that repeats itself: n-gram matches happen
NGRAM, CHAIN = "vllm-ngram:min=2,max=3", "chain:3"


@pytest.fixture(scope="module")
def python():
    from tests.conftest import vllm_or_skip

    found = vllm_or_skip()
    if not packaged.is_installed("smollm2-135m"):
        pytest.skip("smollm2-135m is not in the model store (make setup fetches it)")
    return found


@pytest.fixture(scope="module")
def cache(python, tmp_path_factory):
    from specsim.record.run import RecordRequest, record_cache

    out = tmp_path_factory.mktemp("vllm") / "v.h5"
    record_cache(out, RecordRequest(target="smollm2-135m", drafts=("layers:20",), categories=tuple(CATEGORIES.split(",")),
                                    per_category=1, max_new_tokens=48, store="stats", overhang=8), progress=False)
    return out


def _run(cache, draft, python, schedule=None):
    from specsim.engines import emit
    from specsim.engines.check import read_cache
    from specsim.engines.export import draft_directory, model_directory
    from specsim.engines.vllm import VllmRun, run_vllm, speculative_config
    from specsim.specs import is_model_free, parse_tree

    data = read_cache(cache)
    draft_dir = None if is_model_free(draft) else draft_directory(draft, data.target, target_info=data.target_info)
    config = speculative_config(draft, parse_tree(CHAIN), "greedy", draft_dir=draft_dir).config
    if schedule is not None:  # what `optimize --emit vllm` writes: a length per batch size
        config = emit.vllm_config(config, schedule)
    run = VllmRun(model=model_directory(data.target, data.target_info), prompts=data.prompts, max_tokens=48,
                  configs={"spec": config}, max_model_len=max(map(len, data.prompts)) + 64)
    return data, run_vllm(run, python=python)


@pytest.fixture(scope="module")
def ngram_run(cache, python):
    """vLLM run with an emitted per-batch-size schedule: k = 3 at batch 1 (the CHAIN replayed), 2 beyond."""
    return _run(cache, NGRAM, python, schedule={1: 3, 8: 2})


@pytest.fixture(scope="module")
def draft_model_run(cache, python):
    return _run(cache, "layers:20", python)


EAGLE_STEPS = 40  # a short training: enough for the head to agree with the target now and then


def _trained_head_run(python, folder, kind: str, hidden: tuple, config):
    """A `kind` head `train-draft` makes (briefly, on other categories' prompts), recorded on the check's prompts,
    then run by vLLM from the directory specsim gives it."""
    from specsim.record.models import load_model
    from specsim.record.run import RecordRequest, record_cache
    from specsim.record.train import train

    record_cache(folder / "train.h5", RecordRequest(target="smollm2-135m", categories=("writing", "qa", "stem"),
                                                   per_category=2, max_new_tokens=48, store="stats", hidden=hidden),
                 progress=False)
    train(folder / "train.h5", load_model("smollm2-135m"), folder / "head", config, progress=False)
    draft = f"{kind}:{folder / 'head'}"
    cache = folder / f"{kind}.h5"
    record_cache(cache, RecordRequest(target="smollm2-135m", drafts=(draft,), categories=tuple(CATEGORIES.split(",")),
                                      per_category=1, max_new_tokens=48, store="stats", overhang=8), progress=False)
    return draft, *_run(cache, draft, python)


@pytest.fixture(scope="module")
def eagle_run(python, tmp_path_factory):
    """EAGLE-1/2, run by vLLM's eagle method from the directory specsim writes for it."""
    from specsim.record.train import TrainConfig

    return _trained_head_run(python, tmp_path_factory.mktemp("eagle"), "eagle", ("last",),
                             TrainConfig(kind="eagle", steps=EAGLE_STEPS, lr=3e-3, batch=2, holdout_every=3))


@pytest.fixture(scope="module")
def eagle3_run(python, tmp_path_factory):
    """EAGLE-3 (trained with the states of SmolLM2's layers 2, 15 and 27, over an 8,192-token draft vocabulary), run
    by vLLM's eagle3 method from the directory train-draft wrote (speculators' layout, read by vLLM as it is)."""
    from specsim.record.train import TrainConfig

    return _trained_head_run(python, tmp_path_factory.mktemp("eagle3"), "eagle3", ("last", "2", "15", "27"),
                             TrainConfig(kind="eagle3", steps=EAGLE_STEPS, lr=3e-3, batch=2, holdout_every=3,
                                         ttt_steps=3, draft_vocab=8192))


def _checks(data, draft, result):
    from specsim.engines.check import EngineReport, EngineValidateConfig, compare
    from specsim.specs import parse_tree

    report = EngineReport()
    compare(data, draft, parse_tree(CHAIN), "greedy", 0.0, EngineValidateConfig(), result, report)
    return {c.kind: c for c in report.checks}


def test_an_eagle_head_counts_the_same_in_vllm_and_in_the_replay(eagle_run):
    _assert_head_counts_equal(*eagle_run)


def _assert_head_counts_equal(draft, data, result):
    checks = _checks(data, draft, result)
    assert checks["trajectories"].passed, checks["trajectories"].comparison
    assert checks["counters"].passed, checks["counters"].detail
    assert checks["steps"].passed, checks["steps"].detail
    counters = result["runs"]["spec"][0]["counters"]
    assert counters["num_drafts"] >= 40 and counters["num_draft_tokens"] == 3 * counters["num_drafts"]
    assert counters["num_accepted_tokens"] > 0, counters  # the head agrees sometimes: equal counts are not zeros


def test_an_eagle3_head_counts_the_same_in_vllm_and_in_the_replay(eagle3_run):
    """vLLM's eagle3 method (the target's layers 2, 15, 27 fused, the head's own LM head over 8,192 draft tokens)
    drafts what the replay's recorded laws say, step for step, and its per-position acceptance counts equal the
    replay's."""
    _assert_head_counts_equal(*eagle3_run)


@pytest.mark.parametrize("which", ["ngram", "draft_model"])
def test_vllm_outputs_counters_and_steps_equal_the_replay(which, ngram_run, draft_model_run):
    data, result = ngram_run if which == "ngram" else draft_model_run
    checks = _checks(data, NGRAM if which == "ngram" else "layers:20", result)
    assert checks["trajectories"].passed, checks["trajectories"].comparison
    assert checks["counters"].passed, checks["counters"].detail
    assert checks["steps"].passed, checks["steps"].detail
    counters = result["runs"]["spec"][0]["counters"]  # sums of vLLM's per-request counters
    assert result["runs"]["spec"][0]["metrics"] == counters  # what vLLM's get_metrics() reports
    assert counters["num_drafts"] >= (3 if which == "ngram" else 40)  # a check of something, not of nothing
    if which == "draft_model":  # vLLM drafts k every step, whatever the output limit
        assert counters["num_draft_tokens"] == 3 * counters["num_drafts"]


def test_the_check_rejects_sglangs_ngram_rule_in_place_of_vllms(ngram_run, monkeypatch):
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
    data, result = ngram_run
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


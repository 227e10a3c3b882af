"""Recording the draft's EAGLE-2 expansion with the models (`--expand`): equals the plain reference."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.cache.reader import CacheReader
from specsim.sim.dynamic import expand_reference


@pytest.fixture(scope="module")
def expanded_cache(tiny_model_dir, tiny_prompts_file, tmp_path_factory):
    import torch

    from specsim.cache.stats import StatsSpec
    from specsim.cache.layout import CacheSpec
    from specsim.cache.writer import CacheWriter
    from specsim.prompts import load_prompts
    from specsim.record.models import load_draft, load_model
    from specsim.record.recorder import RecordConfig, build_meta, prompt_records, record, settings

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("expand") / "tiny-expand.h5"
    target = load_model(str(tiny_model_dir))
    drafts = [load_draft("layers:2", target)]
    prompts = load_prompts(str(tiny_prompts_file))
    config = RecordConfig(max_new_tokens=10, temperatures=(0.0, 1.0), seed=0)
    prompt_spec = {"spec": str(tiny_prompts_file), "source": prompts.source, "categories": None,
                   "per_category": None, "sha256": prompts.fingerprint()}
    stats = StatsSpec(expand=(3, 3))
    run = settings(target=target.name, drafts=[d.name for d in drafts], prompt_spec=prompt_spec, config=config,
                   dtype="float32", storage="full", top_k=0, statistics=None)
    meta = build_meta(target, drafts, prompt_spec, run, device="cpu", batch_size=1)
    spec = CacheSpec(vocab_size=target.vocab_size, drafts=tuple(d.name for d in drafts),
                     temperatures=config.temperatures, meta=meta, stats=stats)
    with CacheWriter.create(path, spec, prompt_records(prompts.prompts, target.tokenizer)) as writer:
        outcome = record(writer, target, drafts, config, progress=False)
    assert outcome.expand_seconds > 0
    # where the time went: every phase this recording ran, adding up to its wall time
    assert set(outcome.phases) == {"prompt passes", "generation", "drafts", "statistics", "expansion", "writing",
                                   "other"}
    assert abs(sum(outcome.phases.values()) - outcome.seconds) < 1e-3 + 1e-3 * outcome.seconds
    assert outcome.expand_seconds == outcome.phases["expansion"] > 0 and not outcome.interrupted  # one clock
    return path, drafts[0]


def test_batched_expansion_equals_plain_forwards(expanded_cache):
    """Every recorded candidate, parent and score equals EAGLE-2's rule run with one plain forward per node."""
    import torch

    path, draft = expanded_cache
    model = draft.model
    checked = 0
    with CacheReader(path) as reader:
        for row in list(reader.iter_trajectories())[::3]:
            prompt = reader.prompt_token_ids(row.prompt_index).tolist()
            lo, hi = row.start, row.stop
            tokens = reader.tokens(lo, hi).tolist()
            got = {name: reader.stats(draft.name, name, lo, hi) for name in ("expand_token", "expand_parent",
                                                                               "expand_score")}
            for t in range(len(tokens)):
                context = prompt + tokens[:t]

                def logq(path):
                    with torch.inference_mode():
                        ids = torch.tensor([context + list(path)])
                        return torch.log_softmax(model(ids).logits[0, -1].float(), -1).double().numpy()

                tok, par, score = expand_reference(logq, 3, 3)
                np.testing.assert_array_equal(got["expand_token"][t], tok)
                np.testing.assert_array_equal(got["expand_parent"][t], par)
                np.testing.assert_allclose(got["expand_score"][t], score, atol=2e-4)
                checked += 1
    assert checked >= 20


def _greedy_case(expanded_cache, tokens: int) -> dict:
    """The T=0 trajectories of the expansion cache, their replay under dynamic:topk=3,depth=3,tokens=N,
    and the target to decode them live."""
    from specsim.record.models import load_model
    from specsim.sim.sweep import SweepConfig, sweep

    path, draft = expanded_cache
    spec = f"dynamic:topk=3,depth=3,tokens={tokens}"
    replay = sweep(path, SweepConfig(trees=[spec], policies=["greedy"], n_boot=0, by_category=False)).requests.sort("prompt_index")
    with CacheReader(path) as reader:
        rows = [r for r in reader.iter_trajectories() if r.temperature == 0]
        assert [r.prompt_index for r in rows] == replay["prompt_index"].to_list()
        case = dict(path=path, draft=draft, spec=spec, replay=replay,
                    max_new=int(reader.meta["settings"]["max_new_tokens"]),
                    prompts=[np.asarray(reader.prompt_token_ids(r.prompt_index)) for r in rows],
                    expected=[reader.tokens(r.start, r.stop).tolist() for r in rows])
        target_dir = reader.meta["target"]["spec"]
    case["target"] = load_model(str(target_dir))
    return case


@pytest.mark.parametrize("tokens", [4, 9])
def test_live_dynamic_decoding_matches_the_replay_call_for_call(expanded_cache, tokens):
    """Greedy, float32: live EAGLE-2 decoding emits plain greedy's tokens, in the target calls replay predicts."""
    from specsim.live.drafting import ModelDrafter
    from specsim.live.decoder import LiveConfig, Target, speculative_decode
    from specsim.record.models import eos_token_ids
    from specsim.specs import parse_tree

    case = _greedy_case(expanded_cache, tokens)
    target, draft, tree = case["target"], case["draft"], parse_tree(case["spec"])
    drafter = ModelDrafter(draft.model, draft.name)
    max_new, replay = case["max_new"], case["replay"]
    for prompt, expected, row in zip(case["prompts"], case["expected"], replay.iter_rows(named=True)):
        live = speculative_decode(Target(target.model, eos_token_ids(target)), drafter, np.asarray(prompt),
                                  LiveConfig(tree=tree, max_new_tokens=max_new), np.random.default_rng(0))
        assert live.tokens.tolist() == expected
        assert live.target_calls == row["target_calls"]
        assert all(s.drafted <= tokens for s in live.steps)


def test_inspect_names_the_recorded_expansion(expanded_cache):
    from click.testing import CliRunner

    from specsim.cli import main

    path, _ = expanded_cache
    result = CliRunner().invoke(main, ["inspect", str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "expansion  EAGLE-2 draft expansion topk=" in result.output and "replays dynamic:topk=" in result.output


@pytest.mark.parametrize("batch, batching, tokens", [(2, "lockstep", 4), (3, "continuous", 5), (4, "lockstep", 9)])
def test_batched_live_dynamic_trees_match_the_replay_call_for_call(expanded_cache, batch, batching, tokens):
    """Each request grows its own tree in the shared draft forwards and is verified in its own columns of
    one target forward: every request's calls equal the replay's, as at batch 1."""
    from specsim.live.drafting import ModelDrafter
    from specsim.live.decoder import LiveConfig, Target, decode
    from specsim.record.models import eos_token_ids
    from specsim.specs import parse_tree

    case = _greedy_case(expanded_cache, tokens)
    path, draft, spec, target = case["path"], case["draft"], case["spec"], case["target"]
    prompts, expected, max_new, replay = case["prompts"], case["expected"], case["max_new"], case["replay"]
    run = decode(Target(target.model, eos_token_ids(target)), ModelDrafter(draft.model, draft.name), prompts,
                 [np.random.default_rng(i) for i in range(len(prompts))],
                 LiveConfig(tree=parse_tree(spec), max_new_tokens=max_new, batch=batch, batching=batching))
    assert max(step.batch for step in run.steps) == batch  # requests really shared steps
    from specsim.sim.features import load_features
    from specsim.sim.policies import run_policy
    from specsim.specs import parse_policy

    features = load_features(path, draft.name, 0.0, progress=False)
    length = run_policy(features, parse_tree(spec), parse_policy("greedy"), np.random.default_rng(0)).length
    for i, (decoded, want, row) in enumerate(zip(run.decoded, expected, replay.iter_rows(named=True))):
        assert decoded.tokens.tolist() == want
        assert decoded.target_calls == row["target_calls"]
        start = int(features.traj_start[i])
        assert [s.accepted for s in decoded.steps] == [int(length[start + s.start]) for s in decoded.steps]
    accepted = [sum(s.accepted for s in d.steps) for d in run.decoded]
    assert sum(a > 0 for a in accepted[1:]) >= 2, accepted  # requests beside the first accepted drafts


@pytest.mark.parametrize("tokens", [2, 4, 6, 9])
def test_replay_prices_the_forwards_live_dynamic_trees_run(expanded_cache, tokens):
    """Structural fidelity (tests/test_structure.py) for dynamic trees: the expansion's D - 1 forwards of K
    per request, the root feed of what the draft has not seen, the target over the nodes kept."""
    from tests.test_structure import assert_priced_as_live

    path, draft = expanded_cache
    assert_priced_as_live(path, draft.name, f"dynamic:topk=3,depth=3,tokens={tokens}")


@pytest.mark.parametrize("batch,batching", [(2, "lockstep"), (3, "continuous")])
def test_batch_timeline_prices_the_forwards_live_dynamic_trees_run(expanded_cache, batch, batching):
    from tests.test_structure import assert_timeline_priced_as_live

    path, draft = expanded_cache
    assert_timeline_priced_as_live(path, draft.name, "dynamic:topk=3,depth=3,tokens=6", batch=batch, batching=batching)


@pytest.mark.parametrize("mismatch", ["feeds one token", "cuts the expansion to the room"])
def test_the_probes_catch_the_old_dynamic_pricing(expanded_cache, monkeypatch, mismatch):
    """Reintroduce the mismatches the dynamic structural tests found: the next call's root feed priced as 1 (or
    2) tokens though live re-feeds the root and every accepted draft; the expansion priced only down to the
    request's remaining room though live expands every level (its N best are chosen among all depths). Each
    makes the replay charge fewer draft tokens than live ran."""
    import specsim.sim.pricing as pricing
    import specsim.sim.cost as cost
    from specsim.sim.cost import StepShape
    from specsim.specs import parse_tree
    from tests.test_structure import decode_live, features_of, live_counts, per_request_steps, replayed_counts

    path, draft = expanded_cache
    spec = "dynamic:topk=3,depth=3,tokens=6"
    run = decode_live(path, draft.name, spec)
    features = features_of(path, draft.name)
    live = sum(live_counts(steps)["draft tokens"] for steps in per_request_steps(run))
    count = lambda: sum(c["draft tokens"]  # noqa: E731
                        for c in replayed_counts(features, parse_tree(spec), draft.name, model_free=False))
    assert count() == pytest.approx(live)
    if mismatch == "feeds one token":
        monkeypatch.setattr(pricing, "feeds_accepted", lambda spec, tree=None: False)
    else:
        right = cost.dynamic_step_shape

        def cut(shape, room, *, model_draft=True, one_pass=False):
            full = right(shape, room, model_draft=model_draft, one_pass=one_pass)
            depth = shape.depth if room is None else min(shape.depth, max(int(room), 0))
            return StepShape(full.verify_tokens, full.draft_levels[:depth])
        monkeypatch.setattr(cost, "dynamic_step_shape", cut)
    assert count() < live


def test_validate_samples_dynamic_trees_at_t_above_zero(expanded_cache):
    """validate --policy sample on a dynamic tree: live acceptance at T = 1 beside the exact replay's (the run used to
    crash summarising it, asking a dynamic tree for its static children)."""
    from click.testing import CliRunner

    from specsim.cli import main

    path, draft = expanded_cache
    result = CliRunner().invoke(main, ["validate", str(path), "--draft", draft.name, "--policy", "sample",
                                       "--temperature", "1", "--repeats", "2", "--tree",
                                       "dynamic:topk=3,depth=3,tokens=4", "--device", "cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith(draft.name))
    assert "dynamic:topk=3,depth=3,tokens=4  sample  1" in row and "accept rate live" in row and row.endswith("PASS")

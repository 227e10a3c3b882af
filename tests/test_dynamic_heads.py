"""Dynamic trees over head drafts (EAGLE-2/3's rule on Medusa, EAGLE, EAGLE-3 and MTP heads): the recorded expansion
equals the rule run plainly, live decoding grows the trees the replay reads, and the replay prices what live runs."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.cache.reader import CacheReader
from specsim.sim.dynamic import expand_reference

TOPK, DEPTH = 3, 3


@pytest.fixture(scope="module")
def expanded_heads(tiny_prompts_file, tmp_path_factory):
    """The tiny target (final norm not all ones) and five heads, recorded at T = 0 and 1 with --expand topk=3,depth=3:
    Medusa, EAGLE, EAGLE-3 over a reduced vocabulary, MTP in DeepSeek's and MiMo's wiring."""
    import torch

    from specsim.cache.stats import StatsSpec
    from specsim.record.models import load_model
    from specsim.record.run import RecordRequest, record_cache
    from tests.conftest import build_tiny_model
    from tests.test_heads_record import (_eagle_published, _medusa_published, eagle3_from_last_layer,
                                         mtp_from_last_layer)

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("dynamic-heads")
    target_dir = build_tiny_model(folder / "target", final_norm=True)
    target = load_model(str(target_dir))
    drafts = (f"medusa:{_medusa_published(folder / 'medusa', target)}",
              f"eagle:{_eagle_published(folder / 'eagle', target)}",
              f"eagle3:{eagle3_from_last_layer(target, folder / 'eagle3', draft_vocab=300, seed=1)}",
              f"mtp:{mtp_from_last_layer(target, folder / 'mtp-deepseek', 'deepseek', seed=2, mix=0.01)}",
              f"mtp:{mtp_from_last_layer(target, folder / 'mtp-mimo', 'mimo', seed=1)}")
    request = RecordRequest(target=str(target_dir), drafts=drafts, prompts=str(tiny_prompts_file), max_new_tokens=24,
                            temperatures=(0.0, 1.0), device="cpu", head_depth=DEPTH,
                            stats=StatsSpec(expand=(TOPK, DEPTH)))
    path = folder / "heads-expanded.h5"
    outcome = record_cache(path, request, progress=False)
    assert outcome.phases["expansion"] > 0
    return path, drafts, str(target_dir)


def _reference(head, hidden, x, plen: int, s: int, *, along_trajectory: bool = False):
    """EAGLE-2's expansion at call start s, one plain pass per node: Medusa's law at depth d is head d's; an
    autoregressive head's law after a path is `unroll` along that path (the code the depth-keyed statistics are
    recorded and the heads trained with). along_trajectory: a deliberately wrong rule, every node's law the one
    after the trajectory's tokens of its depth (the path's own tokens ignored, as a teacher-forced chain would)."""
    import torch

    from specsim.record.head_unroll import unroll

    j = plen + s - 2  # the entry of the root's predecessor state

    def logq(path):
        with torch.inference_mode():
            if head.kind == "medusa":
                return torch.log_softmax(head.module(hidden[j : j + 1], head.lm_head)[0, len(path)].float(),
                                         -1).double().numpy()
            drafted = torch.tensor(path, dtype=torch.long)
            if along_trajectory:
                drafted = torch.cat([x[j + 2 : j + 2 + len(path)], drafted])[: len(path)]
            ids = torch.cat([x[1 : j + 2], drafted])
            states = torch.cat([hidden[: j + 1], torch.zeros(len(path), hidden.shape[1])])
            feats = unroll(head.forward, states, ids, torch.tensor([j]), len(path) + 1)
            return torch.log_softmax(head.logits(feats[-1]).float(), -1)[0].double().numpy()

    return expand_reference(logq, TOPK, DEPTH)


def _agrees(got: dict, t: int, want) -> bool:
    tok, par, score = want
    return (np.array_equal(got["expand_token"][t], tok) and np.array_equal(got["expand_parent"][t], par)
            and np.allclose(got["expand_score"][t], score, atol=2e-4))


@pytest.mark.parametrize("which", range(5))
def test_recorded_head_expansions_equal_the_rule_run_node_by_node(expanded_heads, which):
    """Every recorded candidate, parent and score equals EAGLE-2's rule with one plain unrolling per node; the
    same comparison rejects an expansion that feeds the trajectory's tokens instead of each path's (it can fail)."""
    import torch

    from specsim.record.head_checkpoints import load_heads
    from specsim.record.head_unroll import target_hidden
    from specsim.record.models import load_model

    path, drafts, target_dir = expanded_heads
    target = load_model(target_dir)
    head = load_heads(drafts[which], target)
    checked = wrong = 0
    with CacheReader(path) as reader:
        for row in reader.iter_trajectories():
            prompt = reader.prompt_token_ids(row.prompt_index)
            tokens = reader.tokens(row.start, row.stop)
            got = {name: reader.stats(drafts[which], name, row.start, row.stop)
                   for name in ("expand_token", "expand_parent", "expand_score")}
            x = torch.as_tensor(np.concatenate([prompt, tokens]), dtype=torch.long)
            hidden = head.features(target_hidden(target, x, head.hidden_layers))
            for t in range(len(tokens)):
                assert _agrees(got, t, _reference(head, hidden, x, len(prompt), t)), (drafts[which], t)
                checked += 1
                if head.kind != "medusa" and t % 4 == 0:
                    wrong += not _agrees(got, t, _reference(head, hidden, x, len(prompt), t, along_trajectory=True))
    assert checked >= 30
    assert head.kind == "medusa" or wrong > 0  # Medusa's law ignores the path


def _case(expanded_heads, which: int):
    from specsim.record.models import load_model

    path, drafts, target_dir = expanded_heads
    with CacheReader(path) as reader:
        rows = [r for r in reader.iter_trajectories() if r.temperature == 0]
        case = dict(path=path, draft=drafts[which], max_new=int(reader.meta["settings"]["max_new_tokens"]),
                    prompts=[np.asarray(reader.prompt_token_ids(r.prompt_index)) for r in rows],
                    expected=[reader.tokens(r.start, r.stop).tolist() for r in rows])
    case["target"] = load_model(target_dir)
    return case


def _replayed_lengths(path, draft: str, spec: str) -> tuple[np.ndarray, object]:
    from specsim.sim.features import load_features
    from specsim.sim.policies import run_policy
    from specsim.specs import parse_policy, parse_tree

    features = load_features(path, draft, 0.0, progress=False)
    return run_policy(features, parse_tree(spec), parse_policy("greedy"), np.random.default_rng(0)).length, features


@pytest.mark.parametrize("which, tokens, batch, batching", [
    (0, 4, 1, "lockstep"), (0, 9, 3, "continuous"), (1, 4, 1, "lockstep"), (1, 9, 2, "lockstep"),
    (1, 6, 3, "continuous"), (2, 5, 1, "lockstep"), (2, 9, 3, "continuous"), (3, 6, 1, "lockstep"),
    (3, 9, 2, "lockstep"), (4, 4, 3, "continuous"), (4, 9, 1, "lockstep")])
def test_live_dynamic_head_decoding_matches_the_replay_call_for_call(expanded_heads, which, tokens, batch, batching):
    """Greedy, float32: live decoding grows each request's tree from its head (in the rows of shared forwards at
    batch > 1) and emits plain greedy's tokens, accepting at every call what the replay of the recorded
    expansion accepts there."""
    from specsim.live.decoder import LiveConfig, Target, decode
    from specsim.live.head_drafting import head_drafter
    from specsim.record.models import eos_token_ids
    from specsim.specs import parse_tree

    case = _case(expanded_heads, which)
    spec = f"dynamic:topk={TOPK},depth={DEPTH},tokens={tokens}"
    length, features = _replayed_lengths(case["path"], case["draft"], spec)
    target = case["target"]
    run = decode(Target(target.model, eos_token_ids(target)), head_drafter(case["draft"], target), case["prompts"],
                 [np.random.default_rng(i) for i in range(len(case["prompts"]))],
                 LiveConfig(tree=parse_tree(spec), max_new_tokens=case["max_new"], batch=batch, batching=batching))
    assert max(step.batch for step in run.steps) == batch
    for i, (decoded, want) in enumerate(zip(run.decoded, case["expected"])):
        assert decoded.tokens.tolist() == want
        start = int(features.traj_start[i])
        assert [s.accepted for s in decoded.steps] == [int(length[start + s.start]) for s in decoded.steps]
        assert all(s.drafted <= tokens for s in decoded.steps)
    assert sum(s.accepted for d in run.decoded for s in d.steps) > 0  # drafts were accepted: the check means something


@pytest.mark.parametrize("which", range(5))
def test_a_wrong_expansion_fails_the_call_for_call_check(expanded_heads, which, monkeypatch):
    """The live check can fail: with every level below the root drafting from its law shifted by one token id (a
    beam node's children are the wrong tokens), live decoding still emits plain greedy's tokens but accepts
    elsewhere than the replay of the recorded expansion."""
    import specsim.record.expand as expand_module
    from specsim.live.decoder import LiveConfig, Target, decode
    from specsim.live.head_drafting import head_drafter
    from specsim.record.models import eos_token_ids
    from specsim.specs import parse_tree

    right = expand_module.beam_expand

    def shifted(root_logits, children, **kw):
        return right(root_logits, lambda *args: children(*args).roll(1, dims=-1), **kw)

    case = _case(expanded_heads, which)
    spec = f"dynamic:topk={TOPK},depth={DEPTH},tokens=9"
    length, features = _replayed_lengths(case["path"], case["draft"], spec)
    target = case["target"]
    monkeypatch.setattr(expand_module, "beam_expand", shifted)
    run = decode(Target(target.model, eos_token_ids(target)), head_drafter(case["draft"], target), case["prompts"],
                 [np.random.default_rng(i) for i in range(len(case["prompts"]))],
                 LiveConfig(tree=parse_tree(spec), max_new_tokens=case["max_new"]))
    differs = 0
    for i, (decoded, want) in enumerate(zip(run.decoded, case["expected"])):
        assert decoded.tokens.tolist() == want  # verification keeps the output lossless
        start = int(features.traj_start[i])
        differs += [s.accepted for s in decoded.steps] != [int(length[start + s.start]) for s in decoded.steps]
    assert differs > 0


@pytest.mark.parametrize("which, tokens", [(0, 4), (1, 6), (2, 9), (3, 2), (4, 6)])
def test_replay_prices_the_forwards_live_dynamic_heads_run(expanded_heads, which, tokens):
    """Structural fidelity (tests/test_structure.py): Medusa's one pass per call; an EAGLE-style head's feed of the
    root and every accepted draft (none after its prompt pass), then D - 1 beam forwards of K; the target over
    the nodes kept within the room."""
    from tests.test_structure import assert_priced_as_live

    path, drafts, _ = expanded_heads
    assert_priced_as_live(path, drafts[which], f"dynamic:topk={TOPK},depth={DEPTH},tokens={tokens}")


@pytest.mark.parametrize("which, batch, batching", [(0, 3, "lockstep"), (1, 2, "lockstep"), (2, 3, "continuous")])
def test_batch_timeline_prices_the_forwards_live_dynamic_heads_run(expanded_heads, which, batch, batching):
    from tests.test_structure import assert_timeline_priced_as_live

    path, drafts, _ = expanded_heads
    assert_timeline_priced_as_live(path, drafts[which], f"dynamic:topk={TOPK},depth={DEPTH},tokens=6", batch=batch,
                                   batching=batching)


def test_a_medusa_head_is_not_expanded_deeper_than_its_heads(expanded_heads, tiny_prompts_file, tmp_path):
    from specsim.cache.stats import StatsSpec
    from specsim.errors import CacheError
    from specsim.record.run import RecordRequest, record_cache

    path, drafts, target_dir = expanded_heads
    request = RecordRequest(target=target_dir, drafts=(drafts[0],), prompts=str(tiny_prompts_file), max_new_tokens=4,
                            device="cpu", stats=StatsSpec(expand=(2, 4)))
    with pytest.raises(CacheError, match=r"has 3 heads, so it expands to depth 3 at most"):
        record_cache(tmp_path / "x.h5", request, progress=False)
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("which", [0, 1, 2, 4])
def test_sampled_dynamic_head_trees_are_priced_as_live_runs_them(expanded_heads, which):
    """T = 1: live samples its own tokens, so its trees differ from the recording's; along live's own path, every call
    with room for the whole tree is charged what live ran (the target over N + 1 nodes, the root feed of 1 + the
    drafts the call before accepted, D - 1 beam forwards of K; Medusa's one pass). The last calls of a request are
    left out: the nodes they verify within the room depend on the tree, which the replay reads from the recording."""
    from specsim.sim.pricing import Pricing
    from specsim.specs import parse_tree
    from tests.test_structure import PROBES, Probe, decode_live, features_of, live_counts, per_request_steps

    path, drafts, _ = expanded_heads
    spec = f"dynamic:topk={TOPK},depth={DEPTH},tokens=6"
    tree = parse_tree(spec)
    run = decode_live(path, drafts[which], spec, policy="sample", temperature=1.0)
    features = features_of(path, drafts[which], 1.0)
    by_prompt = {int(p): i for i, p in enumerate(features.traj_prompt)}
    priced = {name: Pricing(Probe(name), drafts[which], "probe").priced(features, tree) for name in PROBES}
    compared = accepted = 0
    for trajectory, steps in zip(run.trajectories, per_request_steps(run)):
        start = int(features.traj_start[by_prompt[trajectory.prompt.prompt_index]])
        calls = trajectory.live.steps
        for k, (call, step) in enumerate(zip(calls, steps)):
            if run.config.max_new_tokens - call.start - 1 < tree.max_depth:
                continue  # room for part of the tree only
            want = {}
            for name, (cost, _, feed) in priced.items():
                before = 0.0 if k == 0 or feed is None else feed[start + calls[k - 1].start, calls[k - 1].accepted]
                want[name] = float(cost[start + call.start] + before)
            assert want == pytest.approx(live_counts([step])), (trajectory.prompt.prompt_index, k)
            compared += 1
            accepted += call.accepted
    assert compared >= 20 and accepted > 0

"""Block verification replayed from a cache that recorded the target along the draft's proposals (`--expand-target`).

On the toy Markov model every quantity has a closed form: a cache whose chain records are the exact
expectation (every chain enumerated with its probability) must give, row by row, the law of the accepted
length that enumerating the drafted chains gives by Bayes' rule; a cache of R sampled chains must agree
with it within its standard error; and the replay's expected target calls must agree with the exact
expectation of real block-verified decoding. On the tiny transformer, the recorder's batched chains must
be what one plain forward per chain node gives, and `simulate --policy block` must run from the CLI.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specsim import verify
from specsim.cache.stats import StatsSpec
from specsim.cache.reader import CacheReader
from specsim.errors import SpecError
from specsim.sim.features import load_features
from specsim.sim.policies import block_table
from specsim.specs import parse_policy, parse_tree
from tests.toy_markov import exact_block_calls, proposals_along, random_prompts, record_cache, sticky_pair

N_TOKENS, DEPTH, CHAINS = 8, 3, 6


def _pair():
    return sticky_pair(vocab=4, stay=0.7, seed=3)


@pytest.fixture(scope="module")
def toy_caches(tmp_path_factory):
    """(exact-expectation cache, sampled-chains cache, prompts) on the same trajectories."""
    target, draft = _pair()
    prompts = random_prompts(4, 1, 60, 7)
    root = tmp_path_factory.mktemp("block")
    out = []
    for name, rng, chains in (("exact", None, 2), ("sampled", np.random.default_rng(11), CHAINS)):
        out.append(record_cache(root / f"{name}.h5", target, draft, prompts, N_TOKENS, temperatures=(1.0,), seed=0,
                                stats_spec=StatsSpec(expand_target=(DEPTH, chains)),
                                draft_stats=lambda pr, tok, rng=rng, chains=chains:
                                proposals_along(target, draft, pr, tok, DEPTH, chains, rng)))
    return out[0], out[1], prompts


def _bayes_law(target, draft, context, y, gamma: int) -> np.ndarray:
    """P(τ = i | the call emitted y[:i+1]) by enumerating every chain the draft can draw from `context`."""
    law = np.zeros(gamma + 1)
    for x in itertools.product(range(target.vocab), repeat=gamma):
        prefixes = [list(context) + list(x[:j]) for j in range(gamma + 1)]
        p_rows = np.stack([target.dist(c) for c in prefixes])
        q_rows = np.stack([draft.dist(c) for c in prefixes[:gamma]]) if gamma else np.zeros((0, target.vocab))
        weight = float(np.prod([q_rows[j, x[j]] for j in range(gamma)]))
        kept = verify.block_kept_law(p_rows, q_rows, x)
        for i in range(gamma + 1):
            if list(x[:i]) == list(y[:i]):
                law[i] += weight * kept[i] * verify.block_correction(p_rows, q_rows, x, i)[y[i]]
    return law / np.cumprod([target.dist(list(context) + list(y[:j]))[y[j]] for j in range(gamma + 1)])


def test_the_replayed_law_is_bayes_rule_at_every_call_start(toy_caches):
    """Exact chain records: every row of block_table's law (the call's γ' = min(γ, room) drafts, end cap included)
    equals the enumerated rule's law given the trajectory."""
    exact_path, _, prompts = toy_caches
    target, draft = _pair()
    features = load_features(exact_path, "toy-draft", 1.0, progress=False)
    tree = parse_tree(f"chain:{DEPTH}")
    table = block_table(features, tree, parse_policy("block"), np.random.default_rng(0))
    with CacheReader(exact_path) as reader:
        outputs = {r.prompt_index: reader.tokens(r.start, r.stop).tolist() for r in reader.iter_trajectories()}
    worst, checked = 0.0, 0
    for k in range(0, features.n_traj, 6):
        lo, n = int(features.traj_start[k]), int(features.traj_len[k])
        y = outputs[int(features.traj_prompt[k])]
        assert len(y) == n
        prompt = [int(v) for v in prompts[int(features.traj_prompt[k])]]
        for t in range(n):
            g = min(DEPTH, n - 1 - t)
            law = _bayes_law(target, draft, prompt + y[:t], y[t:], g)
            worst = max(worst, float(np.abs(table.p_len[lo + t, : g + 1] - law).max()))
            assert table.p_len[lo + t, g + 1 :].sum() == 0
            checked += 1
    assert checked >= 70
    assert worst < 1e-5  # the tails are stored in float32


def test_sampled_chains_agree_with_the_exact_expectation_within_their_error(toy_caches):
    exact_path, sampled_path, _ = toy_caches
    tree, policy = parse_tree(f"chain:{DEPTH}"), parse_policy("block")
    exact = block_table(load_features(exact_path, "toy-draft", 1.0, progress=False), tree, policy, None)
    sampled = block_table(load_features(sampled_path, "toy-draft", 1.0, progress=False), tree, policy, None)
    depth = np.arange(DEPTH + 1)
    gap = sampled.p_len @ depth - exact.p_len @ depth  # E[A | t], per start
    assert np.all(sampled.se_len >= 0) and sampled.se_len.max() > 0
    z = gap.sum() / np.sqrt((sampled.se_len ** 2).sum())  # starts' chains are independent
    assert abs(z) < 4, z
    assert not sampled.exact and np.allclose(sampled.p_len.sum(axis=1), 1.0)


def test_the_replay_predicts_real_block_verified_decoding(toy_caches):
    """Expected target calls: the replay on the cached trajectories against the exact expectation of real
    decoding with block verification (every chain, kept count and correction enumerated), within 4 standard
    errors of the trajectories' spread."""
    from specsim.sim.sweep import SweepConfig, sweep

    exact_path, _, prompts = toy_caches
    target, draft = _pair()
    truth = np.array([exact_block_calls(target, draft, p, N_TOKENS, DEPTH) for p in prompts])
    replay = sweep(exact_path, SweepConfig(trees=[f"chain:{DEPTH}"], policies=["block"], n_boot=0,
                                           by_category=False)).requests.sort("prompt_index")
    calls = replay["target_calls"].to_numpy()
    se = np.sqrt(calls.var(ddof=1) / len(calls) + truth.var(ddof=1) / len(truth))
    assert abs(calls.mean() - truth.mean()) < 4 * se, (calls.mean(), truth.mean(), se)


def test_block_rows_are_priced_with_block_verifications_own_walk(toy_caches, tmp_path):
    """With a profile that measured `walk_block`, block's rows pay it where sample's pay `walk_sample`: making the
    block walk dearer lowers block's speedup and nothing else (tokens per call, sample's rows)."""
    import json

    import specsim
    from tests.test_cost import overhead_tables, profile_body

    def profile(name: str, block_rate: float):
        tables = overhead_tables()
        tables["walk_block"] = {b: {n: {"median": block_rate * int(n) * int(b)} for n in by_n}
                                for b, by_n in tables["walk_sample"].items()}
        body = profile_body(step_overhead_s=tables, target={"name": "toy-markov-target"},
                            drafts={"toy-draft": {"name": "toy-draft"}})
        body["draft_step_s"] = {"toy-draft": body.pop("draft_step_s")["d"]}
        (tmp_path / name).write_text(json.dumps(body))
        return tmp_path / name

    rows = {}
    for name, rate in (("cheap.json", 1e-3), ("dear.json", 5e-3)):
        found = specsim.simulate(toy_caches[1], trees=[f"chain:{DEPTH}"], policies=["block", "sample"],
                                 cost_profile=profile(name, rate), n_boot=0, by_category=False)
        rows[name] = {r["policy"]: r for r in found.iter_rows(named=True)}
    cheap, dear = rows["cheap.json"], rows["dear.json"]
    assert "walk_block + draft_sample" in dear["block"]["cost_basis"]
    assert "walk_sample + draft_sample" in dear["sample"]["cost_basis"]
    assert dear["block"]["speedup"] < cheap["block"]["speedup"]
    assert dear["block"]["tokens_per_call"] == cheap["block"]["tokens_per_call"]
    assert dear["sample"]["speedup"] == cheap["sample"]["speedup"]


def test_block_needs_the_recording_and_a_chain(tmp_path):
    target, draft = _pair()
    plain = record_cache(tmp_path / "plain.h5", target, draft, random_prompts(4, 1, 2, 0), 6, temperatures=(1.0,))
    features = load_features(plain, "toy-draft", 1.0, progress=False)
    with pytest.raises(SpecError, match="--expand-target"):
        block_table(features, parse_tree("chain:2"), parse_policy("block"), None)
    deep = record_cache(tmp_path / "deep.h5", target, draft, random_prompts(4, 1, 2, 0), 6, temperatures=(1.0,),
                        stats_spec=StatsSpec(expand_target=(2, 2)),
                        draft_stats=lambda pr, tok: proposals_along(target, draft, pr, tok, 2, 2,
                                                                    np.random.default_rng(0)))
    features = load_features(deep, "toy-draft", 1.0, progress=False)
    with pytest.raises(SpecError, match="--expand-target 3"):
        block_table(features, parse_tree("chain:3"), parse_policy("block"), None)
    with pytest.raises(SpecError, match="chain"):
        block_table(features, parse_tree("kary:2,1"), parse_policy("block"), None)


# ---------------------------------------------------------------------------- the recorder, on a transformer


@pytest.fixture(scope="module")
def tiny_trajectory(tiny_cache):
    from specsim.record.models import load_draft, load_model

    with CacheReader(tiny_cache) as reader:
        row = next(r for r in reader.iter_trajectories() if r.temperature == 1.0)
        prompt = reader.prompt_token_ids(row.prompt_index).tolist()
        tokens = reader.tokens(row.start, row.stop).tolist()
        target_dir = reader.meta["target"]["spec"]
    target = load_model(str(target_dir))
    return target, load_draft("layers:2", target), prompt, tokens


def test_the_recorders_chains_are_what_plain_forwards_give(tiny_trajectory):
    """Every chain node's laws (the draft's, that drew the next token, and the target's) equal one plain forward of
    the prompt, the trajectory before the chain's position and the chain before the node: the batched forwards'
    masks and position ids show each chain its own prefix and nothing else."""
    import torch

    from specsim.record.kv import SlotKV
    from specsim.record.proposals import draw_chains

    target, draft, prompt, tokens = tiny_trajectory
    P, n, T = len(prompt), len(tokens), 0.8

    def laws(model, ids):
        with torch.inference_mode():
            return torch.softmax(model(torch.tensor([ids])).logits[0].float() / T, -1)

    p_root = laws(target.model, prompt + tokens)[P - 1 : P - 1 + n]
    q_root = laws(draft.model, prompt + tokens)[P - 1 : P - 1 + n]
    kvs = []
    for model in (draft.model, target.model):
        kv = SlotKV(model)
        kv.start([np.asarray(prompt + tokens[:-1])])
        kvs.append(kv)
    t = np.arange(2, n - 1, 3)
    x, q_chain, p_chain = draw_chains(*kvs, q_root[t], p_root[t], P + t, depth=3, chains=4, temperature=T,
                                      generator=torch.Generator().manual_seed(0))
    assert not kvs[0].pending and not kvs[1].pending
    for k, s in enumerate(t):
        for r in range(4):
            chain = x[k, r].tolist()
            context = prompt + tokens[:s] + chain[:2]
            p_plain = laws(target.model, context)[P + s - 1 :]  # (3, V): the laws at chain nodes 1..3
            q_plain = laws(draft.model, context)[P + s - 1 :]
            torch.testing.assert_close(p_chain[k, r], p_plain, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(q_chain[k, r], q_plain, atol=2e-5, rtol=1e-4)
    assert len({tuple(c) for c in x.reshape(-1, 3).tolist()}) > 1  # drawn, not one argmax chain


def test_cache_expand_target_and_simulate_policy_block_from_the_cli(tiny_model_dir, tiny_prompts_file, tmp_path):
    import polars as pl
    from click.testing import CliRunner

    from specsim.cli import main
    from tests.cli_helpers import one_line_error

    def run(*args):
        return CliRunner().invoke(main, [str(a) for a in args])

    out = tmp_path / "block.h5"
    base = ["cache", "--target", tiny_model_dir, "--draft", "layers:2", "--prompts", tiny_prompts_file,
            "--max-new-tokens", "8", "--quiet"]
    one_line_error(run(*base, "--temperature", "0", "--expand-target", "3", "--out", out), "T > 0")
    made = run(*base, "--temperature", "0", "--temperature", "0.8", "--expand-target", "3", "--proposal-chains", "4",
               "--out", out)
    assert made.exit_code == 0, made.output
    with CacheReader(out) as reader:
        assert reader.spec.stats.expand_target == (3, 4)
        rows = [r for r in reader.iter_trajectories() if r.temperature > 0]
        tails = np.concatenate([reader.stats("layers:2", "block_tails", r.start, r.stop) for r in rows])
    assert tails.shape[1:] == (4, 3, 3) and np.all((tails >= 0) & (tails <= 1)) and tails.max() > 0
    inspected = run("inspect", out, "--quiet")
    assert inspected.exit_code == 0 and "the target along 4 chains of 3 drafts" in inspected.output
    result = run("simulate", out, "--tree", "chain:3", "--policy", "block", "--out", tmp_path / "r.csv")
    assert result.exit_code == 0, result.output
    row = pl.read_csv(tmp_path / "r.csv").filter(pl.col("category") == "all").row(0, named=True)
    assert row["policy"] == "block" and row["estimate"] != "exact" and row["samples"] == 4
    assert 1.0 <= row["tokens_per_call"] <= 4.0 and row["mc_se_tokens_per_call"] > 0
    one_line_error(run("simulate", out, "--tree", "chain:4", "--policy", "block"), "--expand-target 4")
    from specsim.report.html import write_report
    from specsim.report.study import StudyConfig, run_study, study_tables

    study = run_study([out], StudyConfig(budgets=(1, 2, 3, 4), sample_families=("chain",), model_free=(),
                                         draw_budgets=(), sample_draw_budgets=(), batches=(1,), n_boot=50),
                      progress=False)
    table = study_tables(study)["block_verification"]
    assert table["budget"].to_list() == [1, 2, 3]  # the chains the recording reaches, not chain:4
    assert set(table["temperature"].to_list()) == {0.8}
    sim = pl.read_csv(tmp_path / "r.csv").filter((pl.col("category") == "all") & (pl.col("tree") == "chain:3"))
    replayed = table.filter(pl.col("budget") == 3).row(0, named=True)
    assert replayed["block_tokens_per_call"] == pytest.approx(sim["tokens_per_call"][0], rel=1e-9)
    assert replayed["block_gain"] == pytest.approx(
        replayed["block_tokens_per_call"] / replayed["token_wise_tokens_per_call"] - 1)
    write_report(study, tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text(encoding="utf-8")
    assert "Block verification against token-wise verification" in page and "block_verification.csv" in page


def test_live_block_verification_at_t0_is_greedy_call_for_call(tiny_cache, tmp_path):
    """At T = 0 drafts and target are point masses and block verification is greedy verification (§2d): `validate
    --policy block` decodes live and every call accepts what the replay's call accepts."""
    import polars as pl
    from click.testing import CliRunner

    from specsim.cli import main

    result = CliRunner().invoke(main, ["validate", str(tiny_cache), "--draft", "layers:2", "--tree", "chain:3",
                                       "--policy", "block", "--temperature", "0", "--threads", "1", "--quiet",
                                       "--out", str(tmp_path / "v.csv")])
    assert result.exit_code == 0, result.output
    row = pl.read_csv(tmp_path / "v.csv").filter(pl.col("check") == "greedy calls").row(0, named=True)
    assert row["policy"] == "block" and row["verdict"] == "PASS" and "(100.0%)" in row["comparison"]


def test_the_recorded_factors_and_tails_are_the_rule_on_plain_forwards(tiny_trajectory, monkeypatch):
    """`target_along_proposals` over a whole trajectory, in chunks of positions: its factors on the trajectory and
    its per-chain tails equal `block_path_factors` and `block_chain_tails` computed from plain forwards (the laws
    along the trajectory, and along each chain it drew), every position's tails read with the a_i of the call that
    left the trajectory there."""
    import torch

    from specsim.record import proposals

    target, draft, prompt, tokens = tiny_trajectory
    P, n, T, K, R = len(prompt), len(tokens), 0.9, 3, 3
    drawn = []
    real = proposals.draw_chains

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        drawn.append(out[0].cpu().numpy())
        return out

    monkeypatch.setattr(proposals, "draw_chains", spy)
    monkeypatch.setattr(proposals, "QUERIES_PER_FORWARD", 2 * R * (K - 1))  # chunks of 2 positions
    with torch.inference_mode():
        ids = torch.tensor([prompt + tokens])
        p_logits = target.model(ids).logits[0, P - 1 : P - 1 + n].float()
        q_logits = draft.model(ids).logits[0, P - 1 : P - 1 + n].float()
    got = proposals.target_along_proposals(target.model, {draft.name: (draft.model, q_logits)}, prompt, tokens,
                                           p_logits, temperature=T, depth=K, chains=R, seed=3)[draft.name]
    assert len(drawn) == (n + 1) // 2
    chains = np.concatenate(drawn)  # (n, R, K)

    def laws(model, context):
        with torch.inference_mode():
            return torch.softmax(model(torch.tensor([context])).logits[0].double() / T, -1).numpy()

    p_path, q_path = laws(target.model, prompt + tokens)[P - 1 : P - 1 + n], laws(draft.model, prompt + tokens)[
        P - 1 : P - 1 + n]
    a, keep, whole = verify.block_path_factors(p_path, q_path, tokens, K)
    np.testing.assert_allclose(got["block_keep"], keep, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["block_whole"], whole, rtol=1e-4, atol=1e-6)
    for s in range(n):
        p = np.stack([laws(target.model, prompt + tokens[:s] + c[: K - 1].tolist())[P + s - 1 :] for c in chains[s]])
        q = np.stack([laws(draft.model, prompt + tokens[:s] + c[: K - 1].tolist())[P + s - 1 :] for c in chains[s]])
        branch = np.array([a[s - i, i] if i <= s else 0.0 for i in range(K)])
        want = verify.block_chain_tails(branch, p, q, chains[s])
        want[:, [i for i in range(K) if i > s]] = 0.0
        np.testing.assert_allclose(got["block_tails"][s], want, rtol=1e-4, atol=1e-5)

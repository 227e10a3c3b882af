"""The recorder: cached logits equal independent forward passes; seeds, EOS, batching, resume checks."""

import numpy as np
import pytest
import torch

from specsim.cache.reader import CacheReader
from specsim.errors import ResumeMismatchError
from specsim.prompts import encode
from specsim.record.models import load_draft, load_model
from specsim.record.recorder import (SAMPLER, check_resume, generate, sample_tokens, teacher_forced_logits,
                                     trajectory_seed)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def _forward_last(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float().numpy()


@pytest.mark.parametrize("column", ["target", "layers:2", "int8"])
def test_cached_logits_equal_an_independent_forward_pass_on_the_same_prefix(tiny_cache, target, column):
    models = {"target": target, "layers:2": load_draft("layers:2", target), "int8": load_draft("int8", target)}
    rng = np.random.default_rng(0)
    with CacheReader(tiny_cache) as reader:
        rows = list(reader.iter_trajectories())
        assert {r.temperature for r in rows} == {0.0, 1.0}
        for row in rows:
            t = int(rng.integers(row.length))  # a sampled position of every trajectory
            prefix = reader.prompt_token_ids(row.prompt_index).tolist() + reader.tokens(row.start, row.start + t).tolist()
            expected = _forward_last(models[column].model, prefix)
            cached = reader.logits(column, row.start + t, row.start + t + 1)[0]
            np.testing.assert_allclose(cached, expected, rtol=2e-3, atol=2e-3)  # float16 storage


def test_greedy_trajectories_follow_the_target_argmax(tiny_cache):
    with CacheReader(tiny_cache) as reader:
        for row in reader.iter_trajectories(temperature=0.0):
            logits = reader.logits("target", row.start, row.stop)
            np.testing.assert_array_equal(logits.argmax(-1), reader.tokens(row.start, row.stop))


def test_trajectory_seeds_are_stable_and_distinct():
    seeds = {trajectory_seed(0, i, t) for i in range(50) for t in (0.0, 0.7, 1.0)}
    assert len(seeds) == 150 and all(0 <= s < 2**63 for s in seeds)
    assert trajectory_seed(3, 4, 0.7) == trajectory_seed(3, 4, 0.7000000001)


def test_sampling_reproduces_with_the_same_seed_and_differs_with_another(target):
    ids = encode(target.tokenizer, "Write a short poem about the sea.")
    run = lambda seed: generate(target, [ids], temperature=1.0, seeds=[seed], max_new_tokens=24)[0].tokens
    np.testing.assert_array_equal(run(11), run(11))
    assert not np.array_equal(run(11), run(12))


def _inverse_cdf(logits: np.ndarray, temperature: float, u: float) -> int:
    """The reference draw: the first token whose float64 cumulative probability exceeds u."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    cdf = np.cumsum(p / p.sum())
    return int(np.searchsorted(cdf, u * cdf[-1], side="right"))


def test_sampling_is_the_inverse_cdf_of_one_cpu_uniform_per_token():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 64)).astype(np.float32) * 3
    logits[:, ::5] = -np.inf  # probability 0: never drawn
    seeds = [5, 6, 7]
    ours = [torch.Generator().manual_seed(s) for s in seeds]
    theirs = [torch.Generator().manual_seed(s) for s in seeds]
    for _ in range(300):
        got = sample_tokens(torch.tensor(logits), 0.7, ours).tolist()
        want = [_inverse_cdf(logits[i], 0.7, torch.rand((), generator=g, dtype=torch.float64).item())
                for i, g in enumerate(theirs)]
        assert got == want
        assert all(t % 5 for t in got)


def test_sampled_frequencies_follow_the_tempered_target():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    p = torch.softmax(logits / 0.7, dim=-1)[0].numpy()
    gen = [torch.Generator().manual_seed(3)]
    n = 20000
    counts = np.bincount([int(sample_tokens(logits, 0.7, gen)[0]) for _ in range(n)], minlength=5)
    chi2 = float((((counts - n * p) ** 2) / (n * p)).sum())
    assert chi2 < 18.5  # chi-square, 4 degrees of freedom: P(chi2 > 18.5) < 0.001


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_seed_draws_the_same_tokens_and_estimates_on_cpu_and_cuda():
    from specsim.record.statistics import acceptance_swor

    rng = np.random.default_rng(1)
    logits = torch.tensor(rng.normal(size=(8, 1000)) * 2, dtype=torch.float32)
    draw = lambda device: torch.stack([sample_tokens(logits.to(device), 0.7, [torch.Generator().manual_seed(s)
                                                                               for s in range(8)]) for _ in range(50)])
    assert torch.equal(draw("cpu"), draw("cuda").cpu())
    p, q = torch.softmax(logits.double(), -1), torch.softmax(logits.double().roll(1, -1), -1)
    y = torch.tensor(rng.integers(0, 1000, 8))
    est = lambda device: acceptance_swor(p.to(device), q.to(device), y.to(device), 4, 64,
                                         torch.Generator().manual_seed(9)).cpu()
    torch.testing.assert_close(est("cpu"), est("cuda"), rtol=1e-9, atol=1e-12)


def test_resume_refuses_a_file_drawn_by_another_sampler():
    now = {"seed": 0, "sampler": SAMPLER}
    check_resume("c.h5", {"settings": {"seed": 0, "sampler": SAMPLER}}, now)
    with pytest.raises(ResumeMismatchError, match=r"older specsim \(torch.multinomial.*record a new file"):
        check_resume("c.h5", {"settings": {"seed": 0}}, now)
    check_resume("c.h5", {"settings": {"seed": 0}}, {"seed": 0, "sampler": None})  # greedy-only: nothing drawn


def test_generation_stops_at_eos_and_keeps_the_eos_position(target):
    ids = encode(target.tokenizer, "What is 12 + 30?")
    free = generate(target, [ids], temperature=0.0, seeds=[0], max_new_tokens=16)[0]
    assert free.stop_reason == "max_new_tokens" and len(free.tokens) == 16
    stop_token = int(free.tokens[5])
    first = int(np.argmax(free.tokens == stop_token))
    saved = target.model.generation_config.eos_token_id
    target.model.generation_config.eos_token_id = stop_token
    try:
        stopped = generate(target, [ids], temperature=0.0, seeds=[0], max_new_tokens=16)[0]
    finally:
        target.model.generation_config.eos_token_id = saved
    assert stopped.stop_reason == "eos"
    np.testing.assert_array_equal(stopped.tokens, free.tokens[: first + 1])
    np.testing.assert_array_equal(stopped.p_target_logits, free.p_target_logits[: first + 1])


def test_left_padded_batches_match_single_prompt_generation(target):
    prompts = [encode(target.tokenizer, t) for t in ("Write a short poem about the sea.", "What is 12 + 30?")]
    assert len(prompts[0]) != len(prompts[1])
    batch = generate(target, prompts, temperature=0.0, seeds=[0, 1], max_new_tokens=12)
    for ids, got in zip(prompts, batch):
        alone = generate(target, [ids], temperature=0.0, seeds=[0], max_new_tokens=12)[0]
        np.testing.assert_array_equal(got.tokens, alone.tokens)
        np.testing.assert_allclose(got.p_target_logits, alone.p_target_logits, atol=1e-4)
        # on a CPU each prompt's pass runs alone (no padding to the longest prompt), so the first position's
        # logits are those of recording it alone, bit for bit
        np.testing.assert_array_equal(got.p_target_logits[0], alone.p_target_logits[0])
    batched_tf = teacher_forced_logits(target, prompts, [y.tokens for y in batch])
    for got, y in zip(batched_tf, batch):
        np.testing.assert_allclose(got, y.p_target_logits, atol=1e-4)  # one teacher-forced pass == the KV loop


def test_resume_check_names_the_differing_setting():
    file_meta = {"settings": {"target": "m", "seed": 0, "max_new_tokens": 16}}
    check_resume("c.h5", file_meta, {"target": "m", "seed": 0, "max_new_tokens": 16})
    with pytest.raises(ResumeMismatchError, match=r"setting 'seed' differs: file has 0, now 1"):
        check_resume("c.h5", file_meta, {"target": "m", "seed": 1, "max_new_tokens": 16})
    with pytest.raises(ResumeMismatchError, match="records no settings"):
        check_resume("c.h5", {}, {"seed": 0})


def test_batched_recording_of_derived_drafts_equals_one_prompt_at_a_time(tiny_model_dir, tiny_prompts_file, tmp_path):
    """Left-padded batches: an int8 draft (float64 attention) once gave NaN for every padded request, as a
    padding query that attends nothing produced 0/0 weights; its statistics must equal batch-1 recording."""
    from specsim.sim.features import load_features
    from tests.cli_helpers import record

    paths = {}
    for batch in (1, 4):
        paths[batch] = tmp_path / f"b{batch}.h5"
        record("--target", tiny_model_dir, "--draft", "int8", "--draft", "layers:2", "--prompts", tiny_prompts_file,
               "--max-new-tokens", 8, "--temperature", "0,1", "--store", "stats", "--batch-size", batch,
               "--out", paths[batch])
    for T in (0.0, 1.0):
        for draft in ("int8", "layers:2"):
            one, four = (load_features(paths[b], draft, T, progress=False) for b in (1, 4))
            assert np.isfinite(four.logq).all()
            if T > 0:  # the multi-draft statistics are recorded for sampling only
                assert np.isfinite(four.recorded("pi_iid")).all()
                np.testing.assert_allclose(one.recorded("pi_iid"), four.recorded("pi_iid"), atol=1e-4)
            np.testing.assert_array_equal(one.rank, four.rank)
            np.testing.assert_allclose(one.logq, four.logq, atol=1e-4)


def test_non_finite_logits_are_refused_not_stored(monkeypatch, tiny_model_dir, tiny_prompts_file, tmp_path):
    from click.testing import CliRunner

    from specsim.cli import main
    from specsim.record import models

    real = models.fp64_attention

    def broken(module, query, key, value, attention_mask, **kwargs):  # the old 0/0 on masked queries, everywhere
        out, _ = real(module, query, key, value, attention_mask, **kwargs)
        return out * float("nan"), None

    monkeypatch.setattr(models, "fp64_attention", broken)
    models._register_fp64_attention()
    try:
        result = CliRunner().invoke(main, ["cache", "--target", str(tiny_model_dir), "--draft", "int8", "--prompts",
                                           str(tiny_prompts_file), "--max-new-tokens", "4", "--store", "stats",
                                           "--out", str(tmp_path / "nan.h5"), "--quiet"])
    finally:
        monkeypatch.undo()
        models._register_fp64_attention()
    assert result.exit_code != 0
    assert "int8 gave non-finite logits" in result.output and "nothing of this trajectory was written" in result.output


def test_the_overhang_is_the_target_decoding_on_past_the_end_and_leaves_the_trajectory_alone(target):
    """Past max_new_tokens and past EOS the target keeps decoding (EOS fed back like any token): a longer
    greedy run, cut. Rows that end at different steps (EOS in one, the limit in another) each get theirs."""
    prompts = [encode(target.tokenizer, t) for t in ("What is 12 + 30?", "Write a short poem about the sea.")]
    long = generate(target, prompts, temperature=0.0, seeds=[0, 1], max_new_tokens=20)
    stop_token = int(long[0].tokens[5])
    saved = target.model.generation_config.eos_token_id
    target.model.generation_config.eos_token_id = stop_token
    try:
        plain = generate(target, prompts, temperature=0.0, seeds=[0, 1], max_new_tokens=12)
        over = generate(target, prompts, temperature=0.0, seeds=[0, 1], max_new_tokens=12, overhang=4)
    finally:
        target.model.generation_config.eos_token_id = saved
    for p, o, full in zip(plain, over, long):
        np.testing.assert_array_equal(o.tokens, p.tokens)  # the trajectory does not move
        assert o.stop_reason == p.stop_reason and len(o.overhang) == 4
        n = len(o.tokens)
        np.testing.assert_array_equal(o.recorded, full.tokens[: n + 4])  # greedy continuation, EOS or not
        np.testing.assert_allclose(o.p_target_logits[:n], p.p_target_logits, atol=1e-5)
        assert o.p_target_logits.shape[0] == n + 4
    assert over[0].stop_reason == "eos" and len(over[0].tokens) <= 6


def test_sampled_overhangs_do_not_move_the_trajectory(target):
    ids = encode(target.tokenizer, "Write a short poem about the sea.")
    plain = generate(target, [ids], temperature=1.0, seeds=[5], max_new_tokens=10)[0]
    over = generate(target, [ids], temperature=1.0, seeds=[5], max_new_tokens=10, overhang=3)[0]
    np.testing.assert_array_equal(over.tokens, plain.tokens)
    longer = generate(target, [ids], temperature=1.0, seeds=[5], max_new_tokens=13)[0]
    np.testing.assert_array_equal(over.recorded, longer.tokens)  # the row's own stream, one uniform a token


@pytest.mark.parametrize("max_tokens", [16_384, 40])  # one forward; many (a few sequences each)
def test_batched_hidden_states_equal_one_forward_per_trajectory(target, max_tokens):
    """`target_hidden_batched` (right-padded forwards of several sequences of different lengths) equals
    `target_hidden` one sequence at a time, up to the rounding of larger products; a row off by one is far outside
    that, so the check can fail."""
    from specsim.record.head_unroll import target_hidden, target_hidden_batched

    rng = np.random.default_rng(3)
    layers = ("last", "1", "3", "prenorm")
    xs = [torch.as_tensor(rng.integers(3, 300, size=n)) for n in (9, 23, 14, 31, 6)]
    got = target_hidden_batched(target, xs, layers, max_tokens)
    for x, states in zip(xs, got):
        want = target_hidden(target, x, layers)
        for k in layers:
            assert states[k].shape == want[k].shape == (len(x) - 1, want[k].shape[1])
            scale = float(want[k].abs().max())
            assert float((states[k] - want[k]).abs().max()) < 1e-4 * scale, k
            assert float((states[k][1:] - want[k][:-1]).abs().max()) > 1e-2 * scale, k


def test_a_recording_with_batched_hidden_states_stores_the_same_states(tiny_model_dir, tiny_prompts_file, tmp_path):
    """`cache --hidden-batch`: the same trajectories and statistics, and the stored (float16) states equal one
    forward per trajectory's to float16's step."""
    from tests.cli_helpers import record

    paths = {}
    for tokens in (None, 24):  # 24 tokens: a forward of one or two trajectories
        paths[tokens] = tmp_path / f"h{tokens}.h5"
        record("--target", tiny_model_dir, "--prompts", tiny_prompts_file, "--max-new-tokens", 8, "--temperature",
               "0,1", "--store", "stats", "--batch-size", 4, "--hidden-states", "last,2",
               *(("--hidden-batch", tokens) if tokens else ()), "--out", paths[tokens])
    with CacheReader(paths[None]) as one, CacheReader(paths[24]) as batched:
        n = one.n_positions
        assert n == batched.n_positions > 0
        assert one.trajectories.equals(batched.trajectories)  # the same seeds, lengths and ends
        np.testing.assert_array_equal(one.tokens(0, n), batched.tokens(0, n))
        np.testing.assert_array_equal(one.stats("target", "logprob", 0, n), batched.stats("target", "logprob", 0, n))
        for layer in ("last", "2"):
            a = one.hidden(layer, 0, n).astype(np.float32)
            b = batched.hidden(layer, 0, n).astype(np.float32)
            assert np.abs(a - b).max() <= 2e-3 * np.abs(a).max(), layer

"""A training step's trajectories run together (`batch_loss`) give the loss and gradient of running them one at a
time (`terms` + `loss`, averaged), for EAGLE, EAGLE-3 and MTP, with the prompt as context, in the loss or not given
(the trajectories then start inside their sequences: position ids offset), with and without a draft vocabulary, and
with trajectories shorter than the training-time test depth, however the batch is cut into groups (no padding, or
all of it). The check rejects a batched step whose unrolled lanes see each other."""

import dataclasses

import pytest
import torch

AUX = (1, 2, 3)  # the tiny target's 4 layers: the inputs of layers 1, 2 and 3


@pytest.fixture(scope="module")
def heads(training_cache, tiny_model_dir, tmp_path_factory):
    """Heads trained a few steps (weights away from their initialisation), per case name: (module, config)."""
    from specsim.record.head_checkpoints import load_heads
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    cache, _ = training_cache
    target = load_model(str(tiny_model_dir))
    cases = {
        "eagle3-draft-vocab": TrainConfig(kind="eagle3", steps=8, lr=1e-2, batch=4, holdout_every=4, ttt_steps=4,
                                          aux_layers=AUX, draft_vocab=300, save_every=100),
        "eagle3-whole-vocab": TrainConfig(kind="eagle3", steps=8, lr=1e-2, batch=4, holdout_every=4, ttt_steps=3,
                                          aux_layers=AUX, save_every=100, prompt="loss", ttt_decay=0.8),
        "eagle3-blind": TrainConfig(kind="eagle3", steps=8, lr=1e-2, batch=4, holdout_every=4, ttt_steps=3,
                                    aux_layers=AUX, draft_vocab=300, save_every=100, prompt="none"),
        "eagle": TrainConfig(kind="eagle", steps=8, lr=1e-2, batch=4, holdout_every=4, save_every=100),
        "mtp": TrainConfig(kind="mtp", steps=8, lr=1e-2, batch=4, holdout_every=4, ttt_steps=3, save_every=100,
                           ttt_decay=0.6),
    }
    out = {}
    for name, config in cases.items():
        folder = tmp_path_factory.mktemp(name) / "head"
        train(cache, target, folder, config, progress=False)
        out[name] = (load_heads(f"{config.kind}:{folder}", target).module, config)
    return target, out


def _sequences(cache, target, module, config):
    """Six trajectories of different lengths, one cut to two starts (shorter than the unrolling), one to one."""
    from specsim.record.train_data import load_sequences

    layers = module.config.hidden_layers if config.kind != "eagle" else ()  # as `train` reads them
    seqs = [s for _, s in load_sequences(cache, target, layers, config.prompt)]
    seqs = sorted(seqs, key=lambda s: s.hidden.shape[0])
    picked = [seqs[0], seqs[len(seqs) // 3], seqs[len(seqs) // 2], seqs[-1]]
    for keep in (3, 2):  # entries after the loss's first row: starts = keep - 1
        s = seqs[len(seqs) // 4]
        n = s.loss_from(config) + keep
        picked.append(dataclasses.replace(s, hidden=s.hidden[:n], tokens=s.tokens[:n],
                                          features=None if s.features is None else s.features[:n]))
    assert len({s.hidden.shape[0] for s in picked}) >= 4
    return picked


def _one_at_a_time(module, target, seqs, config):
    from specsim.record.train_loss import loss, terms

    return sum(loss(terms(config.kind, module, target, s, config.ttt_steps, full=False,
                          loss_from=s.loss_from(config)), config) for s in seqs) / len(seqs)


def _loss_and_grads(f, module):
    module.zero_grad()
    value = f()
    value.backward()
    return value.item(), {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", ["eagle3-draft-vocab", "eagle3-whole-vocab", "eagle3-blind", "mtp", "eagle"])
def test_a_batched_step_has_the_per_trajectory_loss_and_gradient(heads, training_cache, case):
    from specsim.record.train_loss import batch_loss

    target, cases = heads
    module, config = cases[case]
    module.train()
    for p in module.parameters():
        p.requires_grad_(True)
    seqs = _sequences(training_cache[0], target, module, config)
    want, want_grads = _loss_and_grads(lambda: _one_at_a_time(module, target, seqs, config), module)
    got, got_grads = _loss_and_grads(lambda: batch_loss(module, target, seqs, config), module)
    assert got == pytest.approx(want, rel=1e-5), (got, want)
    assert want_grads.keys() == got_grads.keys() and want_grads
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    # the batch is cut into groups of similar length, and the loss is the same whichever way it is cut
    import specsim.record.train_loss as train_module

    for share, cells in ((1.0, 1 << 40), (100.0, 1 << 40), (100.0, 1)):  # equal lengths only; all in one; one each
        saved = train_module.PAD_SHARE, train_module.GROUP_CELLS
        train_module.PAD_SHARE, train_module.GROUP_CELLS = share, cells
        try:
            assert batch_loss(module, target, seqs, config).item() == pytest.approx(want, rel=1e-5)
        finally:
            train_module.PAD_SHARE, train_module.GROUP_CELLS = saved


def test_the_check_rejects_a_batched_step_whose_lanes_see_each_other(heads, training_cache, monkeypatch):
    """Training-time test's mask gone wrong (each start's unrolled entries visible to every start, a tree-mask slip):
    the comparison above catches it."""
    import specsim.record.head_unroll as heads_module
    from specsim.record.train_loss import batch_loss

    target, cases = heads
    module, config = cases["eagle3-draft-vocab"]
    seqs = _sequences(training_cache[0], target, module, config)
    want = _one_at_a_time(module, target, seqs, config).item()
    real = heads_module.unroll_batch

    def lanes_see_each_other(forward, hidden, ids, *args):
        def leaky(feats, step_ids, positions, mask, past, *, from_target):
            if not from_target:
                mask = mask.clone()
                mask[:, :, ids.shape[1]:] = True
            return forward(feats, step_ids, positions, mask, past, from_target=from_target)
        return real(leaky, hidden, ids, *args)

    monkeypatch.setattr(heads_module, "unroll_batch", lanes_see_each_other)
    wrong = batch_loss(module, target, seqs, config).item()
    assert wrong != pytest.approx(want, rel=1e-5), (wrong, want)  # the tolerance the comparison above uses


def test_training_steps_run_batched_unless_asked_not_to(training_cache, tiny_model_dir, tmp_path, monkeypatch):
    import specsim.record.train as train_module
    from specsim.record.models import load_model
    from specsim.record.train import TrainConfig, train

    calls = []
    real = train_module.batch_loss
    monkeypatch.setattr(train_module, "batch_loss", lambda *a: calls.append(len(a[2])) or real(*a))
    cache, _ = training_cache
    outcomes = {}
    for batched in (True, False):
        config = TrainConfig(kind="eagle3", steps=3, lr=1e-2, batch=4, holdout_every=4, ttt_steps=2,
                             aux_layers=AUX, draft_vocab=300, save_every=100, batched=batched)
        outcomes[batched] = train(cache, load_model(str(tiny_model_dir)), tmp_path / str(batched), config,
                                  progress=False)
    assert calls == [4, 4, 4]  # the batched run's three steps of four trajectories; none in the other
    # the same steps either way: the held-out numbers after them agree to rounding
    assert outcomes[True].after["loss"] == pytest.approx(outcomes[False].after["loss"], rel=1e-4)


@pytest.mark.parametrize("case", ["eagle3-draft-vocab", "eagle3-whole-vocab", "eagle3-blind", "mtp"])
def test_a_batched_evaluation_has_the_per_trajectory_numbers(heads, training_cache, case):
    """Held-out evaluation of EAGLE-3 and MTP heads can run `config.batch` trajectories at a time (a GPU's default; on
    a CPU one at a time, which is faster there): the same loss, top-1 and overlap per depth as one at a time, on the
    generated rows (with the prompt in the loss
    too), for trajectories shorter than the depth, in groups of 1, 2 or all of them; a wrong evaluation whose target
    laws are one row off is caught."""
    import specsim.record.train_loss as train_module
    from specsim.record.train_data import load_sequences
    from specsim.record.train_loss import evaluate

    target, cases = heads
    module, config = cases[case]
    module.eval()
    seqs = sorted((s for _, s in load_sequences(training_cache[0], target, module.config.hidden_layers,
                                                config.prompt)), key=lambda s: s.hidden.shape[0])
    picked = [seqs[0], seqs[len(seqs) // 2], seqs[-1]]
    for keep in (3, 2):  # generated rows after the first: starts = keep - 1, fewer than the depth
        s = seqs[len(seqs) // 4]
        n = s.context + keep
        picked.append(dataclasses.replace(s, hidden=s.hidden[:n], tokens=s.tokens[:n], features=s.features[:n]))
    want = evaluate(config.kind, module, target, picked, config, together=False)
    calls = []
    real_laws = train_module._group_laws
    train_module._group_laws = lambda *a, **k: calls.append(1) or real_laws(*a, **k)
    try:
        assert evaluate(config.kind, module, target, picked, config) == want and not calls  # a CPU: one at a time
    finally:
        train_module._group_laws = real_laws
    assert set(want["top1"]) == set(range(1, config.ttt_steps + 1))
    for batch in (1, 2, len(picked)):
        got = evaluate(config.kind, module, target, picked, dataclasses.replace(config, batch=batch), together=True)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), (batch, got, want)
        for d in want["top1"]:
            assert got["top1"][d] == pytest.approx(want["top1"][d], abs=1e-9), (batch, d, got, want)
            assert got["overlap"][d] == pytest.approx(want["overlap"][d], rel=1e-5), (batch, d, got, want)
    real = train_module._group_laws

    def one_row_off(*args, **kwargs):  # each row's target law taken from the row before: an index slip
        g, laws, vocab = real(*args, **kwargs)
        return g, [(q, p.roll(1, 0), b, k) for q, p, b, k in laws], vocab

    train_module._group_laws = one_row_off
    try:
        wrong = evaluate(config.kind, module, target, picked, dataclasses.replace(config, batch=len(picked)),
                         together=True)
    finally:
        train_module._group_laws = real
    assert wrong["loss"] != pytest.approx(want["loss"], rel=1e-5)
    assert wrong["overlap"] != pytest.approx(want["overlap"], rel=1e-5)


@pytest.mark.parametrize("tokens", [10_000, 40])  # every prompt in one forward; a few prompts a forward
def test_prompt_states_from_batched_forwards_equal_one_forward_per_prompt(training_cache, tiny_model_dir, tokens):
    """`train-draft --hidden-batch`: the prompts' states (the context rows before each trajectory) from
    right-padded forwards equal one forward per prompt's to float16's step (both are rounded as the cache rounds
    states), and the trajectories' own rows, read from the cache, are the same; a context one row off is far
    outside the bound, so the check can fail."""
    from specsim.record.models import load_model
    from specsim.record.train_data import load_sequences

    target = load_model(str(tiny_model_dir))
    layers = ("1", "2", "3")
    one = load_sequences(training_cache[0], target, layers, "context")
    batched = load_sequences(training_cache[0], target, layers, "context", hidden_batch=tokens)
    assert [i for i, _ in one] == [i for i, _ in batched] and len(one) > 8
    contexts = 0
    for (_, a), (_, b) in zip(one, batched):
        c = a.context
        assert b.context == c and torch.equal(a.tokens, b.tokens)
        assert torch.equal(a.hidden[c:], b.hidden[c:]) and torch.equal(a.features[c:], b.features[c:])
        for x, y in ((a.hidden, b.hidden), (a.features, b.features)):
            scale = float(x[:c].abs().max())
            assert float((x[:c] - y[:c]).abs().max()) <= 2e-3 * scale
            assert float((x[1:c] - y[:c - 1]).abs().max()) > 1e-2 * scale
        contexts += c
    assert contexts > 0

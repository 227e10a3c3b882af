"""A batched training step reads nothing back from the device before its loss (`specsim.record.train_loss`'s
docstring): a read-back (a tensor's value as a Python number, `nonzero`, a boolean mask, `bincount` on a GPU) makes
the host wait for the device to finish all it has queued, and the device then waits for the host. On a CPU nothing
waits, so the tests count the calls that would: every torch call of a step goes through a TorchFunctionMode that
notes those. On a GPU, CUDA's own sync debug mode checks the same with the data moved to the device as
`train-draft` moves it. The old step (2026-11-28's, on the GPU 60-63% busy) read back 14-30 times per step on
these six trajectories: once or twice per trajectory and per depth."""

import collections
import traceback
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.test_train_batch import _sequences, heads  # noqa: F401 (a fixture)

READ_BACKS = {"__int__", "__float__", "__bool__", "__index__", "item", "tolist", "numpy", "cpu", "nonzero",
              "bincount", "equal", "unique", "masked_select"}


class ReadBacks(TorchFunctionMode):
    """Counts the torch calls that read a tensor's value back to the host, by name and the line of specsim's
    code that made them: the READ_BACKS functions, indexing with a boolean mask and one-argument `where` (each a
    `nonzero`), and `repeat_interleave` by a tensor of counts without its output size."""

    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        read = name in READ_BACKS
        if name in ("__getitem__", "__setitem__") and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            read = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
        elif name == "where":
            read = len(args) + len(kwargs or {}) == 1
        elif name == "repeat_interleave":
            counts = args[1] if len(args) > 1 else (kwargs or {}).get("repeats")
            read = isinstance(counts, torch.Tensor) and counts.numel() > 1 and "output_size" not in (kwargs or {})
        if read:
            ours = [f for f in traceback.extract_stack()[:-1] if "/specsim/" in f.filename][-1:]
            self.seen[(name, *(f"{Path(f.filename).name}:{f.lineno}" for f in ours))] += 1
        return func(*args, **(kwargs or {}))


def test_the_count_sees_each_kind_of_read_back():
    x = torch.arange(6.0)
    with ReadBacks() as reads:
        int(x[1]), x.max().item(), bool(x[2] > 1), x[x > 2], (x > 3).nonzero(), torch.equal(x, x), x.tolist()
        torch.bincount(x.long()), [0, 1, 2][x.long()[1]], torch.where(x > 1), x.repeat_interleave(x.long())
        x[2:4], x[torch.tensor([0, 2])], x + 1, x.shape[0], torch.where(x > 1, x, 0.0)  # these read nothing back
        x.repeat_interleave(2), x.repeat_interleave(x.long(), output_size=15)
    assert sorted(name for name, *_ in reads.seen.elements()) == sorted(
        ["__int__", "item", "__bool__", "__getitem__", "nonzero", "equal", "tolist", "bincount", "__index__", "where",
         "repeat_interleave"])


@pytest.mark.parametrize("case", ["eagle3-draft-vocab", "eagle3-whole-vocab", "eagle3-blind", "mtp", "eagle"])
def test_a_batched_training_step_reads_nothing_back(heads, training_cache, case):  # noqa: F811
    """Two steps (the second with what the first kept: the draft vocabulary's LM head rows), forward and backward."""
    from specsim.record.train_loss import batch_loss

    target, cases = heads
    module, config = cases[case]
    module.train()
    seqs = _sequences(training_cache[0], target, module, config)
    with ReadBacks() as reads:
        for _ in range(2):
            batch_loss(module, target, seqs, config).backward()
    assert not reads.seen, dict(reads.seen)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_a_batched_training_step_never_waits_for_the_device(heads, training_cache):  # noqa: F811
    from specsim.record.train_data import to_device
    from specsim.record.train_loss import batch_loss

    target, cases = heads
    module, config = cases["eagle3-draft-vocab"]
    target.model.to("cuda"), module.to("cuda").train()
    seqs, where = to_device(_sequences(training_cache[0], target, module, config), "cuda")
    assert "moved once" in where
    batch_loss(module, target, seqs, config).backward()  # the first gathers the draft vocabulary's rows
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch_loss(module, target, seqs, config).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_training_data_moves_to_a_gpu_once_when_it_fits(heads, training_cache, monkeypatch):  # noqa: F811
    from specsim.record.train_data import to_device

    target, cases = heads
    module, config = cases["eagle3-draft-vocab"]
    seqs = _sequences(training_cache[0], target, module, config)
    assert to_device(seqs, "cpu") == (seqs, None)
    need = sum(t.numel() * t.element_size() for s in seqs for t in (s.hidden, s.tokens, s.features))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (4 * need - 1, 10**12))  # a quarter is too little
    kept, where = to_device(seqs, "cuda")
    assert kept is seqs and where.startswith("training data kept in host memory")
    moved, where = to_device(seqs, "meta")  # a device without a free-memory query: moved, as a GPU with room
    assert where.startswith("training data on the device") and all(
        t.device.type == "meta" for s in moved for t in (s.hidden, s.tokens, s.features))
    assert [s.start for s in moved] == [s.start for s in seqs] and [s.context for s in moved] == [s.context for s in seqs]

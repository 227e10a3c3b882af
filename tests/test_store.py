"""The HDF5 cache store: round trips, top-k storage, bad files, and crash safety."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from specsim.cache.layout import CacheSpec, PromptRecord, topk_compress, topk_expand
from specsim.cache.reader import CacheReader
from specsim.cache.writer import CacheWriter
from specsim.errors import CacheError

V = 40


def _prompts(n=3):
    return [PromptRecord(100 + i, ["math", "qa"][i % 2], f"prompt {i}", np.arange(i + 2, dtype=np.int32)) for i in range(n)]


def _spec(**kw):
    return CacheSpec(vocab_size=V, drafts=("d1", "layers:2"), temperatures=(0.0, 0.7), meta={"settings": {"seed": 1}}, **kw)


def _append(w, rng, prompt_index, temperature, n):
    data = dict(
        tokens=rng.integers(0, V, n),
        target_logits=rng.normal(size=(n, V)) * 3,
        draft_logits={"d1": rng.normal(size=(n, V)), "layers:2": rng.normal(size=(n, V))},
    )
    w.append_trajectory(prompt_index=prompt_index, temperature=temperature, seed=7, stop_reason="eos", **data)
    return data


def test_round_trip_full_storage(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "c.h5"
    with CacheWriter.create(path, _spec(), _prompts()) as w:
        a = _append(w, rng, 0, 0.0, 5)
        b = _append(w, rng, 2, 0.7, 3)
    with CacheReader(path) as r:
        assert r.n_positions == 8
        assert r.trajectories["start"].to_list() == [0, 5]
        assert r.trajectories["category"].to_list() == ["math", "math"]
        assert r.trajectories["temperature"].to_list() == [0.0, 0.7]
        np.testing.assert_array_equal(r.tokens(5, 8), b["tokens"])
        np.testing.assert_allclose(r.logits("target", 0, 5), a["target_logits"], atol=2e-2)  # float16 storage
        np.testing.assert_allclose(r.logits("layers:2", 5, 8), b["draft_logits"]["layers:2"], atol=2e-2)
        np.testing.assert_array_equal(r.prompt_token_ids(1), np.arange(3))
        assert [t.stop for t in r.iter_trajectories(0.7)] == [8]
        assert r.meta["settings"] == {"seed": 1}


def test_a_reader_that_opens_a_new_cache_the_moment_it_appears_does_not_stop_its_writer(tmp_path, monkeypatch):
    """`specsim inspect` on a cache as its recording starts: the reader opens the file the instant it has its
    name, and the writer keeps appending (it used to fail reopening it: "unable to lock file")."""
    rng = np.random.default_rng(2)
    path = tmp_path / "c.h5"
    readers, replace = [], os.replace

    def replace_then_read(src, dst):
        replace(src, dst)
        if str(src).endswith(".creating"):
            readers.append(CacheReader(dst, probe=False))

    monkeypatch.setattr(os, "replace", replace_then_read)
    with CacheWriter.create(path, _spec(), _prompts()) as w:
        assert len(readers) == 1 and readers[0].n_positions == 0
        _append(w, rng, 0, 0.0, 5)
    readers[0].close()
    with CacheReader(path) as r:
        assert r.n_positions == 5


def test_topk_storage_keeps_top_logits_and_tail_mass(tmp_path):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, V)) * 2
    ids, top, tail = topk_compress(logits, 5)
    dense = topk_expand(ids, top, tail, V)
    assert (np.diff(top, axis=1) <= 0).all()  # sorted descending
    np.testing.assert_allclose(np.sort(logits, axis=1)[:, ::-1][:, :5], top)
    lse = lambda x: np.log(np.exp(x).sum(axis=1))  # noqa: E731
    np.testing.assert_allclose(lse(dense), lse(logits), rtol=1e-6)  # total mass preserved

    path = tmp_path / "k.h5"
    with CacheWriter.create(path, _spec(storage="topk", top_k=5), _prompts()) as w:
        data = _append(w, rng, 1, 0.0, 4)
    with CacheReader(path) as r:
        assert r.spec.storage == "topk" and r.spec.top_k == 5
        got = r.logits("target", 0, 4)
        want_ids = np.argsort(-data["target_logits"], axis=1)[:, :5]
        np.testing.assert_allclose(np.take_along_axis(got, want_ids, 1),
                                   np.take_along_axis(data["target_logits"], want_ids, 1), atol=2e-2)


def test_bad_requests_are_refused(tmp_path):
    path = tmp_path / "c.h5"
    with CacheWriter.create(path, _spec(), _prompts()) as w:
        with pytest.raises(CacheError, match="temperature 0.5 is not one of"):
            w.append_trajectory(prompt_index=0, temperature=0.5, seed=0, tokens=[1], target_logits=np.zeros((1, V)),
                                draft_logits={"d1": np.zeros((1, V)), "layers:2": np.zeros((1, V))}, stop_reason="eos")
        with pytest.raises(CacheError, match="expected \\(1, 40\\)"):
            w.append_trajectory(prompt_index=0, temperature=0.0, seed=0, tokens=[1], target_logits=np.zeros((1, 3)),
                                draft_logits={"d1": np.zeros((1, V)), "layers:2": np.zeros((1, V))}, stop_reason="eos")
    with pytest.raises(CacheError, match="exists; pass --resume"):
        CacheWriter.create(path, _spec(), _prompts())
    with CacheReader(path) as r:
        with pytest.raises(CacheError, match="recorded: 0, 0.7"):
            r.check_temperature(1.0)
        with pytest.raises(CacheError, match="recorded drafts: d1, layers:2"):
            r.check_column("int8")


def test_reader_rejects_missing_foreign_and_truncated_files(tmp_path):
    with pytest.raises(CacheError, match="no such file"):
        CacheReader(tmp_path / "nope.h5")
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(CacheError, match="cannot open as a cache"):
        CacheReader(tmp_path / "text.h5")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = 1
    with pytest.raises(CacheError, match="not a specsim cache"):
        CacheReader(tmp_path / "other.h5")
    path = tmp_path / "c.h5"
    with CacheWriter.create(path, _spec(), _prompts()) as w:
        _append(w, np.random.default_rng(0), 0, 0.0, 50)
    data = path.read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 3])
    with pytest.raises(CacheError):
        CacheReader(tmp_path / "cut.h5")


WRITER = textwrap.dedent(
    """
    import sys, time, numpy as np
    from specsim.cache.layout import CacheSpec, PromptRecord
    from specsim.cache.writer import CacheWriter
    spec = CacheSpec(vocab_size=40, drafts=("d1",), temperatures=(0.0,))
    prompts = [PromptRecord(i, "c", "p", np.arange(3, dtype=np.int32)) for i in range(1000)]
    w = CacheWriter.create(sys.argv[1], spec, prompts)
    for i in range(1000):
        rng = np.random.default_rng(i)
        w.append_trajectory(prompt_index=i, temperature=0.0, seed=i, tokens=rng.integers(0, 40, 20),
                            target_logits=rng.normal(size=(20, 40)), draft_logits={"d1": rng.normal(size=(20, 40))},
                            stop_reason="max_new_tokens")
        print(i, flush=True)
        time.sleep(0.02)
    """
)


def test_kill_9_keeps_committed_trajectories_and_resume_continues(tmp_path):
    path = tmp_path / "crash.h5"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    for _ in range(5):  # wait until a few trajectories are committed
        proc.stdout.readline()
    with CacheReader(path) as r:  # readable while the writer runs
        assert len(r.trajectories) >= 4
    time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with CacheReader(path) as r:
        n_before = len(r.trajectories)
        assert n_before >= 5 and r.n_positions == 20 * n_before
        rng = np.random.default_rng(n_before - 1)
        tokens = rng.integers(0, 40, 20)
        np.testing.assert_array_equal(r.tokens(20 * (n_before - 1), 20 * n_before), tokens)
    with CacheWriter.resume(path) as w:
        assert w.is_done(0, 0.0) and not w.is_done(n_before, 0.0)
        rng = np.random.default_rng(n_before)
        w.append_trajectory(prompt_index=n_before, temperature=0.0, seed=0, tokens=rng.integers(0, 40, 20),
                            target_logits=rng.normal(size=(20, 40)), draft_logits={"d1": rng.normal(size=(20, 40))},
                            stop_reason="eos")
    with CacheReader(path) as r:
        assert len(r.trajectories) == n_before + 1
        assert r.trajectories["start"].to_list() == [20 * i for i in range(n_before + 1)]


def _snapshots(tmp_path, n_before=3):
    """A recording of n_before committed trajectories (`before.h5`), the same file after the next commit has
    written and flushed its positions (`positions.h5`), and after it has appended its row (`row.h5`): the states
    on disk between which a kill -9 can land. The writer is stopped there, never closed, as a kill leaves it."""
    import shutil

    rng = np.random.default_rng(0)
    path = tmp_path / "live.h5"
    w = CacheWriter.create(path, _spec(), _prompts(n_before + 1))
    for i in range(n_before):
        _append(w, rng, i, 0.0, 20)
    shutil.copy(path, tmp_path / "before.h5")
    real_flush, flushes = w._f.flush, []

    def flush():
        real_flush()
        shutil.copy(path, tmp_path / ("positions.h5" if not flushes else "row.h5"))
        flushes.append(1)

    w._f.flush = flush
    _append(w, rng, n_before, 0.0, 20)
    return {name: tmp_path / f"{name}.h5" for name in ("before", "positions", "row")}


def _tear(old, new, out, dataset, keep_new, *, base=None):
    """`base` (default `old`) with `dataset`'s last chunk made of `new`'s first `keep_new(size)` bytes and
    `old`'s after them: a write of that chunk cut short (Linux stops a write at a page boundary when SIGKILL
    arrives), the checksum at its end not rewritten."""
    with h5py.File(new, "r", swmr=True) as f:
        ds = f[dataset]
        info = ds.id.get_chunk_info(ds.id.get_num_chunks() - 1)
    data, fresh, stale = bytearray((base or old).read_bytes()), new.read_bytes(), old.read_bytes()
    lo, cut, hi = info.byte_offset, info.byte_offset + keep_new(info.size), info.byte_offset + info.size
    data[lo:hi] = fresh[lo:cut] + stale[cut:hi]
    out.write_bytes(bytes(data))
    return out


def test_a_chunk_write_a_kill_cut_short_loses_no_committed_trajectory(tmp_path):
    """Each commit rewrites the last chunk of every dataset, committed positions beside the new ones. A kill -9
    mid-write leaves the new bytes without their checksum, and HDF5 then refuses the whole chunk (seen once in the
    kill -9 test above under load). The committed bytes are intact and the reader takes them, because the rows
    they belong to hash to their digests; resume rewrites the file as it was before the crash."""
    from click.testing import CliRunner

    from specsim.cli import main

    snap = _snapshots(tmp_path)
    with CacheReader(snap["before"]) as r:
        fingerprint, tokens = r.fingerprint, r.tokens(0, 60)
    for name in ("torn", "bad"):
        _tear(snap["before"], snap["positions"], tmp_path / f"{name}.h5", "positions/token", lambda size: size - 4)
    torn, bad = tmp_path / "torn.h5", tmp_path / "bad.h5"
    with h5py.File(torn, "r", swmr=True) as f, pytest.raises(OSError, match="filter returned failure"):
        f["positions/token"][59]  # what HDF5 itself says: the committed positions of that chunk are unreadable
    with CacheReader(torn) as r:
        assert len(r.trajectories) == 3 and r.fingerprint == fingerprint
        np.testing.assert_array_equal(r.tokens(0, 60), tokens)
        assert [line.split(":")[0] for line in r.recovered] == ["positions/token"]
    res = CliRunner().invoke(main, ["inspect", str(torn), "-q"])
    assert res.exit_code == 0 and "note: positions/token: a chunk fails its checksum" in res.output, res.output
    res = CliRunner().invoke(main, ["inspect", str(torn), "--verify", "-q"])
    assert res.exit_code == 1 and res.output.count("its data is intact") == 3, res.output
    with CacheWriter.resume(torn) as w:
        assert w.n_positions == 60
    with CacheReader(torn) as r:
        assert r.fingerprint == fingerprint and r.verify().ok and not r.recovered

    # the check can fail: a torn chunk whose committed bytes changed too is damage, not a crash's leftover
    with h5py.File(bad, "r", swmr=True) as f:
        offset = f["positions/token"].id.get_chunk_info(0).byte_offset
    data = bytearray(bad.read_bytes())
    data[offset + 4 * 30] ^= 0x01  # position 30's token: committed by trajectory 1
    bad.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=r"damaged data in tokens at positions 0:60 \(prompt 1 at T=0;"):
        with CacheReader(bad) as r:  # opens (the last trajectory is intact); reading the damaged one fails
            r.tokens(0, 60)
    with pytest.raises(CacheError, match="damaged data"):
        CacheWriter.resume(bad)


@pytest.mark.parametrize("extent", ["new", "old"])
def test_a_row_a_kill_cut_short_is_dropped_and_the_rows_before_it_kept(tmp_path, extent):
    """The kill lands while the row that commits the fourth trajectory is written: the table's chunk holds three
    committed rows and most of the fourth under the old checksum, and the table's extent on disk says 4 rows
    ("new") or still 3 ("old"). The three are kept (each hashes to its digest), the partial row is dropped as
    never committed, and resume goes on from there."""
    snap = _snapshots(tmp_path)
    with CacheReader(snap["before"]) as r:
        fingerprint = r.fingerprint
    with h5py.File(snap["row"], "r", swmr=True) as f:
        itemsize = f["trajectories"].dtype.itemsize
    torn = _tear(snap["positions"], snap["row"], tmp_path / "torn.h5", "trajectories",
                 lambda size: 4 * itemsize - 6, base=snap["row" if extent == "new" else "positions"])
    with CacheReader(torn) as r:
        assert len(r.trajectories) == 3 and r.fingerprint == fingerprint
        assert r.recovered[0].startswith("trajectory table: a chunk fails its checksum; its 3 committed rows")
        assert ("half written" in r.recovered[0]) == (extent == "new"), r.recovered
    with CacheWriter.resume(torn) as w:
        assert w.n_positions == 60 and w.is_done(2, 0.0) and not w.is_done(3, 0.0)


def test_truncated_copy_of_a_crashed_recording_is_refused(tmp_path):
    path = tmp_path / "crash.h5"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    for _ in range(3):
        proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    data = path.read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(CacheError, match="truncated"):
        CacheReader(tmp_path / "cut.h5")


def test_garbled_superblock_is_a_cache_error(tmp_path):
    path = tmp_path / "c.h5"
    with CacheWriter.create(path, _spec(), _prompts()) as w:
        _append(w, np.random.default_rng(0), 0, 0.0, 3)
    data = bytearray(path.read_bytes())
    data[8] = 0x7F  # superblock version byte
    path.write_bytes(bytes(data))
    with pytest.raises(CacheError):
        CacheReader(path)


def test_flipped_bytes_in_a_chunk_are_reported_with_their_trajectory(tmp_path):
    """HDF5's fletcher32 checksum on every chunk: a damaged one is named, never read as wrong logits."""
    import h5py

    from tests.synthetic import random_cache

    path = random_cache(tmp_path / "c.h5", n_prompts=3, length=20, vocab=40, temperatures=(0.0,))
    with h5py.File(path, "r") as f:
        ds = f["columns/small/logits"]
        info = ds.id.get_chunk_info(1)  # the second chunk of positions 16:32
    data = bytearray(path.read_bytes())
    data[info.byte_offset + info.size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with CacheReader(path) as reader:
        reader.logits("target", 0, 16)  # an intact chunk reads
        with pytest.raises(CacheError, match=r"damaged data in small logits at positions 16:32 \(prompt \d at T=0"):
            reader.logits("small", 16, 32)
    import specsim.sim.sweep

    with pytest.raises(CacheError, match="damaged data"):  # top_k > 16: features derived from the logits
        specsim.sim.sweep.simulate(path, trees=["kary:2,2"], drafts=["small"], policies=["greedy"], n_boot=0, top_k=20)


@pytest.mark.parametrize("prompts, chunk_kb", [(3, 8), (2000, 256)])
def test_statistics_chunks_grow_with_the_recording(tmp_path, prompts, chunk_kb):
    """A statistic's HDF5 chunk is 1/256 of its expected size (prompts x temperatures x max_new_tokens),
    8 KB (and 64 rows) at least, so a small cache stays small, and 256 KB at most: a large one reads in
    few chunks."""
    from specsim.cache.stats import StatsSpec

    spec = CacheSpec(vocab_size=V, drafts=("d1",), temperatures=(0.0, 0.7), storage="stats", stats=StatsSpec(),
                     meta={"settings": {"max_new_tokens": 256}})
    with CacheWriter.create(tmp_path / "c.h5", spec, _prompts(prompts)):
        pass
    with h5py.File(tmp_path / "c.h5") as f:
        (draft,) = [g for g in f["columns"].values() if g.attrs["name"] == "d1"]
        ds = draft["stats"]["pi_swor_groups"]
        row = ds.dtype.itemsize * int(np.prod(ds.shape[1:]))
        assert ds.chunks[0] == max(64, chunk_kb * 1024 // row)  # 64 rows at least


def test_an_overhang_is_recorded_after_its_trajectory_and_read_by_nothing_else(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "o.h5"
    with CacheWriter.create(path, _spec(), _prompts()) as w:
        n, K = 5, 3
        tokens = rng.integers(0, V, n + K)
        w.append_trajectory(prompt_index=0, temperature=0.0, seed=7, stop_reason="eos", tokens=tokens, overhang=K,
                            target_logits=rng.normal(size=(n + K, V)),
                            draft_logits={"d1": rng.normal(size=(n + K, V)), "layers:2": rng.normal(size=(n + K, V))})
        b = _append(w, rng, 1, 0.7, 4)
        with pytest.raises(CacheError, match=r"overhang 9 must be in 0..7 \(positions past the end of 8\)"):
            w.append_trajectory(prompt_index=2, temperature=0.0, seed=7, stop_reason="eos", tokens=tokens,
                                overhang=9)
    with CacheReader(path) as r:
        assert r.trajectories["length"].to_list() == [5, 4] and r.trajectories["overhang"].to_list() == [3, 0]
        assert r.trajectories["start"].to_list() == [0, 8]  # the next trajectory starts after the overhang
        assert r.n_positions == 12 and r.n_trajectory_positions == 9
        first, second = list(r.iter_trajectories())
        assert (first.stop, first.end, second.start) == (5, 8, 8)
        np.testing.assert_array_equal(r.tokens(first.start, first.stop), tokens[:5])
        np.testing.assert_array_equal(r.tokens(first.stop, first.end), tokens[5:])
        np.testing.assert_array_equal(r.tokens(second.start, second.stop), b["tokens"])
    # resume keeps the overhang rows (what the row counts past its length), a merge copies them
    with CacheWriter.resume(path) as w:
        assert w.n_positions == 12
    from specsim.cache.writer import CacheWriter as W

    with CacheReader(path) as r, W.create(tmp_path / "copy.h5", r.spec, [
            PromptRecord(p.question_id, p.category, p.text, p.token_ids) for p in r._prompts]) as w:
        for row in r.iter_trajectories():
            w.append_copy(r, row)
    with CacheReader(tmp_path / "copy.h5") as r:
        assert r.trajectories["overhang"].to_list() == [3, 0]
        np.testing.assert_array_equal(r.tokens(5, 8), tokens[5:])


@pytest.mark.parametrize("dataset", ["columns/small/logits", "columns/small/stats/rank", "positions/token",
                                     "columns/target/stats/logprob"])
def test_verify_finds_flipped_bytes_anywhere_and_says_where(tmp_path, dataset):
    """simulate reads only what it needs; `inspect --verify` reads every chunk and recomputes every digest."""
    import h5py
    from click.testing import CliRunner

    from specsim.cli import main
    from tests.synthetic import random_cache

    path = random_cache(tmp_path / "c.h5", n_prompts=3, length=20, vocab=40, temperatures=(0.0,))
    ok = CliRunner().invoke(main, ["inspect", str(path), "--verify", "-q"])
    assert ok.exit_code == 0 and "intact" in ok.output and "every content digest recomputed" in ok.output
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info(0)
    data = bytearray(path.read_bytes())
    data[info.byte_offset + info.size // 3] ^= 0x40
    path.write_bytes(bytes(data))
    res = CliRunner().invoke(main, ["inspect", str(path), "--verify", "-q"])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("damaged: ")]
    assert lines and all(dataset in ln and "prompt " in ln and "positions " in ln for ln in lines)


def test_verify_finds_changed_prompts_and_a_row_whose_data_no_longer_hashes_to_its_digest(tmp_path):
    import h5py

    from tests.synthetic import random_cache

    path = random_cache(tmp_path / "c.h5", n_prompts=3, length=20, vocab=40, temperatures=(0.0,))
    with h5py.File(path, "r+") as f:
        ids = f["prompts/token_ids"]
        ids[1] = np.asarray(ids[1]) + 1  # prompts are not chunked: a rewrite, not a flipped bit
        f["columns/small/stats/rank"][25] += 1  # rewritten through HDF5: the checksum follows, the digest does not
    with CacheReader(path) as r:
        found = r.verify()
    assert not found.ok and found.prompts_checked
    assert any(d.startswith("prompts: ") for d in found.damaged)
    row = [d for d in found.damaged if "no longer hashes" in d]
    assert len(row) == 1
    lo, hi = (int(x) for x in row[0].split("positions ")[1].split(")")[0].split(":"))
    assert lo <= 25 < hi  # the trajectory holding the rewritten rank, and only it


def test_verify_finds_a_changed_header_and_a_damaged_trajectory_table(tmp_path):
    """The last unguarded parts: the header attributes (run metadata, spec) are checked against their sha256,
    the trajectory table by its HDF5 checksum."""
    import h5py
    from click.testing import CliRunner

    from specsim.cli import main
    from tests.synthetic import random_cache

    path = random_cache(tmp_path / "c.h5", n_prompts=3, length=20, vocab=40, temperatures=(0.0,))
    ok = CliRunner().invoke(main, ["inspect", str(path), "--verify", "-q"])
    assert ok.exit_code == 0 and "header against its sha256" in ok.output
    with h5py.File(path, "r+") as f:
        assert f["trajectories"].fletcher32
        meta = f.attrs["meta"]
        f.attrs["meta"] = meta.replace('"target": {', '"target": {"edited": 1, ', 1)  # the run metadata rewritten
        assert f.attrs["meta"] != meta
    res = CliRunner().invoke(main, ["inspect", str(path), "--verify", "-q"])
    assert res.exit_code == 1 and "damaged: header: the file's attributes" in res.output, res.output

    path = random_cache(tmp_path / "d.h5", n_prompts=3, length=20, vocab=40, temperatures=(0.0,))
    with h5py.File(path, "r") as f:
        info = f["trajectories"].id.get_chunk_info(0)
    data = bytearray(path.read_bytes())
    data[info.byte_offset + info.size // 2] ^= 0x40  # past the three rows: a file closed cleanly has no excuse
    path.write_bytes(bytes(data))
    res = CliRunner().invoke(main, ["inspect", str(path), "--verify", "-q"])
    assert res.exit_code == 1 and "corrupt or truncated cache" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1  # one line, no traceback


def test_the_former_store_module_still_gives_the_reader_and_writer_and_says_where_they_live():
    """Scripts written against `specsim.cache.store` (documented before the split) keep running, warned."""
    import importlib
    import sys

    from specsim.cache.reader import CacheReader
    from specsim.cache.writer import CacheWriter

    sys.modules.pop("specsim.cache.store", None)
    with pytest.warns(DeprecationWarning, match="specsim.cache.reader"):
        store = importlib.import_module("specsim.cache.store")
    assert store.CacheReader is CacheReader and store.CacheWriter is CacheWriter

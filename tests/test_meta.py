"""The run metadata is read once into a typed, frozen RunMeta; malformed parts read as missing, not as errors."""

import dataclasses

import pytest

from specsim.cache.meta import RunMeta
from specsim.cache.reader import CacheReader
from specsim.errors import CacheError


def test_the_reader_parses_the_recorders_metadata_once(tiny_cache):
    with CacheReader(tiny_cache) as reader:
        run = reader.run
        assert run.settings["max_new_tokens"] == 12 and run.max_new_tokens == 12
        assert run.target_name == run.settings["target"] and run.target["spec"] == run.target_name
        assert set(run.drafts) == {"layers:2", "int8"} and run.tokenizer_sha256 == reader.meta["tokenizer_sha256"]
        assert run.shard == (0, 1) and run.device == "cpu" and "torch" in run.versions
        with pytest.raises(TypeError):
            run.settings["max_new_tokens"] = 99  # read-only: nothing downstream edits what the file says
        with pytest.raises(dataclasses.FrozenInstanceError):
            run.device = "cuda"


@pytest.mark.parametrize("meta", [None, [], {}, {"settings": "x", "target": 3, "drafts": [1]},
                                  {"settings": {"target": "t"}, "target": "old-spec"}])
def test_missing_or_malformed_parts_read_as_missing(meta):
    run = RunMeta.parse(meta)
    assert run.max_new_tokens is None and run.shard == (0, 1) and dict(run.drafts) == {}
    assert run.target_name in ("target", "t")
    with pytest.raises(CacheError, match="records no settings"):
        run.require_settings("f.h5", "cannot rerun it live")


def test_shard_and_limits_come_from_the_settings():
    run = RunMeta.parse({"settings": {"target": "m", "max_new_tokens": 64, "shard": "2/4"}, "target": "m"})
    assert run.shard == (2, 4) and run.max_new_tokens == 64 and run.target_name == "m"
    assert run.require_settings("f.h5", "why")["target"] == "m"
    assert RunMeta.parse({"settings": {"max_new_tokens": True}}).max_new_tokens is None

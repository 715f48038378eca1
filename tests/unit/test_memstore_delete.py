"""Deleting series from a shard's memstore: their samples (open, sealed, flushed) and lookups
go, the counts of memory stay exact, other series are untouched, and samples with the same
labels afterwards make a new series holding only them."""

from __future__ import annotations

import numpy as np

from core.dataset import Dataset
from ingest.batch import SampleBatch
from ingest.memstore import ShardMemstore
from store.api import LabelMatcher, MatchOp

T0 = 1_750_000_000_000


def _batch(hosts: list[str], t: int) -> SampleBatch:
    labels = [{"_metric_": "cpu", "_ws_": "w", "_ns_": "n", "host": h} for h in hosts]
    n = len(hosts)
    return SampleBatch(
        labels, np.arange(n, dtype=np.int32), np.full(n, t, np.int64), np.ones(n, np.float64)
    )


def test_deleted_series_leave_memory_and_lookups_and_come_back_new() -> None:
    mem = ShardMemstore(
        Dataset(name="ds", num_shards=1, spread={"default": 0}), 0, groups_per_shard=2
    )
    hosts = ["a", "b", "c"]
    for i in range(10):
        mem.ingest(_batch(hosts, T0 + i * 1000), i)
    for g in range(2):  # some samples sealed and flushed, some open
        mem.mark_flushed(mem.seal_group(g))
    for i in range(10, 15):
        mem.ingest(_batch(hosts, T0 + i * 1000), i)
    assert mem.memory_samples() == 45

    gone = mem.delete_series([[LabelMatcher("host", MatchOp.RE, "a|b")]])
    assert sorted(gone) == sorted(mem.part_key(s) for s in (0, 1))
    assert mem.find_series([]) == [2]
    assert mem.find_series([LabelMatcher("host", MatchOp.EQ, "a")]) == []
    assert mem.find_series([LabelMatcher("zone", MatchOp.EQ, "")]) == [2]
    assert mem.series_id({"_metric_": "cpu", "_ws_": "w", "_ns_": "n", "host": "a"}) is None
    assert mem.memory_samples() == 15
    assert len(mem.samples(2)[0]) == 15
    assert mem.delete_series([[LabelMatcher("host", MatchOp.EQ, "a")]]) == []

    mem.ingest(_batch(["a"], T0 + 100_000), 15)
    (new,) = mem.find_series([LabelMatcher("host", MatchOp.EQ, "a")])
    assert new == 3
    assert mem.samples(new)[0].tolist() == [T0 + 100_000]
    assert mem.time_range(new) == (T0 + 100_000, T0 + 100_000)
    for g in range(2):  # sealing and eviction go on with the holes
        mem.mark_flushed(mem.seal_group(g))
    assert mem.evict(T0 + 10**9) == 16
    assert mem.memory_samples() == 0

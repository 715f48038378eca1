"""A query part on a node answers nothing past the dataset's retention, from the ColumnStore or
from memory alike: the memstore still holds old samples (it evicts by its own rules), and they
stop answering exactly at `now - retention`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from core.dataset import Dataset
from ingest.memstore import ShardMemstore
from query.executor import NodeQuery, ShardSource, run_node_query
from store.api import LabelMatcher, MatchOp
from store.sqlite import open_sqlite_stores
from tests.ingest.test_memstore import batch

NOW = 1_700_000_000_000
HOUR = 3_600_000


def test_samples_in_memory_past_retention_do_not_answer(tmp_path: Path) -> None:
    ds = Dataset(name="kept", num_shards=2)
    mem = ShardMemstore(ds, 0, groups_per_shard=1)
    recent = {"_metric_": "m", "_ws_": "w", "_ns_": "n", "host": "recent"}
    stale = {**recent, "host": "stale"}  # its only sample is past retention
    cutoff = NOW - HOUR
    times = [cutoff - 60_000, cutoff - 1, cutoff, cutoff + 1, NOW]
    mem.ingest(batch([(recent, t, float(i)) for i, t in enumerate(times)]), 0)
    mem.ingest(batch([(stale, cutoff - 1, 9.0)]), 1)
    meta, column = open_sqlite_stores(tmp_path / "filopy.db")
    try:
        column.clock = lambda: NOW

        def ask(kind: Literal["raw", "series"]) -> Any:
            query = NodeQuery(kind, matchers=((LabelMatcher("__name__", MatchOp.EQ, "m"),),))
            return run_node_query(query, ShardSource(ds, {0: mem}, column)).result

        assert {s.labels["host"]: len(s.ts) for s in ask("raw")} == {
            "recent": 5,
            "stale": 1,
        }
        assert len(ask("series")) == 2
        meta.set_retention(ds.ref, HOUR)
        (series,) = ask("raw")
        assert series.labels["host"] == "recent"
        assert series.ts.tolist() == [cutoff, cutoff + 1, NOW]
        assert [s["host"] for s in ask("series")] == ["recent"]
        column.clock = lambda: NOW + HOUR  # everything but the newest sample is past it
        (series,) = ask("raw")
        assert series.ts.tolist() == [NOW]
    finally:
        meta.close()
        column.close()

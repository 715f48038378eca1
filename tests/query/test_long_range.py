"""A month of history answered from the 1 h resolution (issue 33): 30 days of scrapes written
straight into the store and downsampled by the shard's own downsampler (tests/month_data.py),
then 30-day range queries at 1 h steps on the node's query path (`run_node_query` over the
recovered shard): they read the 1 h records only (no raw chunk, no 5 m record: the coarsest
resolution answers), and their answers equal the raw answers, both the node's (the same path
without periods) and `range_function`'s over the generated samples."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from query.evaluator import range_times
from query.executor import NodeQuery, ShardSource, run_node_query
from query.functions import SampleBatch, range_function
from query.promql import parse
from query.values import StepMatrix
from store import ColumnStore, MetaStore
from store.cassandra import open_cassandra_stores
from store.sqlite import open_sqlite_stores
from tests.month_data import (
    COUNTER,
    GAUGE,
    HOUR,
    MINUTE,
    Month,
    MonthSpec,
    RawOnly,
    block_samples,
    generate,
    labels_of,
)

SPEC = MonthSpec(series=24, days=30, scrape_ms=60_000, resolutions_ms=(5 * MINUTE, HOUR))
# On Cassandra, 1 h only: the 5 m resolution's 360 slices are most of the downsampling time
# there, and which resolution a query picks does not depend on the store.
SPECS = {"sqlite": SPEC, "cassandra": dataclasses.replace(SPEC, resolutions_ms=(HOUR,))}
QUERIES = (
    ("rate", COUNTER),
    ("max_over_time", GAUGE),
    ("avg_over_time", GAUGE),
)


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.cassandra)])
def stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[MetaStore, ColumnStore, str]]:
    if request.param == "sqlite":
        meta, column = open_sqlite_stores(tmp_path / "filopy.db")
        try:
            yield meta, column, "sqlite"
        finally:
            meta.close()
            column.close()
        return
    host, port = request.getfixturevalue("cassandra_address")
    keyspace = f"filopy_month_{uuid.uuid4().hex[:10]}"
    meta, column = open_cassandra_stores([host], port, keyspace, request_timeout_s=30.0)
    try:
        yield meta, column, "cassandra"
    finally:
        try:
            meta._conn.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        finally:
            meta.close()
            column.close()


def _ask(month: Month, column: ColumnStore, expr: str, times: Any, raw: bool) -> StepMatrix:
    source: Any = ShardSource(month.dataset, {0: month.memstore}, column)
    if raw:
        source = RawOnly(source)
    query = NodeQuery("series_local", expr=parse(expr), times=times)
    result = run_node_query(query, source).result
    assert isinstance(result, StepMatrix)
    return result


def _by_series(m: StepMatrix) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {labels["instance"]: (m.values[i], m.present[i]) for i, labels in enumerate(m.labels)}


def _reference(
    spec: MonthSpec, func: str, metric: str, times: Any
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`range_function` over the generated samples of the metric's series (stored and in
    memory alike)."""
    ts, vals = block_samples(spec, 0, spec.series)
    rows = [i for i in range(spec.series) if labels_of(i)["_metric_"] == metric]
    bounds = np.arange(len(rows) + 1, dtype=np.int64) * ts.shape[1]
    batch = SampleBatch([labels_of(i) for i in rows], ts[rows].ravel(), vals[rows].ravel(), bounds)
    values, present = range_function(func, batch, times, HOUR, 0)
    return {labels_of(i)["instance"]: (values[k], present[k]) for k, i in enumerate(rows)}


def _assert_same(
    got: dict[str, tuple[np.ndarray, np.ndarray]],
    want: dict[str, tuple[np.ndarray, np.ndarray]],
    exact: bool,
) -> None:
    assert got.keys() == want.keys()
    for key, (values, present) in got.items():
        w_values, w_present = want[key]
        assert (present == w_present).all(), key
        if exact:
            assert values[present].tolist() == w_values[present].tolist(), key
        else:
            np.testing.assert_allclose(values[present], w_values[present], rtol=1e-9)


def test_a_month_at_hour_steps_reads_only_the_hour_resolution(
    stores: tuple[MetaStore, ColumnStore, str],
) -> None:
    meta, column, backend = stores
    spec = SPECS[backend]
    month = generate(spec, meta, column, name=f"month_{uuid.uuid4().hex[:8]}")
    assert month.memstore.downsampled_until == {r: spec.end_ms for r in spec.resolutions_ms}
    times = range_times(spec.start_ms + HOUR, spec.end_ms, HOUR)  # 30 days: 720 steps
    per_metric = spec.series // 2
    for func, metric in QUERIES:
        expr = f"{func}({metric}[1h])"
        column.chunks_read, column.downsampled_read = 0, {}
        down = _ask(month, column, expr, times, raw=False)
        # One 1 h record per series and day, nothing raw, nothing of the finer resolution.
        assert column.downsampled_read == {HOUR: per_metric * spec.days}, expr
        assert column.chunks_read == 0, expr
        assert len(down.labels) == per_metric
        column.chunks_read = 0
        raw = _ask(month, column, expr, times, raw=True)
        assert column.chunks_read >= per_metric * spec.days * 24, expr  # an hour's chunks
        exact = func != "avg_over_time"  # integer counters; min/max are exact anyway
        _assert_same(_by_series(down), _by_series(raw), exact)
        _assert_same(_by_series(down), _reference(spec, func, metric, times), exact)


def test_steps_off_the_hour_read_raw_chunks(stores: tuple[MetaStore, ColumnStore, str]) -> None:
    """Windows that are not whole periods are answered from raw samples, as before."""
    meta, column, _ = stores
    spec = MonthSpec(series=4, days=3, resolutions_ms=(HOUR,))
    month = generate(spec, meta, column, name=f"month_{uuid.uuid4().hex[:8]}")
    times = range_times(spec.start_ms + HOUR + 1_000, spec.end_ms, HOUR)
    column.chunks_read, column.downsampled_read = 0, {}
    got = _ask(month, column, f"max_over_time({GAUGE}[1h])", times, raw=False)
    assert len(got.labels) == 2
    assert column.downsampled_read == {}
    assert column.chunks_read >= 2 * (spec.days * 24 - 1)  # every hour but the one in memory

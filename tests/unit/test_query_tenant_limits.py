"""Per-tenant query limits, counted where samples are read: a node's `ShardSource` over real
memstores and a SQLite ColumnStore stops within the shard (or slice of series) that takes the
query over its limit; the caller adds up the nodes and refuses a query whose nodes were each
under the limit but not together; a query under the limit answers exactly as without limits;
and which tenant a query counts against."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.dataset import Dataset, DatasetRef
from ingest.memstore import ShardMemstore
from query import executor
from query.executor import NodeAnswer, NodeQuery, ShardSource, run_node_query
from query.limits import NO_TENANT, QueryLimitExceeded, QueryLimits, pinned_tenant, tenant_of
from query.promql import parse
from query.service import QueryService
from query.values import StepMatrix
from store.api import LabelMatcher, MatchOp
from store.sqlite import open_sqlite_stores
from tests.ingest.test_memstore import batch
from tests.rest.test_promql_api import FakeMaps, active_map

DS = Dataset(name="fake", num_shards=4)  # the dataset of test_promql_api's map
T = 1_700_000_000_000
SERIES_PER_SHARD = 10
SAMPLES_EACH = 20
PER_SHARD = SERIES_PER_SHARD * SAMPLES_EACH
NAME = (LabelMatcher("__name__", MatchOp.EQ, "m"),)


def memstore(shard: int, series: int = SERIES_PER_SHARD, each: int = SAMPLES_EACH) -> ShardMemstore:
    mem = ShardMemstore(DS, shard, groups_per_shard=1)
    samples = [
        (
            {"_metric_": "m", "_ws_": "a" if i % 2 else "b", "_ns_": "n", "host": f"s{shard}h{i}"},
            T + 10_000 * k,
            float(i + k),
        )
        for i in range(series)
        for k in range(each)
    ]
    mem.ingest(batch(samples), 0)
    return mem


@pytest.fixture
def columns(tmp_path: Path) -> Iterator[Any]:
    meta, cols = open_sqlite_stores(tmp_path / "filopy.db")
    yield cols
    cols.close()
    meta.close()


@pytest.fixture
def source(columns: Any) -> ShardSource:
    return ShardSource(DS, {s: memstore(s) for s in range(DS.num_shards)}, columns)


def raw(limits: QueryLimits | None) -> NodeQuery:
    return NodeQuery("raw", matchers=(NAME,), start_ms=T - 60_000, end_ms=T + 10**6, limits=limits)


# ----------------------------------------------------------------------------------- the node


def test_a_node_under_the_limit_answers_as_without_limits(columns: Any) -> None:
    def answer(limits: QueryLimits | None) -> NodeAnswer:
        src = ShardSource(DS, {s: memstore(s) for s in range(DS.num_shards)}, columns)
        return run_node_query(raw(limits), src)

    free, limited = answer(None), answer(QueryLimits("a", 4 * PER_SHARD, 4 * SERIES_PER_SHARD))
    assert (limited.samples, limited.series) == (4 * PER_SHARD, 4 * SERIES_PER_SHARD)
    assert (free.samples, free.series, free.shards) == (
        limited.samples,
        limited.series,
        limited.shards,
    )
    for a, b in zip(free.result, limited.result, strict=True):
        assert a.labels == b.labels
        assert np.array_equal(a.ts, b.ts) and np.array_equal(a.vals, b.vals)


@pytest.mark.parametrize(
    ("limits", "limit", "shards_read"),
    [
        (QueryLimits("a", max_samples=PER_SHARD + 1), "samples", {0, 1}),
        (QueryLimits("a", max_series=SERIES_PER_SHARD), "series", {0, 1}),
        (
            QueryLimits("a", max_samples=3 * PER_SHARD, spent_samples=2 * PER_SHARD),
            "samples",
            {0, 1},
        ),
        (QueryLimits("a", max_samples=PER_SHARD - 1), "samples", {0}),
    ],
)
def test_a_node_stops_reading_at_the_shard_that_takes_it_over(
    source: ShardSource, limits: QueryLimits, limit: str, shards_read: set[int]
) -> None:
    with pytest.raises(QueryLimitExceeded) as refused:
        run_node_query(raw(limits), source)
    err = refused.value
    assert (err.tenant, err.limit) == ("a", limit)
    maximum = limits.max_samples if limit == "samples" else limits.max_series
    assert f"query.tenant_max_{limit} = {maximum}" in str(err) and "'a'" in str(err)
    assert source.stats.shards == shards_read  # the shards after it were never read


def test_a_large_shard_is_read_in_slices_and_stops_within_it(
    columns: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = executor.read_merged_batch

    def counted(mem: Any, cols: Any, ref: Any, shard: int, sids: Sequence[int], *a: Any) -> Any:
        reads.append(len(sids))
        return real(mem, cols, ref, shard, sids, *a)

    monkeypatch.setattr(executor, "read_merged_batch", counted)
    many = executor.LIMITED_SLICE_SERIES * 4
    source = ShardSource(DS, {0: memstore(0, series=many, each=1)}, columns)
    with pytest.raises(QueryLimitExceeded):
        run_node_query(raw(QueryLimits("a", max_samples=executor.LIMITED_SLICE_SERIES + 1)), source)
    assert reads == [executor.LIMITED_SLICE_SERIES] * 2  # not the 4 slices of the shard
    reads.clear()
    free = ShardSource(DS, {0: memstore(0, series=many, each=1)}, columns)
    assert run_node_query(raw(None), free).samples == many
    assert reads == [many]  # without limits: one read, as before


# --------------------------------------------------------------------------------- the caller


class Done:
    def __init__(self, answer: NodeAnswer | None, error: Exception | None = None) -> None:
        self.answer, self.error = answer, error

    def result(self, timeout_s: float) -> NodeAnswer:
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


class Nodes:
    """Two nodes evaluating their parts over real memstores, as `run_node_query` does on a
    node; records the limits each part carried."""

    RUNS = {"n1": [0, 1], "n2": [2, 3]}  # test_promql_api's map

    def __init__(self, columns: Any) -> None:
        self.mems = {s: memstore(s) for s in range(DS.num_shards)}
        self.columns = columns
        self.sent: list[QueryLimits | None] = []

    def submit(self, node: str, ref: DatasetRef, shards: Sequence[int], request: NodeQuery) -> Done:
        self.sent.append(request.limits)
        src = ShardSource(DS, {s: self.mems[s] for s in shards}, self.columns)
        try:
            return Done(run_node_query(request, src))
        except QueryLimitExceeded as e:
            return Done(None, e)


def service(nodes: Nodes, max_samples: int = 0, max_series: int = 0) -> QueryService:
    maps = FakeMaps(active_map().snapshot())
    return QueryService(maps, nodes, max_samples=max_samples, max_series=max_series)  # type: ignore[arg-type]


AT = T + 200_000
QUERIES = ['sum(m{_ws_="a"})', 'm{_ws_="a"} * 2', 'rate(m{_ws_="a"}[5m])', "count(m) + count(m)"]


@pytest.mark.parametrize("query", QUERIES)
def test_a_query_under_the_limit_answers_exactly_as_without_limits(
    columns: Any, query: str
) -> None:
    free = service(Nodes(columns)).instant(DS.name, query, AT)
    nodes = Nodes(columns)
    limited = service(nodes, max_samples=10**6, max_series=10**4).instant(DS.name, query, AT)
    assert isinstance(free.value, StepMatrix) and isinstance(limited.value, StepMatrix)
    assert free.value.labels == limited.value.labels
    assert np.array_equal(free.value.values, limited.value.values)
    assert (free.samples_scanned, free.tenant) == (limited.samples_scanned, None)
    assert limited.tenant == ("a" if "_ws_" in query else NO_TENANT)
    assert nodes.sent and all(s is not None and s.max_samples == 10**6 for s in nodes.sent)


def test_the_caller_refuses_when_the_nodes_together_are_over(columns: Any) -> None:
    """Each node reads 2 shards' half (tenant a's series), under the limit alone; together over."""
    nodes = Nodes(columns)
    per_node = 2 * PER_SHARD // 2
    svc = service(nodes, max_samples=per_node + 1)
    with pytest.raises(QueryLimitExceeded) as refused:
        svc.instant(DS.name, 'sum(m{_ws_="a"})', AT)
    assert refused.value.tenant == "a" and refused.value.limit == "samples"
    assert "at most 201 samples" in str(refused.value)


def test_a_later_node_call_carries_what_the_query_spent(columns: Any) -> None:
    """The subquery's parts go to the nodes after the rest of the query's: told what the
    first round read."""
    nodes = Nodes(columns)
    svc = service(nodes, max_samples=10**6)
    query = "quantile_over_time(0.5, (m > 0)[2m:1m]) + count(topk(1, m))"
    svc.instant(DS.name, query, AT, tenant="team-a")
    spent = [s.spent_samples for s in nodes.sent if s is not None]
    assert spent[0] == 0 and spent == sorted(spent) and spent[-1] > 0
    assert {s.tenant for s in nodes.sent if s is not None} == {"team-a"}


def test_limits_off_send_nothing(columns: Any) -> None:
    nodes = Nodes(columns)
    res = service(nodes).instant(DS.name, 'sum(m{_ws_="a"})', AT)
    assert res.tenant is None and nodes.sent and all(s is None for s in nodes.sent)


# --------------------------------------------------------------------------------- the tenant


@pytest.mark.parametrize(
    ("query", "token", "tenant"),
    [
        ('sum(m{_ws_="a"})', None, "a"),
        ('m{_ws_="a"} / on() group_left n{_ws_="a", _ns_="x"}', None, "a"),
        ('m{_ws_="a"} / n{_ws_="b"}', None, NO_TENANT),
        ('m{_ws_=~"a"}', None, NO_TENANT),
        ('m{_ws_="a"} + n', None, NO_TENANT),
        ("1 + 1", None, NO_TENANT),
        ('m{_ws_="a"}', "team-b", "team-b"),
        ("m", "team-b", "team-b"),
    ],
)
def test_the_tenant_of_a_query(query: str, token: str | None, tenant: str) -> None:
    assert tenant_of(parse(query), token) == tenant


def test_a_selector_naming_the_tenant_twice_with_two_values_pins_none() -> None:
    eq = MatchOp.EQ
    both = (LabelMatcher("_ws_", eq, "a"), LabelMatcher("_ws_", eq, "b"))
    assert pinned_tenant([both]) is None
    assert pinned_tenant([(LabelMatcher("_ws_", eq, "a"),) * 2]) == "a"
    assert pinned_tenant([]) is None


def test_checks_count_what_was_spent() -> None:
    limits = QueryLimits("t", max_samples=10, max_series=3)
    limits.check(10, 3)
    with pytest.raises(QueryLimitExceeded):
        limits.check(11, 0)
    with pytest.raises(QueryLimitExceeded):
        limits.check(0, 4)
    later = limits.after(8, 2)
    later.check(2, 1)
    with pytest.raises(QueryLimitExceeded):
        later.check(3, 0)
    QueryLimits("t").check(10**12, 10**9)  # 0: no limit
    assert not QueryLimits("t").enabled and limits.enabled

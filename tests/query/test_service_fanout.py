"""The query service's fan-out with a fake map source and fake nodes (no Ray), the way httpx
tests clients with MockTransport: one call per node per query, partial results, unavailable
shards, a stale map, a node that fails."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from core.dataset import Dataset, DatasetRef
from core.mapper import ShardMapper
from core.shard_status import (
    IngestionStarted,
    RecoveryInProgress,
    ShardAssignmentStarted,
    ShardDown,
    ShardMapState,
)
from query.evaluator import LocalBackend, evaluate
from query.executor import NodeAnswer, NodeQuery, ScanStats, ShardsNotHere, run_node_query
from query.promql import QueryError
from query.service import NodeUnavailable, QueryService, ShardsUnavailable
from query.values import MemorySource, RangeVector, Scalar, SeriesData, StepMatrix
from store.api import LabelMatcher

DS = Dataset(name="fake", num_shards=4)
T = 1_700_000_000_000
NODES = {"n1": [0, 1], "n2": [2, 3]}


def _series(shard: int) -> list[SeriesData]:
    ts = T + 15_000 * np.arange(40, dtype=np.int64)
    return [
        SeriesData(
            {"__name__": metric, "instance": f"i{shard}-{k}"},
            ts,
            np.cumsum(np.full(40, float(shard + k + (metric == "b")))),
        )
        for metric in ("a", "b")
        for k in range(2)
    ]


SERIES = {s: _series(s) for s in range(DS.num_shards)}


class FakeSource:
    """A node's shards as a `SeriesSource` with the `restricted` and `stats` of ShardSource."""

    def __init__(self, shards: Sequence[int], stats: ScanStats | None = None) -> None:
        self.shards = list(shards)
        self.stats = stats or ScanStats()

    def restricted(self, shards: Sequence[int]) -> FakeSource:
        return FakeSource([s for s in self.shards if s in shards], self.stats)

    def limit_to_retention(self) -> None:
        """Kept forever: these series have no store."""

    def select(self, matchers: Sequence[LabelMatcher], start: int, end: int) -> list[SeriesData]:
        self.stats.shards.update(self.shards)
        return MemorySource(x for s in self.shards for x in SERIES[s]).select(matchers, start, end)

    def series(self, matchers: Sequence[LabelMatcher], start: int, end: int) -> list[dict]:
        return [x.labels for x in self.select(matchers, start, end)]


class FakeMaps:
    def __init__(self, state: ShardMapState) -> None:
        self.state = state

    def dataset(self, name: str) -> Dataset:
        assert name == DS.name
        return DS

    def shard_map(self, name: str) -> ShardMapState:
        return self.state

    def latest(self, name: str) -> ShardMapState:
        return self.state

    def close(self) -> None:
        pass


class Done:
    def __init__(self, answer: NodeAnswer | None = None, error: Exception | None = None) -> None:
        self.answer, self.error = answer, error

    def result(self, timeout_s: float) -> NodeAnswer:
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


class FakeNodes:
    """Nodes answering from their shards' series; `runs` says which shards each really runs."""

    def __init__(self, runs: dict[str, list[int]], down: Sequence[str] = ()) -> None:
        self.runs, self.down = runs, set(down)
        self.calls: list[tuple[str, tuple[int, ...], str]] = []

    def submit(self, node: str, ref: DatasetRef, shards: Sequence[int], request: NodeQuery) -> Done:
        self.calls.append((node, tuple(shards), request.kind))
        if node in self.down:
            return Done(error=NodeUnavailable(f"node {node} failed: RayActorError"))
        missing = [s for s in shards if s not in self.runs.get(node, [])]
        if missing:
            return Done(error=ShardsNotHere(ref.name, node, missing))
        return Done(run_node_query(request, FakeSource(shards)))  # type: ignore[arg-type]


def active_map() -> ShardMapper:
    m = ShardMapper(DS.num_shards)
    for node, shards in NODES.items():
        for s in shards:
            m.update_from_event(ShardAssignmentStarted(DS.ref, s, node))
            m.update_from_event(IngestionStarted(DS.ref, s, node))
    return m


def service(m: ShardMapper, nodes: FakeNodes) -> QueryService:
    return QueryService(FakeMaps(m.snapshot()), nodes)


def reference(query: str) -> StepMatrix:
    every = MemorySource(x for s in SERIES.values() for x in s)
    value = evaluate(query, LocalBackend(every), [T + 500_000])
    assert isinstance(value, StepMatrix)
    return value


def same(a: StepMatrix, b: StepMatrix) -> bool:
    rows = {tuple(sorted(lb.items())): v for lb, v in zip(a.labels, a.values, strict=True)}
    other = {tuple(sorted(lb.items())): v for lb, v in zip(b.labels, b.values, strict=True)}
    return rows.keys() == other.keys() and all(np.allclose(rows[k], other[k]) for k in rows)


@pytest.mark.parametrize(
    "query",
    [
        "rate(a[5m]) / on(instance) rate(b[5m])",
        "sum(rate(a[5m])) / sum(rate(b[5m]))",
        "a + on(instance) b * 2 - on(instance) a",
        "topk(1, a) or max(b)",
    ],
)
def test_every_node_part_of_a_query_goes_to_each_node_in_one_call(query: str) -> None:
    nodes = FakeNodes(NODES)
    got = service(active_map(), nodes).instant(DS.name, query, T + 500_000)
    assert isinstance(got.value, StepMatrix)
    assert same(got.value, reference(query)), query
    assert sorted(node for node, *_ in nodes.calls) == ["n1", "n2"], nodes.calls
    assert got.nodes == NODES and got.shards == (0, 1, 2, 3)


def test_a_single_part_is_sent_as_itself() -> None:
    nodes = FakeNodes(NODES)
    service(active_map(), nodes).instant(DS.name, "sum(a)", T + 500_000)
    assert sorted(nodes.calls) == [("n1", (0, 1), "partial"), ("n2", (2, 3), "partial")]


def test_an_unavailable_shard_fails_the_query_or_is_left_out_with_a_warning() -> None:
    m = active_map()
    m.update_from_event(ShardDown(DS.ref, 3, "n2"))
    with pytest.raises(ShardsUnavailable, match=r"3 \(Down\)"):
        service(m, FakeNodes(NODES)).instant(DS.name, "sum(a) / sum(b)", T + 500_000)
    part = service(m, FakeNodes(NODES)).instant(
        DS.name, "sum(a) / sum(b)", T + 500_000, partial=True
    )
    assert part.shards == (0, 1, 2)
    assert any("shards 3 (Down)" in w for w in part.warnings), part.warnings


def test_a_recovering_shard_is_served_with_a_warning() -> None:
    m = active_map()
    m.update_from_event(RecoveryInProgress(DS.ref, 1, "n1", 40))
    got = service(m, FakeNodes(NODES)).instant(DS.name, "count(a)", T + 500_000)
    assert isinstance(got.value, StepMatrix) and got.value.values[0][0] == 8
    assert any("shard 1" in w and "recovering" in w for w in got.warnings), got.warnings


def test_a_stale_map_asks_the_node_again_for_the_shards_it_runs() -> None:
    nodes = FakeNodes({"n1": [0], "n2": [2, 3]})  # shard 1 moved away from n1 meanwhile
    svc = service(active_map(), nodes)
    with pytest.raises(ShardsUnavailable, match=r"1 \(moved from n1\)"):
        svc.instant(DS.name, "sum(a) / sum(b)", T + 500_000)
    assert ("n1", (0,), "batch") in nodes.calls  # re-asked for what it still runs


def test_a_shard_handed_over_meanwhile_is_asked_of_its_new_owner() -> None:
    """The query started on a map where n1 held shard 1; n1 let it go (a handoff completed) and
    the map source now names n2: the query asks n2 once and succeeds, with no 503."""
    m = active_map()
    maps = FakeMaps(m.snapshot())
    nodes = FakeNodes({"n1": [0], "n2": [1, 2, 3]})
    m.update_from_event(ShardAssignmentStarted(DS.ref, 1, "n2", "rebalance"))
    m.update_from_event(IngestionStarted(DS.ref, 1, "n2"))
    stale = maps.state
    maps.state = m.snapshot()

    class StaleFirst(FakeMaps):
        """The first read (the query's plan) sees the stale map; later ones the new one."""

        def __init__(self) -> None:
            super().__init__(stale)
            self.reads = 0

        def shard_map(self, name: str) -> ShardMapState:
            self.reads += 1
            return stale if self.reads == 1 else maps.state

    svc = QueryService(StaleFirst(), nodes)
    want = QueryService(FakeMaps(m.snapshot()), FakeNodes({"n1": [0], "n2": [1, 2, 3]}))
    got = svc.instant(DS.name, "sum(a) / sum(b)", T + 500_000)
    expected = want.instant(DS.name, "sum(a) / sum(b)", T + 500_000)
    assert got.shards == (0, 1, 2, 3)
    assert np.array_equal(got.value.values, expected.value.values)  # type: ignore[union-attr]
    assert ("n2", (1,), "batch") in nodes.calls


def test_a_failed_node_s_shards_are_unavailable() -> None:
    svc = service(active_map(), FakeNodes(NODES, down=["n2"]))
    got = svc.instant(DS.name, "sum(a) / sum(b)", T + 500_000, partial=True)
    assert got.shards == (0, 1)
    assert any("2 (node n2 failed: RayActorError)" in w for w in got.warnings), got.warnings


@pytest.mark.parametrize("query", ["1 + 2", "scalar(sum(a))", "time()"])
def test_a_range_query_of_a_scalar_answers_one_series_without_labels(query: str) -> None:
    """As Prometheus: the answer of a range query is always a matrix."""
    svc = service(active_map(), FakeNodes(NODES))
    start = T + 400_000
    got = svc.range(DS.name, query, start, start + 60_000, 15_000).value
    want = svc.instant(DS.name, query, start + 30_000).value
    assert isinstance(got, StepMatrix) and isinstance(want, Scalar)
    assert got.labels == [{}] and got.times.tolist() == list(range(start, start + 60_001, 15_000))
    assert got.values[0, 2] == want.values[-1]


@pytest.mark.parametrize(("query", "shown"), [('"text"', "string")])
def test_a_range_query_of_a_string_is_refused_naming_its_type(query: str, shown: str) -> None:
    svc = service(active_map(), FakeNodes(NODES))
    with pytest.raises(QueryError) as err:
        svc.range(DS.name, query, T, T + 60_000, 15_000)
    assert err.value.kind == "bad_data" and f'"{shown}" for range query' in err.value.message


def test_an_instant_query_of_a_range_vector_answers_each_series_raw_window() -> None:
    """`a[2m]`: every node's raw samples in the left-open window, labels kept, sorted by labels;
    with offset and @ the window moves; a subquery answers its evaluated points."""
    nodes = FakeNodes(NODES)
    svc = service(active_map(), nodes)
    t = T + 300_000  # a sample falls exactly on t - 2m: left out (left-open), t: kept
    got = svc.instant(DS.name, "a[2m]", t).value
    assert isinstance(got, RangeVector)
    every = sorted(
        (s for ss in SERIES.values() for s in ss if s.labels["__name__"] == "a"),
        key=lambda s: sorted(s.labels.items()),
    )
    assert got.labels == [s.labels for s in every]
    for s, ts, vals in zip(every, got.ts, got.vals, strict=True):
        inside = (s.ts > t - 120_000) & (s.ts <= t)
        assert ts.tolist() == s.ts[inside].tolist() and vals.tolist() == s.vals[inside].tolist()
    assert sorted(node for node, *_ in nodes.calls) == ["n1", "n2"]
    moved = svc.instant(DS.name, f"a[2m] offset 1m @ {(t + 60_000) / 1000}", T).value
    assert [x.tolist() for x in moved.ts] == [x.tolist() for x in got.ts]
    sub = svc.instant(DS.name, "sum(a)[1m:30s]", t).value
    assert isinstance(sub, RangeVector) and sub.labels == [{}]
    # Evaluation times are multiples of the step (from the epoch) inside the left-open window.
    assert sub.ts[0].tolist() == [x for x in range(t - 59_999, t + 1) if x % 30_000 == 0]
    assert len(sub.ts[0]) == 2

"""Downsampling end to end: the engine tests' hour of data (counters with resets, gauges with
NaN, gaps) through real Kafka into a two-node cluster that downsamples as it flushes; every
engine query at aligned steps, where the range functions read stored periods, agrees with the
brute-force reference over the raw samples, and reads far fewer samples than at unaligned
steps (which read raw data)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from core.dataset import Dataset, SourceSettings, StoreOptions
from ingest.gateway import Gateway
from query.evaluator import range_times
from query.promql import parse, value_type
from query.service import QueryService
from query.values import StepMatrix
from tests.cluster import cluster_settings
from tests.query.test_cluster_query import REF, SERIES, TOTAL, rows
from tests.query.test_engine import MIN, QUERIES, SPAN, START, assert_same
from tests.rest.conftest import Rest, start_rest

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

NAME = f"ds{uuid.uuid4().hex[:8]}"
RES = (MIN, 5 * MIN)
FIRST = (START // MIN + 1) * MIN  # the first whole minute of the data
ALIGNED = range_times(FIRST + 3 * MIN, START + SPAN + 7 * MIN, MIN)
UNALIGNED = ALIGNED + 1_000


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    settings = cluster_settings(
        tmp_path_factory.mktemp("down"),
        "kafka",
        flush_interval_s=1.0,
        kafka_bootstrap=kafka_bootstrap,
    )
    settings = settings.model_copy(
        update={
            "downsample": settings.downsample.model_copy(
                update={
                    "resolutions_ms": list(RES),
                    "retention_days": [0.0, 0.0],
                    "delay_s": 0.0,
                    "interval_s": 0.5,
                }
            ),
        }
    )
    for r in start_rest(tmp_path_factory.mktemp("down"), nodes=2, settings=settings):
        _load(r, kafka_bootstrap)
        yield r


def _load(r: Rest, kafka_bootstrap: str) -> None:
    ds = Dataset(
        name=NAME,
        num_shards=4,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
        store=StoreOptions(memory_retention_ms=10 * MIN, flush_interval_s=1.0),
    )
    r.client.setup_dataset(ds)
    r.wait_for("all shards active", lambda: r.all_active(NAME), 60)
    # A backfill, one series after another: half of them, downsampled, then the rest, whose
    # samples are all older than the marks the first half moved.
    half = len(SERIES) // 2
    for part, total in ((SERIES[:half], _samples(SERIES[:half])), (SERIES[half:], TOTAL)):
        with Gateway(ds) as gw:
            for labels, ts, vals in part:
                samples = zip(ts.tolist(), vals.tolist(), strict=True)
                gw.send((labels, int(t), float(v)) for t, v in samples)
        r.wait_for("ingested, flushed and downsampled", lambda n=total: _downsampled(r, n), 180)


def _samples(series: list) -> int:
    return sum(len(ts) for _, ts, _ in series)


def _downsampled(r: Rest, total: int) -> bool:
    stats = [st for per in r.client.ingest_stats(NAME).values() for st in per.values()]
    if sum(st["memstore"].ingested for st in stats) != total:
        return False
    if any(st["unflushed_samples"] for st in stats):
        return False
    # Every shard with samples has stored the minute periods of its first slices, and redone
    # whatever its late series fell into.
    done = [st["downsample"] for st in stats if st["memstore"].ingested]
    if not done or any(d["late_series"] for d in done):
        return False
    return min(d["marks"].get(MIN, 0) for d in done) > START + 40 * MIN


@pytest.fixture(scope="module")
def service(rest: Rest) -> Iterator[QueryService]:
    from coordinator.cluster_queries import cluster_query_service  # it imports Ray

    svc = cluster_query_service(rest.client)
    yield svc
    svc.close()


@pytest.mark.parametrize("query", QUERIES)
def test_aligned_range_queries_match_the_reference(service: QueryService, query: str) -> None:
    expected = REF.evaluate(parse(query), list(ALIGNED))
    got = service.range(NAME, query, int(ALIGNED[0]), int(ALIGNED[-1]), MIN, lookback_ms=5 * MIN)
    assert not got.warnings
    assert isinstance(got.value, StepMatrix)
    if value_type(parse(query)) == "scalar":
        return  # no range function: nothing downsampled (the engine tests cover scalars)
    assert_same(expected, rows(got.value), query)


@pytest.mark.parametrize(
    "query",
    [
        "rate(http_requests_total[5m])",
        "max_over_time(temperature[10m])",
        "changes(up[15m])",
        "sum by (job) (increase(http_requests_total[30m]))",
    ],
)
def test_aligned_windows_read_periods_not_samples(service: QueryService, query: str) -> None:
    """At minute steps the windows are whole minute periods: the stored ones are read, and
    only the newest minutes (past the marks) come from raw samples; a second off the minute,
    every sample of every window is read."""
    start, end = int(ALIGNED[0]), int(ALIGNED[-1])
    aligned = service.range(NAME, query, start, end, MIN, lookback_ms=5 * MIN)
    unaligned = service.range(NAME, query, start + 1_000, end + 1_000, MIN, lookback_ms=5 * MIN)
    assert unaligned.samples_scanned > 0
    assert aligned.samples_scanned < unaligned.samples_scanned / 2, (
        aligned.samples_scanned,
        unaligned.samples_scanned,
    )
    expected = REF.evaluate(parse(query), list(ALIGNED))
    assert_same(expected, rows(aligned.value), query)


def test_the_backfill_was_repaired_where_it_arrived_late(rest: Rest) -> None:
    """The series were sent one after another, so shards summarised slices before all of
    their series arrived: those slices were redone (the answers above are exact only so)."""
    stats = [st for per in rest.client.ingest_stats(NAME).values() for st in per.values()]
    assert sum(st["downsample"]["repaired"] for st in stats) > 0
    assert all(st["downsample"]["failures"] == 0 for st in stats)

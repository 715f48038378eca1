"""Retention end to end: three hours of samples through real Kafka into a two-node cluster
(flushed to SQLite, and still in memory), queried over the Prometheus HTTP API; a
retention of one hour set on the live dataset over REST makes exactly the samples at or after
`now - 1h` answer, from the store and from memory alike, and lifting it brings back what the
sweep did not drop."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from core.dataset import Dataset, SourceSettings, StoreOptions
from ingest.gateway import Gateway
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, start_rest

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

MIN = 60_000
HOUR = 60 * MIN


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    settings = cluster_settings(tmp_path_factory.mktemp("ret"), "kafka", flush_interval_s=1.0)
    # Raw retention alone: with downsampling on, windows past it answer from the periods
    # instead (tests/stores/test_downsampling.py, test_past_raw_retention_the_periods_answer).
    settings = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"bootstrap_servers": kafka_bootstrap}),
            "downsample": settings.downsample.model_copy(
                update={"resolutions_ms": [], "retention_days": []}
            ),
        }
    )
    yield from start_rest(tmp_path_factory.mktemp("ret"), nodes=2, settings=settings)


def test_retention_on_a_live_dataset_cuts_queries_exactly(rest: Rest, kafka_bootstrap: str):
    name = f"ret{uuid.uuid4().hex[:8]}"
    ds = Dataset(
        name=name,
        num_shards=2,
        spread={"default": 0},
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
        # Every sample stays in memory (flushed too): memory answers them all, so only the
        # node's own clamp keeps the ones past retention out.
        store=StoreOptions(memory_retention_ms=4 * HOUR, flush_interval_s=1.0),
    )
    rest.client.setup_dataset(ds)
    rest.wait_for("all shards active", lambda: rest.all_active(name), 60)
    # One sample a minute, half a minute off the minute: a boundary moving by a few seconds
    # while the test asks crosses no sample.
    now = int(time.time() * 1000)
    base = now - now % MIN - MIN // 2
    times = [base - i * MIN for i in range(180, -1, -1)]
    labels = {"_metric_": "cpu", "_ws_": "w", "_ns_": "n", "host": "a"}
    with Gateway(ds) as gw:
        gw.send((labels, t, float(i)) for i, t in enumerate(times))

    def ingested() -> bool:
        stats = rest.client.ingest_stats(name)
        shards = [st for per_node in stats.values() for st in per_node.values()]
        unflushed = sum(st["unflushed_samples"] for st in shards)
        return sum(st["memstore"].ingested for st in shards) == len(times) and unflushed == 0

    rest.wait_for("every sample ingested and flushed", ingested, 120)

    def count() -> tuple[int, int]:
        """Samples the cluster answers over four hours, and how many are within an hour."""
        at = time.time()
        resp = rest.http.get(
            f"/promql/{name}/api/v1/query",
            params={"query": "count_over_time(cpu[4h])", "time": f"{at:.3f}"},
        )
        assert resp.status_code == 200, resp.text
        result = resp.json()["data"]["result"]
        answered = int(result[0]["value"][1]) if result else 0
        return answered, sum(1 for t in times if t >= at * 1000 - HOUR)

    assert count()[0] == len(times)
    put = rest.http.put(f"/api/v1/datasets/{name}/retention", json={"retention": "1h"})
    assert put.status_code == 200, put.text
    answered, within = count()
    assert 55 <= within <= 61  # an hour of one sample a minute
    assert answered == within
    assert rest.http.put(f"/api/v1/datasets/{name}/retention", json={"retention": "0"}).is_success
    # Longer again: what the sweep left answers again (it dropped at most the previous day's
    # bucket, if the three hours crossed midnight UTC and it ended over an hour ago).
    assert count()[0] >= within
    if (times[0] - times[0] % (24 * HOUR)) == (times[-1] - times[-1] % (24 * HOUR)):
        assert count()[0] == len(times)
    rest.client.remove_dataset(name)

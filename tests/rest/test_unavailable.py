"""Without the cluster singleton: every cluster request is a 503, liveness and metrics still answer.

Its own module and cluster: the singleton is killed for good.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rest.conftest import Rest, start_rest
from tests.rest.test_datasets import error_of
from tests.rest.test_operations import metrics, value

pytestmark = pytest.mark.ray


@pytest.fixture
def singleton_gone(tmp_path: Path) -> Iterator[Rest]:
    """A cluster whose singleton is killed for good (no restart)."""
    import ray

    for rest in start_rest(tmp_path, nodes=2):
        assert rest.http.post("/api/v1/datasets", json={"name": "d", "num_shards": 2}).is_success
        ray.kill(rest.cluster.actor, no_restart=True)
        yield rest


def test_without_the_singleton_requests_are_503_and_metrics_say_down(singleton_gone) -> None:
    rest = singleton_gone
    for method, path, body in [
        ("GET", "/api/v1/datasets", None),
        ("GET", "/api/v1/cluster", None),
        ("GET", "/api/v1/cluster/d/status", None),
        ("POST", "/api/v1/cluster/d/stopshards", {"shardList": [0]}),
        ("POST", "/api/v1/datasets", {"name": "e", "num_shards": 2}),
        ("GET", "/api/v1/cluster/d/events", None),
        ("GET", "/__health", None),
    ]:
        message = error_of(rest.http.request(method, path, json=body), 503, "unavailable")
        assert "singleton is unavailable" in message, (path, message)
    assert rest.http.get("/__liveness").status_code == 200
    m = metrics(rest)
    assert value(m["filopy_cluster_up"], "filopy_cluster_up") == 0
    # Nothing the singleton reports is shown stale; this process' own HTTP ingestion counters
    # (docs/ingestion-http.md) and query latencies stay.
    own = ("filopy_http_ingest_", "filopy_query_duration_seconds")
    assert {k for k in m if not k.startswith(own)} == {"filopy_cluster_up"}

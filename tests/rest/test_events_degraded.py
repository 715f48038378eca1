"""The SSE shard event of a degraded shard carries its message, as an Error's does."""

from __future__ import annotations

import pytest

from core.dataset import DatasetRef
from core.shard_status import IngestionDegraded, IngestionStarted
from tests.rest.test_cluster import EventStream

pytestmark = pytest.mark.ray


def test_a_degraded_shard_event_carries_its_message(rest, name: str) -> None:
    import ray

    created = rest.http.post("/api/v1/datasets", json={"name": name, "num_shards": 2})
    assert created.status_code == 201, created.text
    rest.wait_for("all shards active", lambda: rest.all_active(name))
    stream = EventStream(f"{rest.url}/api/v1/cluster/{name}/events")
    try:
        assert stream.next()[0] == "snapshot"
        ref = DatasetRef(name=name)
        owner = rest.client.shard_map(name).owner(1)
        reason = "store unreachable: database is locked; 3 flushes failed, retrying"
        # What the owner's ingester reports when its flushes fail (tests/runtime covers that).
        singleton = rest.cluster.actor
        ray.get(singleton.shard_event.remote(owner, IngestionDegraded(ref, 1, owner, reason)))
        kind, event = stream.next()
        assert kind == "shard_event"
        assert event == {
            "dataset": name,
            "shard": 1,
            "event": "IngestionDegraded",
            "address": owner,
            "node": rest.client.node_names()[owner],
            "message": reason,
            "status": f"Degraded({reason})",
        }
        ray.get(singleton.shard_event.remote(owner, IngestionStarted(ref, 1, owner)))
        kind, event = stream.next()
        assert (event["event"], event["status"]) == ("IngestionStarted", "Active")
        assert "message" not in event
    finally:
        stream.close()
        rest.http.delete(f"/api/v1/datasets/{name}")

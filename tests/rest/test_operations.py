"""/__health, /__liveness and /metrics against a real two-node cluster."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.rest.conftest import Rest
from tests.rest.test_cluster import all_active, post, status
from tests.rest.test_datasets import error_of

pytestmark = pytest.mark.ray


def metrics(rest: Rest) -> dict[str, list[Sample]]:
    resp = rest.http.get("/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(resp.text)}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def test_liveness(rest) -> None:
    assert rest.http.get("/__liveness").json() == {"status": "success", "data": "ok"}


def test_health_follows_the_shards(rest, name: str) -> None:
    assert rest.http.get("/__health").json() == {
        "status": "success",
        "data": {"healthy": True, "datasets": {}},
    }
    resp = rest.http.post("/api/v1/datasets", json={"name": name, "num_shards": 8})
    assert resp.status_code == 201
    rest.wait_for("all shards active", lambda: all_active(rest, name))
    healthy = rest.http.get("/__health")
    assert healthy.status_code == 200, healthy.text
    assert healthy.json()["data"] == {
        "healthy": True,
        "datasets": {name: {"shards": 8, "active": 8, "recovering": 0}},
    }

    owner = status(rest, name)[2]["address"]
    assert post(rest, name, "stopshards", {"shardList": [2, 3, 5]}).status_code == 200
    message = error_of(rest.http.get("/__health"), 503, "unavailable")
    # Stopped by an operator: unowned and not ingesting until started again, so unhealthy.
    assert message == f"unhealthy shards: dataset {name!r}: Stopped: 2-3, 5"

    assert post(rest, name, "startshards", {"address": owner, "shardList": [2]}).status_code == 200
    post(rest, name, "startshards", {"address": owner, "shardList": [3, 5]})
    rest.wait_for("healthy again", lambda: rest.http.get("/__health").status_code == 200)
    rest.http.delete(f"/api/v1/datasets/{name}")


FAMILIES = {
    "filopy_cluster_up",
    "filopy_cluster_members",
    "filopy_shards",
    "filopy_shard_reassignments",
    "filopy_ingested_samples",
    "filopy_ingested_messages",
    "filopy_bad_records",
    "filopy_dropped_samples",
    "filopy_memstore_samples",
    "filopy_offsets_lost",
}


def test_metrics_parse_and_count_shards(rest, name: str) -> None:
    resp = rest.http.post(
        "/api/v1/datasets", json={"name": name, "num_shards": 4, "min_num_nodes": 2}
    )
    assert resp.status_code == 201
    rest.wait_for("all shards active", lambda: all_active(rest, name))

    m = metrics(rest)
    assert set(m) >= FAMILIES
    assert value(m["filopy_cluster_up"], "filopy_cluster_up") == 1
    assert value(m["filopy_cluster_members"], "filopy_cluster_members") == 2
    shards = m["filopy_shards"]
    assert value(shards, "filopy_shards", dataset=name, status="Active") == 4
    for st in ("Unassigned", "Assigned", "Recovery", "Error", "Stopped", "Down"):
        assert value(shards, "filopy_shards", dataset=name, status=st) == 0
    moves = m["filopy_shard_reassignments"]
    assert value(moves, "filopy_shard_reassignments_total", dataset=name, outcome="done") == 0
    assert value(moves, "filopy_shard_reassignments_total", dataset=name, outcome="skipped") == 0
    # source = "none": no Kafka ingesters, so no per-shard ingestion series (tests/rest/test_kafka).
    assert m["filopy_ingested_samples"] == []

    post(rest, name, "stopshards", {"shardList": [0]})
    stopped = metrics(rest)["filopy_shards"]
    assert value(stopped, "filopy_shards", dataset=name, status="Stopped") == 1
    assert value(stopped, "filopy_shards", dataset=name, status="Active") == 3
    rest.http.delete(f"/api/v1/datasets/{name}")
    gone = metrics(rest)
    assert not [s for s in gone["filopy_shards"] if s.labels["dataset"] == name]


def test_metrics_include_http_ingestion(rest) -> None:
    """The REST server's /metrics carries its ingestion endpoints' counters too."""
    before = metrics(rest).get("filopy_http_ingest_requests", [])
    sent = rest.http.post("/ingest/nosuchdataset/api/v1/write", content=b"x")
    assert sent.status_code == 404, sent.text
    after = metrics(rest)
    labels = {"protocol": "prometheus_remote_write", "code": "404"}
    was = [s.value for s in before if labels.items() <= s.labels.items()]
    assert (
        value(after["filopy_http_ingest_requests"], "filopy_http_ingest_requests_total", **labels)
        == (was[0] if was else 0) + 1
    )
    rejected = after["filopy_http_ingest_request_bytes"]
    assert (
        value(
            rejected,
            "filopy_http_ingest_request_bytes_total",
            protocol="prometheus_remote_write",
            outcome="rejected",
        )
        >= 1
    )


def test_rebalance_plan_and_drain_over_rest(rest, name: str) -> None:
    assert rest.http.post("/api/v1/datasets", json={"name": name, "num_shards": 8}).status_code
    rest.wait_for("all shards active", lambda: all_active(rest, name))
    plan = rest.http.get(f"/api/v1/cluster/{name}/plan", params={"add_nodes": 2})
    assert plan.status_code == 200, plan.text
    data = plan.json()["data"]
    assert sorted(data["shards_after"].values()) == [2, 2, 2, 2]
    before = data["shards_before"]
    assert sum(before.values()) == 8 and data["held_back"] == "balanced"
    assert len(data["moves"]) == sum(max(0, n - 2) for n in before.values())
    # The next round, as planned, is what a rebalance then starts.
    next_round = rest.http.get(f"/api/v1/cluster/{name}/plan", params={"throttled": True})
    now = rest.http.post(f"/api/v1/cluster/{name}/rebalance")
    assert now.status_code == 200, now.text
    assert now.json()["data"]["moves"] == next_round.json()["data"]["moves"]
    assert rest.http.get("/api/v1/cluster/nope/plan").status_code == 404
    bad = rest.http.get(f"/api/v1/cluster/{name}/plan", params={"add_nodes": -1})
    assert bad.status_code == 400, bad.text
    history = rest.http.get(f"/api/v1/cluster/{name}/history", params={"limit": 1000})
    assert history.status_code == 200, history.text
    created = [c for c in history.json()["data"] if c["reason"] == "created"]
    assert sorted(c["shard"] for c in created) == list(range(8))
    assert all(c["source"] is None and c["target"] and c["epoch"] for c in created)
    assert rest.http.get("/api/v1/cluster/nope/history").status_code == 404
    unknown = rest.http.post("/api/v1/nodes/no-such-node/drain")
    assert unknown.status_code == 404 and "is not a member" in unknown.json()["error"]
    rest.http.delete(f"/api/v1/datasets/{name}")

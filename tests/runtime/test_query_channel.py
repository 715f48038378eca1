"""Query parts over the nodes' query channels on a real multi-node Ray cluster: the same answers
as Ray calls, a stale map's ShardsNotHere, bad frames refused with the node serving on, the Ray
fallback, and a node that hangs or dies mid-query answering NodeUnavailable, not a hang
(coordinator/query_channel.py, `SocketNodeCaller` in coordinator/cluster_queries.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import ray

from coordinator.cluster_queries import (
    ClusterMaps,
    RayNodeCaller,
    SocketNodeCaller,
    cluster_query_service,
)
from coordinator.names import node_actor_name
from coordinator.query_channel import QueryEndpoint
from core.dataset import Dataset, DatasetRef, SourceSettings, StoreOptions
from core.shard_status import ShardMapState
from ingest.gateway import Gateway
from query.executor import NodeQuery, ShardsNotHere
from query.promql import parse
from query.service import NodeUnavailable, QueryService
from query.values import StepMatrix
from tests.cluster import end_cluster, ray_pool
from tests.runtime.conftest import FiloPyCluster, cluster_settings, start_cluster

pytestmark = [pytest.mark.ray, pytest.mark.kafka]

MIN = 60_000
NAME = f"qc{uuid.uuid4().hex[:6]}"
NOW = int(time.time() * 1000) // MIN * MIN
QUERIES = [
    "sum by (job) (rate(reqs[5m]))",
    "reqs",
    "max(reqs) - min(reqs)",
    'count(reqs{instance=~"i[0-4]"})',
]


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str
) -> Iterator[FiloPyCluster]:
    """Two nodes, a 4-shard dataset read from Kafka holding 20 counters over 30 minutes."""
    settings = cluster_settings(
        tmp_path_factory.mktemp("channel"), "kafka", kafka_bootstrap=kafka_bootstrap
    )
    ray_cluster, ids = ray_pool(2, settings.cluster.node_resource)
    c = start_cluster(ray_cluster, settings)
    try:
        c.wait_for("2 members", lambda: set(c.client.members()) == set(ids))
        ds = Dataset(
            name=NAME,
            num_shards=4,
            min_num_nodes=2,
            source=SourceSettings(bootstrap_servers=kafka_bootstrap),
            store=StoreOptions(flush_interval_s=1.0),
        )
        c.client.setup_dataset(ds)
        c.wait_for("shards active", lambda: c.client.shard_map(NAME).is_healthy(), 60)
        total = 0
        with Gateway(ds) as gw:
            for i in range(20):
                labels = {"_metric_": "reqs", "_ws_": "demo", "_ns_": f"job{i % 3}"}
                labels["instance"] = f"i{i}"
                ts = np.arange(NOW - 30 * MIN, NOW, 15_000)
                total += len(ts)
                gw.send((labels, int(t), float(k * (i + 1))) for k, t in enumerate(ts))

        def ingested() -> bool:
            stats = c.client.ingest_stats(NAME)
            return (
                sum(st["memstore"].ingested for n in stats.values() for st in n.values()) == total
            )

        c.wait_for("every sample ingested", ingested, 60)
        yield c
    finally:
        end_cluster(c)


def _service(c: FiloPyCluster, nodes: object) -> QueryService:
    return QueryService(ClusterMaps(c.client), nodes, 30.0)  # type: ignore[arg-type]


def _rows(value: StepMatrix) -> dict:
    return {
        tuple(sorted(lb.items())): (v.tolist(), p.tolist())
        for lb, v, p in zip(value.labels, value.values, value.present, strict=True)
    }


def _node_stats(c: FiloPyCluster, method: str) -> dict[str, dict]:
    out = {}
    for node in c.client.members():
        handle = ray.get_actor(node_actor_name(node), namespace=c.settings.ray.namespace)
        out[node] = ray.get(getattr(handle, method).remote(), timeout=30)
    return out


def test_the_channel_answers_as_ray_calls_do_without_falling_back(cluster: FiloPyCluster) -> None:
    namespace = cluster.settings.ray.namespace
    channel = SocketNodeCaller(namespace)
    via_channel, via_ray = _service(cluster, channel), _service(cluster, RayNodeCaller(namespace))
    before = sum(s.get("served", 0) for s in _node_stats(cluster, "query_channel_stats").values())
    try:
        for query in QUERIES:
            for _ in range(2):  # the second time on pooled connections
                a = via_channel.range(NAME, query, NOW - 20 * MIN, NOW - MIN, 30_000)
                b = via_ray.range(NAME, query, NOW - 20 * MIN, NOW - MIN, 30_000)
                assert _rows(a.value) == _rows(b.value), query
                assert a.value.labels, query
                assert (a.nodes, a.series_scanned, a.samples_scanned) == (
                    b.nodes,
                    b.series_scanned,
                    b.samples_scanned,
                )
            instant = via_channel.instant(NAME, query, NOW - MIN)
            assert _rows(instant.value) == _rows(via_ray.instant(NAME, query, NOW - MIN).value)
        series = via_channel.series(NAME, [parse("reqs").matchers], NOW - 40 * MIN, NOW)
        assert len(series.value) == 20  # type: ignore[arg-type]
    finally:
        via_channel.close()
        via_ray.close()
    assert channel.fallbacks == 0
    stats = _node_stats(cluster, "query_channel_stats")
    assert sum(s["served"] for s in stats.values()) - before >= 2 * 2 * len(QUERIES)
    assert all(s["refused"] == 0 for s in stats.values()), stats


def test_a_stale_map_gets_shards_not_here_through_the_channel(cluster: FiloPyCluster) -> None:
    state = cluster.client.shard_map(NAME).snapshot()
    a, b = sorted({o for o in state.owners if o})
    b_shards = [s for s in range(4) if state.owner(s) == b]
    caller = SocketNodeCaller(cluster.settings.ray.namespace)
    request = NodeQuery("series", matchers=(parse("reqs").matchers,))
    with pytest.raises(ShardsNotHere) as raised:
        caller.submit(a, _ref(cluster), b_shards, request).result(10)
    assert type(raised.value) is ShardsNotHere
    assert (raised.value.node, raised.value.shards) == (a, b_shards)
    # The connection goes on: the next part on it is answered.
    a_shards = [s for s in range(4) if state.owner(s) == a]
    assert len(caller.submit(a, _ref(cluster), a_shards, request).result(10).result) > 0
    assert caller.fallbacks == 0

    # Through the service: a map naming the wrong owners is corrected by asking the right ones.
    swapped = dataclasses.replace(
        state,
        owners=tuple({a: b, b: a}[state.owner(s)] for s in range(4)),  # type: ignore[index]
    )

    class StaleFirst(ClusterMaps):
        stale = True

        def shard_map(self, name: str) -> ShardMapState:
            fresh = super().shard_map(name)
            if self.stale:
                self.stale = False
                return swapped
            return fresh

    svc = QueryService(StaleFirst(cluster.client), caller, 30.0)
    try:
        got = svc.instant(NAME, "count(reqs)", NOW - MIN)
        assert got.value.values.tolist() == [[20.0]]  # type: ignore[union-attr]
        assert got.nodes == {a: a_shards, b: b_shards}
    finally:
        svc.close()


def _ref(c: FiloPyCluster) -> DatasetRef:
    return next(d.ref for d in c.client.datasets() if d.name == NAME)


def test_bad_frames_are_refused_and_the_node_serves_on(cluster: FiloPyCluster) -> None:
    node = cluster.client.members()[0]
    handle = ray.get_actor(node_actor_name(node), namespace=cluster.settings.ray.namespace)
    endpoint: QueryEndpoint = ray.get(handle.query_endpoint.remote(), timeout=30)
    refused = ray.get(handle.query_channel_stats.remote())["refused"]
    for frame in (
        b"\x00" * 8 + b"x" * 32 + b"not a pickle",  # a bad MAC
        os.urandom(4096),  # garbage
        (1 << 62).to_bytes(8, "big") + b"\x00" * 32,  # an absurd length
    ):
        with socket.create_connection((endpoint.host, endpoint.port), timeout=10) as sock:
            sock.recv(64)  # the greeting
            sock.sendall(frame)
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""  # closed on us
    # Signed with another key: refused too.
    caller = SocketNodeCaller(cluster.settings.ray.namespace)
    forged = QueryEndpoint(endpoint.host, endpoint.port, os.urandom(32))
    caller._endpoint = lambda node: forged  # type: ignore[method-assign]
    state = cluster.client.shard_map(NAME).snapshot()
    mine = [s for s in range(4) if state.owner(s) == node]
    request = NodeQuery("series", matchers=(parse("reqs").matchers,))
    with pytest.raises(NodeUnavailable):
        caller.submit(node, _ref(cluster), mine, request).result(10)
    stats = ray.get(handle.query_channel_stats.remote())
    assert stats["refused"] - refused == 4
    assert ray.get(handle.ping.remote(), timeout=10).node_id == node  # alive
    good = SocketNodeCaller(cluster.settings.ray.namespace)
    assert good.submit(node, _ref(cluster), mine, request).result(10).result
    assert good.fallbacks == 0


class _OlderNode:
    """A coordinator handle as a node without a query channel looks: only `query`."""

    def __init__(self, handle: object) -> None:
        self.query = handle.query  # type: ignore[attr-defined]


def test_fallback_to_ray_when_a_node_has_no_usable_channel(cluster: FiloPyCluster) -> None:
    namespace = cluster.settings.ray.namespace
    state = cluster.client.shard_map(NAME).snapshot()
    node = cluster.client.members()[0]
    mine = [s for s in range(4) if state.owner(s) == node]
    request = NodeQuery("series", matchers=(parse("reqs").matchers,))
    expected = SocketNodeCaller(namespace).submit(node, _ref(cluster), mine, request)
    expected_labels = expected.result(10).result

    # An endpoint no one listens on: the part goes through Ray, and so do the next ones.
    with socket.create_server(("127.0.0.1", 0)) as s:
        dead_port = s.getsockname()[1]
    caller = SocketNodeCaller(namespace)
    caller._endpoint = lambda n: QueryEndpoint("127.0.0.1", dead_port, b"k" * 32)  # type: ignore[method-assign]
    assert caller.submit(node, _ref(cluster), mine, request).result(10).result == (expected_labels)
    assert caller.fallbacks == 1
    caller._endpoint = lambda n: pytest.fail("the channel is not tried again at once")  # type: ignore[method-assign]
    assert caller.submit(node, _ref(cluster), mine, request).result(10).result
    assert caller.fallbacks == 2

    # A node without a channel (an older version): Ray calls.
    ray_caller = RayNodeCaller(namespace)
    real = ray_caller.handle(node)
    ray_caller._handles[node] = _OlderNode(real)
    older = SocketNodeCaller(namespace, ray_caller=ray_caller)
    assert older.submit(node, _ref(cluster), mine, request).result(10).result == (expected_labels)
    assert older.fallbacks == 1

    # The whole service over Ray only, as the bench compares.
    svc = cluster_query_service(cluster.client, 30.0, transport="ray")
    try:
        assert svc.instant(NAME, "count(reqs)", NOW - MIN).value.values.tolist() == [[20.0]]  # type: ignore[union-attr]
    finally:
        svc.close()

"""Subscriptions on a real multi-node Ray cluster: concurrent first subscribers (Python and SSE)
share one sink actor; subscribers resynchronise from a snapshot after a singleton restart and
after a lost delivery."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import ray

from coordinator.client import FiloPyClient, ShardEventSink, Subscription
from coordinator.inbox import Delivery
from core.shard_status import IngestionStarted, ShardAssignmentStarted, Stopped
from filopy import CurrentShardSnapshot, Dataset, ShardDown

pytestmark = pytest.mark.ray

THREADS = 8
METRICS = Dataset(name="metrics", num_shards=4).ref


def _setup(c, num_shards: int = 4) -> Any:
    node = c.add_node()
    c.wait_for("the node joined", lambda: node.node_id in c.client.members())
    c.client.setup_dataset(Dataset(name="metrics", num_shards=num_shards, min_num_nodes=1))
    return c.wait_for(
        "all shards active",
        lambda: (m := c.client.shard_map("metrics")).is_healthy() and m,
    )


def _at_once(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run `fn(i)` on `n` threads released together; each result, or the exception it raised."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except Exception as e:
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_concurrent_first_subscribes_share_one_sink(filopy_cluster) -> None:
    c = filopy_cluster
    before = _setup(c)
    client = FiloPyClient(c.actor, c.settings)  # a fresh client: no sink actor yet

    subs = _at_once(THREADS, lambda _: client.subscribe("metrics"))
    errors = [s for s in subs if isinstance(s, BaseException)]
    assert not errors, errors
    assert len({s.id for s in subs}) == THREADS
    assert len({s.id.split("/", 1)[0] for s in subs}) == 1  # one sink for the client

    firsts = _at_once(THREADS, lambda i: subs[i].next(timeout_s=30))
    for first in firsts:
        assert isinstance(first, CurrentShardSnapshot), first
        assert first.state.owners == before.snapshot().owners

    client.stop_shards("metrics", [0])
    for sub in subs:
        assert _next_down(sub, 0).node == before.owner(0)
        sub.unsubscribe()


def _next_down(sub: Subscription, shard: int) -> ShardDown:
    seen = []
    while True:
        update = sub.next(timeout_s=30)
        seen.append(update)
        if isinstance(update, ShardDown) and update.shard == shard:
            return update
        assert len(seen) < 20, seen


def test_concurrent_first_sse_streams_all_open(filopy_cluster) -> None:
    from filopy.rest import create_app
    from tests.rest.conftest import ServerThread
    from tests.rest.test_cluster import EventStream

    c = filopy_cluster
    _setup(c)
    client = FiloPyClient(c.actor, c.settings)  # the app's client: no sink actor yet
    with ServerThread(create_app(client, c.settings)) as url:
        streams = _at_once(THREADS, lambda _: EventStream(f"{url}/api/v1/cluster/metrics/events"))
        try:
            assert [getattr(s, "status", s) for s in streams] == [200] * THREADS
            for s in streams:
                event, data = s.next(timeout_s=30)
                assert event == "snapshot", (event, data)
                assert data["dataset"] == "metrics"
        finally:
            for s in streams:
                if isinstance(s, EventStream):
                    s.close()


# ----- resynchronising from a snapshot ---------------------------------------------------------


def _drain(sub: Subscription) -> list[Any]:
    """Whatever the subscription still has in flight (until it stays quiet for a while)."""
    seen = []
    while True:
        try:
            seen.append(sub.next(timeout_s=2))
        except TimeoutError:
            return seen


def test_subscribers_get_a_fresh_snapshot_after_the_singleton_restarts(filopy_cluster) -> None:
    c = filopy_cluster
    before = _setup(c)
    sub = c.client.subscribe("metrics")
    first = sub.next(timeout_s=30)
    assert isinstance(first, CurrentShardSnapshot)
    _drain(sub)
    incarnation = ray.get(c.actor.ready.remote())

    ray.kill(c.actor, no_restart=False)
    c.wait_for(
        "the singleton to come back",
        lambda: ray.get(c.actor.ready.remote(), timeout=30) != incarnation,
    )
    # Nothing changes in the cluster, yet the subscriber hears from the new singleton: a
    # snapshot of the recovered map, newer than anything the old singleton sent.
    fresh = sub.next(timeout_s=30)
    assert isinstance(fresh, CurrentShardSnapshot), fresh
    assert fresh.state.owners == before.snapshot().owners
    assert fresh.state.version > first.state.version
    assert _drain(sub) == []  # one snapshot, not one per resync interval
    sub.unsubscribe()


class LossySink(ShardEventSink):
    """A subscriber's sink whose link loses the next `n` (non-resync) deliveries: the fault of a
    delivery that never arrives, on the real singleton, Ray and inbox."""

    def __init__(self) -> None:
        super().__init__()
        self._lose = 0
        self._lost: list[int] = []
        self.resyncs_sent = 0

    async def lose_next(self, n: int) -> None:
        self._lose = n

    async def deliver(self, delivery: Delivery) -> None:
        self.resyncs_sent += delivery.resync
        if self._lose and not delivery.resync:
            self._lose -= 1
            self._lost.append(delivery.seq)
            return
        await super().deliver(delivery)

    async def lost(self) -> list[int]:
        return list(self._lost)

    async def resyncs(self) -> int:
        return self.resyncs_sent


def test_a_subscriber_that_lost_a_delivery_recovers_from_the_periodic_snapshot(
    filopy_cluster,
) -> None:
    c = filopy_cluster
    before = _setup(c)
    name = f"lossy-{uuid.uuid4().hex[:8]}"
    sink = ray.remote(LossySink).options(name=name, namespace=c.settings.ray.namespace).remote()
    sub_id = f"{name}/sub"
    ray.get(c.actor.subscribe.remote(sub_id, sink, METRICS), timeout=30)

    def take(timeout_s: float = 1.0) -> list[Any]:
        return [m.payload for m in ray.get(sink.take.remote(sub_id, timeout_s), timeout=30)]

    first = c.wait_for("the first snapshot", take)
    assert isinstance(first[0], CurrentShardSnapshot)
    while take():
        pass  # anything else in flight

    ray.get(sink.lose_next.remote(1))
    owner = before.owner(0)
    c.client.stop_shards("metrics", [0])  # its ShardDown never reaches the subscriber
    c.wait_for("the loss", lambda: ray.get(sink.lost.remote()))
    # The next resync brings the full state, with shard 0 stopped, and nothing before it.
    healed = c.wait_for("a snapshot to heal the subscriber", take)
    assert isinstance(healed[0], CurrentShardSnapshot), healed
    assert healed[0].state.owners[0] is None
    assert healed[0].state.statuses[0] == Stopped()
    assert not any(isinstance(u, ShardDown) for u in healed)

    # Events flow again, in order, after the snapshot.
    c.client.start_shards("metrics", owner, [0])
    seen: list[Any] = []
    c.wait_for(
        "shard 0 active again",
        lambda: seen.extend(take()) or any(isinstance(u, IngestionStarted) for u in seen),
    )
    assert isinstance(seen[0], ShardAssignmentStarted) and seen[0].shard == 0, seen

    # Once the subscriber has taken a resync and nothing new was sent to it, it gets no more.
    interval = c.settings.cluster.resync_interval_s
    c.wait_for("a resync after the last event", lambda: ray.get(sink.resyncs.remote()) >= 2)
    while take(timeout_s=interval * 1.5):
        pass
    quiet = ray.get(sink.resyncs.remote())
    assert take(timeout_s=interval * 2.5) == []
    assert ray.get(sink.resyncs.remote()) == quiet
    ray.get(c.actor.unsubscribe.remote(sub_id, None), timeout=30)

"""Subscriptions on a real multi-node Ray cluster: concurrent first subscribers (Python and SSE)
share one sink actor; subscribers resynchronise from a snapshot after a singleton restart and
after a lost delivery."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from filopy import CurrentShardSnapshot, Dataset, ShardDown
from filopy.client import FiloPyClient, Subscription

pytestmark = pytest.mark.ray

THREADS = 8


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

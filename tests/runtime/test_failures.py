"""Failures on real Ray nodes: the singleton restarts, subscribers die, nodes hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import ray

from coordinator.client import DatasetUnknownError, ShardRequestError
from coordinator.names import node_actor_name
from filopy import CurrentShardSnapshot, Dataset, ShardDown
from store import StaleEpochError, open_stores
from tests.waiting import wait_for

pytestmark = pytest.mark.ray

METRICS = Dataset(name="metrics", num_shards=8).ref


def _healthy(c, name: str = "metrics"):
    m = c.client.shard_map(name)
    return m if m.is_healthy() else None


def _node(c, node_id: str):
    return ray.get_actor(node_actor_name(node_id), namespace=c.settings.ray.namespace)


def _setup(c, nodes: int, num_shards: int = 8, min_num_nodes: int = 3):
    added = [c.add_node() for _ in range(nodes)]
    ids = {n.node_id for n in added}
    c.wait_for(f"{nodes} members", lambda: set(c.client.members()) == ids)
    c.client.setup_dataset(
        Dataset(name="metrics", num_shards=num_shards, min_num_nodes=min_num_nodes)
    )
    return added, c.wait_for("all shards active", lambda: _healthy(c))


def test_singleton_restart_keeps_maps_subscriptions_and_ingestion(filopy_cluster) -> None:
    c = filopy_cluster
    nodes, before = _setup(c, 3)
    sub = c.client.subscribe("metrics")
    assert isinstance(sub.next(timeout_s=10), CurrentShardSnapshot)
    epochs = {n.node_id: ray.get(_node(c, n.node_id).epochs.remote()) for n in nodes}
    first_incarnation = ray.get(c.actor.ready.remote())

    ray.kill(c.actor, no_restart=False)
    # While the singleton is away, routing keeps working from the maps nodes cache.
    for n in nodes:
        cached = ray.get(_node(c, n.node_id).shard_map.remote(METRICS), timeout=10)
        assert cached.owners == before.snapshot().owners
    c.wait_for(
        "the singleton to come back",
        lambda: ray.get(c.actor.ready.remote(), timeout=30) != first_incarnation,
    )

    after = c.client.shard_map("metrics")
    assert [after.owner(s) for s in range(8)] == [before.owner(s) for s in range(8)]
    assert after.is_healthy()
    assert sub.id in ray.get(c.actor.subscribers.remote(METRICS))
    # Ingestion never stopped: every node still runs the same shards under the same epochs.
    for n in nodes:
        assert ray.get(_node(c, n.node_id).epochs.remote()) == epochs[n.node_id]

    # The subscriber keeps receiving without re-subscribing.
    c.client.stop_shards("metrics", [0])
    deadline = time.monotonic() + 20
    seen = []
    while time.monotonic() < deadline:
        update = sub.next(timeout_s=10)
        seen.append(update)
        if isinstance(update, ShardDown) and update.shard == 0:
            break
    assert any(isinstance(u, ShardDown) and u.shard == 0 for u in seen), seen
    sub.unsubscribe()


def test_subscriber_process_that_exits_is_dropped(filopy_cluster) -> None:
    c = filopy_cluster
    _setup(c, 1, num_shards=4, min_num_nodes=1)
    script = textwrap.dedent(
        f"""
        import ray
        from coordinator.cluster_actor import cluster_actor
        from coordinator.client import FiloPyClient
        from core.config import load_settings
        s = load_settings()
        ray.init(address={c.ray.address!r}, namespace=s.ray.namespace, logging_level="ERROR")
        sub = FiloPyClient(cluster_actor(s), s).subscribe("metrics")
        subscribed = ray.get(cluster_actor(s).subscribers.remote(sub.ref))
        assert sub.id in subscribed, subscribed
        print(sub.id, flush=True)  # and exit without unsubscribing
        """
    )
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "FILOPY_RAY__NAMESPACE": c.settings.ray.namespace,
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    sub_id = proc.stdout.strip().splitlines()[-1]
    c.wait_for(
        "the exited subscriber to be dropped",
        lambda: sub_id not in ray.get(c.actor.subscribers.remote(METRICS)),
        timeout_s=30,
    )


def test_hung_node_loses_its_shards_and_cannot_commit(quick_to_fail_cluster) -> None:
    c = quick_to_fail_cluster
    nodes, before = _setup(c, 3)
    spare = c.add_node()
    c.wait_for("the spare joined", lambda: spare.node_id in c.client.members())
    victim = max(nodes, key=lambda n: len(before.shards_for_node(n.node_id)))
    handle = _node(c, victim.node_id)
    lost = before.shards_for_node(victim.node_id)
    old_epochs = ray.get(handle.epochs.remote())["metrics"]
    pid = ray.get(handle.ping.remote()).pid

    os.kill(pid, signal.SIGSTOP)  # the process hangs: alive to Ray, silent to pings
    try:
        hung_at = time.monotonic()
        moved = c.wait_for(
            "the hung node's shards active on the spare",
            lambda: (m := _healthy(c)) and m.shards_for_node(spare.node_id) == lost and m,
            timeout_s=30,
        )
        took = time.monotonic() - hung_at
        print(f"\nshards {lost} moved {took:.2f} s after their node hung")
        # Silence counts from the last answered ping, at most one interval before the hang.
        cfg = c.settings.cluster
        assert took >= cfg.failure_timeout_s - cfg.ping_interval_s
        assert victim.node_id not in c.client.members()
        assert moved.shards_for_node(victim.node_id) == []

        # Whatever the hung node does when it wakes, its epochs are stale.
        meta, columns = open_stores(c.settings)
        for shard in lost:
            with pytest.raises(StaleEpochError):
                meta.commit_checkpoint(METRICS, shard, 0, 100, old_epochs[shard])
        meta.close()
        columns.close()
    finally:
        os.kill(pid, signal.SIGCONT)

    # Awake again, it answers pings, stops what it no longer owns and rejoins as a member.
    c.wait_for("the woken node to rejoin", lambda: victim.node_id in c.client.members())
    c.wait_for(
        "the woken node to stop its old shards",
        lambda: ray.get(handle.running_shards.remote()).get("metrics", []) == [],
    )


def test_start_and_stop_shards_with_clear_errors(filopy_cluster) -> None:
    c = filopy_cluster
    nodes, before = _setup(c, 2, num_shards=4, min_num_nodes=2)
    a, b = (n.node_id for n in nodes)
    with pytest.raises(ShardRequestError, match="valid shards"):
        c.client.stop_shards("metrics", [99])
    with pytest.raises(DatasetUnknownError, match="nope"):
        c.client.stop_shards("nope", [0])
    with pytest.raises(ShardRequestError):
        c.client.start_shards("metrics", "no-such-node", [0])
    owner = before.owner(0)
    other = b if owner == a else a
    with pytest.raises(ShardRequestError, match="stop"):
        c.client.start_shards("metrics", other, [0])  # owned elsewhere: stop it first

    c.client.stop_shards("metrics", [0])
    c.wait_for(
        "shard 0 stopped on its node",
        lambda: 0 not in ray.get(_node(c, owner).running_shards.remote()).get("metrics", []),
    )
    mine = before.shards_for_node(other)
    c.client.stop_shards("metrics", mine[:1])  # make room on the other node
    c.client.start_shards("metrics", other, [0])
    c.wait_for(
        "shard 0 active on the other node",
        lambda: (
            (m := c.client.shard_map("metrics")).owner(0) == other
            and m.is_healthy() is not None
            and 0 in ray.get(_node(c, other).running_shards.remote()).get("metrics", [])
        ),
    )


def test_killed_coordinator_process_moves_shards_and_the_node_rejoins(filopy_cluster) -> None:
    c = filopy_cluster
    nodes, before = _setup(c, 3)
    spare = c.add_node()
    c.wait_for("the spare joined", lambda: spare.node_id in c.client.members())
    victim = max(nodes, key=lambda n: len(before.shards_for_node(n.node_id)))
    lost = before.shards_for_node(victim.node_id)
    pid = ray.get(_node(c, victim.node_id).ping.remote()).pid

    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)  # the process dies; its Ray node lives on
    c.wait_for(
        "the dead coordinator's shards active on the spare",
        lambda: (m := _healthy(c)) and m.shards_for_node(spare.node_id) == lost,
    )
    print(f"\nshards {lost} active on the spare {time.monotonic() - killed_at:.2f} s after kill -9")
    # The Ray node is still a FiloPy node: it gets a fresh coordinator and rejoins, newest.
    c.wait_for("the node to rejoin", lambda: c.client.members()[-1] == victim.node_id)
    fresh = ray.get(_node(c, victim.node_id).ping.remote())
    assert fresh.pid != pid


def test_unreachable_store_at_start_is_a_clear_error_then_recovery_retries(
    ray_cluster, tmp_path
) -> None:
    from coordinator.client import FiloPyClient
    from coordinator.cluster_actor import start_cluster_actor
    from store import StoreUnavailable

    from .conftest import cluster_settings

    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the store's directory should be")
    base = cluster_settings(tmp_path)
    settings = base.model_copy(
        update={"store": base.store.model_copy(update={"sqlite_path": blocker / "filopy.db"})}
    )
    actor = start_cluster_actor(settings)
    client = FiloPyClient(actor, settings)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"could not recover its state.*blocker"):
            client.datasets()
        assert time.monotonic() - started < 10  # an answer, not a hang
        with pytest.raises(StoreUnavailable, match="could not recover"):
            client.setup_dataset(Dataset(name="metrics", num_shards=4, min_num_nodes=1))
        blocker.unlink()  # the store becomes reachable: the singleton's retry recovers
        wait_for(
            "recovery retried: no datasets",
            lambda: client.datasets() == [],
            interval_s=0.2,
            retry_on=(StoreUnavailable,),
        )
        assert client.setup_dataset(Dataset(name="metrics", num_shards=4, min_num_nodes=1))
        assert [d.name for d in client.datasets()] == ["metrics"]
    finally:
        ray.kill(actor, no_restart=True)

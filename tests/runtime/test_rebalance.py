"""Rebalancing onto joining nodes through the drain protocol, on real Kafka and a real Ray
cluster: new nodes take an even share, every move drains first (nothing replayed, nothing lost
or doubled, epochs increasing), and a query loop running throughout never fails."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from coordinator.client import FiloPyClient
from coordinator.cluster_actor import start_cluster_actor
from coordinator.names import node_actor_name
from coordinator.node_coordinator import VERSION_LABEL
from core.dataset import SourceSettings
from filopy import (
    Dataset,
    Handoff,
    IngestionStarted,
    ShardAssignmentStarted,
    ShardEvent,
    ShardHandoffStarted,
)
from ingest.gateway import Gateway
from ingest.tenure import Tenure
from tests.ingest.test_cluster_ingest import T0, batches, expected, wait_exact
from tests.runtime.conftest import (
    FiloPyCluster,
    LocalRayCluster,
    cluster_settings,
    on_backend,
    start_cluster,
)

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

SHARDS = 32
SERIES = 128
ROUNDS = 160  # scrapes per series; written in steps while the cluster rebalances


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.cassandra)])
def rebalancing_cluster(
    request: pytest.FixtureRequest,
    ray_cluster: LocalRayCluster,
    tmp_path: Path,
    kafka_bootstrap: str,
) -> Iterator[FiloPyCluster]:
    settings = cluster_settings(
        tmp_path, "kafka", rebalance=True, flush_interval_s=1.0, groups_per_shard=4
    )
    settings = settings.model_copy(
        update={
            "rebalance": settings.rebalance.model_copy(
                update={"interval_s": 1.0, "max_concurrent_moves": 2, "drain_timeout_s": 60.0}
            ),
        }
    )
    yield start_cluster(ray_cluster, on_backend(settings, request, kafka_bootstrap))


def test_joining_nodes_get_an_even_share_with_no_replay_no_loss_and_no_failed_query(
    rebalancing_cluster: FiloPyCluster, kafka_bootstrap: str
) -> None:
    c = rebalancing_cluster
    ds = Dataset(
        name=f"rebal{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    first = [c.add_node() for _ in range(2)]
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    assert c.client.setup_dataset(ds)
    c.wait_for("all shards active", lambda: c.client.shard_map(ds.name).is_healthy(), 60)
    epochs_before = _epochs(c, ds)
    before = c.client.shard_map(ds.name)
    subscription = c.client.subscribe(ds.name)

    # A steady producer and a query loop, both running through the whole rebalance.
    stop = threading.Event()
    errors: list[str] = []
    answered = [0]

    def produce() -> None:
        with Gateway(ds) as gw:
            for k in range(0, ROUNDS, 4):
                gw.send_batch(next(batches(SERIES, 4, 4, start=k)))
                gw.flush()
                time.sleep(0.1)

    def query_loop() -> None:
        while not stop.is_set():
            try:
                c.client.query(ds.name, "count(m1)", T0 + 15_000 * ROUNDS)
                answered[0] += 1
            except Exception as e:  # any failure is a failed query
                errors.append(f"{type(e).__name__}: {e}")
            time.sleep(0.05)

    producer = threading.Thread(target=produce)
    querier = threading.Thread(target=query_loop)
    producer.start()
    querier.start()
    try:
        joined = [c.add_node() for _ in range(2)]
        c.wait_for("4 members", lambda: len(c.client.members()) == 4, 60)

        def spread_evenly() -> bool:
            m = c.client.shard_map(ds.name)
            return m.is_healthy() and all(
                m.num_shards_for_node(n.node_id) == SHARDS // 4 for n in first + joined
            )

        c.wait_for("4 shards on each of the 4 nodes", spread_evenly, 120)
        producer.join(120)
    finally:
        stop.set()
        querier.join(60)
        producer.join(60)
        c.client.queries().close()  # its map subscriptions, before Ray goes

    assert not errors, errors[:3]
    assert answered[0] > 0
    wait_exact(c, ds, expected(SERIES, ROUNDS))  # nothing lost, nothing doubled

    # Every move went through a drain: its phases in order, none forced, and the new owners
    # replayed nothing (every flush group was checkpointed at the old owner's last offset)
    # under a new, higher epoch. (A periodic resync snapshot may stand in for some events.)
    final = c.client.shard_map(ds.name)
    moved = [s for s in range(SHARDS) if final.owner(s) != before.owner(s)]
    assert len(moved) == SHARDS // 2  # 16 of 32 shards moved to the 2 new nodes
    assert {final.owner(s) for s in moved} == {n.node_id for n in joined}
    kinds: dict[int, list[str]] = {}
    while True:
        try:
            update = subscription.next(0.5)
        except TimeoutError:
            break
        if isinstance(update, ShardEvent):
            kinds.setdefault(update.shard, []).append(type(update).__name__)
            if isinstance(update, ShardAssignmentStarted):
                assert "forced" not in update.reason, update
    phases = ["ShardHandoffStarted", "ShardDrained", "IngestionStarted"]
    seen_whole = 0
    for s in moved:
        got = [k for k in kinds.get(s, []) if k in phases]
        if "ShardHandoffStarted" in got:
            i = got.index("ShardHandoffStarted")
            assert got[i : i + 3] == phases[: len(got[i : i + 3])], (s, got)
            seen_whole += got[i : i + 3] == phases
    assert seen_whole > 0, kinds
    print(f"\n{len(moved)} moves, {seen_whole} seen phase by phase, {answered[0]} queries answered")
    epochs_after = _epochs(c, ds)
    for s in moved:
        assert epochs_after[s] > epochs_before[s]
    stats = {
        s: st for per_node in c.client.ingest_stats(ds.name).values() for s, st in per_node.items()
    }
    replayed = {s: stats[s]["replayed_offsets"] for s in moved}
    assert replayed == dict.fromkeys(moved, 0), replayed
    skipped = {s: stats[s]["memstore"].skipped_replay for s in moved}
    assert skipped == dict.fromkeys(moved, 0), skipped
    _assert_one_ingesting_owner_at_a_time(c, ds, moved)
    subscription.unsubscribe()


def _assert_one_ingesting_owner_at_a_time(c: FiloPyCluster, ds: Dataset, moved: list[int]) -> None:
    """From the ingesters' own claim/release logs on every node: per shard, each tenure began
    after the previous one ended, under a higher epoch, at the offset right after the last one
    the previous owner read (nothing read twice, nothing skipped)."""
    held: dict[int, list[Tenure]] = {}
    for handle in _coordinators(c):
        for t in ray.get(handle.tenures.remote(ds.name)):
            held.setdefault(t.shard, []).append(t)
    assert sorted(held) == list(range(SHARDS))
    for shard, tenures in held.items():
        tenures.sort(key=lambda t: t.epoch)
        assert len(tenures) == (2 if shard in moved else 1), tenures
        assert tenures[-1].released_at is None, tenures  # the current owner still holds it
        for old, new in itertools.pairwise(tenures):
            assert old.released_at is not None and old.released_at <= new.claimed_at, (old, new)
            assert old.epoch < new.epoch and old.node != new.node, (old, new)
            assert new.first_offset == old.next_offset, (old, new)


def _epochs(c: FiloPyCluster, ds: Dataset) -> dict[int, int]:
    out: dict[int, int] = {}
    for handle in _coordinators(c):
        for shard, epoch in ray.get(handle.epochs.remote()).get(ds.name, {}).items():
            if epoch is not None:
                out[shard] = max(out.get(shard, 0), epoch)
    return out


def _coordinators(c: FiloPyCluster) -> list:
    return [
        ray.get_actor(node_actor_name(n), namespace=c.settings.ray.namespace)
        for n in c.client.members()
    ]


@pytest.fixture
def manual_cluster(ray_cluster: LocalRayCluster, tmp_path: Path) -> Iterator[FiloPyCluster]:
    """Rebalancing off (moves only on request), one move at a time."""
    settings = cluster_settings(tmp_path)
    settings = settings.model_copy(
        update={
            "rebalance": settings.rebalance.model_copy(
                update={"interval_s": 0.5, "max_concurrent_moves": 1}
            )
        }
    )
    actor = start_cluster_actor(settings)
    ray.get(actor.ready.remote(), timeout=60)
    yield FiloPyCluster(ray_cluster, settings, FiloPyClient(actor, settings), actor)


def _cli(c: FiloPyCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FILOPY_RAY__NAMESPACE": c.settings.ray.namespace}
    cmd = [sys.executable, "-m", "filopy.cli", *args, "--address", c.ray.address]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.usefixtures("manual_cluster")
def test_plan_agrees_with_rebalance_apply_and_drain_empties_a_node_one_move_at_a_time(
    manual_cluster: FiloPyCluster,
) -> None:
    c = manual_cluster
    first = [c.add_node() for _ in range(2)]
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    name = f"plan{uuid.uuid4().hex[:6]}"
    assert c.client.setup_dataset(Dataset(name=name, num_shards=8, min_num_nodes=2))
    c.wait_for("all shards active", lambda: c.client.shard_map(name).is_healthy(), 60)
    subscription = c.client.subscribe(name)

    what_if = _cli(c, "plan", name, "--add-nodes", "2", "--json")
    assert what_if.returncode == 0, what_if.stderr
    planned = json.loads(what_if.stdout)
    assert sorted(planned["shards_after"].values()) == [2, 2, 2, 2]
    assert len(planned["moves"]) == 4

    joined = [c.add_node() for _ in range(2)]
    c.wait_for("4 members", lambda: len(c.client.members()) == 4)
    assert c.client.shard_map(name).shards_for_node(joined[0].node_id) == []  # off: no moves
    full = c.client.plan(name)
    assert len(full.moves) == 4 and full.held_back == "balanced"
    shown = _cli(c, "rebalance", name)  # without --apply: the next round, throttled to 1
    assert shown.returncode == 0, shown.stderr
    assert "1 moves" in shown.stdout and "throttled" in shown.stdout
    # Apply rounds until balanced, each after the last one's move is done; the map ends where
    # the full plan said.
    deadline = time.monotonic() + 120
    while c.client.shard_map(name).owners != full.owners:
        assert time.monotonic() < deadline, c.client.shard_map(name).render()
        applied = _cli(c, "rebalance", name, "--apply")
        assert applied.returncode == 0, applied.stderr
        c.wait_for("the round's move done", lambda: c.client.shard_map(name).is_healthy(), 60)

    # Drain one of the first nodes by a prefix of its id: it empties, one move at a time.
    victim = first[0].node_id
    drained = _cli(c, "drain", victim[:10])
    assert drained.returncode == 0, drained.stderr
    assert f"draining {victim}" in drained.stdout
    c.wait_for(
        "the drained node empty and the map healthy",
        lambda: (m := c.client.shard_map(name)).num_shards_for_node(victim) == 0 and m.is_healthy(),
        120,
    )
    assert c.client.moves()["draining"] == [victim]
    unknown = _cli(c, "drain", "no-such-node")
    assert unknown.returncode == 1 and "is not a member" in unknown.stderr
    assert "Traceback" not in unknown.stderr

    # The history lists every change with its reason, the new owner's epoch and replay.
    shown = _cli(c, "history", name, "--limit", "1000", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    by_reason: dict[str, list[dict]] = {}
    for row in rows:
        by_reason.setdefault(row["reason"], []).append(row)
    assert sorted(r["shard"] for r in by_reason["created"]) == list(range(8))
    rebalanced = by_reason["rebalance"]
    assert len(rebalanced) == 4
    assert {r["to_node"] for r in rebalanced} == {n.node_id for n in joined}
    drained_rows = by_reason["drain"]
    assert drained_rows and all(r["from_node"] == victim for r in drained_rows)
    for r in rebalanced + drained_rows:
        assert r["epoch"] is not None and r["epoch"] >= 2 and r["replayed_offsets"] == 0
    assert [r["at_ms"] for r in rows] == sorted((r["at_ms"] for r in rows), reverse=True)
    table = _cli(c, "history", name, "--shard", str(rebalanced[0]["shard"]))
    assert table.returncode == 0 and "rebalance" in table.stdout, table.stderr

    # Never more than one handoff in flight (max_concurrent_moves = 1), from the events.
    in_flight = peak = 0
    while True:
        try:
            update = subscription.next(0.5)
        except TimeoutError:
            break
        if isinstance(update, ShardHandoffStarted):
            in_flight += 1
            peak = max(peak, in_flight)
        elif isinstance(update, IngestionStarted) and in_flight:
            in_flight -= 1
    assert peak == 1
    subscription.unsubscribe()


def test_a_singleton_restarted_mid_rebalance_finishes_every_move(
    manual_cluster: FiloPyCluster,
) -> None:
    """Moves in flight when the singleton dies are resumed by the new one (from the maps the
    nodes' guardians kept): no shard is left in a handoff, none is forced."""
    c = manual_cluster
    [c.add_node() for _ in range(2)]
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    name = f"restart{uuid.uuid4().hex[:6]}"
    assert c.client.setup_dataset(Dataset(name=name, num_shards=8, min_num_nodes=2))
    c.wait_for("all shards active", lambda: c.client.shard_map(name).is_healthy(), 60)
    joined = [c.add_node() for _ in range(2)]
    c.wait_for("4 members", lambda: len(c.client.members()) == 4)
    full = c.client.plan(name)
    assert len(full.moves) == 4
    first_incarnation = ray.get(c.actor.ready.remote())
    started = c.client.rebalance(name)
    assert len(started.moves) == 1  # max_concurrent_moves = 1
    ray.kill(c.actor, no_restart=False)  # mid-move
    c.wait_for(
        "the singleton to come back",
        lambda: ray.get(c.actor.ready.remote(), timeout=30) != first_incarnation,
        60,
    )
    # The move in flight completes under the new singleton, well within the drain timeout
    # (60 s), so it was resumed, not forced; the rest follow on request.
    deadline = time.monotonic() + 45
    while c.client.shard_map(name).owners != full.owners:
        assert time.monotonic() < deadline, c.client.shard_map(name).render()
        c.client.rebalance(name)
        time.sleep(0.3)
    c.wait_for("healthy", lambda: c.client.shard_map(name).is_healthy(), 60)
    final = c.client.shard_map(name)
    assert not any(isinstance(st, Handoff) for st in final.statuses)
    assert {final.owner(s) for s in range(8)} >= {n.node_id for n in joined}
    assert c.client.moves() == {"in_flight": [], "draining": []}


def test_no_moves_while_node_versions_differ_and_new_shards_go_to_the_newest(
    ray_cluster: LocalRayCluster, tmp_path: Path
) -> None:
    """A rolling update in progress: a node with a newer `filopy.io/version` label joins; the
    cluster moves nothing onto it (and says why in the plan) but gives it new shards first."""
    settings = cluster_settings(tmp_path, rebalance=True)
    settings = settings.model_copy(
        update={"rebalance": settings.rebalance.model_copy(update={"interval_s": 0.3})}
    )
    actor = start_cluster_actor(settings)
    ray.get(actor.ready.remote(), timeout=60)
    c = FiloPyCluster(ray_cluster, settings, FiloPyClient(actor, settings), actor)
    old = [c.add_node(labels={VERSION_LABEL: "1.0"}) for _ in range(2)]
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    name = f"versions{uuid.uuid4().hex[:6]}"
    assert c.client.setup_dataset(Dataset(name=name, num_shards=8, min_num_nodes=2))
    c.wait_for("all shards active", lambda: c.client.shard_map(name).is_healthy(), 60)
    new = c.add_node(labels={VERSION_LABEL: "1.1"})
    c.wait_for("3 members", lambda: len(c.client.members()) == 3)
    held = c.wait_for("the plan to hold back", lambda: c.client.plan(name).held_back, 10)
    assert "versions differ" in held and "1.0" in held and "1.1" in held, held
    # Many rounds later (interval 0.3 s) nothing has moved onto the newer node.
    time.sleep(3)
    m = c.client.shard_map(name)
    assert m.shards_for_node(new.node_id) == [], m.render()
    assert {m.owner(s) for s in range(8)} == {n.node_id for n in old}
    assert c.client.moves() == {"in_flight": [], "draining": []}
    # A new dataset's shards go to the newest version first.
    fresh = f"fresh{uuid.uuid4().hex[:6]}"
    # (One shard per node: min_num_nodes 4 for 3 nodes, so the order shows in who gets one.)
    assert c.client.setup_dataset(Dataset(name=fresh, num_shards=4, min_num_nodes=4))
    owner = c.wait_for("shard 0 placed", lambda: c.client.shard_map(fresh).owner(0), 30)
    assert owner == new.node_id


def test_a_drain_that_hangs_falls_back_to_a_forced_move_and_loses_nothing(
    ray_cluster: LocalRayCluster, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """The old owner freezes (SIGSTOP) before it can drain: after `drain_timeout_s` the move is
    forced (and the event says so), the new owner replays from the checkpoints under a new
    epoch, and the old owner, woken, is fenced off: every sample once."""
    settings = cluster_settings(
        tmp_path, "kafka", flush_interval_s=0.5, groups_per_shard=2, kafka_bootstrap=kafka_bootstrap
    )
    settings = settings.model_copy(
        update={
            # Long enough that the frozen node is not declared failed: only the drain times out.
            "cluster": settings.cluster.model_copy(update={"failure_timeout_s": 120.0}),
            "rebalance": settings.rebalance.model_copy(
                update={"interval_s": 0.5, "max_concurrent_moves": 1, "drain_timeout_s": 3.0}
            ),
        }
    )
    actor = start_cluster_actor(settings)
    ray.get(actor.ready.remote(), timeout=60)
    c = FiloPyCluster(ray_cluster, settings, FiloPyClient(actor, settings), actor)
    ds = Dataset(
        name=f"hang{uuid.uuid4().hex[:6]}",
        num_shards=4,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    [c.add_node() for _ in range(2)]
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    assert c.client.setup_dataset(ds)
    c.wait_for("all shards active", lambda: c.client.shard_map(ds.name).is_healthy(), 60)
    with Gateway(ds) as gw:
        for k in range(0, 40, 4):
            gw.send_batch(next(batches(16, 4, 4, start=k)))
        gw.flush()
    wait_exact(c, ds, expected(16, 40))
    c.add_node()
    c.wait_for("3 members", lambda: len(c.client.members()) == 3)
    (move,) = c.client.plan(ds.name, throttled=True).moves
    subscription = c.client.subscribe(ds.name)
    handle = ray.get_actor(node_actor_name(move.source), namespace=settings.ray.namespace)
    pid = ray.get(handle.ping.remote()).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        started = c.client.rebalance(ds.name)
        assert [(s, a, b) for _, s, a, b in started.moves] == [
            (move.shard, move.source, move.target)
        ]
        c.wait_for(
            "the forced move to land",
            lambda: (
                (m := c.client.shard_map(ds.name)).owner(move.shard) == move.target
                and m.is_healthy()
            ),
            60,
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    forced = []
    while True:
        try:
            update = subscription.next(0.5)
        except TimeoutError:
            break
        if isinstance(update, ShardAssignmentStarted) and update.shard == move.shard:
            forced.append(update.reason)
    assert any("did not drain" in r and "forced" in r for r in forced), forced
    subscription.unsubscribe()
    # More data after the move, then every sample exactly once (the woken node's ingester
    # for the shard is fenced by the new epoch and stops).
    with Gateway(ds) as gw:
        for k in range(40, 80, 4):
            gw.send_batch(next(batches(16, 4, 4, start=k)))
        gw.flush()
    c.wait_for(
        "the woken node to stop the moved shard",
        lambda: move.shard not in ray.get(handle.running_shards.remote()).get(ds.name, []),
        60,
    )
    wait_exact(c, ds, expected(16, 80))

"""NodeCoordinator converges on full maps, ignores stale ones and re-reports lost events.

The coordinator class is used directly (no Ray) with a SQLite MetaStore and a recording reporter.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from coordinator.messages import NodeShardMap
from coordinator.node_coordinator import NAME_ENV, NAME_LABEL, NodeCoordinator, node_name
from core.config import load_settings
from core.shard_status import (
    ShardAssignmentStarted,
    ShardDrained,
    ShardEvent,
    ShardHandoffStarted,
)
from filopy import Dataset, IngestionStarted, IngestionStopped, ShardMapper
from tests.mapper_helpers import unassign_shard

DS = Dataset(name="m", num_shards=4, min_num_nodes=1)


def _map(mapper: ShardMapper, node: str = "n1") -> NodeShardMap:
    return NodeShardMap(node, DS.ref, DS, mapper.snapshot())


def test_converges_ignores_stale_and_rereports_lost_events(tmp_path: Path) -> None:
    base = load_settings()
    settings = base.model_copy(
        update={
            "store": base.store.model_copy(update={"sqlite_path": tmp_path / "m.db"}),
            "ingest": base.ingest.model_copy(update={"source": "none"}),
        }
    )
    events: list[ShardEvent] = []
    node = NodeCoordinator("n1", settings, reporter=events.append)
    sweeps: list[str] = []  # the process's heap policy, asked to sweep when shards stop
    node._heap = SimpleNamespace(sweep_soon=lambda: sweeps.append("sweep"))  # type: ignore[assignment]
    mapper = ShardMapper(4)
    for shard in (0, 1):
        mapper.update_from_event(ShardAssignmentStarted(DS.ref, shard, "n1"))

    async def scenario() -> None:
        v1 = _map(mapper)
        assert await node.apply_map(v1)
        assert await node.running_shards() == {"m": [0, 1]}
        # Shards start concurrently: their reports may come in either order.
        assert sorted(events, key=lambda e: e.shard) == [
            IngestionStarted(DS.ref, 0, "n1"),
            IngestionStarted(DS.ref, 1, "n1"),
        ]
        epochs = (await node.epochs())["m"]
        assert sorted(epochs) == [0, 1] and all(e is not None and e >= 1 for e in epochs.values())

        # The singleton missed both reports: its resent map still says Assigned.
        events.clear()
        assert not await node.apply_map(v1)
        assert events == [IngestionStarted(DS.ref, 0, "n1"), IngestionStarted(DS.ref, 1, "n1")]

        # Once the singleton knows, a resend of that map triggers nothing.
        for shard in (0, 1):
            mapper.update_from_event(IngestionStarted(DS.ref, shard, "n1"))
        v2 = _map(mapper)
        assert await node.apply_map(v2)
        events.clear()
        assert not await node.apply_map(v2)
        assert not await node.apply_map(v1)  # stale
        assert events == []

        # Shard 1 moves away: it is stopped and reported stopped, and its memory swept soon.
        assert sweeps == []
        unassign_shard(mapper, 1)
        assert await node.apply_map(_map(mapper))
        assert await node.running_shards() == {"m": [0]}
        assert events == [IngestionStopped(DS.ref, 1, "n1")]
        assert sweeps == ["sweep"]

    asyncio.run(scenario())


def test_a_handoff_drains_the_shard_keeps_serving_it_then_lets_it_go(tmp_path: Path) -> None:
    """Drain protocol, node side: Handoff -> the ingester stops (flushing everything) and the
    node reports ShardDrained, still holding the shard for queries; once the map gives the
    shard to the target the node lets it go without another report; a handoff cancelled after
    the drain starts the shard afresh."""
    base = load_settings()
    settings = base.model_copy(
        update={
            "store": base.store.model_copy(update={"sqlite_path": tmp_path / "m.db"}),
            "ingest": base.ingest.model_copy(update={"source": "none"}),
        }
    )
    events: list[ShardEvent] = []
    node = NodeCoordinator("n1", settings, reporter=events.append)
    mapper = ShardMapper(4)
    for shard in (0, 1):
        mapper.update_from_event(ShardAssignmentStarted(DS.ref, shard, "n1"))
        mapper.update_from_event(IngestionStarted(DS.ref, shard, "n1"))

    async def scenario() -> None:
        assert await node.apply_map(_map(mapper))
        first_epoch = (await node.epochs())["m"][1]
        events.clear()
        mapper.update_from_event(ShardHandoffStarted(DS.ref, 1, "n1", "n2"))
        assert await node.apply_map(_map(mapper))
        assert events == [ShardDrained(DS.ref, 1, "n1")]
        assert await node.running_shards() == {"m": [0, 1]}  # still answers for shard 1
        # A resent map that still shows the handoff gets the drained report again.
        events.clear()
        assert not await node.apply_map(_map(mapper))
        assert events == [ShardDrained(DS.ref, 1, "n1")]

        # Cancelled (the target left): the shard is n1's again and starts afresh.
        events.clear()
        mapper.update_from_event(ShardAssignmentStarted(DS.ref, 1, "n1", "cancelled"))
        assert await node.apply_map(_map(mapper))
        assert events == [IngestionStarted(DS.ref, 1, "n1")]
        second_epoch = (await node.epochs())["m"][1]
        assert second_epoch is not None and first_epoch is not None
        assert second_epoch > first_epoch

        # A handoff that completes. The target (a second coordinator) starts the shard as
        # soon as it is drained, before it owns it; the old owner holds it until then.
        target_events: list[ShardEvent] = []
        target = NodeCoordinator("n2", settings, reporter=target_events.append)
        mapper.update_from_event(IngestionStarted(DS.ref, 1, "n1"))
        mapper.update_from_event(ShardHandoffStarted(DS.ref, 1, "n1", "n2"))
        assert await node.apply_map(_map(mapper))
        assert await target.apply_map(_map(mapper, "n2"))
        assert await target.running_shards() == {}  # not drained yet: nothing to start
        events.clear()
        mapper.update_from_event(ShardDrained(DS.ref, 1, "n1"))
        assert await node.apply_map(_map(mapper))
        assert await target.apply_map(_map(mapper, "n2"))
        assert await node.running_shards() == {"m": [0, 1]}  # still answers for it
        assert await target.running_shards() == {"m": [1]}
        assert target_events == [IngestionStarted(DS.ref, 1, "n2")]
        assert (await target.epochs())["m"][1] > second_epoch  # a new epoch fences n1 off
        # The singleton missed the target's report: a resent map makes it report again.
        target_events.clear()
        assert not await target.apply_map(_map(mapper, "n2"))
        assert target_events == [IngestionStarted(DS.ref, 1, "n2")]
        # Live: the map names n2 as the owner and n1 lets the shard go, reporting nothing.
        mapper.update_from_event(IngestionStarted(DS.ref, 1, "n2"))
        assert await node.apply_map(_map(mapper))
        assert await target.apply_map(_map(mapper, "n2"))
        assert await node.running_shards() == {"m": [0]}
        assert await target.running_shards() == {"m": [1]}
        # No IngestionStopped: it stopped when it drained. (Maps still showing the handoff got
        # the drained report again, which the singleton ignores once it has it.)
        assert set(events) <= {ShardDrained(DS.ref, 1, "n1")}

    asyncio.run(scenario())


def test_a_node_s_name_is_its_label_else_its_environment_else_host_and_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = "5214b7c722fbec4f287a8ead291dfe54c5db4afb95bf97782828c73c"
    monkeypatch.delenv(NAME_ENV, raising=False)
    assert node_name(node) == f"{socket.gethostname().split('.')[0]}-5214b7"
    monkeypatch.setenv(NAME_ENV, " ingest-7 ")
    assert node_name(node) == "ingest-7"
    assert node_name(node, {NAME_LABEL: "edge-1"}) == "edge-1"
    assert node_name(node, {NAME_LABEL: ""}) == "ingest-7"  # an empty label names nothing

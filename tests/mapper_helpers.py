"""ShardMapper operations only tests need, as plain functions over the mapper's public API.

Production changes a map through events (`update_from_event`) and `remove_node` alone; these
build and inspect maps the same way, so a map a test builds is one production could reach.
"""

from __future__ import annotations

from collections.abc import Iterable

from core.dataset import DatasetRef
from core.mapper import ShardMapper
from core.shard_status import (
    Active,
    Assigned,
    Degraded,
    Down,
    Error,
    Handoff,
    IngestionDegraded,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    Recovery,
    RecoveryInProgress,
    ShardAssignmentStarted,
    ShardDown,
    ShardDrained,
    ShardEvent,
    ShardHandoffStarted,
    ShardStatus,
    Stopped,
    Unassigned,
)

__all__ = [
    "active_bitmap",
    "merge_from",
    "minimal_events",
    "num_assigned_shards",
    "register_node",
    "shard_events",
    "unassign_shard",
]

# The mapper ignores an event's dataset: events the helpers make for themselves carry this one.
_REF = DatasetRef(name="mapper-helpers")


def shard_events(
    ref: DatasetRef, shard: int, owner: str | None, status: ShardStatus
) -> list[ShardEvent]:
    """The events that take an Unassigned shard to `status` owned by `owner`."""
    match status:
        case Unassigned():
            return []
        case Assigned():
            return [ShardAssignmentStarted(ref, shard, owner)]
        case Active():
            return [IngestionStarted(ref, shard, owner)]
        case Recovery(progress_pct=pct):
            return [RecoveryInProgress(ref, shard, owner, pct)]
        case Degraded(message=message):
            return [IngestionDegraded(ref, shard, owner, message)]
        case Error(message=message):
            return [IngestionError(ref, shard, None, message)]
        case Stopped():
            assigned = [] if owner is None else [ShardAssignmentStarted(ref, shard, owner)]
            return [*assigned, IngestionStopped(ref, shard, owner)]
        case Down():
            return [ShardDown(ref, shard, None)]
        case Handoff(target=target, drained=drained):
            events: list[ShardEvent] = [
                ShardAssignmentStarted(ref, shard, owner),
                ShardHandoffStarted(ref, shard, owner, target),
            ]
            if drained:
                events.append(ShardDrained(ref, shard, owner))
            return events
    raise AssertionError(status)


def minimal_events(mapper: ShardMapper, ref: DatasetRef) -> list[ShardEvent]:
    """The shortest event list that rebuilds `mapper`'s state on a fresh mapper: one event per
    non-Unassigned shard, two for a Stopped shard that still has an owner (three for a drained
    handoff)."""
    return [
        event
        for shard, (owner, status) in enumerate(zip(mapper.owners, mapper.statuses, strict=True))
        for event in shard_events(ref, shard, owner, status)
    ]


def merge_from(mapper: ShardMapper, other: ShardMapper, ref: DatasetRef) -> ShardMapper:
    """Adopt every shard of `other` that is not plain Unassigned (FiloDB's mergeFrom)."""
    if other.num_shards != mapper.num_shards:
        raise ValueError(f"cannot merge {other.num_shards} shards into {mapper.num_shards}")
    for event in minimal_events(other, ref):
        mapper.update_from_event(event)
    return mapper


def _check_shard(mapper: ShardMapper, shard: int) -> None:
    if not 0 <= shard < mapper.num_shards:
        raise ValueError(f"invalid shard {shard}: valid shards are 0..{mapper.num_shards - 1}")


def register_node(mapper: ShardMapper, shards: Iterable[int], node: str) -> None:
    """Make `node` the owner of `shards`, each keeping its status; an idle one (Unassigned,
    Error, Down) becomes Assigned."""
    for shard in shards:
        _check_shard(mapper, shard)
        if mapper.owner(shard) == node:
            continue
        status = mapper.status(shard)
        if isinstance(status, Unassigned | Error | Down):
            status = Assigned()
        for event in shard_events(_REF, shard, node, status):
            mapper.update_from_event(event)


def unassign_shard(mapper: ShardMapper, shard: int) -> None:
    """Clear the shard's owner (an ingesting shard becomes Unassigned, a Stopped one stays
    Stopped), as `remove_node` does for each of a node's shards: the owner's other shards are
    given back to it as they were."""
    _check_shard(mapper, shard)
    owner = mapper.owner(shard)
    if owner is None:
        return
    kept = [(s, mapper.status(s)) for s in mapper.shards_for_node(owner) if s != shard]
    mapper.remove_node(owner)
    for s, status in kept:
        for event in shard_events(_REF, s, owner, status):
            mapper.update_from_event(event)


def num_assigned_shards(mapper: ShardMapper) -> int:
    """Shards with an owner."""
    return mapper.num_shards - mapper.num_unassigned_shards


def active_bitmap(mapper: ShardMapper) -> bytes:
    """One bit per shard, set when Active; shard 0 is the high bit of byte 0 (as FiloDB)."""
    out = bytearray((mapper.num_shards + 7) // 8)
    for shard, status in enumerate(mapper.statuses):
        if isinstance(status, Active):
            out[shard >> 3] |= 0x80 >> (shard & 7)
    return bytes(out)

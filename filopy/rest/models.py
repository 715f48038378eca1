"""Request and response shapes of the REST API, as pydantic models so /docs shows them exactly.

Every success is `{"status": "success", "data": ...}` and every error
`{"status": "error", "errorType": ..., "error": ...}`, the envelope of Prometheus' HTTP API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from coordinator.rebalance import Plan
from core.mapper import ShardMapper
from core.shard_status import (
    CurrentShardSnapshot,
    IngestionDegraded,
    IngestionError,
    RecoveryInProgress,
    ShardEvent,
)
from store.api import OwnershipChange

T = TypeVar("T")

# Request fields are strict: `"1"`, `true` or `1.0` for a shard number is a 400 naming the field,
# never coerced (pydantic's lax mode read `true` as shard 1).
ShardNumber = Annotated[
    int, Field(ge=0, strict=True, description="A shard number, 0 .. num_shards - 1.")
]


class Success(BaseModel, Generic[T]):
    status: Literal["success"] = "success"
    data: T


class ErrorBody(BaseModel):
    status: Literal["error"] = "error"
    errorType: str = Field(description="A stable, machine-readable category; see docs/rest.md.")
    error: str = Field(description="What went wrong, for a human.")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StartShardsRequest(_Request):
    address: str = Field(min_length=1, description="The node id (Ray node id) to start them on.")
    shardList: list[ShardNumber] = Field(description="The shards to start; each must be unowned.")


class StopShardsRequest(_Request):
    shardList: list[ShardNumber] = Field(description="The shards to stop; each must be owned.")


class ShardsStartedData(BaseModel):
    address: str
    shardList: list[int]


class ShardsStoppedData(BaseModel):
    shardList: list[int]


class DatasetRemovedData(BaseModel):
    name: str


class ShardStatusData(BaseModel):
    shard: int
    status: str = Field(description="E.g. Active, Recovery(40), Down, Unassigned, Error(...).")
    address: str = Field(description="Id of the node that owns the shard; empty when none.")
    node: str = Field("", description="The owner's name; empty when none.")


class NodeShardStatus(BaseModel):
    shard: int
    status: str


class AddressStatusData(BaseModel):
    address: str = Field(description="A node id; empty for the shards no node owns.")
    node: str = Field("", description="The node's name; empty for the shards no node owns.")
    shards: list[NodeShardStatus]


class NodeData(BaseModel):
    address: str = Field(description="The node id (Ray's).")
    name: str = Field(description="Its readable name, unique in the cluster.")
    version: str = Field(description="The version it advertises (rolling updates).")


class NodesData(BaseModel):
    members: list[NodeData] = Field(description="Oldest first.")
    refused: dict[str, str] = Field(
        description="Nodes kept out of the cluster, by id, with why (their name is taken)."
    )


class MoveData(BaseModel):
    shard: int
    source: str = Field(description="The node the shard leaves (drains first).")
    target: str = Field(description="The node that takes it over once live.")


class PlanData(BaseModel):
    """A rebalance plan: nothing here has been applied."""

    moves: list[MoveData]
    shards_before: dict[str, float] = Field(description="Shards (or load) per node now.")
    shards_after: dict[str, float] = Field(description="Shards (or load) per node after.")
    unowned_after: int = Field(description="Shards no node would own (over every capacity).")
    held_back: str = Field(
        description='Why no more moves: "balanced", "throttled", "versions differ (...)".'
    )


class OwnershipChangeData(BaseModel):
    shard: int
    at_ms: int = Field(description="When the owner changed (ms since the epoch).")
    source: str | None = Field(description="The previous owner; null: none.")
    target: str | None = Field(description="The new owner; null: none (Down, Error, Stopped).")
    reason: str = Field(description="created, joined, left (...), failed (...), error, ...")
    epoch: int | None = Field(description="The new owner's ownership epoch, once it was live.")
    replayed_offsets: int | None = Field(
        description="Offsets it read at start that an owner before it had read (exact after a "
        "handoff; after a killed owner, all it could have read: docs/operations.md)."
    )


def ownership_data(change: OwnershipChange) -> OwnershipChangeData:
    return OwnershipChangeData(
        shard=change.shard,
        at_ms=change.at_ms,
        source=change.from_node,
        target=change.to_node,
        reason=change.reason,
        epoch=change.epoch,
        replayed_offsets=change.replayed_offsets,
    )


class MovesStartedData(BaseModel):
    moves: list[MoveData]
    held_back: str = ""


def plan_data(plan: Plan) -> PlanData:
    return PlanData(
        moves=[MoveData(shard=m.shard, source=m.source, target=m.target) for m in plan.moves],
        shards_before=dict(plan.load_before),
        shards_after=dict(plan.load_after),
        unowned_after=sum(1 for o in plan.owners if o is None),
        held_back=plan.held_back,
    )


class DatasetHealth(BaseModel):
    shards: int
    active: int
    recovering: int


class HealthData(BaseModel):
    healthy: bool
    datasets: dict[str, DatasetHealth]


def shard_statuses(
    mapper: ShardMapper, names: Mapping[str, str] | None = None
) -> list[ShardStatusData]:
    names = names or {}
    out = []
    for s in range(mapper.num_shards):
        owner = mapper.owner(s) or ""
        node = names.get(owner, owner)
        out.append(ShardStatusData(shard=s, status=str(mapper.status(s)), address=owner, node=node))
    return out


def snapshot_data(
    snapshot: CurrentShardSnapshot, names: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The `snapshot` SSE event: the whole map, shaped like GET .../status."""
    mapper = ShardMapper.from_state(snapshot.state)
    return {
        "dataset": snapshot.ref.name,
        "version": snapshot.state.version,
        "shards": [s.model_dump() for s in shard_statuses(mapper, names)],
    }


def event_data(
    event: ShardEvent, mapper: ShardMapper | None, names: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A `shard_event` SSE event. `mapper` (the subscriber's copy of the map, updated with the
    event) supplies the shard's resulting status, so clients need not re-implement transitions;
    `names` the node's name."""
    node = event.node or ""
    out: dict[str, Any] = {
        "dataset": event.ref.name,
        "shard": event.shard,
        "event": type(event).__name__,
        "address": node,
        "node": (names or {}).get(node, node),
    }
    if isinstance(event, RecoveryInProgress):
        out["progressPct"] = event.progress_pct
    if isinstance(event, IngestionError | IngestionDegraded | RecoveryInProgress) and event.message:
        out["message"] = event.message
    if mapper is not None:
        out["status"] = str(mapper.status(event.shard))
    return out


class TokenRequest(_Request):
    name: str = Field(min_length=1, max_length=200, description="Who or what uses the token.")
    scopes: list[Literal["read", "write", "admin"]] = Field(
        min_length=1, description="read: queries, status, events; write: ingestion; admin: all."
    )
    datasets: list[str] = Field(
        default_factory=list, description="The only datasets it may use; empty: every dataset."
    )
    tenant: str | None = Field(
        default=None, description="A write token's tenant: the `_ws_` of everything it writes."
    )


class TokenData(BaseModel):
    id: str = Field(description="Public: names the token (fpy_<id>_...) in lists and revocations.")
    name: str
    scopes: list[str]
    datasets: list[str]
    tenant: str | None
    created_ms: int
    revoked_ms: int | None


class CreatedTokenData(TokenData):
    token: str = Field(description="The token itself: shown this once, stored only as a hash.")

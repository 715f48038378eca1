"""SubscribeShardUpdates as Server-Sent Events, for clients in any language."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import APIRouter
from sse_starlette import EventSourceResponse, ServerSentEvent

from core.mapper import ShardEventError, ShardMapper
from core.shard_status import CurrentShardSnapshot
from filopy.rest.deps import ClusterDep, DatasetName, errors
from filopy.rest.models import event_data, snapshot_data

if TYPE_CHECKING:
    from coordinator.client import FiloPyClient, Subscription

router = APIRouter(tags=["cluster"])


@router.get(
    "/api/v1/cluster/{ds}/events",
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "An SSE stream: a `snapshot` event, then a `shard_event` per "
            "change, and `dataset_removed` when the dataset goes away.",
            "content": {"text/event-stream": {}},
        },
        **errors(400, 404, 503),
    },
)
async def events(ds: DatasetName, cluster: ClusterDep) -> EventSourceResponse:
    """SubscribeShardUpdates as Server-Sent Events, for clients in any language."""
    sub: Subscription = await cluster.call(cluster.client.subscribe, ds)
    return EventSourceResponse(_stream(cluster.client, sub), ping=15)


async def _names(
    client: FiloPyClient, known: dict[str, str], node: str | None = None
) -> dict[str, str]:
    """Node names for the stream: fetched for a snapshot or a node not named yet, added to
    those known (a node that left keeps its name in later events about it, as its id keeps
    naming only it); the known ones while the cluster does not answer."""
    if node is not None and (not node or node in known):
        return known
    try:
        return known | await anyio.to_thread.run_sync(client.node_names)
    except Exception:
        return known


async def _stream(client: FiloPyClient, sub: Subscription) -> AsyncIterator[ServerSentEvent]:
    mapper: ShardMapper | None = None
    names: dict[str, str] = {}
    try:
        async for update in sub:
            if isinstance(update, CurrentShardSnapshot):
                mapper = ShardMapper.from_state(update.state)
                names = await _names(client, names)
                data = _json(snapshot_data(update, names))
                yield ServerSentEvent(data=data, event="snapshot")
                continue
            if mapper is not None:
                try:
                    mapper.update_from_event(update)
                except ShardEventError:
                    mapper = None  # out of step: report events without statuses
            names = await _names(client, names, update.node or "")
            data = _json(event_data(update, mapper, names))
            yield ServerSentEvent(data=data, event="shard_event")
        yield ServerSentEvent(data=_json({"dataset": sub.ref.name}), event="dataset_removed")
    finally:
        # Also on client disconnect (cancellation): drop the subscription in the cluster.
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await anyio.to_thread.run_sync(sub.unsubscribe)


def _json(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))

"""Rebalancing (docs/operations.md): what-if plans, the ownership history, a rebalance round."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from filopy.rest.deps import ClusterDep, DatasetName, errors
from filopy.rest.models import (
    MoveData,
    MovesStartedData,
    OwnershipChangeData,
    PlanData,
    Success,
    ownership_data,
    plan_data,
)

router = APIRouter(tags=["rebalancing"])


@router.get(
    "/api/v1/cluster/{ds}/plan", response_model=Success[PlanData], responses=errors(400, 404, 503)
)
async def plan(
    ds: DatasetName,
    cluster: ClusterDep,
    add_nodes: Annotated[int, Query(ge=0, le=1024, description="Nodes joining.")] = 0,
    remove_node: Annotated[
        list[str], Query(description="A node leaving (id or unique prefix); repeatable.")
    ] = [],  # noqa: B006 - FastAPI copies defaults
    drain_node: Annotated[
        list[str], Query(description="A node to empty (id or unique prefix); repeatable.")
    ] = [],  # noqa: B006
    throttled: Annotated[
        bool, Query(description="Only the moves the next round may start.")
    ] = False,
) -> Any:
    """What rebalancing would do now, or after nodes join, leave or are drained: the moves,
    and shards per node before and after. Applies nothing."""
    result = await cluster.call(
        lambda: cluster.client.plan(
            ds,
            add_nodes=add_nodes,
            remove_nodes=remove_node,
            drain_nodes=drain_node,
            throttled=throttled,
        )
    )
    return Success(data=plan_data(result))


@router.get(
    "/api/v1/cluster/{ds}/history",
    response_model=Success[list[OwnershipChangeData]],
    responses=errors(400, 404, 503),
)
async def history(
    ds: DatasetName,
    cluster: ClusterDep,
    shard: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="Only this shard.")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000, description="At most this many.")] = 100,
) -> Any:
    """Who owned which shard when, and why: every ownership change, newest first, with the
    new owner's epoch and the offsets it replayed (kept `store.history_retention_days`)."""
    changes = await cluster.call(lambda: cluster.client.history(ds, shard, limit))
    return Success(data=[ownership_data(c) for c in changes])


@router.post(
    "/api/v1/cluster/{ds}/rebalance",
    response_model=Success[MovesStartedData],
    responses=errors(404, 503),
)
async def rebalance(ds: DatasetName, cluster: ClusterDep) -> Any:
    """Run one rebalance round now: start the moves the throttle allows (each a handoff:
    the old owner drains, the new one takes over once live)."""
    done = await cluster.call(cluster.client.rebalance, ds)
    held = "; ".join(why for _, why in done.held_back)
    moves = [MoveData(shard=s, source=a, target=b) for _, s, a, b in done.moves]
    return Success(data=MovesStartedData(moves=moves, held_back=held))

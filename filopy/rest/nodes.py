"""The cluster's nodes: who they are, and draining one for maintenance."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from filopy.rest.deps import ClusterDep, errors
from filopy.rest.models import MoveData, MovesStartedData, NodeData, NodesData, Success

router = APIRouter()


@router.get(
    "/api/v1/nodes", tags=["cluster"], response_model=Success[NodesData], responses=errors(503)
)
async def nodes(cluster: ClusterDep) -> Any:
    """The cluster's nodes: id, name and version of each member, and the nodes refused
    (a name a member already has)."""
    found = await cluster.call(cluster.client.nodes)
    listed = [NodeData(address=m.node, name=m.name, version=m.version) for m in found.members]
    refused = dict(found.refused)
    return Success(data=NodesData(members=listed, refused=refused))


@router.post(
    "/api/v1/nodes/{node}/drain",
    tags=["rebalancing"],
    response_model=Success[MovesStartedData],
    responses=errors(404, 503),
)
async def drain_node(node: str, cluster: ClusterDep) -> Any:
    """Empty a node for maintenance: its shards move off through handoffs, a few at a time
    (the throttle); it gets no new shards until it leaves or the drain is cancelled."""
    done = await cluster.call(cluster.client.drain_node, node)
    moves = [MoveData(shard=s, source=a, target=b) for _, s, a, b in done.moves]
    return Success(data=MovesStartedData(moves=moves))


@router.delete(
    "/api/v1/nodes/{node}/drain",
    tags=["rebalancing"],
    response_model=Success[MovesStartedData],
    responses=errors(404, 503),
)
async def cancel_drain(node: str, cluster: ClusterDep) -> Any:
    """Stop emptying a node (moves in flight finish)."""
    await cluster.call(lambda: cluster.client.drain_node(node, cancel=True))
    return Success(data=MovesStartedData(moves=[]))

"""The cluster's datasets and their shards: status, status by owner, start and stop shards."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from core.mapper import ShardMapper
from filopy.rest.deps import ClusterDep, DatasetName, errors
from filopy.rest.models import (
    AddressStatusData,
    NodeShardStatus,
    ShardsStartedData,
    ShardsStoppedData,
    ShardStatusData,
    StartShardsRequest,
    StopShardsRequest,
    Success,
    shard_statuses,
)

router = APIRouter(tags=["cluster"])


@router.get("/api/v1/cluster", response_model=Success[list[str]], responses=errors(503))
async def cluster(cluster: ClusterDep) -> Any:
    """The names of the datasets the cluster ingests."""
    return Success(data=sorted(d.name for d in await cluster.call(cluster.client.datasets)))


@router.get(
    "/api/v1/cluster/{ds}/status",
    response_model=Success[list[ShardStatusData]],
    responses=errors(400, 404, 503),
)
async def shard_status(ds: DatasetName, cluster: ClusterDep) -> Any:
    """Every shard's status and owner (address: a node id; empty when unowned)."""
    client = cluster.client
    mapper: ShardMapper = await cluster.call(client.shard_map, ds)
    return Success(data=shard_statuses(mapper, await cluster.call(client.node_names)))


@router.get(
    "/api/v1/cluster/{ds}/statusByAddress",
    response_model=Success[list[AddressStatusData]],
    responses=errors(400, 404, 503),
)
async def status_by_address(ds: DatasetName, cluster: ClusterDep) -> Any:
    """Shards grouped by owner: every member (oldest first, maybe with no shards), then
    the unowned shards under address ""."""
    client = cluster.client
    mapper: ShardMapper = await cluster.call(client.shard_map, ds)
    members: list[str] = await cluster.call(client.members)
    names: dict[str, str] = await cluster.call(client.node_names)
    owners = list(members) + sorted(mapper.all_nodes() - set(members))

    def group(address: str, shards: list[int]) -> AddressStatusData:
        statuses = [NodeShardStatus(shard=s, status=str(mapper.status(s))) for s in shards]
        node = names.get(address, address)
        return AddressStatusData(address=address, node=node, shards=statuses)

    out = [group(node, mapper.shards_for_node(node)) for node in owners]
    unowned = mapper.unassigned_shards()
    if unowned:
        out.append(group("", unowned))
    return Success(data=out)


@router.post(
    "/api/v1/cluster/{ds}/startshards",
    response_model=Success[ShardsStartedData],
    responses=errors(400, 404, 503),
)
async def start_shards(ds: DatasetName, request: StartShardsRequest, cluster: ClusterDep) -> Any:
    """Start unowned shards on a node. Nothing changes unless every shard can start."""
    client = cluster.client
    done = await cluster.call(client.start_shards, ds, request.address, request.shardList)
    return Success(data=ShardsStartedData(address=done.node, shardList=list(done.shards)))


@router.post(
    "/api/v1/cluster/{ds}/stopshards",
    response_model=Success[ShardsStoppedData],
    responses=errors(400, 404, 503),
)
async def stop_shards(ds: DatasetName, request: StopShardsRequest, cluster: ClusterDep) -> Any:
    """Take shards from their nodes (status Down); they stay unowned until started again
    or until membership changes."""
    done = await cluster.call(cluster.client.stop_shards, ds, request.shardList)
    return Success(data=ShardsStoppedData(shardList=list(done.shards)))

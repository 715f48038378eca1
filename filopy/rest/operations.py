"""Operations: health (for load balancers and alerts), liveness, Prometheus metrics."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core.mapper import ShardMapper, shard_ranges
from core.shard_status import Active, Degraded, Error, Recovery
from filopy.rest.deps import ClusterDep, errors
from filopy.rest.errors import UNAVAILABLE, ApiError, error_response
from filopy.rest.models import DatasetHealth, HealthData, Success

router = APIRouter(tags=["operations"])


@router.get("/__health", response_model=Success[HealthData], responses=errors(503))
async def health(cluster: ClusterDep) -> Any:
    """200 when every shard of every dataset is Active or in Recovery, else 503 naming the
    shards that are not, with the reason for Degraded and Error ones (a Degraded shard
    still ingests, but its store or Kafka is out: the cluster is not healthy); also 503
    while the singleton holds failover back because more members are silent than answer."""
    client = cluster.client
    datasets = await cluster.call(client.datasets)
    report: dict[str, DatasetHealth] = {}
    problems: list[str] = []
    for d in sorted(datasets, key=lambda d: d.name):
        try:
            mapper: ShardMapper = await cluster.call(client.shard_map, d.name)
        except ApiError as e:
            if e.status == 404:
                continue  # removed meanwhile
            raise
        active = len(mapper.active_shards())
        live = mapper.active_or_recovering_shards()
        report[d.name] = DatasetHealth(
            shards=mapper.num_shards, active=active, recovering=len(live) - active
        )
        if len(live) < mapper.num_shards:
            problems.append(f"dataset {d.name!r}: {_unhealthy(mapper)}")
    said = ["unhealthy shards: " + "; ".join(problems)] if problems else []
    suspect = await cluster.call(client.suspect_self)
    if suspect:
        said.insert(0, f"failover held back: {suspect}")
    if said:
        return error_response(503, UNAVAILABLE, "; ".join(said))
    return Success(data=HealthData(healthy=True, datasets=report))


@router.get("/__liveness", response_model=Success[str])
async def liveness() -> Any:
    """200 while this server runs; it does not ask the cluster."""
    return Success(data="ok")


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text."}},
)
async def metrics(request: Request) -> Response:
    """Prometheus exposition format; see docs/rest.md for the metric families."""
    body = await anyio.to_thread.run_sync(generate_latest, request.app.state.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def _unhealthy(mapper: ShardMapper) -> str:
    """`Down: 3, 5-7; Unassigned: 9; Degraded: 4 (store unavailable ...)`: the shards not Active
    or in Recovery, by status; Degraded and Error shards with their messages."""
    by_status: dict[str, list[int]] = {}
    for s in range(mapper.num_shards):
        st = mapper.status(s)
        if not isinstance(st, Active | Recovery):
            by_status.setdefault(type(st).__name__, []).append(s)
    reasons = {
        s: st.message
        for s in range(mapper.num_shards)
        if isinstance(st := mapper.status(s), Degraded | Error) and st.message
    }

    def why(shards: list[int]) -> str:
        said = [f"shard {s}: {reasons[s]}" for s in shards if s in reasons][:5]
        return f" ({'; '.join(said)})" if said else ""

    return "; ".join(f"{k}: {shard_ranges(v)}{why(v)}" for k, v in sorted(by_status.items()))

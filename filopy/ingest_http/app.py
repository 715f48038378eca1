"""The HTTP ingestion endpoints as one router, and the standalone gateway app (`filopy gateway`).

The gateway reads the dataset definitions from the MetaStore (SQLite file or Cassandra, as
configured) every few seconds and writes to Kafka, so several can run behind any load balancer,
apart from the cluster. `filopy serve` mounts the same router, reading definitions from the
singleton.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from core.config import Settings
from core.dataset import Dataset
from core.jit import warm
from filopy.auth import secure
from filopy.ingest_http.core import Ingestion
from filopy.ingest_http.influx import influx_router
from filopy.ingest_http.otlp import otlp_router
from filopy.ingest_http.remote_write import remote_write_router
from store import open_stores

Endpoint = Callable[[str, Request], Awaitable[Response]]


def ingest_routers(ingestion: Ingestion) -> list[APIRouter]:
    """The routers of every protocol, sharing `ingestion`'s producers."""
    return [remote_write_router(ingestion), influx_router(ingestion), otlp_router(ingestion)]


def ingest_router(ingestion: Ingestion, routers: Iterable[APIRouter] | None = None) -> APIRouter:
    """Every ingestion endpoint (docs/ingestion-http.md), sharing `ingestion`'s producers."""
    router = APIRouter(on_shutdown=[ingestion.close])
    for one in routers if routers is not None else ingest_routers(ingestion):
        router.include_router(one)
    return router


class DirectWrites:
    """ASGI middleware: a POST to a write endpoint calls its endpoint function directly, the
    function its route calls, without FastAPI's routing, dependency solving and exception
    middleware, a large share of a small request's CPU (docs/ingestion-http.md). The endpoints
    take `(dataset, request)` and answer every outcome themselves (`Ingestion.handle`); anything
    else, and any other request, goes to the app."""

    def __init__(self, app: ASGIApp, routes: Iterable[tuple[re.Pattern[str], Endpoint]]) -> None:
        self.app = app
        self.routes = list(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = get_route_path(scope)
            for regex, endpoint in self.routes:
                match = regex.match(path)
                if match is not None:
                    response = await endpoint(match["dataset"], Request(scope, receive, send))
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def direct_writes(routers: Iterable[APIRouter]) -> list[tuple[re.Pattern[str], Endpoint]]:
    """The POST routes of `routers` whose endpoint is `(dataset: str, request: Request)`."""
    found = []
    for router in routers:
        for route in router.routes:
            if (
                isinstance(route, APIRoute)
                and route.methods == {"POST"}
                and list(route.param_convertors) == ["dataset"]
                and list(route.endpoint.__annotations__) == ["dataset", "request", "return"]
            ):
                found.append((route.path_regex, route.endpoint))
    return found


def serve_ingestion(app: FastAPI, ingestion: Ingestion) -> None:
    """Every ingestion endpoint on `app`, the write endpoints' POSTs called directly
    (`DirectWrites`). The decoders' compiled kernels are loaded (or compiled) now, before the
    server listens: not on a sender's first request."""
    warm()
    routers = ingest_routers(ingestion)
    app.include_router(ingest_router(ingestion, routers))
    app.add_middleware(DirectWrites, routes=direct_writes(routers))


def stored_datasets(settings: Settings) -> list[Dataset]:
    """Every dataset definition in the MetaStore, with the cluster's Kafka where it names none."""
    meta, columns = open_stores(settings)
    try:
        datasets = meta.list_datasets()
    finally:
        meta.close()
        columns.close()
    return [d.with_cluster_kafka(settings.kafka.bootstrap_servers) for d in datasets]


def create_gateway_app(settings: Settings) -> FastAPI:
    """The ingestion endpoints alone, with definitions from the MetaStore."""
    app = FastAPI(
        title="FiloPy ingestion gateway",
        summary="Remote write, Influx line protocol and OTLP into FiloPy datasets, routed to "
        "Kafka by shard key.",
        version="1",
    )
    ingestion = Ingestion(lambda: stored_datasets(settings), settings.gateway, kafka=settings.kafka)
    serve_ingestion(app, ingestion)

    @app.get("/__liveness", tags=["operations"])
    async def liveness() -> dict[str, Any]:
        """200 while this gateway runs."""
        return {"status": "success", "data": "ok"}

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def metrics() -> Response:
        """This gateway's ingestion metrics, Prometheus text format."""
        body = await anyio.to_thread.run_sync(generate_latest, ingestion.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    secure(app, settings)
    return app

"""The REST API of a FiloPy cluster: datasets, shard status and control, events, health, metrics.

`create_app(client, settings)` builds the FastAPI app from one router per resource (each a
module of this package); the CLI serves it with uvicorn. The routers reach the cluster through
`app.state` (`filopy.rest.deps`). The reference, with examples, is docs/rest.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry

from core.config import Settings
from filopy.auth import secure
from filopy.ingest_http import Ingestion, serve_ingestion
from filopy.rest import (
    datasets,
    events,
    nodes,
    operations,
    promql_admin,
    promql_queries,
    promql_status,
    rebalancing,
    shards,
    tokens,
)
from filopy.rest.console import mount_console
from filopy.rest.deps import Cluster
from filopy.rest.errors import install_handlers
from filopy.rest.metrics import ClusterCollector
from filopy.rest.promql_state import PromQL, TenantQueryMetrics, query_latency
from query.service import QueryService

if TYPE_CHECKING:
    from coordinator.client import FiloPyClient


def create_app(client: FiloPyClient, settings: Settings) -> FastAPI:
    """The REST server for the cluster `client` talks to."""
    # Here, not at the top: it imports Ray, which the rest of this package (the CLI's REST
    # client reads its errors) and its unit tests do not need.
    from coordinator.cluster_queries import cluster_query_service

    timeout_s = client.timeout_s
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(client))

    app = FastAPI(
        title="FiloPy",
        summary="Datasets, shard status and control, shard events, health and metrics.",
        version="1",
    )
    app.state.settings = settings
    app.state.client = client
    app.state.cluster = Cluster(client, settings)
    app.state.registry = registry
    install_handlers(app, timeout_s)
    queries = cluster_query_service(client, timeout_s, limits=settings.query)
    serve_promql(app, client, queries, registry)  # docs/query.md
    # docs/ingestion-http.md
    ingestion = Ingestion(client.datasets, settings.gateway, kafka=settings.kafka)
    serve_ingestion(app, ingestion)  # write POSTs called directly: docs/ingestion-http.md
    registry.register(ingestion.metrics.registry)
    app.router.add_event_handler("shutdown", queries.close)  # stop following maps before Ray goes
    mount_console(app)
    # In this order, the OpenAPI document lists the paths as it always has.
    for resource in (
        datasets,
        shards,
        rebalancing,
        nodes,
        events,
        operations,
        tokens,
        promql_admin,
    ):
        app.include_router(resource.router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    secure(app, settings)
    return app


def serve_promql(
    app: FastAPI,
    client: FiloPyClient,
    service: QueryService,
    registry: CollectorRegistry | None = None,
) -> None:
    """Prometheus' query API on `app` (docs/query.md), answered by `service`: every endpoint
    under /api/v1 (the dataset a parameter) and under /promql/{dataset}/api/v1; `query` and
    `query_range` called directly (`DirectQueries`)."""
    registry = registry or CollectorRegistry()
    limited = service.max_samples or service.max_series  # the tenants' counters only then
    tenants = TenantQueryMetrics.registered(registry) if limited else None
    app.state.promql = PromQL(client, service, query_latency(registry), tenants)
    # Each router under both prefixes, its operations named `promql_{endpoint}_{where}_{method}`.
    for prefix, where in (("/api/v1", "param"), ("/promql/{dataset}/api/v1", "path")):

        def operation_id(route: APIRoute, where: str = where) -> str:
            (method,) = route.methods
            return f"promql_{route.name}_{where}_{method.lower()}"

        for router in (promql_queries.router, promql_status.router):
            app.include_router(router, prefix=prefix, generate_unique_id_function=operation_id)
    app.add_middleware(promql_queries.DirectQueries)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI documents request validation as 422; this API answers 400 (as the spec asks),
    so the schema says so too."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        for item in schema.get("paths", {}).values():
            for op in item.values():
                responses = op.get("responses", {})
                if responses.pop("422", None) is not None and "400" not in responses:
                    responses["400"] = {
                        "description": "Bad Request",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ErrorBody"}
                            }
                        },
                    }
        schemas = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema

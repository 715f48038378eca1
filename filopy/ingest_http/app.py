"""The HTTP ingestion endpoints as one router, and the standalone gateway app (`filopy gateway`).

The gateway reads the dataset definitions from the MetaStore (SQLite file or Cassandra, as
configured) every few seconds and writes to Kafka, so several can run behind any load balancer,
apart from the cluster. `filopy serve` mounts the same router, reading definitions from the
singleton.
"""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from filopy.config import Settings
from filopy.dataset import Dataset
from filopy.ingest_http.core import Ingestion
from filopy.ingest_http.influx import influx_router
from filopy.ingest_http.otlp import otlp_router
from filopy.ingest_http.remote_write import remote_write_router
from filopy.store import open_stores


def ingest_router(ingestion: Ingestion) -> APIRouter:
    """Every ingestion endpoint (docs/ingestion-http.md), sharing `ingestion`'s producers."""
    router = APIRouter(on_shutdown=[ingestion.close])
    router.include_router(remote_write_router(ingestion))
    router.include_router(influx_router(ingestion))
    router.include_router(otlp_router(ingestion))
    return router


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
    ingestion = Ingestion(lambda: stored_datasets(settings), settings.gateway)
    app.include_router(ingest_router(ingestion))

    @app.get("/__liveness", tags=["operations"])
    async def liveness() -> dict[str, Any]:
        """200 while this gateway runs."""
        return {"status": "success", "data": "ok"}

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def metrics() -> Response:
        """This gateway's ingestion metrics, Prometheus text format."""
        body = await anyio.to_thread.run_sync(generate_latest, ingestion.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app

"""The standalone ingestion gateway (`filopy gateway`): HTTP ingestion without Ray.

It reads the dataset definitions from the MetaStore (SQLite file or Cassandra, as configured)
every few seconds and writes to Kafka, so several can run behind any load balancer, apart from
the cluster. `filopy serve` mounts the same endpoints, reading definitions from the singleton.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from filopy.config import Settings
from filopy.dataset import Dataset
from filopy.ingest_http.remote_write import RemoteWriteSettings, remote_write_router
from filopy.store import open_stores


def stored_datasets(settings: Settings) -> list[Dataset]:
    """Every dataset definition in the MetaStore, with the cluster's Kafka where it names none."""
    meta, columns = open_stores(settings)
    try:
        datasets = meta.list_datasets()
    finally:
        meta.close()
        columns.close()
    return [d.with_cluster_kafka(settings.kafka.bootstrap_servers) for d in datasets]


def create_gateway_app(settings: Settings, limits: RemoteWriteSettings | None = None) -> FastAPI:
    """The ingestion endpoints alone, with definitions from the MetaStore."""
    app = FastAPI(
        title="FiloPy ingestion gateway",
        summary="Prometheus remote write into FiloPy datasets, routed to Kafka by shard key.",
        version="1",
    )
    app.include_router(remote_write_router(lambda: stored_datasets(settings), limits))

    @app.get("/__liveness", tags=["operations"])
    async def liveness() -> dict[str, Any]:
        """200 while this gateway runs."""
        return {"status": "success", "data": "ok"}

    return app

"""(being written) otlp ingestion endpoints."""

from __future__ import annotations

from fastapi import APIRouter

from filopy.ingest_http.core import Ingestion


def otlp_router(ingestion: Ingestion) -> APIRouter:
    """No routes yet."""
    return APIRouter(tags=["ingestion"])

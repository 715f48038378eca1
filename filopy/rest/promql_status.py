"""The Prometheus query API's endpoints this server answers alone, without the cluster: build
and runtime information, configuration and flags (none), metric metadata and exemplars (none
stored), and formatting a query. Grafana and promtool ask for them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from filopy.rest.errors import BAD_DATA, ApiError
from filopy.rest.promql import (
    CONFIG_YAML,
    MAX_TIME_MS,
    MIN_TIME_MS,
    build_info,
    parse_time,
    runtime_info,
    valid_promql,
)
from filopy.rest.promql_state import add_route, one, params, promql_of, required

router = APIRouter(tags=["query (Prometheus API)"])


async def buildinfo(request: Request, dataset: str | None = None) -> dict[str, Any]:
    return {"status": "success", "data": build_info()}


async def runtimeinfo(request: Request, dataset: str | None = None) -> dict[str, Any]:
    return {"status": "success", "data": runtime_info(promql_of(request).started)}


async def config(request: Request, dataset: str | None = None) -> dict[str, Any]:
    return {"status": "success", "data": {"yaml": CONFIG_YAML}}


async def flags(request: Request, dataset: str | None = None) -> dict[str, Any]:
    """Prometheus' command-line flags: FiloPy has none of them."""
    return {"status": "success", "data": {}}


async def metadata(request: Request, dataset: str | None = None) -> dict[str, Any]:
    """Metric metadata (type, help, unit): FiloPy stores none, so the answer is valid and
    empty, as Prometheus' for a metric it has no metadata of."""
    p = await params(request)
    for name in ("limit", "limit_per_metric"):
        text = one(p, name)
        if text not in (None, ""):
            try:
                int(text)
            except ValueError:  # Prometheus' own words
                raise ApiError(400, BAD_DATA, f"{name} must be a number") from None
    return {"status": "success", "data": {}}


async def query_exemplars(request: Request, dataset: str | None = None) -> dict[str, Any]:
    """Exemplars: FiloPy stores none (remote write drops them), so a valid query gets an
    empty list; an invalid one or bad bounds are 400 as in Prometheus."""
    p = await params(request)
    text = required(p, "query")
    start_text, end_text = one(p, "start"), one(p, "end")
    start = parse_time(start_text, "start", open_ended=True) if start_text else MIN_TIME_MS
    end = parse_time(end_text, "end", open_ended=True) if end_text else MAX_TIME_MS
    if end < start:
        raise ApiError(400, BAD_DATA, "end timestamp must not be before start timestamp")
    valid_promql(text)
    return {"status": "success", "data": []}


async def format_query(request: Request, dataset: str | None = None) -> dict[str, Any]:
    """The query pretty-printed (`promql-parser`'s printer), for Grafana's "Format query";
    any valid PromQL, also what FiloPy does not evaluate."""
    p = await params(request)
    return {"status": "success", "data": valid_promql(required(p, "query")).prettify()}


add_route(router, "/status/buildinfo", buildinfo, "Build information (for Grafana)", ("GET",))
add_route(router, "/status/runtimeinfo", runtimeinfo, "Runtime information", ("GET",))
add_route(router, "/status/config", config, "Configuration (none: an empty YAML)", ("GET",))
add_route(router, "/status/flags", flags, "Command-line flags (none)", ("GET",))
add_route(router, "/metadata", metadata, "Metric metadata (none stored: empty)", ("GET",))
add_route(router, "/query_exemplars", query_exemplars, "Exemplars (none stored)", ("GET", "POST"))
add_route(router, "/format_query", format_query, "The query pretty-printed", ("GET", "POST"))

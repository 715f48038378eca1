"""Prometheus' TSDB admin calls on a dataset: `delete_series` (whole series, from every shard's
memory and the store) and `clean_tombstones` (nothing to clean: deletes leave no tombstones to
compact). Admin scope (filopy/auth.py). docs/lifecycle.md, "Deleting series"."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from filopy.rest.deps import ClusterDep, errors
from filopy.rest.errors import BAD_DATA, ApiError
from filopy.rest.promql import parse_matchers, parse_time
from filopy.rest.promql_state import one, params

router = APIRouter(tags=["query (Prometheus API)"])
PREFIX = "/promql/{dataset}/api/v1/admin/tsdb"


def _whole_range(start_text: str | None, end_text: str | None) -> None:
    """FiloPy deletes whole series: a range must reach from the beginning of time (at or
    before the epoch) to now or later; anything narrower is refused rather than widened."""
    now = int(time.time() * 1000)
    start = parse_time(start_text, "start", open_ended=True) if start_text else None
    end = parse_time(end_text, "end", open_ended=True) if end_text else None
    if start is not None and end is not None and end < start:
        raise ApiError(
            400, BAD_DATA, 'invalid parameter "end": end timestamp must not be before start'
        )
    if (start is not None and start > 0) or (end is not None and end < now):
        raise ApiError(
            400,
            BAD_DATA,
            "FiloPy deletes whole series only: omit start and end, or give a start at or before "
            "0 and an end at or after now (deleting part of a series' time range is not "
            "supported)",
        )


async def delete_series(request: Request, dataset: str, cluster: ClusterDep) -> Response:
    """Delete every series any `match[]` selects, from memory and the store of every shard;
    204 as Prometheus. Samples written afterwards with the same labels make a new series."""
    p = await params(request)
    matches = p.get("match[]", [])
    if not matches:
        raise ApiError(400, BAD_DATA, 'invalid parameter "match[]": no match[] parameter provided')
    selectors = [parse_matchers(m) for m in matches]
    if any(not sel for sel in selectors):
        raise ApiError(400, BAD_DATA, 'invalid parameter "match[]": a selector needs a matcher')
    _whole_range(one(p, "start"), one(p, "end"))
    await cluster.dataset(dataset)  # 404 for an unknown dataset
    await cluster.call(cluster.client.delete_series, dataset, selectors)
    return Response(status_code=204)


async def clean_tombstones(dataset: str, cluster: ClusterDep) -> Response:
    """Prometheus compacts deleted data away here; FiloPy's deletes free it at once: 204."""
    await cluster.dataset(dataset)
    return Response(status_code=204)


for _method in ("POST", "PUT"):
    router.add_api_route(
        f"{PREFIX}/delete_series",
        delete_series,
        methods=[_method],
        status_code=204,
        summary="Delete series (Prometheus' delete_series): whole series, admin scope",
        responses=errors(400, 404, 503),
        response_class=Response,
    )
    router.add_api_route(
        f"{PREFIX}/clean_tombstones",
        clean_tombstones,
        methods=[_method],
        status_code=204,
        summary="Prometheus' clean_tombstones: nothing to do",
        responses=errors(404),
        response_class=Response,
    )

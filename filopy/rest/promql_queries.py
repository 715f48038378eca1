"""The Prometheus query API's reads of the cluster's data: instant and range queries, series,
label names and values, and FiloPy's `explain` (docs/query.md)."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from filopy.auth import principal_of
from filopy.rest.errors import BAD_DATA, ApiError, error_response
from filopy.rest.promql import (
    MAX_TIME_MS,
    MIN_TIME_MS,
    JsonAnswer,
    limit_of,
    parse_duration,
    parse_matchers,
    parse_time,
    result_json,
)
from filopy.rest.promql_state import (
    Params,
    PromQL,
    add_route,
    envelope,
    limited,
    one,
    options,
    params,
    promql_of,
    required,
)
from query.service import QueryResult

router = APIRouter(tags=["query (Prometheus API)"])


# The two query endpoints answer a `JsonAnswer` of the body they build (native types only):
# returned as a dict, FastAPI would first walk every point of it in Python
# (`jsonable_encoder`), a good part of a small query's time. The OpenAPI schema is the same.
# Their dataset is the path's or the `dataset` parameter's last value, query string or body
# (FastAPI's `dataset` argument would be the query string's alone).
async def query(request: Request, dataset: str | None = None) -> dict[str, Any]:
    promql = promql_of(request)
    async with promql.timed("query"):
        p = await params(request)
        text = required(p, "query")
        t = one(p, "time")
        at = parse_time(t, "time") if t else int(time.time() * 1000)
        ds = await promql.dataset_of(p, request.path_params.get("dataset"))
        opts = options(p)
        tenant = principal_of(request.scope).tenant
        run = promql.service.instant
        res = promql.counted(await promql.run(lambda: run(ds, text, at, **opts, tenant=tenant)))
        body = envelope(res, result_json(res.value, fragments=True))
        return JsonAnswer(body)  # type: ignore[return-value]


async def query_range(request: Request, dataset: str | None = None) -> dict[str, Any]:
    promql = promql_of(request)
    async with promql.timed("query_range"):
        p = await params(request)
        text = required(p, "query")
        start = parse_time(required(p, "start"), "start")
        end = parse_time(required(p, "end"), "end")
        step = parse_duration(required(p, "step"), "step")
        if step <= 0:
            raise ApiError(
                400,
                BAD_DATA,
                'invalid parameter "step": zero or negative query resolution step widths are '
                "not accepted. Try a positive integer",
            )
        if end < start:
            raise ApiError(
                400, BAD_DATA, 'invalid parameter "end": end timestamp must not be before start'
            )
        ds = await promql.dataset_of(p, request.path_params.get("dataset"))
        opts = options(p)
        tenant = principal_of(request.scope).tenant
        res = promql.counted(
            await promql.run(
                lambda: promql.service.range(ds, text, start, end, step, **opts, tenant=tenant)
            )
        )
        data = result_json(res.value, fragments=True)
        if data["resultType"] == "vector":  # a one-step range is still a matrix
            data = {
                "resultType": "matrix",
                "result": [{"metric": r["metric"], "values": [r["value"]]} for r in data["result"]],
            }
        return JsonAnswer(envelope(res, data))  # type: ignore[return-value]


async def _series(promql: PromQL, p: Params, ds: str, need_match: bool) -> QueryResult:
    matches = p.get("match[]", [])
    if need_match and not matches:
        raise ApiError(400, BAD_DATA, 'invalid parameter "match[]": no match[] parameter provided')
    selectors = [parse_matchers(m) for m in matches] or [()]
    start_text, end_text = one(p, "start"), one(p, "end")
    start = parse_time(start_text, "start", open_ended=True) if start_text else MIN_TIME_MS
    end = parse_time(end_text, "end", open_ended=True) if end_text else MAX_TIME_MS
    partial = options(p)["partial"]
    return await promql.run(
        lambda: promql.service.series(ds, selectors, start, end, partial=partial)
    )


async def series(request: Request, dataset: str | None = None) -> dict[str, Any]:
    promql = promql_of(request)
    p = await params(request)
    limit = limit_of(one(p, "limit"))
    ds = await promql.dataset_of(p, dataset)
    res = await _series(promql, p, ds, need_match=True)
    assert isinstance(res.value, list)
    return limited(res, res.value, limit)


async def labels(request: Request, dataset: str | None = None) -> dict[str, Any]:
    promql = promql_of(request)
    p = await params(request)
    limit = limit_of(one(p, "limit"))
    ds = await promql.dataset_of(p, dataset)
    res = await _series(promql, p, ds, need_match=False)
    names = sorted({k for labels in res.value for k in labels})  # type: ignore[union-attr]
    return limited(res, names, limit)


async def label_values(request: Request, name: str, dataset: str | None = None) -> dict[str, Any]:
    promql = promql_of(request)
    p = await params(request)
    limit = limit_of(one(p, "limit"))
    ds = await promql.dataset_of(p, dataset)
    res = await _series(promql, p, ds, need_match=False)
    found = res.value
    assert isinstance(found, list)
    values = sorted({labels[name] for labels in found if name in labels})
    return limited(res, values, limit)


async def explain(request: Request, dataset: str | None = None) -> dict[str, Any]:
    promql = promql_of(request)
    p = await params(request)
    text = required(p, "query")
    ds = await promql.dataset_of(p, dataset)
    spread = options(p).get("spread")
    plan = await promql.run(lambda: promql.service.explain(ds, text, spread=spread))
    return {"status": "success", "data": plan}


add_route(router, "/query", query, "Instant query (PromQL)", ("GET", "POST"))
add_route(router, "/query_range", query_range, "Range query (PromQL)", ("GET", "POST"))
add_route(router, "/series", series, "Series matching selectors", ("GET", "POST"))
add_route(router, "/labels", labels, "Label names", ("GET", "POST"))
add_route(router, "/label/{name}/values", label_values, "Label values", ("GET",))
add_route(
    router, "/explain", explain, "The plan: shard keys, spread, shards, nodes", ("GET", "POST")
)


QueryEndpoint = Callable[[Request, str | None], Awaitable[Any]]


class DirectQueries:
    """ASGI middleware: `query` and `query_range` (what dashboards call, again and again) call
    their endpoint function directly, without FastAPI's routing through every route of the app,
    dependency solving and exception middleware, a large share of a small query's CPU
    (bench/results/rest_dispatch.txt). The endpoints parse their own parameters and answer a
    `Response`; an `ApiError` is answered as the app's handler answers it. Anything else goes to
    the app."""

    _PATH = re.compile(r"/promql/(?P<dataset>[^/]+)(?P<rest>/api/v1/.*)")
    ENDPOINTS: dict[tuple[str, str], QueryEndpoint] = {
        (method, f"/api/v1/{name}"): fn
        for name, fn in (("query", query), ("query_range", query_range))
        for method in ("GET", "POST")
    }

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, dataset = get_route_path(scope), None
            match = self._PATH.fullmatch(path)
            if match is not None:
                path, dataset = match["rest"], match["dataset"]
            endpoint = self.ENDPOINTS.get((scope["method"], path))
            if endpoint is not None:
                scope["path_params"] = {} if dataset is None else {"dataset": dataset}
                try:
                    response = await endpoint(Request(scope, receive, send), dataset)
                except ApiError as e:
                    response = error_response(e.status, e.error_type, e.message)
                assert isinstance(response, Response)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

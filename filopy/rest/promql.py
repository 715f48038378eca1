"""Prometheus's HTTP query API, so Grafana, promtool and friends query FiloPy unchanged.

Every endpoint exists twice: under `/promql/{dataset}/api/v1/...` (point a Prometheus client at
`http://host:8080/promql/DATASET`), and under `/api/v1/...` with a `dataset` parameter, which may
be left out when the cluster has exactly one dataset. Shapes, error types and `warnings` follow
the Prometheus API; FiloPy adds `spread` (override the dataset's spread for routing),
`partial_response` (answer without unavailable shards, with a warning, instead of failing) and
`/api/v1/explain` (the routing and pushdown plan).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import math
import os
import platform
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import numpy as np
import orjson
import promql_parser as pp
from fastapi import APIRouter, FastAPI, Request
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, Histogram
from starlette.responses import Response
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.client import FiloPyClient
from filopy.rest.errors import BAD_DATA, UNSUPPORTED, ApiError, api_error, error_response
from filopy.rest.models import ErrorBody
from query.promql import QueryError, VectorSelector, depth_bound, parse
from query.service import QueryResult, QueryService
from query.values import RangeVector, Scalar, StepMatrix, String, Value
from store.api import LabelMatcher

R = TypeVar("R")
# 400 bad query or parameter, 404 unknown dataset, 422 execution error, 501 valid PromQL
# FiloPy does not evaluate, 503 shards unavailable.
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 404, 422, 501, 503)
}
_DURATION = re.compile(r"(\d+(ms|[smhdwy]))+")
_DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
    "y": 31_536_000_000,
}
MIN_TIME_MS = -(2**62) // 1000
MAX_TIME_MS = 2**62 // 1000

# Queries run on threads of their own, so the event loop keeps serving while one waits on the
# nodes: a plain executor (its threads start as queries need them), shared by the process's
# routers, bounded as anyio's worker threads are (40), at ~15 us less per call (no capacity
# limiter, run vars or cancel scopes on the way).
QUERY_THREADS = 40
_QUERY_EXECUTOR = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="query")


def format_value(v: float) -> str:
    """A sample value as Prometheus writes it (Go's FormatFloat(v, 'f', -1, 64)): the shortest
    digits that read back as `v`, never in exponent form. `repr` gives those digits (a few
    times faster than NumPy's formatter, and a range query's answer formats every point); only
    its exponent form, NaN and the infinities take the slow path."""
    r = repr(v)
    if r[-2:] == ".0":
        return r[:-2]
    if "e" in r or "n" in r:  # 1e+16, 5e-324, nan, inf
        return _format_slow(v)
    return r


def _format_slow(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, trim="-")


class _Json(Response):
    """A JSON answer rendered by orjson: a range query's matrix is tens of thousands of
    points, which the standard library encodes several times slower."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _ts(ms: int) -> float | int:
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def parse_time(text: str, what: str, *, open_ended: bool = False) -> int:
    """Unix seconds (float) or RFC 3339 to ms. `open_ended` accepts `-Inf`/`+Inf` (as the
    series endpoints do) for the earliest / latest time."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ApiError(
                400,
                BAD_DATA,
                f'invalid parameter "{what}": cannot parse "{text}" to a valid timestamp',
            ) from None
    if open_ended and math.isinf(seconds):
        return MIN_TIME_MS if seconds < 0 else MAX_TIME_MS
    if not math.isfinite(seconds) or not MIN_TIME_MS <= seconds * 1000 <= MAX_TIME_MS:
        raise ApiError(400, BAD_DATA, f'invalid parameter "{what}": "{text}" is out of range')
    return round(seconds * 1000)


def parse_duration(text: str, what: str) -> int:
    """Seconds (float) or a Prometheus duration (`15s`, `1m30s`) to ms."""
    ms: float | None = None
    try:
        ms = float(text) * 1000
    except ValueError:
        if _DURATION.fullmatch(text) and text:
            ms = sum(int(n) * _UNITS_MS[unit] for n, unit in _DURATION_PART.findall(text))
    if ms is None or math.isnan(ms):
        raise ApiError(
            400, BAD_DATA, f'invalid parameter "{what}": cannot parse "{text}" to a valid duration'
        )
    if not math.isfinite(ms) or abs(ms) > MAX_TIME_MS:
        raise ApiError(400, BAD_DATA, f'invalid parameter "{what}": "{text}" is out of range')
    return round(ms)


def parse_matchers(text: str) -> tuple[LabelMatcher, ...]:
    try:
        expr = parse(text)
    except QueryError as e:
        if e.kind == "unsupported":  # a valid selector FiloPy does not evaluate: 501
            raise ApiError(501, UNSUPPORTED, f'parameter "match[]": {e}') from None
        raise ApiError(400, BAD_DATA, f'invalid parameter "match[]": {e}') from None
    if not isinstance(expr, VectorSelector):
        raise ApiError(400, BAD_DATA, f'invalid parameter "match[]": {text!r} is not a selector')
    return expr.matchers


def result_json(value: Value, *, fragments: bool = False) -> dict[str, Any]:
    """The `data` of a query answer, as Prometheus shapes it. With `fragments` (the HTTP
    answer, rendered by orjson), each series' points of a matrix are one pre-encoded
    `orjson.Fragment` instead of a list per point: a range query's tens of thousands of small
    lists would be most of its answer's time, and set off the garbage collector's full
    collections every few queries."""
    if isinstance(value, Scalar):
        return {
            "resultType": "scalar",
            "result": [_ts(int(value.times[-1])), format_value(float(value.values[-1]))],
        }
    if isinstance(value, RangeVector):
        return {
            "resultType": "matrix",
            "result": [
                {
                    "metric": labels,
                    "values": [
                        [_ts(t), format_value(v)]
                        for t, v in zip(ts.tolist(), vals.tolist(), strict=True)
                    ],
                }
                for labels, ts, vals in zip(value.labels, value.ts, value.vals, strict=True)
            ],
        }
    if isinstance(value, String):
        return {"resultType": "string", "result": [_ts(int(value.times[-1])), value.value]}
    assert isinstance(value, StepMatrix)
    if len(value.times) == 1:
        t = _ts(int(value.times[0]))
        vals, has = value.values[:, 0].tolist(), value.present[:, 0].tolist()
        return {
            "resultType": "vector",
            "result": [
                {"metric": labels, "value": [t, format_value(v)]}
                for labels, v, h in zip(value.labels, vals, has, strict=True)
                if h
            ],
        }
    times = [_ts(int(t)) for t in value.times]
    result: list[dict[str, Any]] = []
    fmt = format_value
    if fragments:
        stamps = [orjson.dumps(t).decode() for t in times]
        for labels, row, has in zip(value.labels, value.values, value.present, strict=True):
            if has.all():
                texts = [f'[{t},"{fmt(v)}"]' for t, v in zip(stamps, row.tolist(), strict=True)]
            else:
                texts = [
                    f'[{t},"{fmt(v)}"]'
                    for t, v, h in zip(stamps, row.tolist(), has.tolist(), strict=True)
                    if h
                ]
            if texts:
                points = orjson.Fragment("[" + ",".join(texts) + "]")
                result.append({"metric": labels, "values": points})
        return {"resultType": "matrix", "result": result}
    for labels, row, has in zip(value.labels, value.values, value.present, strict=True):
        points = [
            [t, fmt(v)] for t, v, h in zip(times, row.tolist(), has.tolist(), strict=True) if h
        ]
        if points:
            result.append({"metric": labels, "values": points})
    return {"resultType": "matrix", "result": result}


def _param(
    name: str, description: str, schema: dict[str, Any] | None = None, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema or {"type": "string"},
    }


_TIME = "unix seconds or RFC 3339"
_OPTIONS = [
    _param("spread", "route with this spread instead of the dataset's", {"type": "integer"}),
    _param("partial_response", "leave unavailable shards out, with a warning", {"type": "boolean"}),
    _param("lookback_delta", "lookback for instant selectors (default 5m)"),
]
_MATCH = _param(
    "match[]", "series selector (repeatable)", {"type": "array", "items": {"type": "string"}}
)
_QUERY = _param("query", "PromQL expression", required=True)
_LIMIT = _param(
    "limit", "most entries to return, 0: all (a warning says when cut)", {"type": "integer"}
)
# The parameters each endpoint reads (query string, or a form body on POST), for the OpenAPI
# document: the handlers read them from the request so that GET and POST share one route.
PARAMETERS: dict[str, list[dict[str, Any]]] = {
    "/query": [_QUERY, _param("time", _TIME), *_OPTIONS],
    "/query_range": [
        _QUERY,
        _param("start", _TIME, required=True),
        _param("end", _TIME, required=True),
        _param("step", "seconds or a duration such as 1m", required=True),
        *_OPTIONS,
    ],
    "/series": [
        {**_MATCH, "required": True},
        _param("start", _TIME),
        _param("end", _TIME),
        _LIMIT,
    ],
    "/labels": [_MATCH, _param("start", _TIME), _param("end", _TIME), _LIMIT],
    "/label/{name}/values": [_MATCH, _param("start", _TIME), _param("end", _TIME), _LIMIT],
    "/explain": [_QUERY, _OPTIONS[0]],
    "/status/buildinfo": [],
    "/status/runtimeinfo": [],
    "/status/config": [],
    "/status/flags": [],
    "/metadata": [
        _param("metric", "a metric name"),
        _param("limit", "most metrics to return", {"type": "integer"}),
        _param("limit_per_metric", "most entries per metric", {"type": "integer"}),
    ],
    "/query_exemplars": [_QUERY, _param("start", _TIME), _param("end", _TIME)],
    "/format_query": [_QUERY],
}

# The Prometheus version whose query API FiloPy answers as (its window rules and functions are
# Prometheus 3's): clients such as Grafana pick features by `version`. FiloPy's own version is in
# `filopyVersion` (and `revision`).
PROMETHEUS_API_VERSION = "3.0.0"


def valid_promql(text: str) -> Any:
    """The parser's tree of any valid PromQL (also what FiloPy does not evaluate); 400 else."""
    try:
        depth_bound(text)
        return pp.parse(text)
    except QueryError as e:
        raise ApiError(400, BAD_DATA, f'invalid parameter "query": {e.message}') from None
    except Exception as e:  # the Rust parser raises ValueError
        raise ApiError(400, BAD_DATA, f'invalid parameter "query": {e}') from None


def build_info() -> dict[str, str]:
    """`/api/v1/status/buildinfo`'s data, in Prometheus' shape."""
    try:
        own = importlib.metadata.version("filopy")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        own = "unknown"
    return {
        "version": PROMETHEUS_API_VERSION,
        "revision": f"filopy-{own}",
        "branch": "filopy",
        "buildUser": "filopy",
        "buildDate": "",
        "goVersion": f"none (FiloPy {own}, Python {platform.python_version()})",
        "filopyVersion": own,
    }


# Go's GOMEMLIMIT when none is set (math.MaxInt64), which Prometheus reports as is.
_NO_MEMORY_LIMIT = 2**63 - 1


def rfc3339(t: float) -> str:
    """A time as Go's time.Time marshals to JSON (RFC 3339, UTC, `Z`)."""
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def runtime_info(started: float) -> dict[str, Any]:
    """`/api/v1/status/runtimeinfo`'s data, in Prometheus' shape. FiloPy has no Prometheus
    configuration to reload and is not a Go program: the Go fields say so with neutral values
    (threads for goroutines, CPUs for GOMAXPROCS, no memory limit, empty GOGC/GODEBUG)."""
    return {
        "startTime": rfc3339(started),
        "CWD": os.getcwd(),
        "hostname": socket.gethostname(),
        "serverTime": rfc3339(time.time()),
        "reloadConfigSuccess": True,
        "lastConfigTime": rfc3339(started),
        "corruptionCount": 0,
        "goroutineCount": threading.active_count(),
        "GOMAXPROCS": os.cpu_count() or 1,
        "GOMEMLIMIT": _NO_MEMORY_LIMIT,
        "GOGC": "",
        "GODEBUG": "",
        "storageRetention": "",
    }


# `/api/v1/status/config`: FiloPy has no Prometheus configuration (no scrape jobs, rules or
# alerting); this is a valid, empty YAML document saying where its configuration is.
CONFIG_YAML = (
    "# FiloPy has no Prometheus configuration: no scrape, rule or alerting configuration.\n"
    "# Datasets are defined through /api/v1/datasets; the server's settings are filopy.toml.\n"
)


def limit_of(text: str | None) -> int:
    """Prometheus' `limit` parameter: a non-negative integer, 0 (or none) for no limit."""
    if text in (None, ""):
        return 0
    try:
        limit = int(text)
    except ValueError:
        raise ApiError(
            400, BAD_DATA, f'invalid parameter "limit": {text!r} is not an integer'
        ) from None
    if limit < 0:
        raise ApiError(400, BAD_DATA, 'invalid parameter "limit": limit must be non-negative')
    return limit


QUERY_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def query_latency(registry: CollectorRegistry) -> Histogram:
    """The query API's latency, by endpoint and outcome (ok, or the Prometheus errorType)."""
    return Histogram(
        "filopy_query_duration_seconds",
        "Time to answer a PromQL instant or range query, by endpoint and outcome (ok, or the "
        "error type: bad_data, execution, timeout, unavailable, ...).",
        ["endpoint", "outcome"],
        buckets=QUERY_LATENCY_BUCKETS,
        registry=registry,
    )


def promql_router(
    client: FiloPyClient, service: QueryService, registry: CollectorRegistry | None = None
) -> APIRouter:
    router = APIRouter(tags=["query (Prometheus API)"])
    timeout_s = client.timeout_s
    started = time.time()
    latency = query_latency(registry or CollectorRegistry())

    @asynccontextmanager
    async def timed(endpoint: str) -> AsyncIterator[None]:
        began = time.perf_counter()
        outcome = "ok"
        try:
            yield
        except ApiError as e:
            outcome = e.error_type
            raise
        except Exception:
            outcome = "internal"
            raise
        finally:
            latency.labels(endpoint, outcome).observe(time.perf_counter() - began)

    async def run(fn: Callable[..., R], *args: Any) -> R:
        try:
            return await asyncio.get_running_loop().run_in_executor(_QUERY_EXECUTOR, fn, *args)
        except ApiError:
            raise
        except Exception as e:
            raise api_error(e, timeout_s) from None

    async def params(request: Request) -> dict[str, Any]:
        """Query string and form body together (Prometheus accepts both, GET and POST; the
        body's value wins). A urlencoded body, what every Prometheus client sends, is split
        here: Starlette's form parser costs more than the rest of a small query's request."""
        out: dict[str, Any] = {}
        for k, v in parse_qsl(
            request.scope["query_string"].decode("latin-1"), keep_blank_values=True
        ):
            out.setdefault(k, []).append(v)
        if request.method == "POST":
            kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind == "application/x-www-form-urlencoded":
                pairs = parse_qsl((await request.body()).decode("latin-1"), keep_blank_values=True)
            else:
                pairs = [(k, str(v)) for k, v in (await request.form()).multi_items()]
            for k, v in pairs:
                out.setdefault(k, []).append(v)
        return out

    def one(p: dict[str, Any], name: str, default: str | None = None) -> str | None:
        vals = p.get(name)
        return vals[-1] if vals else default

    def required(p: dict[str, Any], name: str) -> str:
        v = one(p, name)
        if v is None or v == "":
            raise ApiError(400, BAD_DATA, f'invalid parameter "{name}": required')
        return v

    async def dataset_of(p: dict[str, Any], path_dataset: str | None) -> str:
        if path_dataset is not None:
            return path_dataset
        named = one(p, "dataset")
        if named:
            return named
        names = [d.name for d in await run(client.datasets)]
        if len(names) == 1:
            return names[0]
        raise ApiError(
            400,
            BAD_DATA,
            f'invalid parameter "dataset": required when the cluster has {len(names)} datasets '
            "(or query /promql/DATASET/api/v1/...)",
        )

    def options(p: dict[str, Any]) -> dict[str, Any]:
        spread = one(p, "spread")
        out: dict[str, Any] = {
            "partial": (one(p, "partial_response", "false") or "").lower() in ("1", "true"),
        }
        if spread not in (None, ""):
            try:
                out["spread"] = int(spread)
            except ValueError:
                raise ApiError(400, BAD_DATA, f'invalid parameter "spread": {spread!r}') from None
        lookback = one(p, "lookback_delta")
        if lookback:
            out["lookback_ms"] = parse_duration(lookback, "lookback_delta")
            if out["lookback_ms"] <= 0:
                raise ApiError(
                    400, BAD_DATA, 'invalid parameter "lookback_delta": must be positive'
                )
        return out

    def envelope(res: QueryResult, data: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"status": "success", "data": data}
        if res.warnings:
            body["warnings"] = res.warnings
        return body

    def limited(res: QueryResult, data: list[Any], limit: int) -> dict[str, Any]:
        """The envelope of at most `limit` entries (0: all), with Prometheus' warning if cut."""
        body = envelope(res, data[:limit] if limit else data)
        if limit and len(data) > limit:
            body["warnings"] = [*body.get("warnings", []), "results truncated due to limit"]
        return body

    # The two query endpoints answer a `_Json` of the body they build (native types only):
    # returned as a dict, FastAPI would first walk every point of it in Python
    # (`jsonable_encoder`), a good part of a small query's time. The OpenAPI schema is the same.
    async def query(request: Request, dataset: str | None = None) -> dict[str, Any]:
        async with timed("query"):
            return _Json(await _query(request, dataset))  # type: ignore[return-value]

    async def query_range(request: Request, dataset: str | None = None) -> dict[str, Any]:
        async with timed("query_range"):
            return _Json(await _query_range(request, dataset))  # type: ignore[return-value]

    async def _query(request: Request, dataset: str | None) -> dict[str, Any]:
        p = await params(request)
        text = required(p, "query")
        t = one(p, "time")
        at = parse_time(t, "time") if t else int(time.time() * 1000)
        ds = await dataset_of(p, dataset)
        opts = options(p)
        res = await run(lambda: service.instant(ds, text, at, **opts))
        return envelope(res, result_json(res.value, fragments=True))

    async def _query_range(request: Request, dataset: str | None) -> dict[str, Any]:
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
        ds = await dataset_of(p, dataset)
        opts = options(p)
        res = await run(lambda: service.range(ds, text, start, end, step, **opts))
        data = result_json(res.value, fragments=True)
        if data["resultType"] == "vector":  # a one-step range is still a matrix
            data = {
                "resultType": "matrix",
                "result": [{"metric": r["metric"], "values": [r["value"]]} for r in data["result"]],
            }
        return envelope(res, data)

    async def _series(p: dict[str, Any], ds: str, need_match: bool) -> QueryResult:
        matches = p.get("match[]", [])
        if need_match and not matches:
            raise ApiError(
                400, BAD_DATA, 'invalid parameter "match[]": no match[] parameter provided'
            )
        selectors = [parse_matchers(m) for m in matches] or [()]
        start_text, end_text = one(p, "start"), one(p, "end")
        start = parse_time(start_text, "start", open_ended=True) if start_text else MIN_TIME_MS
        end = parse_time(end_text, "end", open_ended=True) if end_text else MAX_TIME_MS
        partial = options(p)["partial"]
        return await run(lambda: service.series(ds, selectors, start, end, partial=partial))

    async def series(request: Request, dataset: str | None = None) -> dict[str, Any]:
        p = await params(request)
        limit = limit_of(one(p, "limit"))
        ds = await dataset_of(p, dataset)
        res = await _series(p, ds, need_match=True)
        assert isinstance(res.value, list)
        return limited(res, res.value, limit)

    async def labels(request: Request, dataset: str | None = None) -> dict[str, Any]:
        p = await params(request)
        limit = limit_of(one(p, "limit"))
        ds = await dataset_of(p, dataset)
        res = await _series(p, ds, need_match=False)
        names = sorted({k for labels in res.value for k in labels})  # type: ignore[union-attr]
        return limited(res, names, limit)

    async def label_values(
        request: Request, name: str, dataset: str | None = None
    ) -> dict[str, Any]:
        p = await params(request)
        limit = limit_of(one(p, "limit"))
        ds = await dataset_of(p, dataset)
        res = await _series(p, ds, need_match=False)
        found = res.value
        assert isinstance(found, list)
        values = sorted({labels[name] for labels in found if name in labels})
        return limited(res, values, limit)

    async def buildinfo(request: Request, dataset: str | None = None) -> dict[str, Any]:
        return {"status": "success", "data": build_info()}

    async def runtimeinfo(request: Request, dataset: str | None = None) -> dict[str, Any]:
        return {"status": "success", "data": runtime_info(started)}

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

    async def explain(request: Request, dataset: str | None = None) -> dict[str, Any]:
        p = await params(request)
        text = required(p, "query")
        ds = await dataset_of(p, dataset)
        spread = options(p).get("spread")
        plan = await run(lambda: service.explain(ds, text, spread=spread))
        return {"status": "success", "data": plan}

    for prefix, where in (("/api/v1", "param"), ("/promql/{dataset}/api/v1", "path")):
        for path, fn, summary, methods in (
            ("/query", query, "Instant query (PromQL)", ("GET", "POST")),
            ("/query_range", query_range, "Range query (PromQL)", ("GET", "POST")),
            ("/series", series, "Series matching selectors", ("GET", "POST")),
            ("/labels", labels, "Label names", ("GET", "POST")),
            ("/label/{name}/values", label_values, "Label values", ("GET",)),
            ("/explain", explain, "The plan: shard keys, spread, shards, nodes", ("GET", "POST")),
            ("/status/buildinfo", buildinfo, "Build information (for Grafana)", ("GET",)),
            ("/status/runtimeinfo", runtimeinfo, "Runtime information", ("GET",)),
            ("/status/config", config, "Configuration (none: an empty YAML)", ("GET",)),
            ("/status/flags", flags, "Command-line flags (none)", ("GET",)),
            ("/metadata", metadata, "Metric metadata (none stored: empty)", ("GET",)),
            ("/query_exemplars", query_exemplars, "Exemplars (none stored)", ("GET", "POST")),
            ("/format_query", format_query, "The query pretty-printed", ("GET", "POST")),
        ):
            for method in methods:
                router.add_api_route(
                    prefix + path,
                    fn,
                    methods=[method],
                    summary=summary,
                    responses=ERRORS,
                    operation_id=f"promql_{fn.__name__}_{where}_{method.lower()}",
                    openapi_extra={"parameters": PARAMETERS[path]},
                )
    return router


QueryEndpoint = Callable[[Request, str | None], Any]


class DirectQueries:
    """ASGI middleware: `query` and `query_range` (what dashboards call, again and again) call
    their endpoint function directly, without FastAPI's routing through every route of the app,
    dependency solving and exception middleware (~0.3 ms of a query answered in ~1.5 ms). The
    endpoints parse their own parameters and answer a `Response`; an `ApiError` is answered as
    the app's handler answers it. Anything else goes to the app."""

    _PATH = re.compile(r"/promql/(?P<dataset>[^/]+)(?P<rest>/api/v1/.*)")

    def __init__(self, app: ASGIApp, endpoints: dict[tuple[str, str], QueryEndpoint]) -> None:
        self.app = app
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, dataset = get_route_path(scope), None
            match = self._PATH.fullmatch(path)
            if match is not None:
                path, dataset = match["rest"], match["dataset"]
            endpoint = self.endpoints.get((scope["method"], path))
            if endpoint is not None:
                try:
                    response = await endpoint(Request(scope, receive, send), dataset)
                except ApiError as e:
                    response = error_response(e.status, e.error_type, e.message)
                assert isinstance(response, Response)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def serve_queries(app: FastAPI, router: APIRouter) -> None:
    """`router`'s endpoints on `app`, `query` and `query_range` called directly
    (`DirectQueries`)."""
    app.include_router(router)
    endpoints: dict[tuple[str, str], QueryEndpoint] = {}
    for route in router.routes:
        if (
            isinstance(route, APIRoute)
            and route.path.startswith("/api/v1/")
            and route.endpoint.__name__ in ("query", "query_range")
        ):
            for method in route.methods:
                endpoints[(method, route.path)] = route.endpoint
    app.add_middleware(DirectQueries, endpoints=endpoints)

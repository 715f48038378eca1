"""Prometheus's HTTP query API, so Grafana, promtool and friends query FiloPy unchanged: its
value and time formats, parameters and fixed answers, shared by its routers
(`filopy.rest.promql_queries`, `filopy.rest.promql_status`) and the CLI.

Every endpoint exists twice: under `/promql/{dataset}/api/v1/...` (point a Prometheus client at
`http://host:8080/promql/DATASET`), and under `/api/v1/...` with a `dataset` parameter, which may
be left out when the cluster has exactly one dataset. Shapes, error types and `warnings` follow
the Prometheus API; FiloPy adds `spread` (override the dataset's spread for routing),
`partial_response` (answer without unavailable shards, with a warning, instead of failing) and
`/api/v1/explain` (the routing and pushdown plan).
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import re
import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
import promql_parser as pp
from starlette.responses import Response

from filopy.rest.errors import BAD_DATA, UNSUPPORTED, ApiError
from filopy.rest.models import ErrorBody
from query.promql import QueryError, VectorSelector, check_at, depth_bound, parse
from query.values import RangeVector, Scalar, StepMatrix, String, Value
from store.api import LabelMatcher

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


class JsonAnswer(Response):
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
        check_at(text)
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

"""Influx line protocol over HTTP into a dataset, at the paths Telegraf's InfluxDB outputs use.

- `POST /ingest/{dataset}/write`: InfluxDB 1.x's write API (`[[outputs.influxdb]]`, the 1.x
  client libraries). `precision` is one of n/ns (default), u/us/µ, ms, s, m, h (1.x takes n, ns,
  u, ms, s, m, h; us and µ are accepted too). `db`, `rp`, `consistency`, `u`/`p` are ignored:
  the dataset is the path's.
- `POST /ingest/{dataset}/api/v2/write`: InfluxDB 2.x's (`[[outputs.influxdb_v2]]`, the 2.x
  clients). `precision` is ns (default), us, ms or s; `org`, `bucket` and the token are ignored.
- `POST /ingest/{dataset}/query`: answers `CREATE DATABASE` (which Telegraf's 1.x output sends at
  start) with InfluxDB's empty success, so nothing is logged as failed; other InfluxQL is 400.
- `GET|HEAD /ingest/{dataset}/ping`: 204 if the dataset exists (404 if not), as InfluxDB's
  `/ping`, with `X-Influxdb-Version`.

Bodies are identity or gzip. Each numeric field of a line is a sample of the series `tags +
{metric: measurement_field}` (just `measurement` for a field named `value`;
`ingest.wire.line_protocol.decode_lines`); a line without a timestamp gets the request's receive
time, truncated to the precision as InfluxDB does. Answers are InfluxDB's, which its senders'
retry logic reads: 204 once Kafka acknowledged every sample; 400 when lines were refused (bad
syntax, timestamps out of range, series over the dataset's limits) after the good lines were
written (a partial write, as InfluxDB 1.x does; 2.x OSS would refuse the whole batch), the
message naming how many samples were written and the first offender; 404 unknown dataset; 413
over a limit (Telegraf's v2 output then splits the batch); 503 + Retry-After when Kafka is slow
or down (retried). Error bodies are 1.x's `{"error": ...}` (with `X-Influxdb-Error`) or 2.x's
`{"code": ..., "message": ...}`. String and boolean fields are valid line protocol that FiloPy
(float samples only) cannot store: they are skipped and counted (`non_numeric` in the
metrics, `X-Filopy-Skipped` in the answer), without failing the request. See
docs/ingestion-http.md.
"""

from __future__ import annotations

import re
import time
from typing import Any, ClassVar
from urllib.parse import parse_qsl

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from core.errors import Unavailable
from filopy.ingest_http.core import (
    Ingestion,
    IngestProtocol,
    Received,
    Refused,
    WriteResult,
    read_body,
)
from ingest.bad_records import BadRecord, Decoded
from ingest.wire.line_protocol import decode_lines

V1_PATH = "/ingest/{dataset}/write"
V2_PATH = "/ingest/{dataset}/api/v2/write"
QUERY_PATH = "/ingest/{dataset}/query"
PING_PATH = "/ingest/{dataset}/ping"
VERSION = "FiloPy"  # the X-Influxdb-Version header (clients' ping() reads it)
SKIPPED_HEADER = "X-Filopy-Skipped"
_QUERY_BODY_LIMIT = 65536

# `precision` as each API spells it -> the unit decoded (ns, us, ms, s; m and h via s).
V1_PRECISIONS: dict[str, str] = {
    "": "ns",
    "n": "ns",
    "ns": "ns",
    "u": "us",
    "us": "us",
    "µ": "us",  # U+00B5 MICRO SIGN
    "μ": "us",  # U+03BC GREEK SMALL LETTER MU
    "ms": "ms",
    "s": "s",
    "m": "m",
    "h": "h",
}
V2_PRECISIONS: dict[str, str] = {"": "ns", "ns": "ns", "us": "us", "ms": "ms", "s": "s"}
_NON_NUMERIC = BadRecord.NON_NUMERIC.value


def header_text(message: str) -> str:
    """A message as an HTTP header value: one line, latin-1 safe, at most 1024 characters."""
    text = message.encode("ascii", "backslashreplace").decode("ascii")
    return re.sub(r"[\x00-\x1f\x7f]", " ", text)[:1024]


class InfluxError(BaseModel):
    """InfluxDB 1.x's error body (the message is also in `X-Influxdb-Error`)."""

    error: str


class InfluxV2Error(BaseModel):
    """InfluxDB 2.x's error body: a code ("invalid", "not found", "request too large",
    "unavailable", ...) and a message."""

    code: str
    message: str


class _LineProtocol(IngestProtocol):
    """One request: its precision comes from the URL, its default timestamp from its arrival."""

    encodings: ClassVar[frozenset[str]] = frozenset({"identity", "gzip"})
    default_encoding: ClassVar[str] = "identity"
    precisions: ClassVar[dict[str, str]]
    precision_help: ClassVar[str]

    def __init__(self, precision: str | None, received_ms: int) -> None:
        self.precision = precision or ""
        self.received_ms = received_ms

    def decode(self, received: Received) -> Decoded:
        unit = self.precisions.get(self.precision)
        if unit is None:
            raise Refused(400, "bad_data", self.precision_help.format(self.precision))
        ds = received.dataset
        return decode_lines(received.body, self.received_ms, ds.metric_column, unit, ds.limits)

    def answer(self, result: WriteResult) -> Response:
        """204 once every sample is acknowledged, even if string or boolean fields were skipped
        (valid line protocol, not storable: counted, named in a header); else 400."""
        refused = {r: n for r, n in result.rejected.items() if r != _NON_NUMERIC}
        if refused:
            return self.refuse(Refused(400, "bad_data", self.message(result)), result)
        response = Response(status_code=204)
        if result.rejected:
            response.headers[SKIPPED_HEADER] = (
                f"{_NON_NUMERIC}={result.rejected[_NON_NUMERIC]} (string and boolean fields)"
            )
        return response

    def message(self, result: WriteResult) -> str:
        return result.describe()


class InfluxV1(_LineProtocol):
    """InfluxDB 1.x's write API: `{"error": ...}` bodies, `X-Influxdb-Error`."""

    name: ClassVar[str] = "influx_v1"
    precisions: ClassVar[dict[str, str]] = V1_PRECISIONS
    precision_help: ClassVar[str] = 'invalid precision "{}" (use n, ns, u, us, ms, s, m or h)'

    def message(self, result: WriteResult) -> str:
        # InfluxDB's words for "some points were written": Telegraf logs and drops, never retries.
        text = result.describe()
        return f"partial write: {text}" if result.accepted else text

    def refuse(self, refused: Refused, result: WriteResult | None = None) -> Response:
        return v1_error(refused.status, refused.message, refused.retry_after)


_V2_CODES = {
    400: "invalid",
    404: "not found",
    409: "conflict",
    413: "request too large",
    415: "invalid",
    429: "too many requests",
    503: "unavailable",
}


class InfluxV2(_LineProtocol):
    """InfluxDB 2.x's write API: `{"code": ..., "message": ...}` bodies."""

    name: ClassVar[str] = "influx_v2"
    precisions: ClassVar[dict[str, str]] = V2_PRECISIONS
    precision_help: ClassVar[str] = (
        'invalid precision "{}"; valid precision units are ns, us, ms, and s'
    )

    def refuse(self, refused: Refused, result: WriteResult | None = None) -> Response:
        body = {"code": _V2_CODES.get(refused.status, "internal error"), "message": refused.message}
        headers = {"X-Platform-Error-Code": body["code"]}
        if refused.retry_after:
            headers["Retry-After"] = str(refused.retry_after)
        return JSONResponse(body, status_code=refused.status, headers=headers)


def v1_error(status: int, message: str, retry_after: int | None = None) -> Response:
    """InfluxDB 1.x's error answer (`httpError`): JSON body and the message in a header."""
    headers = {"X-Influxdb-Error": header_text(message), "X-Influxdb-Version": VERSION}
    if retry_after:
        headers["Retry-After"] = str(retry_after)
    return JSONResponse({"error": message}, status_code=status, headers=headers)


_CREATE_DATABASE = re.compile(r"\s*create\s+database\s", re.IGNORECASE)


def _statements(q: str) -> list[str]:
    return [s for s in q.split(";") if s.strip()]


def _errors(model: type[BaseModel], texts: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": model, "description": text} for code, text in texts.items()}


_WRITE_ERRORS = {
    400: "Undecodable lines, timestamps out of range or series over the dataset's limits "
    "(the good lines are written: a partial write), or a bad precision.",
    404: "Unknown dataset.",
    409: "The dataset reads another record format from Kafka.",
    413: "Body, samples or series over the limit: send smaller batches.",
    415: "A Content-Encoding other than gzip or identity.",
    503: "Kafka unavailable or slow; retry after Retry-After seconds.",
}
_WRITTEN = {
    "description": "Every sample is acknowledged by Kafka (acks=all). String and boolean "
    "fields, which FiloPy cannot store, are skipped and counted in X-Filopy-Skipped."
}


def _precision_parameter(values: dict[str, str], default: str) -> dict[str, Any]:
    """The `precision` query parameter for the OpenAPI document (read from the URL, not
    validated by FastAPI, so a bad one gets InfluxDB's 400 rather than a 422)."""
    return {
        "parameters": [
            {
                "name": "precision",
                "in": "query",
                "required": False,
                "description": f"The unit of the lines' timestamps (default {default}).",
                "schema": {"type": "string", "enum": list(values)},
            }
        ]
    }


def influx_router(ingestion: Ingestion) -> APIRouter:
    """The Influx line-protocol endpoints (1.x and 2.x write APIs), on the shared ingestion
    state."""
    router = APIRouter(tags=["ingestion"])

    @router.post(
        V1_PATH,
        status_code=204,
        response_class=Response,
        responses={204: _WRITTEN, **_errors(InfluxError, _WRITE_ERRORS)},
        openapi_extra=_precision_parameter(V1_PRECISIONS, "ns"),
    )
    async def influx_write_v1(dataset: str, request: Request) -> Response:
        """Influx line protocol into `dataset`, as InfluxDB 1.x's `/write` (Telegraf's
        `[[outputs.influxdb]]`): `precision` n|ns|u|us|ms|s|m|h; `db`, `rp` ignored. Body
        identity or gzip. 204 only once Kafka acknowledged every sample."""
        received_ms = time.time_ns() // 1_000_000
        protocol = InfluxV1(request.query_params.get("precision"), received_ms)
        return await ingestion.handle(protocol, dataset, request)

    @router.post(
        V2_PATH,
        status_code=204,
        response_class=Response,
        responses={204: _WRITTEN, **_errors(InfluxV2Error, _WRITE_ERRORS)},
        openapi_extra=_precision_parameter(V2_PRECISIONS, "ns"),
    )
    async def influx_write_v2(dataset: str, request: Request) -> Response:
        """Influx line protocol into `dataset`, as InfluxDB 2.x's `/api/v2/write` (Telegraf's
        `[[outputs.influxdb_v2]]`): `precision` ns|us|ms|s; `org`, `bucket` and the token
        ignored. Body identity or gzip. 204 only once Kafka acknowledged every sample."""
        received_ms = time.time_ns() // 1_000_000
        protocol = InfluxV2(request.query_params.get("precision"), received_ms)
        return await ingestion.handle(protocol, dataset, request)

    async def known(dataset: str) -> Response | None:
        """None if `dataset` can be written to, else InfluxDB 1.x's error answer."""
        try:
            await anyio.to_thread.run_sync(ingestion.dataset, dataset)
        except Refused as e:
            return v1_error(e.status, e.message)
        except Unavailable as e:
            return v1_error(503, str(e), ingestion.settings.retry_after_s)
        return None

    @router.get(
        PING_PATH,
        status_code=204,
        response_class=Response,
        responses={
            204: {"description": "The dataset exists; `X-Influxdb-Version` names the server."},
            **_errors(InfluxError, {404: "Unknown dataset.", 409: "Not written by the gateway."}),
            503: {"model": InfluxError, "description": "The definitions cannot be read."},
        },
    )
    async def influx_ping(dataset: str) -> Response:
        """InfluxDB's `/ping` for clients that check the server first: 204 if `dataset`
        exists."""
        return await known(dataset) or Response(
            status_code=204, headers={"X-Influxdb-Version": VERSION}
        )

    @router.head(PING_PATH, include_in_schema=False)
    async def influx_ping_head(dataset: str) -> Response:
        refused = await known(dataset)
        status = refused.status_code if refused else 204
        return Response(status_code=status, headers={"X-Influxdb-Version": VERSION})

    @router.api_route(QUERY_PATH, methods=["GET", "POST"], include_in_schema=False)
    async def influx_query(dataset: str, request: Request) -> Response:
        """`CREATE DATABASE` (Telegraf's 1.x output and 1.x clients send it before writing)
        answered as InfluxDB does when it succeeds; FiloPy's dataset is the path's. Any other
        InfluxQL is refused: FiloPy answers PromQL, at /api/v1/query."""
        try:
            body = await read_body(request, _QUERY_BODY_LIMIT)
        except Refused as e:
            return v1_error(e.status, e.message)
        q = request.query_params.get("q")
        if q is None and "form" in request.headers.get("content-type", ""):
            q = dict(parse_qsl(body.decode("utf-8", "replace"))).get("q")
        if not q:
            return v1_error(400, 'missing required parameter "q"')
        statements = _statements(q)
        if not statements or not all(_CREATE_DATABASE.match(s) for s in statements):
            return v1_error(
                400,
                "FiloPy's Influx endpoints take writes only (and CREATE DATABASE, which does "
                f"nothing): query dataset {dataset!r} with PromQL at /api/v1/query",
            )
        refused = await known(dataset)
        if refused is not None:
            return refused
        results = [{"statement_id": i} for i in range(len(statements))]
        return JSONResponse({"results": results}, headers={"X-Influxdb-Version": VERSION})

    return router

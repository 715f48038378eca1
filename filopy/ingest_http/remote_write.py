"""Prometheus remote write 1.0 into a dataset: `POST /ingest/{dataset}/api/v1/write`.

A request is a snappy-compressed (block format) protobuf `prometheus.WriteRequest`. Its samples
go through `ingest.gateway.Gateway`, so each series lands on the Kafka partition of its shard
(shard key, spread and per-key overrides, as everywhere else), and the answer waits for Kafka:

* 204 once every sample of the request is acknowledged by all in-sync replicas (acks=all);
* 400 with a message for a body that is not snappy + WriteRequest, and for series breaking the
  dataset's contract (no metric name, over `Dataset.limits`, timestamps out of range) or native
  histograms, which FiloPy cannot store: the other samples of the request are written first
  (acknowledged), as Prometheus' own receiver does, and senders do not retry a 4xx;
* 404 for an unknown dataset; 409 for a dataset that does not read the gateway's format;
* 413 for a body over the size limit (compressed or decompressed); 415 for another encoding
  or for remote write 2.0 (not yet supported);
* 503 with Retry-After when Kafka does not acknowledge in time or cannot be reached: senders
  retry it.

`__name__` becomes the dataset's metric column (`_metric_` by default; PromQL's `__name__`
maps back to it); every other label is kept as is. Exemplars and metadata are accepted and
dropped. See docs/ingestion-http.md.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import anyio
import cramjam
import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from google.protobuf.message import DecodeError
from pydantic import BaseModel

from filopy.dataset import Dataset, RecordFormat
from filopy.errors import Conflict, FiloPyError, NotFound, Unavailable
from filopy.hashing import PROMETHEUS_METRIC_LABEL
from filopy.ingest_http.prompb.remote_pb2 import WriteRequest
from ingest.bad_records import DEFAULT_TS_RANGE, SERIES_REASONS, BadRecord, series_problem
from ingest.batch import Labels, SampleBatch
from ingest.gateway import Gateway, GatewayError

log = logging.getLogger("filopy.ingest_http")

PATH = "/ingest/{dataset}/api/v1/write"
DEFAULT_MAX_BODY_BYTES = 16 << 20  # compressed; Prometheus sends far smaller requests
DEFAULT_MAX_DECODED_BYTES = 128 << 20  # after snappy, before protobuf
DEFAULT_ACK_TIMEOUT_S = 30.0
DEFAULT_RETRY_AFTER_S = 5
DEFINITIONS_TTL_S = 10.0  # how long a dataset definition is trusted before it is read again


@dataclass(frozen=True, slots=True)
class RemoteWriteSettings:
    """The endpoint's limits and timeouts."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
    ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S
    retry_after_s: int = DEFAULT_RETRY_AFTER_S


class ErrorBody(BaseModel):
    """The error body, shaped as the REST API's (not imported: this runs without the REST app)."""

    status: str = "error"
    errorType: str
    error: str


class _Refused(Exception):
    """Control flow: an answer other than 2xx (status, errorType, message), made here."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message


def _refused(
    status: int, error_type: str, message: str, retry_after: int | None = None
) -> Response:
    body = {"status": "error", "errorType": error_type, "error": message}
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(body, status_code=status, headers=headers)


# ----- decoding ------------------------------------------------------------------------------


def _snappy_length(body: bytes) -> int:
    """The decompressed length a snappy block announces (its leading uvarint)."""
    n = shift = 0
    for i, b in enumerate(body[:10]):
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n
        shift += 7
        if i == 9:
            break
    raise _Refused(400, "bad_data", "the body is not snappy-compressed (bad length header)")


def decode_write_request(body: bytes, max_decoded_bytes: int) -> WriteRequest:
    """A snappy block-compressed protobuf WriteRequest, or `_Refused` (400 or 413)."""
    if not body:
        raise _Refused(400, "bad_data", "empty body: expected a snappy-compressed WriteRequest")
    size = _snappy_length(body)
    if size > max_decoded_bytes:
        raise _Refused(
            413,
            "too_large",
            f"the body decompresses to {size} bytes, over the limit of {max_decoded_bytes}",
        )
    try:
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except Exception as e:
        raise _Refused(
            400, "bad_data", f"the body is not snappy-compressed (block format): {e}"
        ) from None
    request = WriteRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as e:
        raise _Refused(
            400, "bad_data", f"the body is not a protobuf prometheus.WriteRequest: {e}"
        ) from None
    return request


@dataclass(slots=True)
class Converted:
    """A WriteRequest's float samples as a batch, and what could not be taken."""

    batch: SampleBatch
    histograms: int  # native histogram samples (not storable)
    first_histogram: str | None


def to_batch(request: WriteRequest, metric_column: str) -> Converted:
    """Float samples of every series, labels mapped (`__name__` -> the metric column)."""
    series: list[Labels] = []
    counts: list[int] = []
    ts_parts: list[np.ndarray] = []
    val_parts: list[np.ndarray] = []
    histograms = 0
    first_histogram = None
    for ts in request.timeseries:
        labels = {
            (metric_column if lb.name == PROMETHEUS_METRIC_LABEL else lb.name): lb.value
            for lb in ts.labels
        }
        if ts.histograms:
            histograms += len(ts.histograms)
            first_histogram = first_histogram or _show(labels)
        n = len(ts.samples)
        if not n:
            continue
        series.append(labels)
        counts.append(n)
        samples = ts.samples
        ts_parts.append(np.fromiter((s.timestamp for s in samples), np.int64, n))
        val_parts.append(np.fromiter((s.value for s in samples), np.float64, n))
    if not series:
        return Converted(SampleBatch.empty(), histograms, first_histogram)
    idx = np.repeat(np.arange(len(series), dtype=np.int32), counts)
    batch = SampleBatch(series, idx, np.concatenate(ts_parts), np.concatenate(val_parts))
    return Converted(batch, histograms, first_histogram)


def _show(labels: Mapping[str, str]) -> str:
    shown = ", ".join(f"{k}={v!r}"[:80] for k, v in list(labels.items())[:6])
    return "{" + shown + (", ..." if len(labels) > 6 else "") + "}"


def first_offender(batch: SampleBatch, dataset: Dataset, reasons: Iterable[str]) -> str:
    """The first series or sample of the batch refused for one of `reasons`, and why."""
    wanted = set(reasons)
    series_reasons = {r.value for r in SERIES_REASONS}
    if wanted & series_reasons:
        for labels in batch.series:
            problem = series_problem(labels, dataset.metric_column, dataset.limits)
            if problem is not None and problem[0].value in wanted:
                return f"{problem[1]}; series {_show(labels)}"
    if BadRecord.TIMESTAMP_RANGE.value in wanted:
        lo, hi = DEFAULT_TS_RANGE
        bad = np.flatnonzero((batch.timestamps < lo) | (batch.timestamps > hi))
        if len(bad):
            i = int(bad[0])
            labels = batch.series[int(batch.series_idx[i])]
            return (
                f"timestamp {int(batch.timestamps[i])} ms is outside [{lo}, {hi}]; "
                f"series {_show(labels)}"
            )
    return "samples refused: " + ", ".join(sorted(wanted))


# ----- gateways --------------------------------------------------------------------------------


class GatewayPool:
    """Idle `Gateway`s per dataset (a Gateway is one producer, not thread-safe): a request
    takes one, sends, waits for Kafka's acks, and gives it back. A gateway whose messages failed
    is dropped, never reused (its failure would poison later requests)."""

    def __init__(self, settings: RemoteWriteSettings) -> None:
        self._settings = settings
        self._idle: dict[str, queue.SimpleQueue[Gateway]] = {}
        self._lock = threading.Lock()

    def _take(self, dataset: Dataset) -> Gateway:
        with self._lock:
            idle = self._idle.setdefault(dataset.name, queue.SimpleQueue())
        while True:
            try:
                gw = idle.get_nowait()
            except queue.Empty:
                break
            if gw.dataset == dataset:
                return gw
            _close_quietly(gw)  # the definition changed
        return Gateway(
            dataset,
            timeout_s=min(10.0, self._settings.ack_timeout_s),
            producer_config={"message.timeout.ms": int(self._settings.ack_timeout_s * 1000)},
        )

    def write(self, dataset: Dataset, batch: SampleBatch) -> tuple[int, dict[str, int]]:
        """Send and wait for every ack; (samples acked, skipped per reason). Blocking."""
        gw = self._take(dataset)
        before = gw.skipped
        try:
            accepted = gw.send_batch(batch)
            gw.flush(self._settings.ack_timeout_s)
        except BaseException:
            _close_quietly(gw, timeout_s=0)
            raise
        skipped = {r: n - before.get(r, 0) for r, n in gw.skipped.items() if n > before.get(r, 0)}
        self._idle[dataset.name].put(gw)
        return accepted, skipped

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for q in idle.values():
            while not q.empty():
                _close_quietly(q.get_nowait())


def _close_quietly(gw: Gateway, timeout_s: float = 5.0) -> None:
    try:
        gw.close(timeout_s)
    except Exception as e:  # its samples were answered for already (or refused)
        log.debug("closing a gateway: %s", e)


class Definitions:
    """Dataset definitions by name, read through `load` and kept for a few seconds; an unknown
    name is read again at once (a dataset just created is found)."""

    def __init__(self, load: Callable[[], Iterable[Dataset]], ttl_s: float = DEFINITIONS_TTL_S):
        self._load = load
        self._ttl_s = ttl_s
        self._by_name: dict[str, Dataset] = {}
        self._read_at = -float("inf")
        self._lock = threading.Lock()

    def get(self, name: str) -> Dataset:
        with self._lock:
            fresh = time.monotonic() - self._read_at < self._ttl_s
            if not fresh or name not in self._by_name:
                self._by_name = {d.name: d for d in self._load()}
                self._read_at = time.monotonic()
            ds = self._by_name.get(name)
        if ds is None:
            raise NotFound(f"unknown dataset {name!r}")
        return ds


# ----- the endpoint ---------------------------------------------------------------------------


def remote_write_router(
    datasets: Callable[[], Iterable[Dataset]],
    settings: RemoteWriteSettings | None = None,
) -> APIRouter:
    """The remote-write endpoint; `datasets` lists the definitions (blocking; called on a
    worker thread, at most every few seconds)."""
    settings = settings or RemoteWriteSettings()
    pool = GatewayPool(settings)
    definitions = Definitions(datasets)
    router = APIRouter(tags=["ingestion"], on_shutdown=[pool.close])

    def handle(name: str, body: bytes) -> tuple[int, str]:
        """Blocking: (status, message) for a request whose body was read within limits."""
        try:
            dataset = definitions.get(name)
        except NotFound as e:
            raise _Refused(404, "not_found", str(e)) from None
        if dataset.source.record_format is not RecordFormat.BINARY:
            raise _Refused(
                409,
                "conflict",
                f"dataset {name!r} reads record_format {dataset.source.record_format.value!r} "
                f"from Kafka; the gateway writes {RecordFormat.BINARY.value!r}",
            )
        request = decode_write_request(body, settings.max_decoded_bytes)
        converted = to_batch(request, dataset.metric_column)
        batch = converted.batch
        accepted, skipped = pool.write(dataset, batch) if len(batch) else (0, {})
        problems = []
        if skipped:
            n = sum(skipped.values())
            reasons = ", ".join(f"{r}: {k}" for r, k in sorted(skipped.items()))
            problems.append(
                f"{n} samples refused ({reasons}); first: {first_offender(batch, dataset, skipped)}"
            )
        if converted.histograms:
            problems.append(
                f"{converted.histograms} native histogram samples refused (FiloPy stores float "
                f"samples only); first: series {converted.first_histogram}"
            )
        if problems:
            return 400, f"{accepted} samples written; " + "; ".join(problems)
        return 204, ""

    @router.post(
        PATH,
        status_code=204,
        response_class=Response,
        responses={
            204: {"description": "Every sample is acknowledged by Kafka (acks=all)."},
            400: {"model": ErrorBody, "description": "Undecodable body or refused series."},
            404: {"model": ErrorBody, "description": "Unknown dataset."},
            409: {"model": ErrorBody, "description": "The dataset reads another record format."},
            413: {"model": ErrorBody, "description": "Body over the size limit."},
            415: {"model": ErrorBody, "description": "Not snappy remote write 1.0."},
            503: {"model": ErrorBody, "description": "Kafka unavailable or slow; retry later."},
        },
    )
    async def remote_write(dataset: str, request: Request) -> Response:
        """Prometheus remote write 1.0 into `dataset` (snappy-compressed protobuf
        `prometheus.WriteRequest`). 204 only once Kafka acknowledged every sample."""
        encoding = request.headers.get("content-encoding", "snappy").strip().lower()
        if encoding != "snappy":
            return _refused(
                415, "unsupported", f"Content-Encoding {encoding!r}: only snappy is supported"
            )
        ctype = request.headers.get("content-type", "application/x-protobuf")
        if "io.prometheus.write.v2" in ctype:
            return _refused(
                415, "unsupported", "remote write 2.0 is not supported yet; send 1.0 (prompb)"
            )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
            return _refused(
                413,
                "too_large",
                f"the body is {declared} bytes, over the limit of {settings.max_body_bytes}",
            )
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > settings.max_body_bytes:
                return _refused(
                    413,
                    "too_large",
                    f"the body is over the limit of {settings.max_body_bytes} bytes",
                )
            chunks.append(chunk)
        body = b"".join(chunks)
        try:
            status, message = await anyio.to_thread.run_sync(handle, dataset, body)
        except _Refused as e:
            return _refused(e.status, e.error_type, e.message)
        except (GatewayError, Unavailable) as e:
            log.warning("remote write to %r: Kafka unavailable: %s", dataset, e)
            return _refused(503, "unavailable", f"Kafka unavailable: {e}", settings.retry_after_s)
        except Conflict as e:
            return _refused(409, "conflict", str(e))
        except NotFound as e:
            return _refused(404, "not_found", str(e))
        except FiloPyError as e:
            return _refused(400, "bad_data", str(e))
        if status == 204:
            return Response(status_code=204)
        return _refused(status, "bad_data", message)

    return router

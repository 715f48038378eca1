"""What every HTTP ingestion endpoint shares: body limits and decompression, dataset lookup,
writing a batch through `ingest.gateway.Gateway` and waiting for Kafka's acks, limits, metrics.

A protocol (remote write, Influx line protocol, OTLP) only decodes a body into a `Decoded` batch
(through its decoder in `ingest.wire`) and shapes its answers; `Ingestion.handle` does the
rest, so every protocol answers the same faults the same way: 413 over a size or count limit,
404 unknown dataset, 409 a dataset that does not read the gateway's format, 503 + Retry-After
when Kafka does not acknowledge in time.
A 2xx is sent only once Kafka acknowledged every accepted sample (acks=all): it means durable.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import tomllib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar
from zlib import MAX_WBITS

import anyio
import cramjam
import numpy as np
from confluent_kafka import KafkaException
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from isal import isal_zlib
from pydantic import BaseModel
from starlette.datastructures import Headers, QueryParams

from core.config import DEFAULT_CONFIG_FILE, GatewaySettings, KafkaSettings
from core.dataset import Dataset, RecordFormat
from core.errors import Conflict, FiloPyError, Invalid, NotFound, Unavailable
from core.worker import Worker
from filopy.auth import principal_of
from filopy.ingest_http.metrics import IngestMetrics
from filopy.ingest_http.tenants import TENANT_LABEL, OverLimit, TenantLimits
from ingest.bad_records import (
    DEFAULT_TS_RANGE,
    SERIES_REASONS,
    BadRecord,
    Decoded,
    series_problem,
    show_labels,
)
from ingest.batch import SampleBatch
from ingest.gateway import Acks, Gateway, GatewayError

log = logging.getLogger("filopy.ingest_http")

# config/filopy.toml's [gateway] values, for code that builds an app without a Settings object
DEFAULT_SETTINGS = GatewaySettings(**tomllib.loads(DEFAULT_CONFIG_FILE.read_text())["gateway"])


class ErrorBody(BaseModel):
    """The error body, shaped as the REST API's (not imported: this runs without the REST app)."""

    status: str = "error"
    errorType: str
    error: str


class Refused(Exception):
    """An answer other than 2xx: the HTTP status, a short error type and a message for people."""

    def __init__(
        self, status: int, error_type: str, message: str, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Received:
    """One request as a protocol's decoder sees it: the decompressed body and what came with it."""

    body: bytes
    dataset: Dataset
    headers: Headers
    params: QueryParams


@dataclass(slots=True)
class WriteResult:
    """What became of a request's samples: acknowledged by Kafka, or refused (per reason)."""

    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    first_rejected: str | None = None  # the first refused series or sample, and why
    series: int = 0  # distinct series accepted or refused

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected.values())

    def describe(self) -> str:
        """'N samples written; M refused (reason: k, ...); first: ...' for a 4xx message."""
        reasons = ", ".join(f"{r}: {k}" for r, k in sorted(self.rejected.items()))
        first = f"; first: {self.first_rejected}" if self.first_rejected else ""
        return f"{self.accepted} samples written; {self.n_rejected} refused ({reasons}){first}"


class IngestProtocol(ABC):
    """One wire protocol: how a body decodes into samples and how answers look."""

    name: ClassVar[str]  # the `protocol` label of the metrics
    encodings: ClassVar[frozenset[str]] = frozenset({"identity", "gzip"})
    default_encoding: ClassVar[str] = "identity"  # when the request names none

    @abstractmethod
    def decode(self, received: Received) -> Decoded:
        """The request's samples (blocking, on a worker thread). Samples that cannot be stored
        are counted by reason in `batch.bad_records`, the first described in `first_bad`;
        a body that cannot be read at all raises `Invalid` (the decoders') or `Refused` (400)."""

    def check(self, headers: Headers) -> None:  # noqa: B027 - a hook; most protocols need none
        """Refuse a request before its body is read (e.g. an unsupported content type)."""

    def answer(self, result: WriteResult) -> Response:
        """The answer once the accepted samples are durable: 204, or 400 if some were refused
        (Prometheus' receivers do so; senders do not retry a 4xx)."""
        if result.rejected:
            return self.refuse(Refused(400, "bad_data", result.describe()), result)
        return Response(status_code=204)

    def refuse(self, refused: Refused, result: WriteResult | None = None) -> Response:
        """An error answer: JSON `{"status": "error", "errorType", "error"}` by default."""
        body = {"status": "error", "errorType": refused.error_type, "error": refused.message}
        headers = {"Retry-After": str(refused.retry_after)} if refused.retry_after else None
        return JSONResponse(body, status_code=refused.status, headers=headers)


# ----- bodies ----------------------------------------------------------------------------------


def _snappy_length(body: bytes) -> int:
    """The decompressed length a snappy block announces (its leading uvarint)."""
    n = shift = 0
    for b in body[:10]:
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n
        shift += 7
    raise Refused(400, "bad_data", "the body is not snappy-compressed (bad length header)")


def _has_header(body: bytes, encoding: str) -> bool:
    """Whether `body` starts as a gzip member (RFC 1952) or a zlib stream (RFC 1950) does."""
    if encoding == "gzip":
        return body[:3] == b"\x1f\x8b\x08"  # magic, deflate
    return len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """The body decompressed, at most `limit` bytes (413 above), or 400 if it is not what
    `encoding` says."""
    if encoding == "identity":
        return body
    if encoding == "snappy":  # block format, as remote write sends it
        if not body:
            return body
        size = _snappy_length(body)
        if size > limit:
            raise Refused(
                413, "too_large", f"the body decompresses to {size} bytes, over the limit {limit}"
            )
        try:
            return bytes(cramjam.snappy.decompress_raw(body))
        except Exception as e:
            raise Refused(
                400, "bad_data", f"the body is not snappy-compressed (block format): {e}"
            ) from None
    if encoding in ("gzip", "deflate"):  # deflate: a zlib stream, as OTel SDKs send it
        # ISA-L's inflate: zlib's API and answers, faster, and without the GIL
        # (docs/ingestion-http.md)
        if not _has_header(body, encoding):  # (ISA-L would wait for more bytes of a short one)
            raise Refused(400, "bad_data", f"the body is not {encoding}-compressed: no header")
        d = isal_zlib.decompressobj(wbits=16 + MAX_WBITS if encoding == "gzip" else MAX_WBITS)
        try:
            out = d.decompress(body, limit + 1)
        except isal_zlib.error as e:
            raise Refused(400, "bad_data", f"the body is not {encoding}-compressed: {e}") from None
        if len(out) > limit:
            raise Refused(
                413, "too_large", f"the body decompresses to over the limit of {limit} bytes"
            )
        if not d.eof:
            raise Refused(400, "bad_data", f"the {encoding} body is truncated")
        return out
    raise AssertionError(encoding)


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Refused(413, "too_large", f"the body is {declared} bytes, over the limit of {limit}")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, "too_large", f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# ----- gateways and definitions -----------------------------------------------------------------


# How long the producer waits to fill a batch. A request is answered only once Kafka acked its
# messages, so the wait is every request's latency: shorter than the Gateway's default (for bulk
# loads), but not the shortest, as each produce() then wakes librdkafka's broker thread more
# often and costs more (docs/ingestion-http.md, "Linger 2 ms").
LINGER_MS = 2

# Requests are handled on the event loop itself when nothing in them can wait (`Ingestion.
# _inline`): a body of at most INLINE_BYTES decompressed is a few ms of CPU at most, and a
# thread per request cost more than the work: the event loop and the request threads took turns
# on the GIL at every hand-over (docs/ingestion-http.md, "Requests on the event loop").
# Anything larger, or that could wait, goes to a thread.
INLINE_BYTES = 1 << 20
INLINE_BACKLOG = 10_000  # messages queued for Kafka past which a send could block

# [gateway] kafka_compression -> the producer's settings. The gateway leaves the record format's
# bodies uncompressed and librdkafka compresses each partition's batch in its own threads, without
# the GIL, off the event loop (docs/ingestion-http.md, "Kafka compression"). Bulk loads keep
# `Gateway`'s own zstd: their messages are large, and there is no event loop to free.
PRODUCER_COMPRESSION: dict[str, dict[str, object]] = {
    "none": {"compression.type": "none"},
    "gzip": {"compression.type": "gzip", "compression.level": 1},
    "snappy": {"compression.type": "snappy"},
    "lz4": {"compression.type": "lz4"},
    "zstd": {"compression.type": "zstd", "compression.level": 1},
}


class _Shared:
    """One dataset's producer: a Gateway, the lock that serialises sends on it (a Gateway is
    not thread-safe) and the thread serving its delivery reports."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.lock = threading.Lock()
        self._poller = Worker(f"filopy-acks-{gateway.topic}", self._poll)
        self._poller.start()

    def _poll(self) -> None:
        while not self._poller.stopping:
            try:
                self.gateway.poll(0.1)
            except Exception as e:  # a closed producer: the pool replaces this gateway
                log.debug("polling %s: %s", self.gateway.topic, e)
                self._poller.wait(0.1)

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued (at most `timeout_s`), then stop polling (within a poll)."""
        _close_quietly(self.gateway, timeout_s)
        self._poller.stop(timeout=0)


class GatewayPool:
    """One shared `Gateway` per dataset: one Kafka producer carries every request, batching
    across them (requests in flight at once share the broker round trips). A request sends
    under the dataset's lock and then awaits its own messages' acknowledgements (`Acks`), so
    no request waits for another's, and a failed message fails only its own request. A
    gateway that cannot send any more (a fatal producer error, a changed definition) is
    replaced; the old one delivers what it holds in the background."""

    def __init__(
        self, ack_timeout_s: float, kafka_compression: str, kafka: KafkaSettings | None = None
    ) -> None:
        self._ack_timeout_s = ack_timeout_s
        self._kafka_compression = kafka_compression
        self._kafka = kafka  # how the producers connect (None: this process's settings)
        self._shared: dict[str, _Shared] = {}
        self._lock = threading.Lock()

    def _get(self, dataset: Dataset) -> _Shared:
        with self._lock:
            shared = self._shared.get(dataset.name)
            if shared is not None and shared.gateway.dataset == dataset and shared.gateway.usable:
                return shared
            if shared is not None:  # outside the caller's way: it may wait for Kafka
                threading.Thread(target=shared.close, args=(self._ack_timeout_s,)).start()
                del self._shared[dataset.name]
            gateway = Gateway(
                dataset,
                timeout_s=min(10.0, self._ack_timeout_s),
                kafka=self._kafka,
                # bodies left uncompressed: the producer compresses (PRODUCER_COMPRESSION)
                compression_level=0,
                producer_config={
                    "message.timeout.ms": int(self._ack_timeout_s * 1000),
                    "linger.ms": LINGER_MS,
                    **PRODUCER_COMPRESSION[self._kafka_compression],
                },
            )
            shared = self._shared[dataset.name] = _Shared(gateway)
            return shared

    def send(
        self, dataset: Dataset, batch: SampleBatch, acks: Acks, wait: bool = True
    ) -> tuple[int, dict[str, int]] | None:
        """Hand the batch to Kafka (without waiting for acks) and seal `acks`; (samples sent,
        skipped per reason). With `wait=False`, None (nothing sent, `acks` untouched) where
        sending could wait: no usable producer yet (making one asks Kafka), another request
        sending, or more than `INLINE_BACKLOG` messages queued for Kafka (a full queue
        blocks `produce`)."""
        if wait:
            shared = self._get(dataset)
            shared.lock.acquire()
        else:
            found = self._shared.get(dataset.name)
            if found is None or found.gateway.dataset != dataset or not found.gateway.usable:
                return None
            if not found.lock.acquire(blocking=False):
                return None
            shared = found
            if shared.gateway.backlog > INLINE_BACKLOG:
                shared.lock.release()
                return None
        try:
            gw = shared.gateway
            before = gw.skipped
            try:
                accepted = gw.send_batch(batch, acks)
            except KafkaException as e:  # e.g. the producer's queue refuses: retry later
                raise GatewayError(f"Kafka refused a message: {e}") from None
            finally:
                acks.seal()
            after = gw.skipped
        finally:
            shared.lock.release()
        skipped = {r: n - before.get(r, 0) for r, n in after.items() if n > before.get(r, 0)}
        return accepted, skipped

    async def acknowledged(self, acks: Acks, done: asyncio.Future[None]) -> None:
        """Wait until Kafka answered every message of `acks`; `GatewayError` if one failed
        or the answers take longer than the ack timeout."""
        try:
            await asyncio.wait_for(done, self._ack_timeout_s)
        except TimeoutError:
            raise GatewayError(
                f"{acks.pending} of {acks.messages} messages not acknowledged by Kafka within "
                f"{self._ack_timeout_s:g} s"
            ) from None
        if acks.failed:
            raise GatewayError(
                f"{acks.failed} of {acks.messages} messages failed; first: {acks.errors[0]}"
            )

    def close(self) -> None:
        with self._lock:
            shared, self._shared = self._shared, {}
        for one in shared.values():
            one.close(5.0)


def _close_quietly(gw: Gateway, timeout_s: float = 5.0) -> None:
    try:
        gw.close(timeout_s)
    except Exception as e:  # its samples were answered for already (or refused)
        log.debug("closing a gateway: %s", e)


class Definitions:
    """Dataset definitions by name, read through `load` and kept for a few seconds; an unknown
    name is read again at once (a dataset just created is found)."""

    def __init__(self, load: Callable[[], Iterable[Dataset]], ttl_s: float) -> None:
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

    def at_hand(self, name: str) -> Dataset | None:
        """The definition if known and fresh, else None: without waiting (`get` may read
        the store, or wait for another thread reading it)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if time.monotonic() - self._read_at >= self._ttl_s:
                return None
            return self._by_name.get(name)
        finally:
            self._lock.release()


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


# ----- refusals --------------------------------------------------------------------------------


def first_offender(batch: SampleBatch, dataset: Dataset, reasons: Iterable[str]) -> str:
    """The first series or sample of the batch refused by the gateway for one of `reasons`."""
    wanted = set(reasons)
    series_reasons = {r.value for r in SERIES_REASONS}
    if wanted & series_reasons:
        for labels in batch.series:
            problem = series_problem(labels, dataset.metric_column, dataset.limits)
            if problem is not None and problem[0].value in wanted:
                return f"{problem[1]}; series {show_labels(labels)}"
    if BadRecord.TIMESTAMP_RANGE.value in wanted:
        lo, hi = DEFAULT_TS_RANGE
        bad = np.flatnonzero((batch.timestamps < lo) | (batch.timestamps > hi))
        if len(bad):
            i = int(bad[0])
            labels = batch.series[int(batch.series_idx[i])]
            return (
                f"timestamp {int(batch.timestamps[i])} ms is outside [{lo}, {hi}]; "
                f"series {show_labels(labels)}"
            )
    return "samples refused: " + ", ".join(sorted(wanted))


# ----- the shared request path -------------------------------------------------------------------


class Ingestion:
    """The state every endpoint of one app shares: definitions, producers, limits, metrics."""

    def __init__(
        self,
        datasets: Callable[[], Iterable[Dataset]],
        settings: GatewaySettings = DEFAULT_SETTINGS,
        metrics: IngestMetrics | None = None,
        kafka: KafkaSettings | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or IngestMetrics()
        self.definitions = Definitions(datasets, settings.definitions_ttl_s)
        self.pool = GatewayPool(settings.ack_timeout_s, settings.kafka_compression, kafka)
        self.tenants = TenantLimits(
            settings.tenant_samples_per_s,
            settings.tenant_burst_s,
            settings.tenant_active_series,
            settings.tenant_active_window_s,
            settings.retry_after_s,
        )

    def close(self) -> None:
        self.pool.close()

    def dataset(self, name: str) -> Dataset:
        """The dataset the gateway may write to, or 404 / 409."""
        try:
            return self._writable(self.definitions.get(name))
        except NotFound as e:
            raise Refused(404, "not_found", str(e)) from None

    @staticmethod
    def _writable(dataset: Dataset) -> Dataset:
        if dataset.source.record_format is not RecordFormat.BINARY:
            raise Refused(
                409,
                "conflict",
                f"dataset {dataset.name!r} reads record_format "
                f"{dataset.source.record_format.value!r} from Kafka; the gateway writes "
                f"{RecordFormat.BINARY.value!r}",
            )
        return dataset

    def check_limits(self, batch: SampleBatch) -> None:
        s = self.settings
        if len(batch) > s.max_samples_per_request:
            raise Refused(
                413,
                "too_large",
                f"{len(batch)} samples in one request, over the limit of "
                f"{s.max_samples_per_request}: send smaller requests",
            )
        if len(batch.series) > s.max_series_per_request:
            raise Refused(
                413,
                "too_large",
                f"{len(batch.series)} series in one request, over the limit of "
                f"{s.max_series_per_request}: send smaller requests",
            )

    def admit(self, batch: SampleBatch, tenant: str | None) -> None:
        """The tenants' limits (`TenantLimits`): 429 with Retry-After over one, nothing written."""
        try:
            taken = self.tenants.admit(batch, tenant)
        except OverLimit as e:
            self.metrics.tenant_refused.labels(e.tenant, e.limit).inc(len(batch))
            raise Refused(429, "too_many_requests", str(e), e.retry_after_s) from None
        for name, n in taken.items():
            self.metrics.tenant_samples.labels(name).inc(n)

    @staticmethod
    def check_tenant(batch: SampleBatch, tenant: str | None) -> None:
        """A token limited to a tenant writes only series whose `_ws_` is that tenant: one
        other series refuses the whole request (403), before anything of it is written."""
        if tenant is None:
            return
        for labels in batch.series:
            if labels.get(TENANT_LABEL) != tenant:
                raise Refused(
                    403,
                    "forbidden",
                    f"this token writes only {TENANT_LABEL}={tenant!r}; a series has "
                    f"{TENANT_LABEL}={labels.get(TENANT_LABEL)!r}",
                )

    def write(
        self, dataset: Dataset, decoded: Decoded, acks: Acks, tenant: str | None = None
    ) -> WriteResult:
        """Send the decoded samples to Kafka (their acknowledgements arrive in `acks`); what
        was refused is counted, never written."""
        result = self._write(dataset, decoded, acks, wait=True, tenant=tenant)
        assert result is not None  # (a send that may wait always sends)
        return result

    def _write(
        self, dataset: Dataset, decoded: Decoded, acks: Acks, wait: bool, tenant: str | None
    ) -> WriteResult | None:
        """`write`; with `wait=False`, None (nothing sent) where sending could wait
        (`GatewayPool.send`)."""
        batch = decoded.batch
        self.check_limits(batch)
        self.check_tenant(batch, tenant)
        if self.tenants.enabled and len(batch):
            self.admit(batch, tenant)
        rejected = dict(batch.bad_records)
        first = decoded.first_bad
        if len(batch):
            sent = self.pool.send(dataset, batch, acks, wait)
            if sent is None:
                return None
            accepted, skipped = sent
        else:
            accepted, skipped = 0, {}
            acks.seal()
        if skipped:
            for reason, n in skipped.items():
                rejected[reason] = rejected.get(reason, 0) + n
            first = first or first_offender(batch, dataset, skipped)
        return WriteResult(accepted, rejected, first, len(batch.series))

    def _inline(
        self,
        name: str,
        raw: bytes,
        decode: Callable[[Dataset, int], Decoded],
        acks: Acks,
        tenant: str | None,
    ) -> WriteResult | tuple[Dataset, Decoded] | None:
        """A common request handled on the event loop, where nothing in it can wait: its
        definition at hand, its body at most `INLINE_BYTES` decompressed, its producer free
        (`GatewayPool.send`). Then the result; (dataset, decoded) if only the sending could
        wait; None (nothing done) for a request to handle on a thread."""
        if len(raw) > INLINE_BYTES:
            return None
        dataset = self.definitions.at_hand(name)
        if dataset is None:
            return None
        self._writable(dataset)
        try:
            decoded = decode(dataset, min(INLINE_BYTES, self.settings.max_decoded_bytes))
        except Refused as e:
            if e.status == 413:  # over the inline bound (or the limit: the thread says which)
                return None
            raise
        sent = self._write(dataset, decoded, acks, wait=False, tenant=tenant)
        return (dataset, decoded) if sent is None else sent

    async def handle(self, protocol: IngestProtocol, name: str, request: Request) -> Response:
        """Read, decode, write, answer; every outcome counted in the metrics."""
        t0 = time.perf_counter()
        size = 0
        result: WriteResult | None = None
        try:
            encoding = request.headers.get("content-encoding", protocol.default_encoding)
            encoding = encoding.strip().lower() or protocol.default_encoding
            if encoding not in protocol.encodings:
                raise Refused(
                    415,
                    "unsupported",
                    f"Content-Encoding {encoding!r}: this endpoint takes "
                    + ", ".join(sorted(protocol.encodings)),
                )
            protocol.check(request.headers)
            raw = await read_body(request, self.settings.max_body_bytes)
            size = len(raw)

            loop = asyncio.get_running_loop()
            done: asyncio.Future[None] = loop.create_future()
            acks = Acks(lambda _: loop.call_soon_threadsafe(_resolve, done))

            def decode(dataset: Dataset, limit: int) -> Decoded:
                body = decompress(raw, encoding, limit)
                return protocol.decode(
                    Received(body, dataset, request.headers, request.query_params)
                )

            tenant = principal_of(request.scope).tenant

            def blocking() -> WriteResult:
                dataset = self.dataset(name)
                decoded = decode(dataset, self.settings.max_decoded_bytes)
                return self.write(dataset, decoded, acks, tenant)

            sent = self._inline(name, raw, decode, acks, tenant)
            if isinstance(sent, tuple):  # decoded here; the sending could wait
                sent = await anyio.to_thread.run_sync(self.write, *sent, acks, tenant)
            elif sent is None:
                sent = await anyio.to_thread.run_sync(blocking)
            if acks.messages:
                await self.pool.acknowledged(acks, done)
            result = sent
            response = protocol.answer(result)
        except Refused as e:
            response = protocol.refuse(e, result)
        except (GatewayError, Unavailable) as e:
            log.warning("%s to %r: Kafka unavailable: %s", protocol.name, name, e)
            self.metrics.kafka_errors.labels(protocol.name).inc()
            retry = self.settings.retry_after_s
            refused = Refused(503, "unavailable", f"Kafka unavailable: {e}", retry)
            response = protocol.refuse(refused)
        except Conflict as e:
            response = protocol.refuse(Refused(409, "conflict", str(e)))
        except NotFound as e:
            response = protocol.refuse(Refused(404, "not_found", str(e)))
        except Invalid as e:  # a body the protocol's decoder (ingest.wire) cannot read
            response = protocol.refuse(Refused(400, "bad_data", str(e)))
        except FiloPyError as e:
            response = protocol.refuse(Refused(400, "bad_data", str(e)))
        self.metrics.observe(protocol.name, response.status_code, size, result, t0)
        return response

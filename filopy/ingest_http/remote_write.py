"""Prometheus remote write into a dataset: `POST /ingest/{dataset}/api/v1/write`.

A request is a snappy-compressed (block format) protobuf, either remote write 1.0's
`prometheus.WriteRequest` or 2.0's `io.prometheus.write.v2.Request`, told apart by the
Content-Type as the 2.0 spec says: `application/x-protobuf` (or none, or
`;proto=prometheus.WriteRequest`) is 1.0, `;proto=io.prometheus.write.v2.Request` is 2.0; any
other media type or message is 415, as is any encoding but snappy.

The shared path (`core.Ingestion`) routes each series to its shard's Kafka partition and answers
204 only once every sample is acknowledged by Kafka (acks=all); 400 with a message when some
samples were refused (the rest are written first, as Prometheus' own receiver does; senders do
not retry a 4xx); 503 + Retry-After when Kafka is slow or down (senders retry). A 2.0 answer
carries the X-Prometheus-Remote-Write-{Samples,Histograms,Exemplars}-Written headers whenever
the counts are known (2xx and 4xx; not 415, whose request was not negotiated, nor 5xx, when
Kafka may have acknowledged part of the samples). See docs/ingestion-http.md.
"""

from __future__ import annotations

from typing import ClassVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers

from filopy.ingest_http.core import (
    ErrorBody,
    Ingestion,
    IngestProtocol,
    Received,
    Refused,
    WriteResult,
)
from ingest.bad_records import Decoded
from ingest.wire import remote_write_v1, remote_write_v2

PATH = "/ingest/{dataset}/api/v1/write"
MEDIA_TYPE = "application/x-protobuf"
V1_MESSAGE = "prometheus.WriteRequest"
V2_MESSAGE = "io.prometheus.write.v2.Request"
V2_CONTENT_TYPE = f"{MEDIA_TYPE};proto={V2_MESSAGE}"
SAMPLES_WRITTEN = "X-Prometheus-Remote-Write-Samples-Written"
HISTOGRAMS_WRITTEN = "X-Prometheus-Remote-Write-Histograms-Written"
EXEMPLARS_WRITTEN = "X-Prometheus-Remote-Write-Exemplars-Written"


def message_type(content_type: str | None) -> str:
    """The protobuf message a Content-Type names (`V1_MESSAGE` or `V2_MESSAGE`), or 415.
    No Content-Type at all is 1.0, as Prometheus' receiver takes it (old senders)."""
    if not content_type or not content_type.strip():
        return V1_MESSAGE
    media, *params = content_type.split(";")
    if media.strip().lower() != MEDIA_TYPE:
        raise Refused(
            415,
            "unsupported",
            f"Content-Type {content_type!r}: this endpoint takes {MEDIA_TYPE} (remote write 1.0) "
            f"or {V2_CONTENT_TYPE} (remote write 2.0)",
        )
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "proto":
            proto = value.strip().strip('"')
            if proto in (V1_MESSAGE, V2_MESSAGE):
                return proto
            raise Refused(
                415,
                "unsupported",
                f"Content-Type {content_type!r}: unknown message {proto!r}; this endpoint takes "
                f"{V1_MESSAGE} (remote write 1.0) or {V2_MESSAGE} (remote write 2.0)",
            )
    return V1_MESSAGE


def is_v2(headers: Headers) -> bool:
    """A 2.0 request (an unsupported Content-Type is not: 1.0's `check` answers it with 415)."""
    try:
        return message_type(headers.get("content-type")) == V2_MESSAGE
    except Refused:
        return False


class RemoteWrite(IngestProtocol):
    """Remote write 1.0 (and the 415 answer to what is neither 1.0 nor 2.0). Stateless, shared."""

    name: ClassVar[str] = "prometheus_remote_write"
    encodings: ClassVar[frozenset[str]] = frozenset({"snappy"})
    default_encoding: ClassVar[str] = "snappy"

    def check(self, headers: Headers) -> None:
        message_type(headers.get("content-type"))

    def decode(self, received: Received) -> Decoded:
        if not received.body:
            raise Refused(400, "bad_data", "empty body: expected a snappy-compressed WriteRequest")
        return remote_write_v1.decode(received.body, received.dataset.metric_column)


class RemoteWriteV2(IngestProtocol):
    """Remote write 2.0. One instance per request: it keeps the request's exemplar counts from
    `decode` (a worker thread) to `answer`, which the written-headers need."""

    name: ClassVar[str] = "prometheus_remote_write_v2"
    encodings: ClassVar[frozenset[str]] = frozenset({"snappy"})
    default_encoding: ClassVar[str] = "snappy"

    def __init__(self) -> None:
        self.decoded: remote_write_v2.DecodedV2 | None = None

    def decode(self, received: Received) -> Decoded:
        if not received.body:
            raise Refused(400, "bad_data", f"empty body: expected a snappy-compressed {V2_MESSAGE}")
        ds = received.dataset
        self.decoded = remote_write_v2.decode(received.body, ds.metric_column, ds.limits)
        return self.decoded.decoded

    def _written(self, result: WriteResult | None) -> dict[str, str]:
        """The written-headers: what Kafka acknowledged (none if nothing was written)."""
        exemplars = self.decoded.exemplars if result is not None and self.decoded else 0
        samples = result.accepted if result is not None else 0
        return {
            SAMPLES_WRITTEN: str(samples),
            HISTOGRAMS_WRITTEN: "0",  # native histograms are refused
            EXEMPLARS_WRITTEN: str(exemplars),
        }

    def answer(self, result: WriteResult) -> Response:
        """204 once every sample is durable and nothing was refused, else 400 naming what was
        refused (the spec forbids a 2xx if any sample, histogram or exemplar was not written)."""
        refused_exemplars = self.decoded.exemplars_refused if self.decoded else 0
        if result.rejected or refused_exemplars:
            message = result.describe() if result.rejected else f"{result.accepted} samples written"
            if refused_exemplars and self.decoded:
                message += (
                    f"; {refused_exemplars} exemplars refused with their series "
                    f"(first: {self.decoded.first_exemplar_refused})"
                )
            return self.refuse(Refused(400, "bad_data", message), result)
        return Response(status_code=204, headers=self._written(result))

    def refuse(self, refused: Refused, result: WriteResult | None = None) -> Response:
        response = super().refuse(refused, result)
        known = 400 <= refused.status < 500 and refused.status != 415
        if known and isinstance(response, JSONResponse):
            response.headers.update(self._written(result))
        return response


def remote_write_router(ingestion: Ingestion) -> APIRouter:
    """The remote-write endpoint (1.0 and 2.0), on the shared ingestion state."""
    router = APIRouter(tags=["ingestion"])
    v1 = RemoteWrite()

    @router.post(
        PATH,
        status_code=204,
        response_class=Response,
        responses={
            204: {
                "description": "Every sample is acknowledged by Kafka (acks=all). 2.0: with the "
                "X-Prometheus-Remote-Write-*-Written headers."
            },
            400: {
                "model": ErrorBody,
                "description": "Undecodable body, a bad symbol ref (2.0), or refused series or "
                "native histograms (the rest is written; 2.0: the *-Written headers say how much).",
            },
            404: {"model": ErrorBody, "description": "Unknown dataset."},
            409: {"model": ErrorBody, "description": "The dataset reads another record format."},
            413: {"model": ErrorBody, "description": "Body or sample count over the limit."},
            415: {
                "model": ErrorBody,
                "description": "Neither snappy remote write 1.0 nor 2.0 (Content-Type or "
                "Content-Encoding).",
            },
            503: {"model": ErrorBody, "description": "Kafka unavailable or slow; retry later."},
        },
    )
    async def remote_write(dataset: str, request: Request) -> Response:
        """Prometheus remote write 1.0 (`prometheus.WriteRequest`) or 2.0
        (`io.prometheus.write.v2.Request`, by Content-Type) into `dataset`, snappy-compressed
        protobuf. 204 only once Kafka acknowledged every sample."""
        protocol = RemoteWriteV2() if is_v2(request.headers) else v1
        return await ingestion.handle(protocol, dataset, request)

    return router

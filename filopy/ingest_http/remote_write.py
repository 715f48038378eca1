"""Prometheus remote write into a dataset: `POST /ingest/{dataset}/api/v1/write`.

A request is a snappy-compressed (block format) protobuf: remote write 1.0's
`prometheus.WriteRequest` (2.0's `io.prometheus.write.v2.Request` is refused with 415 until it
is supported). The shared path (`core.Ingestion`) routes each series to its shard's Kafka
partition and answers 204 only once every sample is acknowledged by Kafka (acks=all); 400 with a
message when some samples were refused (the rest are written first, as Prometheus' own receiver
does; senders do not retry a 4xx); 503 + Retry-After when Kafka is slow or down (senders retry).
See docs/ingestion-http.md.
"""

from __future__ import annotations

from typing import ClassVar

from fastapi import APIRouter, Request, Response
from starlette.datastructures import Headers

from filopy.ingest_http import remote_write_v1
from filopy.ingest_http.core import ErrorBody, Ingestion, IngestProtocol, Received, Refused
from ingest.bad_records import Decoded

PATH = "/ingest/{dataset}/api/v1/write"
V2_CONTENT_TYPE = "io.prometheus.write.v2.Request"


class RemoteWrite(IngestProtocol):
    name: ClassVar[str] = "prometheus_remote_write"
    encodings: ClassVar[frozenset[str]] = frozenset({"snappy"})
    default_encoding: ClassVar[str] = "snappy"

    def check(self, headers: Headers) -> None:
        if V2_CONTENT_TYPE in headers.get("content-type", ""):
            raise Refused(
                415, "unsupported", "remote write 2.0 is not supported yet; send 1.0 (prompb)"
            )

    def decode(self, received: Received) -> Decoded:
        if not received.body:
            raise Refused(400, "bad_data", "empty body: expected a snappy-compressed WriteRequest")
        return remote_write_v1.decode(received.body, received.dataset.metric_column)


def remote_write_router(ingestion: Ingestion) -> APIRouter:
    """The remote-write endpoint, on the shared ingestion state."""
    router = APIRouter(tags=["ingestion"])
    protocol = RemoteWrite()

    @router.post(
        PATH,
        status_code=204,
        response_class=Response,
        responses={
            204: {"description": "Every sample is acknowledged by Kafka (acks=all)."},
            400: {"model": ErrorBody, "description": "Undecodable body or refused series."},
            404: {"model": ErrorBody, "description": "Unknown dataset."},
            409: {"model": ErrorBody, "description": "The dataset reads another record format."},
            413: {"model": ErrorBody, "description": "Body or sample count over the limit."},
            415: {"model": ErrorBody, "description": "Not snappy remote write 1.0."},
            503: {"model": ErrorBody, "description": "Kafka unavailable or slow; retry later."},
        },
    )
    async def remote_write(dataset: str, request: Request) -> Response:
        """Prometheus remote write 1.0 into `dataset` (snappy-compressed protobuf
        `prometheus.WriteRequest`). 204 only once Kafka acknowledged every sample."""
        return await ingestion.handle(protocol, dataset, request)

    return router

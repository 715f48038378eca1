"""OTLP/HTTP metrics into a dataset: `POST /ingest/{dataset}/v1/metrics`.

The body is an `ExportMetricsServiceRequest`, binary protobuf (`Content-Type:
application/x-protobuf`) or its JSON mapping (`application/json`), identity or gzip. Answers
follow the OTLP spec (https://opentelemetry.io/docs/specs/otlp/#otlphttp), in the request's own
encoding: 200 with an `ExportMetricsServiceResponse` once Kafka acknowledged every accepted sample,
its `partial_success` naming the data points refused and why (senders do not retry those); a
`google.rpc.Status` body with 400 (bad data), 404, 409, 413, 415, or 503 + Retry-After (retried).

The body is decoded by `ingest.wire.otlp` (how metrics become Prometheus series: see there and
docs/ingestion-http.md); this module only negotiates the encoding and shapes the answers.
"""

from __future__ import annotations

from typing import Any, ClassVar

from fastapi import APIRouter, Request, Response
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from starlette.datastructures import Headers

from filopy.ingest_http.core import (
    Ingestion,
    IngestProtocol,
    Received,
    Refused,
    WriteResult,
)
from ingest.bad_records import Decoded
from ingest.wire.otlp import JSON, PROTOBUF, decode

PATH = "/ingest/{dataset}/v1/metrics"
_MEDIA_TYPES = {PROTOBUF: PROTOBUF, "application/protobuf": "application/protobuf", JSON: JSON}

# gRPC codes for the Status body (the spec says clients do not act on them; people read them).
_GRPC_CODE = {400: 3, 404: 5, 409: 9, 413: 8, 415: 3, 429: 8, 503: 14}


# ----- answers ---------------------------------------------------------------------------------


def _status_class() -> type[Message]:
    """`google.rpc.Status` (code, message; no details), built here: googleapis-common-protos is
    not a dependency, and a private pool never clashes with it when it is loaded."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="filopy/ingest_http/otlp_status.proto", package="google.rpc", syntax="proto3"
    )
    msg = fdp.message_type.add(name="Status")
    f = descriptor_pb2.FieldDescriptorProto
    msg.field.add(name="code", number=1, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    msg.field.add(name="message", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("google.rpc.Status"))


Status = _status_class()


def media_type(content_type: str) -> str | None:
    """The OTLP encoding a Content-Type names (parameters ignored), None if neither."""
    return _MEDIA_TYPES.get(content_type.split(";", 1)[0].strip().lower())


class OtlpMetrics(IngestProtocol):
    """One request's protocol: its answers are in the encoding the request came in."""

    name: ClassVar[str] = "otlp"
    encodings: ClassVar[frozenset[str]] = frozenset({"identity", "gzip", "deflate"})
    default_encoding: ClassVar[str] = "identity"

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type
        self.media = media_type(content_type)

    @property
    def answer_type(self) -> str:
        """The request's media type; JSON when it names none OTLP knows (not an OTLP client:
        probably a person, with curl)."""
        return self.media or JSON

    def _body(self, message: Message, status: int = 200) -> Response:
        if self.answer_type == JSON:
            text = json_format.MessageToJson(message, indent=None)
            return Response(text, status_code=status, media_type=JSON)
        return Response(
            message.SerializeToString(), status_code=status, media_type=self.answer_type
        )

    def check(self, headers: Headers) -> None:
        if self.media is None:
            raise Refused(
                415,
                "unsupported",
                f"Content-Type {self.content_type!r}: OTLP/HTTP takes {PROTOBUF} "
                f"(ExportMetricsServiceRequest) or {JSON} (its JSON mapping)",
            )

    def decode(self, received: Received) -> Decoded:
        ds = received.dataset
        return decode(received.body, self.answer_type, ds.metric_column, ds.limits)

    def answer(self, result: WriteResult) -> Response:
        """200 with an ExportMetricsServiceResponse; `partial_success` if some data points were
        refused (senders must not retry them)."""
        response = ExportMetricsServiceResponse()
        if result.rejected:
            reasons = ", ".join(f"{r}: {k}" for r, k in sorted(result.rejected.items()))
            first = f"; first: {result.first_rejected}" if result.first_rejected else ""
            response.partial_success.rejected_data_points = result.n_rejected
            response.partial_success.error_message = (
                f"{result.n_rejected} data points rejected ({reasons}){first}; "
                f"{result.accepted} samples written"
            )
        return self._body(response)

    def refuse(self, refused: Refused, result: WriteResult | None = None) -> Response:
        """A `google.rpc.Status` body; Retry-After on 429 / 503 (which senders retry)."""
        status = Status(code=_GRPC_CODE.get(refused.status, 2), message=refused.message)
        response = self._body(status, refused.status)
        if refused.retry_after:
            response.headers["Retry-After"] = str(refused.retry_after)
        return response


def _error(what: str) -> dict[str, Any]:
    return {
        "description": f"{what} A google.rpc.Status (`code`, `message`), protobuf or JSON as "
        "the request (JSON if its Content-Type is neither).",
        "content": {PROTOBUF: {}, JSON: {}},
    }


# Only the JSON body is described as a schema (an object: the protobuf JSON mapping of
# ExportMetricsServiceRequest); binary protobuf has none to give.
_REQUEST_BODY = {
    "required": True,
    "description": "An ExportMetricsServiceRequest: binary protobuf (Content-Type: "
    f"{PROTOBUF}) or its JSON mapping ({JSON}); Content-Encoding gzip or identity.",
    "content": {
        JSON: {
            "schema": {
                "type": "object",
                "description": "ExportMetricsServiceRequest, protobuf JSON mapping (OTLP/JSON)",
            }
        }
    },
}


def otlp_router(ingestion: Ingestion) -> APIRouter:
    """The OTLP/HTTP metrics endpoint, on the shared ingestion state."""
    router = APIRouter(tags=["ingestion"])

    @router.post(
        PATH,
        response_class=Response,
        openapi_extra={"requestBody": _REQUEST_BODY},
        responses={
            200: {
                "description": "Every accepted sample is acknowledged by Kafka (acks=all): an "
                "ExportMetricsServiceResponse, with partial_success naming refused data points.",
                "content": {PROTOBUF: {}, JSON: {}},
            },
            400: _error("Undecodable body."),
            404: _error("Unknown dataset."),
            409: _error("The dataset reads another record format."),
            413: _error("Body, samples or series over the limit."),
            415: _error("Not protobuf or JSON, or not gzip / identity."),
            503: _error("Kafka unavailable or slow: retry after Retry-After seconds."),
        },
    )
    async def otlp_metrics(dataset: str, request: Request) -> Response:
        """OTLP/HTTP metrics into `dataset`: an ExportMetricsServiceRequest as protobuf
        (`application/x-protobuf`) or JSON (`application/json`), gzip or identity."""
        protocol = OtlpMetrics(request.headers.get("content-type", ""))
        return await ingestion.handle(protocol, dataset, request)

    return router

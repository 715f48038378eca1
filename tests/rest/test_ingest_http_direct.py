"""The write endpoints called directly (`filopy.ingest_http.app.DirectWrites`, as `filopy
gateway` serves them) answer exactly as through FastAPI's routing: every status, body and
header, for good requests (written to the real Kafka) and bad ones of every protocol; other
methods and paths still reach the routes."""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Iterator

import cramjam
import httpx
import pytest
from fastapi import FastAPI

from core.dataset import Dataset, SourceSettings
from filopy.ingest_http import Ingestion, ingest_router
from filopy.ingest_http.app import DirectWrites, serve_ingestion
from filopy.ingest_http.core import DEFAULT_SETTINGS
from ingest.topics import ensure_topic
from ingest.wire.prompb.remote_pb2 import WriteRequest
from tests.rest.conftest import ServerThread

pytestmark = [pytest.mark.kafka]

T0 = 1_700_000_000_000


def _rw1() -> bytes:
    req = WriteRequest()
    for i in range(20):
        ts = req.timeseries.add()
        for name, value in (("__name__", "up"), ("i", str(i)), ("job", "x")):
            lb = ts.labels.add()
            lb.name, lb.value = name, value
        s = ts.samples.add()
        s.value, s.timestamp = float(i % 3), T0 + i
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


RW = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
LP = "\n".join(f"cpu,host=h{i} value={i}.5 {T0 + i}" for i in range(20)).encode()
OTLP_JSON = json.dumps(
    {
        "resourceMetrics": [
            {
                "scopeMetrics": [
                    {
                        "metrics": [
                            {
                                "name": "g",
                                "gauge": {
                                    "dataPoints": [
                                        {"asDouble": 1.5, "timeUnixNano": str(T0 * 1_000_000)}
                                    ]
                                },
                            }
                        ]
                    }
                ]
            }
        ]
    }
).encode()

# (method, path with {ds}, headers, body)
REQUESTS: list[tuple[str, str, dict[str, str], bytes]] = [
    ("POST", "/ingest/{ds}/api/v1/write", RW, _rw1()),
    ("POST", "/ingest/{ds}/api/v1/write", {**RW, "Content-Encoding": "gzip"}, _rw1()),
    ("POST", "/ingest/{ds}/api/v1/write", {**RW, "Content-Type": "text/plain"}, _rw1()),
    ("POST", "/ingest/{ds}/api/v1/write", RW, b""),
    ("POST", "/ingest/{ds}/api/v1/write", RW, b"not snappy"),
    ("POST", "/ingest/{ds}/api/v1/write", RW, bytes(cramjam.snappy.compress_raw(b"\xff\xff"))),
    ("POST", "/ingest/nosuch/api/v1/write", RW, _rw1()),
    (
        "POST",
        "/ingest/{ds}/api/v1/write",
        {**RW, "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
        bytes(cramjam.snappy.compress_raw(b"\x0a\x00")),
    ),
    ("POST", "/ingest/{ds}/write?precision=ms", {}, LP),
    ("POST", "/ingest/{ds}/write?precision=ms", {"Content-Encoding": "gzip"}, gzip.compress(LP)),
    ("POST", "/ingest/{ds}/write?precision=xx", {}, LP),
    ("POST", "/ingest/{ds}/write?precision=ms", {}, LP + b"\nbad line\ncpu value=t " + b"1"),
    ("POST", "/ingest/{ds}/write", {"Content-Encoding": "br"}, LP),
    ("POST", "/ingest/nosuch/write", {}, LP),
    ("POST", "/ingest/{ds}/api/v2/write?precision=ms", {}, LP),
    ("POST", "/ingest/{ds}/api/v2/write?precision=ns", {}, b"cpu value=1 1"),
    ("POST", "/ingest/{ds}/v1/metrics", {"Content-Type": "application/json"}, OTLP_JSON),
    ("POST", "/ingest/{ds}/v1/metrics", {"Content-Type": "text/plain"}, OTLP_JSON),
    ("GET", "/ingest/{ds}/api/v1/write", {}, b""),
    ("PUT", "/ingest/{ds}/write", {}, LP),
    ("POST", "/ingest/{ds}/api/v1/write/more", RW, _rw1()),
    ("POST", "/ingest//write", {}, LP),
    ("GET", "/ingest/{ds}/ping", {}, b""),
    ("POST", "/ingest/{ds}/query?q=CREATE+DATABASE+x", {}, b""),
]
_VARYING = {"date", "server"}


@pytest.fixture(scope="module")
def dataset(kafka_bootstrap: str) -> Dataset:
    ds = Dataset(
        name=f"direct{uuid.uuid4().hex[:8]}",
        num_shards=4,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    ensure_topic(ds, kafka_bootstrap)
    return ds


@pytest.fixture(scope="module")
def urls(dataset: Dataset) -> Iterator[tuple[str, str]]:
    """(routed, direct): the same endpoints served by FastAPI's routing alone, and as
    `filopy gateway` serves them."""
    routed, direct = FastAPI(), FastAPI()
    routed.include_router(ingest_router(Ingestion(lambda: [dataset], DEFAULT_SETTINGS)))
    serve_ingestion(direct, Ingestion(lambda: [dataset], DEFAULT_SETTINGS))
    assert any(m.cls is DirectWrites for m in direct.user_middleware)
    with ServerThread(routed) as a, ServerThread(direct) as b:
        yield a, b


def _answer(response: httpx.Response) -> tuple[int, bytes, list[tuple[str, str]]]:
    headers = sorted((k, v) for k, v in response.headers.items() if k not in _VARYING)
    return response.status_code, response.content, headers


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: f"{r[0]} {r[1]}")
def test_direct_writes_answer_as_the_routes(
    request_: tuple[str, str, dict[str, str], bytes], urls: tuple[str, str], dataset: Dataset
) -> None:
    method, path, headers, body = request_
    answers = []
    for url in urls:
        with httpx.Client(base_url=url, timeout=60) as http:
            r = http.request(method, path.format(ds=dataset.name), headers=headers, content=body)
        answers.append(_answer(r))
    assert answers[0] == answers[1]
    assert answers[0][0] != 500, answers[0]

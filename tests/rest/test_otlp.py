"""OTLP/HTTP metrics into `filopy serve`'s app, with the OpenTelemetry Python SDK as the sender.

The SDK's own `OTLPMetricExporter` (opentelemetry-exporter-otlp-proto-http) exports a gauge, an
observable gauge, a counter, an up-down counter and a histogram to
`/ingest/{dataset}/v1/metrics` of a REST server on a real two-node cluster ingesting from the
real Kafka; FiloPy's PromQL API reads back exactly the values recorded, with the names and
labels Prometheus' OTLP receiver gives them. A delta-temporality exporter gets its counter and
histogram points refused in `partial_success`; bad bodies get 4xx with a `google.rpc.Status`.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
from fastapi import FastAPI
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics import _Gauge as Gauge
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from core.dataset import SourceSettings
from filopy import Dataset
from filopy.ingest_http import Ingestion, ingest_router
from filopy.ingest_http.core import DEFAULT_SETTINGS
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, ServerThread, start_rest
from tests.rest.test_cluster import all_active
from tests.waiting import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

CUMULATIVE = {
    t: AggregationTemporality.CUMULATIVE
    for t in (
        Counter,
        UpDownCounter,
        Histogram,
        Gauge,
        ObservableCounter,
        ObservableUpDownCounter,
        ObservableGauge,
    )
}
# What the SDK's OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta gives.
DELTA = CUMULATIVE | {
    Counter: AggregationTemporality.DELTA,
    Histogram: AggregationTemporality.DELTA,
    ObservableCounter: AggregationTemporality.DELTA,
}


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    settings = cluster_settings(
        tmp_path_factory.mktemp("otlp"), "kafka", kafka_bootstrap=kafka_bootstrap
    )
    yield from start_rest(tmp_path_factory.mktemp("otlp"), nodes=2, settings=settings)


def new_dataset(rest: Rest, kafka_bootstrap: str) -> str:
    name = f"otlp{uuid.uuid4().hex[:8]}"
    body = {
        "name": name,
        "num_shards": 4,
        "min_num_nodes": 2,
        "source": {"bootstrap_servers": kafka_bootstrap},
    }
    assert rest.http.post("/api/v1/datasets", json=body).status_code == 201
    rest.wait_for("all shards active", lambda: all_active(rest, name))
    return name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sender:
    """The SDK's exporter behind a periodic reader (which never fires by itself: exports happen
    on `force_flush` and at `shutdown`), and every HTTP response it got."""

    def __init__(
        self,
        url: str,
        resource: Resource,
        temporality: dict[type, AggregationTemporality],
        compression: Compression = Compression.NoCompression,
        timeout_s: float = 30,
    ) -> None:
        self.responses: list[requests.Response] = []
        session = requests.Session()
        session.hooks["response"].append(lambda r, *_a, **_k: self.responses.append(r))
        exporter = OTLPMetricExporter(
            endpoint=url,
            compression=compression,
            session=session,
            timeout=timeout_s,
            preferred_temporality=temporality,
        )
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        self.provider = MeterProvider(resource=resource, metric_readers=[reader])
        self.meter = self.provider.get_meter("filopy.tests.otlp", "1.0")

    def flush(self) -> None:
        assert self.provider.force_flush(30_000)

    def shutdown(self) -> None:
        self.provider.shutdown()


def now_ms() -> int:
    return int(time.time() * 1000)


def query(rest: Rest, name: str, q: str, at_ms: int) -> list[dict[str, Any]]:
    resp = rest.http.get(
        f"/promql/{name}/api/v1/query", params={"query": q, "time": f"{at_ms / 1000:.3f}"}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def instant(rest: Rest, name: str, q: str, at_ms: int) -> dict[str, float]:
    """{labels as sorted JSON: value} of an instant query."""
    return {
        json.dumps(r["metric"], sort_keys=True): float(r["value"][1])
        for r in query(rest, name, q, at_ms)
    }


def key(**labels: str) -> str:
    return json.dumps(labels, sort_keys=True)


def export_response(resp: requests.Response) -> ExportMetricsServiceResponse:
    assert resp.status_code == 200, resp.content
    assert resp.headers["Content-Type"] == "application/x-protobuf"
    out = ExportMetricsServiceResponse()
    out.ParseFromString(resp.content)
    return out


def test_sdk_gauges_counters_histograms_read_back_by_promql(
    rest: Rest, kafka_bootstrap: str
) -> None:
    name = new_dataset(rest, kafka_bootstrap)
    resource = Resource.create(
        {
            "service.name": "checkout",
            "service.namespace": "shop",
            "service.instance.id": "checkout-1",
            "host.name": "box-7",
            "deployment.environment": "test",
        }
    )
    sender = Sender(f"{rest.url}/ingest/{name}/v1/metrics", resource, CUMULATIVE, Compression.Gzip)
    meter = sender.meter
    requests_counter = meter.create_counter("http.server.requests", unit="{request}")
    queue = meter.create_up_down_counter("queue.size", unit="{item}")
    duration = meter.create_histogram(
        "http.server.duration", unit="ms", explicit_bucket_boundaries_advisory=[10, 50, 100]
    )
    temperature = meter.create_gauge("room.temperature", unit="Cel")

    def memory(_options: CallbackOptions) -> list[Observation]:
        return [Observation(1234.5, {"pool": "heap"})]

    def cpu(_options: CallbackOptions) -> list[Observation]:
        return [Observation(0.25)]

    meter.create_observable_gauge("process.memory.usage", [memory], unit="By")
    meter.create_observable_gauge("cpu.utilization", [cpu], unit="1")

    get, post = {"http.method": "GET", "status": 200}, {"http.method": "POST", "status": 500}
    route = {"http.route": "/pay"}
    requests_counter.add(3, get)
    requests_counter.add(2, get)
    requests_counter.add(1, post)
    queue.add(10)
    queue.add(-3)
    for ms in (5, 20, 70, 150, 30):
        duration.record(ms, route)
    temperature.set(21, {"room": "a"})
    t0 = now_ms()
    sender.flush()
    t1 = now_ms()
    requests_counter.add(4, get)
    queue.add(-2)
    duration.record(500, route)
    temperature.set(19, {"room": "a"})
    time.sleep(0.01)  # the exports' times apart by a few ms (so t1 < t2)
    t2 = now_ms()
    sender.shutdown()  # the reader's last collection exports once more
    t3 = now_ms()

    assert len(sender.responses) == 2, [r.status_code for r in sender.responses]
    for resp in sender.responses:
        assert gzip.decompress(resp.request.body)  # the SDK sent gzip
        assert not export_response(resp).HasField("partial_success")

    ids = {"job": "shop/checkout", "instance": "checkout-1"}
    counter, hist = "http_server_requests_total", "http_server_duration_milliseconds"
    get_, post_ = {"http_method": "GET", "status": "200"}, {"http_method": "POST", "status": "500"}
    route_ = {"http_route": "/pay"}

    def expected(
        gets: float, buckets: list[float], total: float, queue_size: float, temp: float
    ) -> dict[str, float]:
        """Every series of the export, as the SDK recorded it so far."""
        out = {
            key(__name__=counter, **get_, **ids): gets,
            key(__name__=counter, **post_, **ids): 1.0,
            key(__name__=f"{hist}_sum", **route_, **ids): total,
            key(__name__=f"{hist}_count", **route_, **ids): buckets[-1],
            key(__name__="queue_size", **ids): queue_size,
            key(__name__="room_temperature_celsius", room="a", **ids): temp,
            key(__name__="process_memory_usage_bytes", pool="heap", **ids): 1234.5,
            key(__name__="cpu_utilization_ratio", **ids): 0.25,
        }
        for le, n in zip(("10", "50", "100", "+Inf"), buckets, strict=True):
            out[key(__name__=f"{hist}_bucket", le=le, **route_, **ids)] = n
        return out

    every = '{__name__=~"http_.*|queue_size|room_.*|process_.*|cpu_.*"}'
    second = expected(9.0, [1.0, 3.0, 4.0, 6.0], 775.0, 5.0, 19.0)
    eventually(lambda: instant(rest, name, every, t3), second)
    # Each export's samples carry the SDK's collection time (time_unix_nano -> ms): the first
    # export's lie in [t0, t1], the second's in [t2, t3].
    assert instant(rest, name, every, t0 - 1) == {}
    first = expected(5.0, [1.0, 3.0, 4.0, 5.0], 275.0, 7.0, 21.0)
    assert instant(rest, name, every, t1) == first
    assert instant(rest, name, every, t2 - 1) == first
    for metric in {json.loads(k)["__name__"] for k in second}:  # two samples a series, no more
        counts = instant(rest, name, f"count_over_time({metric}[1h])", t3)
        assert counts and set(counts.values()) == {2.0}, (metric, counts)

    (target_info,) = query(rest, name, "target_info", t3)
    labels = target_info["metric"]
    assert float(target_info["value"][1]) == 1.0
    assert {k: labels[k] for k in ("job", "instance", "host_name", "deployment_environment")} == {
        **ids,
        "host_name": "box-7",
        "deployment_environment": "test",
    }
    assert labels["telemetry_sdk_language"] == "python"  # the SDK's own resource attributes
    assert not {"service_name", "service_namespace", "service_instance_id"} & set(labels)
    rest.http.delete(f"/api/v1/datasets/{name}")


def test_delta_temporality_is_refused_in_partial_success(rest: Rest, kafka_bootstrap: str) -> None:
    """An exporter preferring delta: its counter and histogram points are refused (200 with
    `partial_success`, which senders do not retry); its gauge is written. This exporter
    compresses with deflate (a zlib stream), the SDK's other compression."""
    name = new_dataset(rest, kafka_bootstrap)
    resource = Resource({"service.name": "batch-job"})
    sender = Sender(f"{rest.url}/ingest/{name}/v1/metrics", resource, DELTA, Compression.Deflate)
    sender.meter.create_counter("jobs.done").add(3, {"queue": "q1"})
    sender.meter.create_histogram("job.duration", unit="s").record(1.5)
    sender.meter.create_gauge("workers").set(4)
    sender.shutdown()  # one export

    (resp,) = sender.responses
    partial = export_response(resp).partial_success
    assert partial.rejected_data_points == 2
    message = partial.error_message
    assert message.startswith("2 data points rejected (delta_temporality: 2); first: "), message
    assert "delta aggregation temporality" in message and message.endswith("1 samples written")
    eventually(
        lambda: instant(rest, name, "workers", now_ms()),
        {key(__name__="workers", job="batch-job"): 4.0},
    )
    assert instant(rest, name, '{__name__=~"jobs.*|job_.*"}', now_ms()) == {}
    rest.http.delete(f"/api/v1/datasets/{name}")


# The OTLP/JSON example of the spec (open-telemetry/opentelemetry-proto examples/metrics.json at
# ac2c4b5, 64-bit integers as strings; reflowed): the SDK sends protobuf only, so OTLP/JSON is
# checked against the spec's own request. Its counter and histogram are delta and it has an
# exponential histogram.
SPEC_JSON_EXAMPLE = """
{"resourceMetrics": [{
  "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "my.service"}}]},
  "scopeMetrics": [{
    "scope": {"name": "my.library", "version": "1.0.0", "attributes": [
      {"key": "my.scope.attribute", "value": {"stringValue": "some scope attribute"}}]},
    "metrics": [
      {"name": "my.counter", "unit": "1", "description": "I am a Counter",
       "sum": {"aggregationTemporality": 1, "isMonotonic": true, "dataPoints": [
         {"asDouble": 5, "startTimeUnixNano": "1544712660300000000",
          "timeUnixNano": "1544712660300000000",
          "attributes": [{"key": "my.counter.attr", "value": {"stringValue": "some value"}}]}]}},
      {"name": "my.gauge", "unit": "1", "description": "I am a Gauge",
       "gauge": {"dataPoints": [
         {"asDouble": 10, "timeUnixNano": "1544712660300000000",
          "attributes": [{"key": "my.gauge.attr", "value": {"stringValue": "some value"}}]}]}},
      {"name": "my.histogram", "unit": "1", "description": "I am a Histogram",
       "histogram": {"aggregationTemporality": 1, "dataPoints": [
         {"startTimeUnixNano": "1544712660300000000", "timeUnixNano": "1544712660300000000",
          "count": "2", "sum": 2, "bucketCounts": ["1","1"], "explicitBounds": [1],
          "min": 0, "max": 2,
          "attributes": [{"key": "my.histogram.attr", "value": {"stringValue": "some value"}}]}]}},
      {"name": "my.exponential.histogram", "unit": "1",
       "description": "I am an Exponential Histogram",
       "exponentialHistogram": {"aggregationTemporality": 1, "dataPoints": [
         {"startTimeUnixNano": "1544712660300000000", "timeUnixNano": "1544712660300000000",
          "count": "3", "sum": 10, "scale": 0, "zeroCount": "1",
          "positive": {"offset": 1, "bucketCounts": ["0","2"]}, "min": 0, "max": 5,
          "zeroThreshold": 0,
          "attributes": [{"key": "my.exponential.histogram.attr",
                          "value": {"stringValue": "some value"}}]}]}}
    ]}]}]}
"""


def status(resp: httpx.Response, code: int, content_type: str = "application/x-protobuf") -> str:
    """The message of a `google.rpc.Status` error body (protobuf or JSON, as the request)."""
    assert resp.status_code == code, resp.content
    assert resp.headers["content-type"] == content_type
    if content_type == "application/json":
        body = resp.json()
        assert set(body) == {"code", "message"}, body
        return body["message"]
    out = Status()
    out.ParseFromString(resp.content)
    assert out.message
    return out.message


def test_json_bad_bodies_and_the_server_keeps_serving(rest: Rest, kafka_bootstrap: str) -> None:
    name = new_dataset(rest, kafka_bootstrap)
    url = f"/ingest/{name}/v1/metrics"
    protobuf = {"Content-Type": "application/x-protobuf"}

    as_json = {"Content-Type": "application/json"}
    resp = rest.http.post(url, content=SPEC_JSON_EXAMPLE, headers=as_json)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    partial = resp.json()["partialSuccess"]
    assert partial["rejectedDataPoints"] == "3"  # int64 as a string, as the JSON mapping says
    assert partial["errorMessage"].startswith("3 data points rejected (delta_temporality: 3)")
    at = 1544712660300
    eventually(
        lambda: instant(rest, name, "my_gauge_ratio", at),
        {key(__name__="my_gauge_ratio", my_gauge_attr="some value", job="my.service"): 10.0},
    )
    empty = rest.http.post(url, content=b"", headers=protobuf)  # an empty request: success
    assert empty.status_code == 200 and empty.content == b""

    not_protobuf = rest.http.post(url, content=b"\xff" * 64, headers=protobuf)
    assert "not a protobuf ExportMetricsServiceRequest" in status(not_protobuf, 400)
    not_json = rest.http.post(url, content=b'{"resourceMetrics": [', headers=as_json)
    assert "not a JSON ExportMetricsServiceRequest" in status(not_json, 400, "application/json")
    truncated = gzip.compress(b"\x0a\x00" * 1000)[:-20]
    cut = rest.http.post(url, content=truncated, headers=protobuf | {"Content-Encoding": "gzip"})
    assert status(cut, 400) == "the gzip body is truncated"
    wrong_type = rest.http.post(url, content=b"x", headers={"Content-Type": "text/plain"})
    assert "Content-Type 'text/plain'" in status(wrong_type, 415, "application/json")
    brotli = rest.http.post(url, content=b"x", headers=protobuf | {"Content-Encoding": "br"})
    assert "Content-Encoding 'br'" in status(brotli, 415)
    unknown = rest.http.post("/ingest/nosuchdataset/v1/metrics", content=b"", headers=protobuf)
    assert status(unknown, 404) == "unknown dataset 'nosuchdataset'"

    # The server keeps serving: the SDK's next export is written.
    sender = Sender(f"{rest.url}{url}", Resource({"service.name": "after"}), CUMULATIVE)
    sender.meter.create_gauge("still.serving").set(1)
    sender.shutdown()
    (resp_ok,) = sender.responses
    assert not export_response(resp_ok).HasField("partial_success")
    eventually(
        lambda: instant(rest, name, "still_serving", now_ms()),
        {key(__name__="still_serving", job="after"): 1.0},
    )
    rest.http.delete(f"/api/v1/datasets/{name}")


def test_unreachable_kafka_is_503_with_retry_after_and_the_sdk_retries() -> None:
    """Kafka not answering: 503 + Retry-After with a Status body; the SDK retries (503 is one
    of OTLP's retryable codes) until its timeout, then gives up."""
    dead = f"127.0.0.1:{free_port()}"
    ds = Dataset(name="otlpdead", num_shards=2, source=SourceSettings(bootstrap_servers=dead))
    limits = DEFAULT_SETTINGS.model_copy(update={"ack_timeout_s": 1.0, "retry_after_s": 1})
    app = FastAPI()
    app.include_router(ingest_router(Ingestion(lambda: [ds], limits)))
    with ServerThread(app) as url:
        sender = Sender(f"{url}/ingest/otlpdead/v1/metrics", Resource({}), CUMULATIVE, timeout_s=8)
        sender.meter.create_gauge("lost").set(1)
        sender.shutdown()
    assert len(sender.responses) >= 2, [r.status_code for r in sender.responses]
    for resp in sender.responses:
        assert resp.status_code == 503
        assert resp.headers["Retry-After"] == "1"
        out = Status()
        out.ParseFromString(resp.content)
        assert out.message.startswith(f"Kafka unavailable: Kafka at {dead}"), out.message

"""Prometheus remote write 1.0 into `filopy serve`'s app, with a real Prometheus as the sender.

A real Prometheus server (Debian's /usr/bin/prometheus) scrapes its own /metrics every second
and remote-writes to `/ingest/{dataset}/api/v1/write` of a REST server on a real two-node
cluster ingesting from the real Kafka. The series and per-series sample counts FiloPy holds for
a range equal what Prometheus' own query API reports for that range.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import cramjam
import httpx
import pytest
from fastapi import FastAPI

from core.dataset import SourceSettings
from filopy import Dataset
from filopy.ingest_http import Ingestion, create_gateway_app, ingest_router
from filopy.ingest_http.core import DEFAULT_SETTINGS
from ingest.wire.prompb.remote_pb2 import WriteRequest
from tests import prometheus
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, ServerThread, start_rest
from tests.rest.test_cluster import all_active
from tests.waiting import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.ray]


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    settings = cluster_settings(
        tmp_path_factory.mktemp("rw"), "kafka", kafka_bootstrap=kafka_bootstrap
    )
    yield from start_rest(tmp_path_factory.mktemp("rw"), nodes=2, settings=settings)


def new_dataset(rest: Rest, kafka_bootstrap: str) -> str:
    name = f"rw{uuid.uuid4().hex[:8]}"
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


def held_counts(rest: Rest, name: str, until_ms: int) -> dict[str, int]:
    """Per series FiloPy holds (Prometheus' labels, as JSON): samples at or before `until_ms`."""
    out: dict[str, int] = {}
    for per_series in rest.client.series_samples(name).values():
        for key, timestamps in per_series.items():
            labels = json.loads(key)
            labels["__name__"] = labels.pop("_metric_")
            n = sum(1 for t in timestamps if t <= until_ms)
            if n:
                out[json.dumps(labels, sort_keys=True)] = n
    return out


@pytest.mark.parametrize("server", ["serve", "gateway"])
def test_prometheus_remote_write_series_and_samples_match(
    rest: Rest, kafka_bootstrap: str, tmp_path: Path, server: str
) -> None:
    """`serve`: the endpoint of the REST app (`filopy serve` / `filopy up`); `gateway`: the
    standalone app of `filopy gateway`, reading definitions from the store, without Ray."""
    name = new_dataset(rest, kafka_bootstrap)
    if server == "serve":
        send_to(rest.url, rest, name, kafka_bootstrap, tmp_path)
    else:
        with ServerThread(create_gateway_app(rest.cluster.settings)) as url:
            send_to(url, rest, name, kafka_bootstrap, tmp_path)


def send_to(base_url: str, rest: Rest, name: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    port = free_port()
    config = f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["127.0.0.1:{port}"]
remote_write:
  - url: {base_url}/ingest/{name}/api/v1/write
{prometheus.QUEUE}
"""
    with prometheus.running(config, tmp_path, port) as prom:
        rest.wait_for("8 scrapes", lambda: prom.scrapes() >= 8, timeout_s=60)
        end_ms = int(time.time() * 1000)
        end = end_ms / 1000
        rest.wait_for("samples after the range sent", lambda: prom.sent_past(end + 1), timeout_s=60)
        want = prom.series_counts('{job="prometheus"}', at=end)
        assert prom.stop() == 0
    assert len(want) > 100 and sum(want.values()) > 8 * 100  # a real, varied workload
    assert "non-recoverable error" not in prom.log(), prom.log()[-3000:]

    eventually(lambda: held_counts(rest, name, end_ms), want)
    rest.http.delete(f"/api/v1/datasets/{name}")


def test_bad_bodies_are_400_with_a_message_and_unknown_datasets_404(
    rest: Rest, kafka_bootstrap: str
) -> None:
    name = new_dataset(rest, kafka_bootstrap)
    url = f"/ingest/{name}/api/v1/write"
    headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}

    def refused(resp: httpx.Response, status: int) -> str:
        assert resp.status_code == status, resp.text
        body = resp.json()
        assert body["status"] == "error" and body["error"]
        return body["error"]

    garbage = rest.http.post(url, content=b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")
    assert "snappy" in refused(garbage, 400)
    not_snappy = rest.http.post(url, content=b"hello, world", headers=headers)
    assert "snappy" in refused(not_snappy, 400)
    not_protobuf = rest.http.post(
        url, content=bytes(cramjam.snappy.compress_raw(b"\xff" * 64)), headers=headers
    )
    assert "WriteRequest" in refused(not_protobuf, 400)
    assert "empty body" in refused(rest.http.post(url, content=b"", headers=headers), 400)
    huge = rest.http.post(url, content=b"\0" * ((16 << 20) + 1), headers=headers)
    assert "over the limit" in refused(huge, 413)

    request = WriteRequest()
    good = request.timeseries.add()
    good.labels.add(name="__name__", value="up")
    good.labels.add(name="job", value="a")
    good.samples.add(value=1.0, timestamp=1_700_000_000_000)
    nameless = request.timeseries.add()
    nameless.labels.add(name="job", value="b")
    nameless.samples.add(value=2.0, timestamp=1_700_000_000_000)
    body = bytes(cramjam.snappy.compress_raw(request.SerializeToString()))

    unknown = rest.http.post("/ingest/nosuchdataset/api/v1/write", content=body, headers=headers)
    assert refused(unknown, 404) == "unknown dataset 'nosuchdataset'"
    message = refused(rest.http.post(url, content=body, headers=headers), 400)
    assert message.startswith("1 samples written; 1 refused (no_metric: 1); first: "), message
    assert "job='b'" in message

    v2 = rest.http.post(
        url,
        content=body,
        headers=headers
        | {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
    )
    assert "prometheus.WriteRequest" in refused(v2, 400)  # a 1.0 body sent as 2.0
    gzip = rest.http.post(url, content=body, headers=headers | {"Content-Encoding": "gzip"})
    assert "snappy" in refused(gzip, 415)

    # The good series was written (and acknowledged) despite the 400; the server keeps serving.
    rest.wait_for("the good sample", lambda: held_counts(rest, name, 2**62) != {}, timeout_s=60)
    assert held_counts(rest, name, 2**62) == {
        json.dumps({"__name__": "up", "job": "a"}, sort_keys=True): 1
    }
    rest.http.delete(f"/api/v1/datasets/{name}")


def test_unreachable_kafka_is_503_with_retry_after() -> None:
    """Kafka not answering (nothing listens on the port): 503 and Retry-After, so senders retry."""
    dead = f"127.0.0.1:{free_port()}"
    ds = Dataset(name="rwdead", num_shards=2, source=SourceSettings(bootstrap_servers=dead))
    limits = DEFAULT_SETTINGS.model_copy(update={"ack_timeout_s": 2.0, "retry_after_s": 7})
    app = FastAPI()
    app.include_router(ingest_router(Ingestion(lambda: [ds], limits)))
    request = WriteRequest()
    series = request.timeseries.add()
    series.labels.add(name="__name__", value="up")
    series.samples.add(value=1.0, timestamp=1_700_000_000_000)
    body = bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(2):  # and again: a failed gateway is not reused
            resp = http.post(
                "/ingest/rwdead/api/v1/write",
                content=body,
                headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"},
            )
            assert resp.status_code == 503, resp.text
            assert resp.headers["Retry-After"] == "7"
            assert resp.json()["errorType"] == "unavailable"
            assert resp.json()["error"].startswith(f"Kafka unavailable: Kafka at {dead}")


def test_filopy_gateway_serves_alone(tmp_path: Path) -> None:
    """`filopy gateway` as its own process (no Ray): it starts and answers from its store."""
    port = free_port()
    env = {**os.environ, "FILOPY_STATE_DIR": str(tmp_path)}
    # Auth on, as by default: a write token made with the CLI in the store the gateway reads.
    made = subprocess.run(
        [sys.executable, "-m", "filopy.cli", "token", "create", "gw", "--scope", "write"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    token = made.stdout.strip()
    cmd = [sys.executable, "-m", "filopy.cli", "gateway", "--port", str(port)]
    cmd += ["--max-body-bytes", "2000"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, headers=auth) as http:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                try:
                    resp = http.post("/ingest/nosuch/api/v1/write", content=b"x")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "filopy gateway did not start"
                    time.sleep(0.2)
            anonymous = httpx.post(f"http://127.0.0.1:{port}/ingest/nosuch/api/v1/write")
            assert anonymous.status_code == 401, anonymous.text
            assert resp.status_code == 404, resp.text
            assert resp.json()["error"] == "unknown dataset 'nosuch'"
            huge = http.post("/ingest/nosuch/api/v1/write", content=b"\0" * 2001)
            assert huge.status_code == 413, huge.text
            assert huge.json()["error"] == "the body is 2001 bytes, over the limit of 2000"
    finally:
        proc.terminate()
        proc.wait(30)

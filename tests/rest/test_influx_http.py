"""Influx line protocol over HTTP into `filopy serve`'s app, with InfluxData's own client
libraries as the senders.

`influxdb-client` (the InfluxDB 2.x Python client, gzip) writes to `/ingest/{dataset}/api/v2/write`
and `influxdb` (the 1.x client: ping, CREATE DATABASE, gzip) to `/ingest/{dataset}/write`, in every
precision each API takes, into a REST server on a real two-node cluster ingesting from the real
Kafka; FiloPy's PromQL reads back exactly the values and timestamps written. The 2.x client's
batching writer, told 503 + Retry-After while Kafka is unreachable, retries and lands every point
once. Bad input (hand-made requests) gets InfluxDB's 4xx answers with a message, the good lines
of a partial write are written and the bad ones are not, and the server keeps serving.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from influxdb import InfluxDBClient as InfluxDBClientV1
from influxdb.exceptions import InfluxDBClientError
from influxdb_client import InfluxDBClient, Point, WriteOptions, WritePrecision
from influxdb_client.client.exceptions import InfluxDBError
from influxdb_client.client.write_api import SYNCHRONOUS

from core.dataset import Dataset, SourceSettings
from filopy.ingest_http import Ingestion, create_gateway_app, ingest_router
from filopy.ingest_http.app import stored_datasets
from filopy.ingest_http.core import DEFAULT_SETTINGS
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, ServerThread, start_rest
from tests.rest.test_cluster import all_active
from tests.rest.test_remote_write import free_port, held_counts
from tests.waiting import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

T0 = 1_700_000_000  # seconds: every written timestamp is near it
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    settings = cluster_settings(
        tmp_path_factory.mktemp("influx"), "kafka", kafka_bootstrap=kafka_bootstrap
    )
    yield from start_rest(tmp_path_factory.mktemp("influx"), nodes=2, settings=settings)


def new_dataset(rest: Rest, kafka_bootstrap: str) -> str:
    name = f"lp{uuid.uuid4().hex[:8]}"
    body = {
        "name": name,
        "num_shards": 4,
        "min_num_nodes": 2,
        "source": {"bootstrap_servers": kafka_bootstrap},
    }
    assert rest.http.post("/api/v1/datasets", json=body).status_code == 201
    rest.wait_for("all shards active", lambda: all_active(rest, name))
    return name


def key(**labels: str) -> str:
    return json.dumps(labels, sort_keys=True)


def held(rest: Rest, name: str, selector: str) -> dict[str, list[tuple[int, float]]]:
    """Per series that `selector` matches (labels as sorted JSON): its (timestamp ms, value)
    samples, each as often as FiloPy holds it. The timestamps are the nodes' raw samples; the
    values FiloPy's PromQL gives at exactly those times."""
    stamps: dict[str, list[int]] = {}
    for per_series in rest.client.series_samples(name).values():
        for series, timestamps in per_series.items():
            labels = json.loads(series)
            labels["__name__"] = labels.pop("_metric_")
            stamps.setdefault(json.dumps(labels, sort_keys=True), []).extend(map(int, timestamps))
    out: dict[str, list[tuple[int, float]]] = {}
    for t in sorted({t for ts in stamps.values() for t in ts}):
        resp = rest.http.get(
            f"/promql/{name}/api/v1/query", params={"query": selector, "time": f"{t / 1000:.3f}"}
        )
        assert resp.status_code == 200, resp.text
        for r in resp.json()["data"]["result"]:
            series = json.dumps(r["metric"], sort_keys=True)
            n = stamps.get(series, []).count(t)
            out.setdefault(series, []).extend([(t, float(r["value"][1]))] * n)
    return {series: samples for series, samples in out.items() if samples}


def test_influxdb_v2_client_writes_every_precision_read_back_by_promql(
    rest: Rest, kafka_bootstrap: str
) -> None:
    """The 2.x client (gzip, synchronous): Points and raw lines in ns, us, ms and s; escapes,
    a `value` field, integer fields; a string field is skipped without failing the write."""
    name = new_dataset(rest, kafka_bootstrap)
    with InfluxDBClient(
        url=f"{rest.url}/ingest/{name}", token="", org="filopy", enable_gzip=True
    ) as client:
        write = client.write_api(write_options=SYNCHRONOUS)
        write.write(
            "ignored-bucket",
            record=Point("cpu")
            .tag("host", "a")
            .field("usage", 0.5)
            .field("idle", 99)
            .time(T0 * 10**9 + 123_456_789, WritePrecision.NS),
        )
        write.write(
            "b",
            record=[f"mem,host=a used=1.25,free=3i {T0 * 10**6 + 2_000_500}"],
            write_precision=WritePrecision.US,
        )
        write.write(
            "b",
            record=[
                {
                    "measurement": "net",
                    "tags": {"host": "a", "iface": "eth0"},
                    "fields": {"rx": 10.0, "tx": -2.5e-3},
                    "time": T0 * 1000 + 3_007,
                }
            ],
            write_precision=WritePrecision.MS,
        )
        write.write(
            "b",
            record=(
                f"disk,host=a,path=/var\\ log value=42 {T0 + 4}\n"
                f'weather,location=us\\,midwest temperature=82,note="warm" {T0 + 5}\n'
            ),
            write_precision=WritePrecision.S,
        )
        # A string field beside a numeric one: written, and the string counted as skipped.
        write.write(
            "b",
            record=Point("system")
            .tag("host", "a")
            .field("load1", 0.75)
            .field("uptime_format", "1 day, 2:03")
            .time(T0 * 1000 + 6_000, WritePrecision.MS),
        )
    ms = T0 * 1000
    want = {
        key(__name__="cpu_usage", host="a"): [(ms + 123, 0.5)],
        key(__name__="cpu_idle", host="a"): [(ms + 123, 99.0)],
        key(__name__="mem_used", host="a"): [(ms + 2_000, 1.25)],
        key(__name__="mem_free", host="a"): [(ms + 2_000, 3.0)],
        key(__name__="net_rx", host="a", iface="eth0"): [(ms + 3_007, 10.0)],
        key(__name__="net_tx", host="a", iface="eth0"): [(ms + 3_007, -2.5e-3)],
        key(__name__="disk", host="a", path="/var log"): [(ms + 4_000, 42.0)],
        key(__name__="weather_temperature", location="us,midwest"): [(ms + 5_000, 82.0)],
        key(__name__="system_load1", host="a"): [(ms + 6_000, 0.75)],
    }
    eventually(lambda: held(rest, name, '{__name__=~".+"}'), want)
    skipped = rest.http.post(
        f"/ingest/{name}/api/v2/write?precision=ms",
        content=f'system,host=a uptime_format="x",load1=1 {ms + 7_000}',
    )
    assert skipped.status_code == 204, skipped.text
    assert skipped.headers["X-Filopy-Skipped"].startswith("non_numeric=1 ")
    rest.http.delete(f"/api/v1/datasets/{name}")


def test_influxdb_v1_client_pings_creates_database_and_writes_read_back(
    rest: Rest, kafka_bootstrap: str
) -> None:
    """The 1.x client (gzip): ping, CREATE DATABASE, points in h, m, s, ms, u, n; a point
    without a time gets the receive time truncated to the precision; a partial write raises
    the client's error with InfluxDB's "partial write" message."""
    name = new_dataset(rest, kafka_bootstrap)
    port = int(rest.url.rsplit(":", 1)[1])
    client = InfluxDBClientV1(
        host="127.0.0.1", port=port, path=f"ingest/{name}", database="telegraf", gzip=True
    )
    try:
        assert client.ping() == "FiloPy"
        client.create_database("telegraf")  # a no-op, answered as InfluxDB does
        room = {"room": "kitchen"}
        # In time order (FiloPy, as Prometheus, keeps a series' samples in order): one point
        # per precision, and a datetime the client converts.
        points = [  # (precision, time in that unit, value)
            ("s", T0 + 3, 3.0),
            ("ms", T0 * 1000 + 4_004, 4.0),
            ("u", T0 * 10**6 + 5_005_999, 5.0),
            ("n", T0 * 10**9 + 6_006_999_999, 6.0),
            ("s", datetime.fromtimestamp(T0 + 7, UTC), 7.0),
            ("m", T0 // 60 + 2, 2.0),
            ("h", T0 // 3600 + 1, 1.0),
        ]
        for precision, t, v in points:
            point = {"measurement": "temp", "tags": room, "time": t, "fields": {"c": v}}
            assert client.write_points([point], time_precision=precision)
        before_ms = time.time_ns() // 1_000_000
        assert client.write_points(
            [{"measurement": "untimed", "fields": {"value": 8.0}}], time_precision="m"
        )
        after_ms = time.time_ns() // 1_000_000
        with pytest.raises(InfluxDBClientError) as refused:
            client.write_points(
                ["good value=9 1700000008", "bad line", "good value=10 1700000009"],
                time_precision="s",
                protocol="line",
            )
        assert refused.value.code == 400
        message = json.loads(refused.value.content)["error"]
        assert message == (
            "partial write: 2 samples written; 1 refused (undecodable: 1); first: "
            "undecodable: Failed to parse key of field.: bad line"
        )
    finally:
        client.close()
    ms = T0 * 1000
    want_temp = [
        ((T0 // 3600 + 1) * HOUR_MS, 1.0),
        ((T0 // 60 + 2) * 60_000, 2.0),
        (ms + 3_000, 3.0),
        (ms + 4_004, 4.0),
        (ms + 5_005, 5.0),
        (ms + 6_006, 6.0),
        (ms + 7_000, 7.0),
    ]
    want = {
        key(__name__="temp_c", room="kitchen"): sorted(want_temp),
        key(__name__="good"): [(ms + 8_000, 9.0), (ms + 9_000, 10.0)],
    }
    eventually(lambda: held(rest, name, '{__name__=~"temp_c|good"}'), want)
    eventually(lambda: list(held(rest, name, "untimed")), [key(__name__="untimed")])
    ((t, v),) = held(rest, name, "untimed")[key(__name__="untimed")]
    assert v == 8.0 and t % 60_000 == 0 and before_ms - 60_000 < t <= after_ms
    rest.http.delete(f"/api/v1/datasets/{name}")


def test_bad_input_is_4xx_with_influxdb_bodies_and_the_server_keeps_serving(
    rest: Rest, kafka_bootstrap: str
) -> None:
    name = new_dataset(rest, kafka_bootstrap)
    v1, v2 = f"/ingest/{name}/write", f"/ingest/{name}/api/v2/write"

    def v1_refused(resp: httpx.Response, status: int) -> str:
        assert resp.status_code == status, resp.text
        message = resp.json()["error"]
        assert message and resp.headers["X-Influxdb-Error"] == message.encode(
            "ascii", "backslashreplace"
        ).decode("ascii")
        return message

    def v2_refused(resp: httpx.Response, status: int, code: str) -> str:
        assert resp.status_code == status, resp.text
        body = resp.json()
        assert body["code"] == code and body["message"], body
        return body["message"]

    ms = T0 * 1000
    # Partial writes: good lines written, each bad one counted, the first named.
    lines = (
        f"ok,via=v1 value=1 {ms}\n"
        "no fields here\n"
        f"ok,via=v1 value=2 {ms + 1000}\n"
        "past,via=v1 value=3 -5\n"
        "café,via=v1 value=\n"
    )
    message = v1_refused(rest.http.post(v1, params={"precision": "ms"}, content=lines), 400)
    assert message.startswith(
        "partial write: 2 samples written; 3 refused (timestamp_range: 1, undecodable: 2); "
        "first: undecodable: "
    ), message
    assert message.endswith(": no fields here"), message
    gzipped = gzip.compress(f"ok,via=v2 value=4 {T0 + 2}\nok,via=v2 value=oops {T0 + 3}".encode())
    message = v2_refused(
        rest.http.post(
            v2, params={"precision": "s"}, content=gzipped, headers={"Content-Encoding": "gzip"}
        ),
        400,
        "invalid",
    )
    assert message.startswith("1 samples written; 1 refused (undecodable: 1); first: "), message
    assert "value=oops" in message
    nothing = "still bad\n" * 3
    message = v2_refused(rest.http.post(v2, content=nothing), 400, "invalid")
    assert message.startswith("0 samples written; 3 refused (undecodable: 3)"), message

    # Bodies, parameters, encodings, datasets.
    assert "truncated" in v2_refused(
        rest.http.post(
            v2, content=gzip.compress(b"x value=1")[:-6], headers={"Content-Encoding": "gzip"}
        ),
        400,
        "invalid",
    )
    assert "not gzip" in v1_refused(
        rest.http.post(v1, content=b"x value=1", headers={"Content-Encoding": "gzip"}), 400
    )
    assert "br" in v1_refused(
        rest.http.post(v1, content=b"x value=1", headers={"Content-Encoding": "br"}), 415
    )
    huge = b"x value=1\n" * ((16 << 20) // 10 + 1)
    assert "over the limit" in v1_refused(rest.http.post(v1, content=huge), 413)
    assert "over the limit" in v2_refused(
        rest.http.post(v2, content=huge), 413, "request too large"
    )
    assert v1_refused(
        rest.http.post(v1, params={"precision": "us1"}, content=b"x value=1"), 400
    ) == ('invalid precision "us1" (use n, ns, u, us, ms, s, m or h)')
    assert v2_refused(
        rest.http.post(v2, params={"precision": "m"}, content=b"x value=1"), 400, "invalid"
    ) == ('invalid precision "m"; valid precision units are ns, us, ms, and s')
    for path, refused in (("write", v1_refused), ("query", v1_refused), ("ping", v1_refused)):
        method = rest.http.get if path == "ping" else rest.http.post
        resp = method(f"/ingest/nosuchdataset/{path}", params={"q": "CREATE DATABASE x"})
        assert refused(resp, 404) == "unknown dataset 'nosuchdataset'"
    unknown = rest.http.post("/ingest/nosuchdataset/api/v2/write", content=b"x value=1")
    assert v2_refused(unknown, 404, "not found") == "unknown dataset 'nosuchdataset'"
    assert "PromQL" in v1_refused(
        rest.http.post(f"/ingest/{name}/query", params={"q": "SELECT * FROM cpu"}), 400
    )
    # Telegraf's [[outputs.influxdb]] sends this form before writing (plugins/outputs/influxdb).
    created = rest.http.post(f"/ingest/{name}/query", data={"q": 'CREATE DATABASE "telegraf"'})
    assert created.status_code == 200 and created.json() == {"results": [{"statement_id": 0}]}
    assert rest.http.head(f"/ingest/{name}/ping").status_code == 204
    assert rest.http.post(v2, content=b"").status_code == 204  # nothing to write: InfluxDB's 204

    # The server keeps serving; exactly the good lines were written.
    assert (
        rest.http.post(v2, params={"precision": "s"}, content=f"after value=5 {T0 + 4}").status_code
        == 204
    )
    want = {
        key(__name__="ok", via="v1"): [(ms, 1.0), (ms + 1000, 2.0)],
        key(__name__="ok", via="v2"): [(ms + 2000, 4.0)],
        key(__name__="after"): [(ms + 4000, 5.0)],
    }
    eventually(lambda: held(rest, name, '{__name__=~".+"}'), want)
    assert sum(held_counts(rest, name, 2**62).values()) == 4
    rest.http.delete(f"/api/v1/datasets/{name}")


def test_request_limits_are_413_and_telegraf_style_splits_get_through(
    rest: Rest, kafka_bootstrap: str
) -> None:
    """`filopy gateway` with small limits: a request over the sample or decoded-size limit is
    413 with nothing of it written; the same lines in smaller requests are all written."""
    name = new_dataset(rest, kafka_bootstrap)
    settings = rest.cluster.settings
    gateway = settings.gateway.model_copy(
        update={"max_samples_per_request": 10, "max_decoded_bytes": 4096}
    )
    app = create_gateway_app(settings.model_copy(update={"gateway": gateway}))
    lines = [f"batch,n={i} value={i} {T0 * 1000 + i}" for i in range(20)]
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        path = f"/ingest/{name}/api/v2/write?precision=ms"
        too_many = http.post(path, content="\n".join(lines))
        assert too_many.status_code == 413, too_many.text
        assert too_many.json() == {
            "code": "request too large",
            "message": "20 samples in one request, over the limit of 10: send smaller requests",
        }
        bomb = gzip.compress(b"#" * 5000)
        too_big = http.post(path, content=bomb, headers={"Content-Encoding": "gzip"})
        assert too_big.status_code == 413, too_big.text
        assert "over the limit of 4096 bytes" in too_big.json()["message"]
        for half in (lines[:10], lines[10:]):
            assert http.post(path, content="\n".join(half)).status_code == 204
    want = {key(__name__="batch", n=str(i)): [(T0 * 1000 + i, float(i))] for i in range(20)}
    eventually(lambda: held(rest, name, "batch"), want)
    rest.http.delete(f"/api/v1/datasets/{name}")


def test_kafka_unreachable_is_503_and_the_v2_client_retries_until_written_once(
    rest: Rest, kafka_bootstrap: str
) -> None:
    """The gateway's Kafka unreachable (its definition names a port nobody listens on): 503
    with Retry-After in InfluxDB 2.x's shape; the 2.x client's batching writer retries; once
    the gateway reaches the real Kafka again, every point is written exactly once."""
    name = new_dataset(rest, kafka_bootstrap)
    (live,) = [d for d in stored_datasets(rest.cluster.settings) if d.name == name]
    dead = live.model_copy(
        update={"source": SourceSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")}
    )
    current: list[Dataset] = [dead]
    limits = DEFAULT_SETTINGS.model_copy(
        update={"ack_timeout_s": 1.0, "retry_after_s": 1, "definitions_ttl_s": 0.0}
    )
    app = FastAPI()
    app.include_router(ingest_router(Ingestion(lambda: list(current), limits)))
    retries: list[InfluxDBError] = []
    retried, done = threading.Event(), threading.Event()
    outcome: list[str] = []

    def on_retry(_conf: Any, _data: Any, error: InfluxDBError) -> None:
        retries.append(error)
        retried.set()

    def on_success(_conf: Any, _data: Any) -> None:
        outcome.append("written")
        done.set()

    def on_error(_conf: Any, _data: Any, error: Exception) -> None:
        outcome.append(f"failed: {error}")
        done.set()

    options = WriteOptions(
        batch_size=100,
        flush_interval=200,
        retry_interval=500,
        max_retries=30,
        max_retry_time=120_000,
    )
    with (
        ServerThread(app) as url,
        InfluxDBClient(url=f"{url}/ingest/{name}", token="", org="o") as client,
        client.write_api(
            write_options=options,
            success_callback=on_success,
            error_callback=on_error,
            retry_callback=on_retry,
        ) as write,
    ):
        write.write(
            "b",
            record=[f"outage,n={i} value={i} {T0 + i}" for i in range(5)],
            write_precision=WritePrecision.S,
        )
        assert retried.wait(60), "the client did not retry"
        current[:] = [live]  # Kafka is back
        assert done.wait(90), "the client neither wrote nor gave up"
    assert outcome == ["written"]
    assert all(e.response.status == 503 and e.retry_after == "1" for e in retries), retries
    assert retries[0].message.startswith("Kafka unavailable: Kafka at 127.0.0.1:"), retries[0]
    assert retries[0].headers["X-Platform-Error-Code"] == "unavailable"
    want = {key(__name__="outage", n=str(i)): [((T0 + i) * 1000, float(i))] for i in range(5)}
    eventually(lambda: held(rest, name, "outage"), want)
    rest.http.delete(f"/api/v1/datasets/{name}")

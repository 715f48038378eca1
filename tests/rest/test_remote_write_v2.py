"""Prometheus remote write 2.0 (`io.prometheus.write.v2.Request`) at the remote-write endpoint.

A real Prometheus 3 (built from its Go module by scripts/rw-compliance.sh: Debian's 2.42 cannot
send 2.0) scrapes itself and a Python target whose counter carries exemplars, and remote-writes
2.0 (`protobuf_message: io.prometheus.write.v2.Request`, exemplars and metadata on) to
`filopy serve`'s endpoint on a real two-node cluster ingesting from the real Kafka. It must see
the X-Prometheus-Remote-Write-*-Written headers it expects (it treats a 2xx without them as a
1.0-only receiver); the series and per-series sample counts FiloPy holds equal what Prometheus'
own query API reports for the range, and Prometheus reports no failed sample or exemplar. Run
again with native histograms scraped and sent: every request holding one is answered 400 after
its float samples are written, the headers tell Prometheus so (it counts the histograms failed,
no sample), and FiloPy still holds exactly Prometheus' float samples.

Bad 2.0 input, built by hand (no client sends it), against a `filopy gateway` app: symbol refs
outside the table, odd label refs, a symbol table not starting with "", a 1.0 body under the 2.0
Content-Type, unknown messages; each a 4xx with a message, nothing written. Native histograms
are refused (400) after the float samples beside them are written, and the headers say so.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cramjam
import httpx
import pytest
from fastapi import FastAPI
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client import Counter as PromCounter

from core.dataset import LabelLimits, SourceSettings
from core.errors import Invalid
from filopy import Dataset
from filopy.ingest_http import Ingestion, create_gateway_app, ingest_router
from filopy.ingest_http.core import DEFAULT_SETTINGS
from ingest.batch import KeyedBatch
from ingest.topics import ensure_topic
from ingest.wire import remote_write_v2
from ingest.wire.prompb.remote_pb2 import WriteRequest
from ingest.wire.prompb.write_v2_pb2 import Request
from store import open_stores
from tests import prometheus
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, ServerThread, start_rest, topic_batches
from tests.rest.test_remote_write import free_port, held_counts, new_dataset
from tests.rest.test_remote_write_kafka_outage import _settings
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "rw-compliance.sh"
V2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
HEADERS = {"Content-Encoding": "snappy", "Content-Type": V2}
WRITTEN = "X-Prometheus-Remote-Write-{}-Written"
SHARDS = 2
T0 = 1_700_000_000_000
LIMITS = LabelLimits()


# ----- helpers ----------------------------------------------------------------------------------


@contextmanager
def gateway_on(tmp: Path, kafka_bootstrap: str) -> Iterator[tuple[str, Dataset]]:
    """A `filopy gateway` app (no Ray, definitions from SQLite) on a fresh dataset's topic."""
    settings = _settings(tmp, kafka_bootstrap)
    ds = Dataset(
        name=f"rw2{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    ensure_topic(ds)
    meta, columns = open_stores(settings)
    meta.create_dataset(ds)
    meta.close()
    columns.close()
    with ServerThread(create_gateway_app(settings)) as url:
        yield url, ds


def topic_series(ds: Dataset) -> list[tuple[dict[str, str], int]]:
    """Every series in each message of the dataset's topic (with Prometheus' `__name__`) and
    its sample count, read straight from Kafka."""
    out: list[tuple[dict[str, str], int]] = []
    for batch in topic_batches(ds):
        counts = Counter(batch.series_idx.tolist())
        for i, labels in enumerate(batch.series):
            named = dict(labels)
            named["__name__"] = named.pop("_metric_")
            out.append((named, counts[i]))
    return out


def v2_body(*series: dict[str, Any], symbols: list[str] | None = None) -> bytes:
    """A snappy-compressed 2.0 request. Each series: `labels` (a dict, or raw `refs`),
    `samples` [(ts, value)], `histograms` (a count), `exemplars` [labels dict], `metadata`
    (help, unit)."""
    table = [""] if symbols is None else list(symbols)

    def ref(s: str) -> int:
        if s not in table:
            table.append(s)
        return table.index(s)

    request = Request()
    for s in series:
        ts = request.timeseries.add()
        if "refs" in s:
            ts.labels_refs.extend(s["refs"])
        for k, v in sorted(s.get("labels", {}).items()):
            ts.labels_refs.extend([ref(k), ref(v)])
        for t, v in s.get("samples", ()):
            ts.samples.add(timestamp=t, value=v)
        for i in range(s.get("histograms", 0)):
            h = ts.histograms.add(timestamp=T0 + i, count_int=3, sum=1.5, schema=0)
            h.positive_spans.add(offset=0, length=1)
            h.positive_deltas.append(3)
        for e in s.get("exemplars", ()):
            ex = ts.exemplars.add(value=1.0, timestamp=T0)
            for k, v in e.items():
                ex.labels_refs.extend([ref(k), ref(v)])
        if "metadata" in s:
            ts.metadata.type = ts.metadata.METRIC_TYPE_COUNTER
            ts.metadata.help_ref = ref(s["metadata"][0])
            ts.metadata.unit_ref = ref(s["metadata"][1])
    request.symbols.extend(table)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def written(resp: httpx.Response) -> tuple[int, int, int] | None:
    """(samples, histograms, exemplars) of the written-headers; None when none is sent."""
    got = [resp.headers.get(WRITTEN.format(k)) for k in ("Samples", "Histograms", "Exemplars")]
    if all(v is None for v in got):
        return None
    assert all(v is not None for v in got), resp.headers
    return int(got[0]), int(got[1]), int(got[2])  # type: ignore[arg-type]


def error(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["status"] == "error" and body["error"]
    return body["error"]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str
) -> Iterator[tuple[httpx.Client, Dataset]]:
    with (
        gateway_on(tmp_path_factory.mktemp("rw2"), kafka_bootstrap) as (url, ds),
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        yield http, ds


# ----- hand-built requests: what no client sends ---------------------------------------------


def test_v2_maps_labels_as_v1_and_sends_the_written_headers(
    gateway: tuple[httpx.Client, Dataset],
) -> None:
    http, ds = gateway
    url = f"/ingest/{ds.name}/api/v1/write"
    labels = {"__name__": "same_as_v1", "job": "a", "le": "0.5", "path": "/x y"}
    body = v2_body(
        {
            "labels": labels,
            "samples": [(T0, 1.0), (T0 + 1, 2.0)],
            "exemplars": [{"trace_id": "t1"}, {}],
            "metadata": ("Help text", "seconds"),
        },
        {"labels": {"__name__": "only_exemplars"}, "exemplars": [{"trace_id": "t2"}]},
        {"labels": {"__name__": "only_metadata"}, "metadata": ("h", "")},
    )
    resp = http.post(url, content=body, headers=HEADERS)
    assert resp.status_code == 204, resp.text
    assert resp.content == b""
    assert written(resp) == (2, 0, 3)

    v1 = WriteRequest()
    series = v1.timeseries.add()
    for k, v in labels.items():
        series.labels.add(name=k, value=v)
    series.samples.add(timestamp=T0 + 2, value=3.0)
    resp = http.post(
        url,
        content=bytes(cramjam.snappy.compress_raw(v1.SerializeToString())),
        headers=HEADERS | {"Content-Type": "application/x-protobuf"},
    )
    assert resp.status_code == 204, resp.text
    assert written(resp) is None  # 1.0 has no written-headers

    held = [(s, n) for s, n in topic_series(ds) if s["__name__"] == "same_as_v1"]
    assert held == [(labels, 2), (labels, 1)]  # one series, whichever version sent it


def test_bad_symbol_refs_are_400_and_nothing_is_written(
    gateway: tuple[httpx.Client, Dataset],
) -> None:
    http, ds = gateway
    url = f"/ingest/{ds.name}/api/v1/write"
    ok = {"labels": {"__name__": "bad_refs_ok"}, "samples": [(T0, 1.0)]}
    cases = {
        "outside the symbol table (3 symbols)": v2_body(ok, {"refs": [1, 7], "samples": [(T0, 1)]}),
        "3 label refs, not name-value pairs": v2_body(
            ok, {"refs": [1, 2, 1], "samples": [(T0, 1)]}
        ),
        "must start with the empty string": v2_body(ok, symbols=["x"]),
    }
    # An exemplar and a metadata ref past the table, built directly.
    request = Request()
    request.symbols.extend(["", "__name__", "m"])
    series = request.timeseries.add(labels_refs=[1, 2])
    series.samples.add(timestamp=T0, value=1.0)
    series.exemplars.add(labels_refs=[1, 9], value=1.0, timestamp=T0)
    cases["exemplar: label ref 9 is outside the symbol table (3 symbols)"] = bytes(
        cramjam.snappy.compress_raw(request.SerializeToString())
    )
    del series.exemplars[:]
    series.metadata.help_ref = 5
    cases["a label or metadata ref is outside the symbol table (3 symbols)"] = bytes(
        cramjam.snappy.compress_raw(request.SerializeToString())
    )
    v1 = WriteRequest()
    v1.timeseries.add().samples.add(timestamp=T0, value=1.0)
    cases["a prometheus.WriteRequest of remote write 1.0?"] = bytes(
        cramjam.snappy.compress_raw(v1.SerializeToString())
    )
    cases["not a protobuf io.prometheus.write.v2.Request"] = bytes(
        cramjam.snappy.compress_raw(b"\xff" * 32)
    )
    cases["empty body"] = b""
    for expected, body in cases.items():
        resp = http.post(url, content=body, headers=HEADERS)
        assert expected in error(resp, 400), (expected, resp.text)
        assert written(resp) == (0, 0, 0), expected
    assert not [s for s, _ in topic_series(ds) if s["__name__"] in ("bad_refs_ok", "m")]


def test_native_histograms_are_refused_after_the_floats_beside_them_are_written(
    gateway: tuple[httpx.Client, Dataset],
) -> None:
    http, ds = gateway
    body = v2_body(
        {"labels": {"__name__": "beside_histograms"}, "samples": [(T0, 1.0), (T0 + 1, 2.0)]},
        {"labels": {"__name__": "a_native_histogram", "job": "h"}, "histograms": 3},
        {"labels": {"job": "nameless"}, "exemplars": [{"trace_id": "t"}]},
    )
    resp = http.post(f"/ingest/{ds.name}/api/v1/write", content=body, headers=HEADERS)
    message = error(resp, 400)
    assert message.startswith(
        "2 samples written; 3 refused (unsupported: 3); first: native histogram samples "
        "(FiloPy stores float samples only); series {__name__='a_native_histogram', job='h'}"
    ), message
    assert "1 exemplars refused with their series (first: no metric name" in message
    assert written(resp) == (2, 0, 0)
    names = Counter(s["__name__"] for s, _ in topic_series(ds))
    assert names["beside_histograms"] == 1 and names["a_native_histogram"] == 0


def test_other_messages_and_media_types_are_415(gateway: tuple[httpx.Client, Dataset]) -> None:
    http, ds = gateway
    url = f"/ingest/{ds.name}/api/v1/write"
    body = v2_body({"labels": {"__name__": "x"}, "samples": [(T0, 1.0)]})
    for content_type, expected in (
        ("application/x-protobuf;proto=io.prometheus.write.v3.Request", "unknown message"),
        ("application/json", "this endpoint takes application/x-protobuf"),
        ("text/plain; proto=io.prometheus.write.v2.Request", "this endpoint takes"),
    ):
        resp = http.post(url, content=body, headers=HEADERS | {"Content-Type": content_type})
        assert expected in error(resp, 415)
        assert written(resp) is None
    resp = http.post(url, content=body, headers=HEADERS | {"Content-Encoding": "zstd"})
    assert "snappy" in error(resp, 415)
    # Parameters are case-insensitive and may be quoted; 1.0 may be named explicitly.
    quoted = HEADERS | {
        "Content-Type": 'Application/X-Protobuf; Proto="io.prometheus.write.v2.Request"'
    }
    assert http.post(url, content=body, headers=quoted).status_code == 204


def test_unreachable_kafka_is_503_without_written_headers() -> None:
    """Kafka not answering: 503 + Retry-After; no counts, since Kafka may hold part of them."""
    dead = f"127.0.0.1:{free_port()}"
    ds = Dataset(name="rw2dead", num_shards=2, source=SourceSettings(bootstrap_servers=dead))
    limits = DEFAULT_SETTINGS.model_copy(update={"ack_timeout_s": 2.0, "retry_after_s": 7})
    app = FastAPI()
    app.include_router(ingest_router(Ingestion(lambda: [ds], limits)))
    body = v2_body({"labels": {"__name__": "up"}, "samples": [(T0, 1.0)]})
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        resp = http.post("/ingest/rw2dead/api/v1/write", content=body, headers=HEADERS)
        assert error(resp, 503).startswith("Kafka unavailable")
        assert resp.headers["Retry-After"] == "7"
        assert written(resp) is None
        missing = http.post("/ingest/nosuch/api/v1/write", content=body, headers=HEADERS)
        assert error(missing, 404) == "unknown dataset 'nosuch'"
        assert written(missing) == (0, 0, 0)


# ----- the vectorized decoder equals the full parse ------------------------------------------


def _field(number: int, wire: int, payload: bytes) -> bytes:
    """One protobuf field: its tag, a length for wire type 2, and the payload."""
    head = _uvarint(number << 3 | wire)
    return head + (_uvarint(len(payload)) if wire == 2 else b"") + payload


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


_names = st.sampled_from(["__name__", "job", "instance", "le", "a b", "ü", ""])
_values = st.sampled_from(["up", "x", "node", "", "0.5", "😀", "a\nb"])
_series = st.fixed_dictionaries(
    {
        "labels": st.dictionaries(_names, _values, max_size=5),
        "samples": st.lists(
            st.tuples(
                st.sampled_from([0, 1, T0, -5, 2**62]),
                st.sampled_from([0.0, 1.5, -2.0, float("inf"), float("nan")]),
                st.sampled_from([0, 0, T0 - 1]),  # start_timestamp (0: unset)
            ),
            max_size=3,
        ),
        "metadata": st.sampled_from([None, (0, "", ""), (1, "help", "unit"), (3, "", "s")]),
        "created": st.sampled_from([None, T0 - 7]),  # field 6 of Prometheus 3.0-3.6 senders
        "histograms": st.sampled_from([0, 0, 0, 1]),
        "exemplars": st.sampled_from([0, 0, 0, 1]),
    }
)


def _raw_request(series: list[dict[str, Any]], symbols: list[str] | None = None) -> bytes:
    """A 2.0 body as a sender encodes it: fields in number order, refs packed, metadata written
    even when empty (gogoproto's non-nullable fields), zero values left out."""
    table = [""] if symbols is None else symbols
    body = b""
    parts = []
    for s in series:
        for k, v in sorted(s["labels"].items()):
            table.extend(x for x in (k, v) if x not in table)
        refs = [table.index(x) for k, v in sorted(s["labels"].items()) for x in (k, v)]
        ts = Request().timeseries.add()
        ts.labels_refs.extend(refs)
        for t, v, start in s["samples"]:
            ts.samples.add(timestamp=t, value=v, start_timestamp=start)
        for _ in range(s["histograms"]):
            ts.histograms.add(timestamp=T0, count_int=1)
        for _ in range(s["exemplars"]):
            ts.exemplars.add(timestamp=T0, value=1.0)
        meta = b""
        if s["metadata"] is not None:
            kind, help_, unit = s["metadata"]
            table.extend(x for x in (help_, unit) if x not in table)
            ts.metadata.type = kind
            ts.metadata.help_ref = table.index(help_)
            ts.metadata.unit_ref = table.index(unit)
            meta = ts.metadata.SerializeToString()
        ts.ClearField("metadata")
        encoded = ts.SerializeToString() + _field(5, 2, meta)
        if s["created"] is not None:
            encoded += _field(6, 0, _uvarint(s["created"]))
        parts.append(encoded)
    body = b"".join(_field(4, 2, x.encode()) for x in table)
    return body + b"".join(_field(5, 2, p) for p in parts)


def _outcome(raw: bytes, column: str, how: str) -> Any:
    """What a decoder makes of a body: the batch and counts, or its refusal."""
    try:
        if how == "full":
            d = remote_write_v2.to_batch(remote_write_v2.parse(raw), column, LIMITS)
        elif how == "fast":
            fast = remote_write_v2.decode_fast(raw, column)
            if fast is None:
                return None
            d = fast
        else:
            d = remote_write_v2.decode(raw, column, LIMITS)
    except Invalid as e:
        return ("refused", str(e))
    b = d.decoded.batch
    return (
        b.series,
        b.series_idx.tolist(),
        b.timestamps.tolist(),
        [repr(v) for v in b.values.tolist()],  # NaN equal to NaN
        b.bad_records,
        d.decoded.first_bad,
        d.exemplars,
        d.exemplars_refused,
    )


@given(st.lists(_series, max_size=6), st.sampled_from([None, ["x"], []]))
def test_the_vectorized_decoder_gives_what_the_full_parse_gives(
    series: list[dict[str, Any]], symbols: list[str] | None
) -> None:
    raw = _raw_request(series, symbols)
    for column in ("_metric_", "__name__"):
        full = _outcome(raw, column, "full")
        fast = _outcome(raw, column, "fast")
        assert fast is None or fast == full
        assert _outcome(raw, column, "either") == full
        first = remote_write_v2.decode_fast(raw, column)
        again = remote_write_v2.decode_fast(raw, column)
        if first is not None and again is not None and first.decoded.batch.series:
            # Keys: stable across requests; equal keys for equal labels only.
            batch, batch2 = first.decoded.batch, again.decoded.batch
            assert isinstance(batch, KeyedBatch) and isinstance(batch2, KeyedBatch)
            assert batch.keys == batch2.keys
            pairs = list(zip(batch.keys, batch.series, strict=True))
            by_key = dict(pairs)
            assert all(by_key[k] == labels for k, labels in pairs)
    # What Prometheus sends (float samples, a valid symbol table) takes the fast path.
    if (
        series
        and symbols is None
        and all(s["samples"] and not s["histograms"] and not s["exemplars"] for s in series)
    ):
        assert _outcome(raw, "_metric_", "fast") is not None


def test_the_vectorized_decoder_reads_long_label_lists_and_many_samples() -> None:
    """Refs past 127 (2-byte varints), a refs field over 127 bytes, 70 samples on a series."""
    wide = {f"label_{i:03d}": f"value_{i}" for i in range(90)} | {"__name__": "wide"}
    many = [(T0 + i, float(i), 0) for i in range(70)]
    base = {"metadata": None, "created": None, "histograms": 0, "exemplars": 0}
    shapes = [
        [base | {"labels": wide, "samples": [(T0, 1.0, 0)]}],
        [base | {"labels": {"__name__": "many"}, "samples": many[:64]}],
        [base | {"labels": {"__name__": "many"}, "samples": many}],
    ]
    for series in shapes:
        raw = _raw_request(series)
        assert _outcome(raw, "_metric_", "either") == _outcome(raw, "_metric_", "full")
    for series in shapes:  # the walker has no limit on labels or samples
        assert _outcome(_raw_request(series), "_metric_", "fast") is not None


@given(st.binary(max_size=200), st.integers(0, 400))
def test_the_vectorized_decoder_never_fails_on_corrupt_bodies(tail: bytes, cut: int) -> None:
    """Cut or corrupted bodies: the fast path gives up (the full parse answers) or agrees."""
    one = {
        "labels": {"__name__": "up", "job": "a"},
        "samples": [(T0, 1.0, 0)],
        "metadata": (1, "h", ""),
        "created": None,
        "histograms": 0,
        "exemplars": 0,
    }
    raw = _raw_request([one, one, one])
    for body in (raw[:cut] + tail, tail + raw[cut:], raw[:cut]):
        fast = _outcome(body, "_metric_", "fast")
        assert fast is None or fast == _outcome(body, "_metric_", "full")


# ----- a real 2.0 sender: Prometheus 3 -----------------------------------------------------------


def prometheus3() -> Path:
    """Prometheus 3, built (once, cached) by the project's script; a missing `go` fails."""
    done = subprocess.run(
        ["bash", str(SCRIPT), "prometheus"], capture_output=True, text=True, timeout=3600
    )
    assert done.returncode == 0, f"{SCRIPT} prometheus failed:\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    settings = cluster_settings(
        tmp_path_factory.mktemp("rw2"), "kafka", kafka_bootstrap=kafka_bootstrap
    )
    yield from start_rest(tmp_path_factory.mktemp("rw2"), nodes=2, settings=settings)


@contextmanager
def exemplar_target() -> Iterator[int]:
    """A Python target (prometheus_client, OpenMetrics) whose counter gets a new exemplar
    every 200 ms."""
    registry = CollectorRegistry()
    jobs = PromCounter("filopy_test_jobs", "Jobs done.", ["queue"], registry=registry)
    port = free_port()
    server, thread = start_http_server(port, "127.0.0.1", registry=registry)
    stop = threading.Event()

    def work() -> None:
        i = 0
        while not stop.wait(0.2):
            i += 1
            jobs.labels("q1").inc(exemplar={"trace_id": f"{i:032x}"})

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        yield port
    finally:
        stop.set()
        worker.join(5)
        server.shutdown()
        server.server_close()
        thread.join(5)


def ingest_requests(rest: Rest) -> Counter[tuple[str, str]]:
    """The REST app's ingestion requests so far, by (protocol, code)."""
    out: Counter[tuple[str, str]] = Counter()
    for line in rest.http.get("/metrics").text.splitlines():
        if line.startswith("filopy_http_ingest_requests_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            out[labels["protocol"], labels["code"]] += int(float(line.rsplit(" ", 1)[1]))
    return out


@pytest.mark.ray
@pytest.mark.timeout(3900)
@pytest.mark.parametrize("native_histograms", [False, True], ids=["floats", "native_histograms"])
def test_prometheus3_remote_write_2_series_and_samples_match(
    rest: Rest, kafka_bootstrap: str, tmp_path: Path, native_histograms: bool
) -> None:
    """`floats`: Prometheus scrapes classic metrics only; every request is answered 204.
    `native_histograms`: it also scrapes its own native histograms (scrape_native_histograms),
    which FiloPy refuses: those requests are 400 after their float samples are written, and the
    written-headers tell Prometheus exactly that (it counts the histograms failed, no sample)."""
    binary = prometheus3()
    name = new_dataset(rest, kafka_bootstrap)
    before = ingest_requests(rest)
    port = free_port()
    with exemplar_target() as target:
        config = f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
  scrape_native_histograms: {str(native_histograms).lower()}
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["127.0.0.1:{port}"]
  - job_name: worker
    static_configs:
      - targets: ["127.0.0.1:{target}"]
remote_write:
  - url: {rest.url}/ingest/{name}/api/v1/write
    protobuf_message: io.prometheus.write.v2.Request
    send_exemplars: true
    send_native_histograms: {str(native_histograms).lower()}
{prometheus.QUEUE}
"""
        flags = ["--enable-feature=exemplar-storage,metadata-wal-records"]
        with prometheus.running(config, tmp_path, port, str(binary), flags) as prom:
            rest.wait_for("8 scrapes", lambda: prom.scrapes("prometheus|worker") >= 8, 90)
            end_ms = int(time.time() * 1000)
            end = end_ms / 1000
            rest.wait_for("samples after the range sent", lambda: prom.sent_past(end + 1), 90)
            want = prom.series_counts('{job=~"prometheus|worker"}', at=end)
            histogram_series = sum(
                1 for s in prom.query('{job=~"prometheus|worker"}[1h]', at=end) if "histograms" in s
            )
            sent = {
                kind: prom.scalar(f"prometheus_remote_storage_{kind}_total")
                for kind in ("samples", "exemplars", "histograms")
            }
            failed = {
                kind: prom.scalar(f"prometheus_remote_storage_{kind}_failed_total")
                for kind in ("samples", "exemplars", "histograms", "metadata")
            }
            assert prom.stop() == 0
    log_text = prom.log()
    requests = ingest_requests(rest) - before
    assert len(want) > 100 and sum(want.values()) > 8 * 100  # a real, varied workload
    assert any('"job": "worker"' in k and "filopy_test_jobs_total" in k for k in want)
    assert sent["exemplars"] > 0  # the worker's exemplars went out
    assert "investigation needed" not in log_text  # a 2xx whose headers undercount
    assert not [k for k in requests if k[0] == "prometheus_remote_write"]  # never fell back
    if not native_histograms:
        assert histogram_series == 0
        assert "non-recoverable error" not in log_text, log_text[-3000:]
        assert failed == dict.fromkeys(failed, 0.0), failed
        assert set(requests) == {("prometheus_remote_write_v2", "204")}
        assert requests[("prometheus_remote_write_v2", "204")] > 0
    else:
        # Requests holding native histograms got 400; the headers said their float samples
        # and exemplars were written, so Prometheus counts only the histograms as failed.
        assert histogram_series > 0 and sent["histograms"] > 0
        assert requests[("prometheus_remote_write_v2", "400")] > 0  # (most hold histograms)
        assert set(requests) <= {
            ("prometheus_remote_write_v2", "204"),
            ("prometheus_remote_write_v2", "400"),
        }
        assert "native histogram samples (FiloPy stores float samples only)" in log_text
        assert failed["histograms"] > 0
        assert failed["samples"] == failed["exemplars"] == 0, failed

    eventually(lambda: held_counts(rest, name, end_ms), want)
    rest.http.delete(f"/api/v1/datasets/{name}")

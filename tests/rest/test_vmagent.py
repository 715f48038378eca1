"""vmagent (Debian's victoria-metrics package, /usr/bin/vmagent) as a sender to FiloPy.

(a) vmagent scrapes real targets (its own /metrics and FiloPy's REST /metrics) and remote-writes
    every sample both to `/ingest/{dataset}/api/v1/write` of a REST server on a real two-node
    cluster ingesting from the real Kafka and to a real VictoriaMetrics single-node server (the
    same package). For a time range, the series, timestamps and values FiloPy holds equal what
    VictoriaMetrics stored from the same vmagent.
(b) vmagent's InfluxDB inputs (`-influxListenAddr` over TCP, and its HTTP `/write` and
    `/api/v2/write`) receive line protocol and relay it by remote write to `filopy gateway`'s app;
    FiloPy's PromQL reads back exactly the values sent, with vmagent's names for them.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from filopy.ingest_http import create_gateway_app
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, ServerThread, start_rest
from tests.rest.test_influx_http import eventually, held, key, new_dataset
from tests.rest.test_remote_write import free_port
from tests.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

VMAGENT = shutil.which("vmagent") or "/usr/bin/vmagent"
VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
Samples = dict[str, list[tuple[int, float]]]  # series (labels as sorted JSON) -> (ms, value)


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    for tool in (VMAGENT, VICTORIA_METRICS):  # the real sender is the point: fail, never skip
        if not Path(tool).exists():
            pytest.fail(f"{tool} not found: run scripts/system-deps.sh (Debian's victoria-metrics)")
    settings = cluster_settings(
        tmp_path_factory.mktemp("vmagent"), "kafka", kafka_bootstrap=kafka_bootstrap
    )
    yield from start_rest(tmp_path_factory.mktemp("vmagent"), nodes=2, settings=settings)


class Process:
    """A server process logging to a file, waited for on its /health, stopped (SIGINT, then
    SIGKILL) when the block ends."""

    def __init__(self, name: str, args: list[str], port: int, log: Path) -> None:
        self.name, self.args, self.log = name, args, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Process:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"{self.name} exited:\n{self.log_tail()}"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{self.name} did not start:\n{self.log_tail()}"
            time.sleep(0.2)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def vmagent(
    tmp_path: Path,
    remote_write_urls: list[str],
    *extra: str,
    scrape_config: Path | None = None,
    port: int | None = None,
) -> Process:
    port = port or free_port()
    args = [
        VMAGENT,
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-remoteWrite.tmpDataPath={tmp_path / 'vmagent-queue'}",
        "-remoteWrite.flushInterval=1s",
        # One sender per URL: blocks arrive in the order vmagent queued them (see below).
        "-remoteWrite.queues=1",
        "-remoteWrite.showURL",
        *[f"-remoteWrite.url={u}" for u in remote_write_urls],
        *([f"-promscrape.config={scrape_config}"] if scrape_config else []),
        *extra,
    ]
    return Process("vmagent", args, port, tmp_path / "vmagent.log")


def exported(vm: str, match: str) -> Samples:
    """VictoriaMetrics' raw samples (its /api/v1/export), per series."""
    resp = httpx.post(f"{vm}/api/v1/export", data={"match[]": match}, timeout=60)
    assert resp.status_code == 200, resp.text
    out: Samples = {}
    for line in resp.text.splitlines():
        series = json.loads(line)
        samples = list(zip(series["timestamps"], map(float, series["values"]), strict=True))
        out[json.dumps(series["metric"], sort_keys=True)] = sorted(samples)
    return out


def until(samples: Samples, end_ms: int) -> Samples:
    """The samples at or before `end_ms`, series without any left out."""
    cut = {k: sorted(s for s in v if s[0] <= end_ms) for k, v in samples.items()}
    return {k: v for k, v in cut.items() if v}


def same(a: Samples, b: Samples) -> bool:
    """Equal series and timestamps; values equal up to VictoriaMetrics' storage, which keeps
    12 significant decimal digits or so (its decimal encoding), NaN (staleness) equal to NaN."""
    if a.keys() != b.keys():
        return False
    for k, xs in a.items():
        ys = b[k]
        if [t for t, _ in xs] != [t for t, _ in ys]:
            return False
        for (_, x), (_, y) in zip(xs, ys, strict=True):
            if not ((math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-11)):
                return False
    return True


def test_vmagent_scrapes_and_remote_writes_what_victoria_metrics_also_stores(
    rest: Rest, kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = new_dataset(rest, kafka_bootstrap)
    vm_port, agent_port = free_port(), free_port()
    filopy_target = rest.url.removeprefix("http://")
    config = tmp_path / "scrape.yml"
    config.write_text(
        f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: vmagent
    static_configs:
      - targets: ["127.0.0.1:{agent_port}"]
  - job_name: filopy
    scrape_interval: 2s
    scrape_timeout: 2s
    static_configs:
      - targets: ["{filopy_target}"]
"""
    )
    vm_args = [
        VICTORIA_METRICS,
        f"-httpListenAddr=127.0.0.1:{vm_port}",
        f"-storageDataPath={tmp_path / 'vm-data'}",
        "-retentionPeriod=100y",
    ]
    with Process("victoria-metrics", vm_args, vm_port, tmp_path / "vm.log") as vm:
        agent = vmagent(
            tmp_path,
            [f"{rest.url}/ingest/{name}/api/v1/write", f"{vm.url}/api/v1/write"],
            scrape_config=config,
            port=agent_port,
        )
        with agent:
            ups = '{__name__="up", job=~"vmagent|filopy"}'

            def scrapes(job: str) -> int:
                series = exported(vm.url, f'up{{job="{job}"}}')
                return sum(len(v) for v in series.values())

            wait_for(
                "8 scrapes of vmagent and 4 of FiloPy",
                lambda: scrapes("vmagent") >= 8 and scrapes("filopy") >= 4,
            )
            end_ms = time.time_ns() // 1_000_000

            # With one sender per URL, blocks are sent in order, each retried until accepted:
            # once a scrape 3 s after the end reached a receiver, every sample up to the end did.
            def past_end(got: Samples) -> bool:
                jobs = {json.loads(k)["job"] for k, v in got.items() if v[-1][0] > end_ms + 3000}
                return jobs == {"vmagent", "filopy"}

            wait_for("VictoriaMetrics past the end", lambda: past_end(exported(vm.url, ups)))
            wait_for("FiloPy past the end", lambda: past_end(held(rest, name, ups)))
            assert agent.stop() == 0, agent.log_tail()
        want = until(exported(vm.url, '{job=~"vmagent|filopy"}'), end_ms)
    n_samples = sum(map(len, want.values()))
    assert len(want) > 300 and n_samples > 8 * 300, len(want)  # a real, varied workload
    print(f"vmagent -> FiloPy and VictoriaMetrics: {len(want)} series, {n_samples} samples")

    got: Samples = {}
    deadline = time.monotonic() + 60
    while not same(got, want) and time.monotonic() < deadline:
        got = until(held(rest, name, '{job=~"vmagent|filopy"}'), end_ms)
    assert got.keys() == want.keys()
    assert {k: [t for t, _ in v] for k, v in got.items()} == {
        k: [t for t, _ in v] for k, v in want.items()
    }
    assert same(got, want)
    # Every block was accepted at once: vmagent logs each refused one.
    refused = [ln for ln in agent.log.read_text().splitlines() if "unexpected status code" in ln]
    assert not refused, refused[:5]
    rest.http.delete(f"/api/v1/datasets/{name}")


def test_vmagent_relays_influx_line_protocol_to_the_gateway(
    rest: Rest, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Line protocol into vmagent (TCP `-influxListenAddr`, HTTP /write with db and precision,
    /api/v2/write), remote-written to `filopy gateway`'s app: the values read back are those
    sent, named as vmagent names them (`measurement_field`, `db` label, booleans as 1/0)."""
    name = new_dataset(rest, kafka_bootstrap)
    influx_port = free_port()
    t0 = (time.time_ns() // 1_000_000_000 - 600) * 1000  # ms, ten minutes ago
    with (
        ServerThread(create_gateway_app(rest.cluster.settings)) as gateway,
        vmagent(
            tmp_path,
            [f"{gateway}/ingest/{name}/api/v1/write"],
            f"-influxListenAddr=127.0.0.1:{influx_port}",
        ) as agent,
    ):
        # Each body ends with a newline, so vmagent parses it as one block: it parses a stream
        # in blocks on concurrent workers, so the samples of a series split across blocks may
        # be relayed out of order, and FiloPy, in order per series like Prometheus, drops the
        # late ones (counted as out_of_order; docs/ingestion-http.md).
        with socket.create_connection(("127.0.0.1", influx_port), timeout=10) as tcp:
            tcp.sendall(
                (
                    f"tcp,host=a usage=0.25,count=7i {t0 * 10**6}\n"
                    f"tcp,host=a usage=0.5,count=8i {(t0 + 1000) * 10**6}\n"
                    f"tcp,host=b,region=eu-west up=true {t0 * 10**6}\n"
                ).encode()
            )
        v1 = httpx.post(
            f"{agent.url}/write",
            params={"db": "telegraf", "precision": "ms"},
            content=f"http1,host=c temp=21.5 {t0 + 2000}\nhttp1,host=c temp=-3e-2 {t0 + 3000}\n",
        )
        assert v1.status_code == 204, v1.text
        v2 = httpx.post(
            f"{agent.url}/api/v2/write",
            params={"bucket": "b", "org": "o", "precision": "s"},
            content=f"http2 value=42 {t0 // 1000 + 4}\n",
        )
        assert v2.status_code == 204, v2.text
        want = {
            key(__name__="tcp_usage", host="a"): [(t0, 0.25), (t0 + 1000, 0.5)],
            key(__name__="tcp_count", host="a"): [(t0, 7.0), (t0 + 1000, 8.0)],
            key(__name__="tcp_up", host="b", region="eu-west"): [(t0, 1.0)],
            key(__name__="http1_temp", db="telegraf", host="c"): [
                (t0 + 2000, 21.5),
                (t0 + 3000, -0.03),
            ],
            key(__name__="http2_value"): [(t0 + 4000, 42.0)],
        }
        eventually(lambda: held(rest, name, '{__name__=~"tcp_.+|http1_.+|http2_.+"}'), want)
    assert agent.proc is not None and agent.proc.returncode == 0, agent.log_tail()
    rest.http.delete(f"/api/v1/datasets/{name}")

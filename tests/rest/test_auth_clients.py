"""Real clients with auth on (issue 32): each sends its token the way it normally does, as
docs/ingestion-http.md and docs/query.md configure it.

One two-node cluster ingesting from the real Kafka, its REST server with auth on. With a write
token for the right dataset each client's samples are stored and read back exactly (as the
client's own test module reads them); with a revoked token, a read-scope token or a token for
another dataset nothing is stored and the client reports the refusal its own way: Debian's
Prometheus (bearer `credentials_file` and `basic_auth` `password_file`) its failed-samples
counter and a log line with the status; vmagent (`-remoteWrite.bearerTokenFile`) its log and
its requests counter; InfluxData's 2.x and 1.x Python clients an exception with the status; the
OpenTelemetry SDK's OTLP/HTTP exporter (`headers=`) a failed export. Grafana's calls
(scripts/grafana_calls.py) pass with a read token as bearer or as basic auth, and fail on 403
with a write token; the console in headless Chromium asks for a token, keeps asking with the
server's message for a wrong one, and follows the cluster live with a read token (a late 401 of
a poll sent with the wrong token does not bring the form back); schemathesis finds no 5xx with
an admin token, and without one a documented 401 everywhere but on the open routes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from influxdb import InfluxDBClient as InfluxDBClientV1
from influxdb.exceptions import InfluxDBClientError
from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.exceptions import InfluxDBError
from influxdb_client.client.write_api import SYNCHRONOUS
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource
from playwright.sync_api import Page, Route, sync_playwright
from schemathesis import GenerationMode
from schemathesis.checks import (
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
)

from filopy.auth import TokenBook
from store import open_stores
from tests import prometheus
from tests.cluster import cluster_settings
from tests.prometheus import PROMETHEUS
from tests.rest.conftest import Rest, start_rest
from tests.rest.test_influx_http import T0, held, key, new_dataset
from tests.rest.test_otlp import instant, now_ms
from tests.rest.test_remote_write import free_port, held_counts
from tests.rest.test_schemathesis import REASONS, narrowed
from tests.rest.test_vmagent import VMAGENT, vmagent
from tests.waiting import eventually, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WAIT_MS = 60_000  # a browser wait: generous, ends on a condition
WRONG = "fpy_0123456789ab_" + "x" * 43  # a token's shape, no token of the store


@dataclass
class Cluster:
    """The auth-on cluster: its REST server (`rest.http` sends an admin token), the store's
    tokens, and a dataset that no refused client may write into."""

    rest: Rest
    book: TokenBook
    kafka: str
    admin: str
    victim: str

    def token(self, name: str, scopes: list[str], datasets: tuple[str, ...] = ()) -> str:
        """A new token, once the server takes it: a server that read the store's tokens less
        than a second ago refuses an id it has not seen yet (filopy/auth.py's TokenCache)."""
        _, text = self.book.create(name, scopes, datasets)
        ds = datasets[0] if datasets else self.victim
        probe = (
            ("POST", f"/ingest/{ds}/api/v2/write")  # an empty write: 204, nothing written
            if "write" in scopes
            else ("GET", f"/api/v1/datasets/{ds}")
        )
        wait_for(
            f"the server takes token {name!r}",
            lambda: self.call(*probe, text).status_code not in (401, 503),
        )
        return text

    def revoked(self, name: str) -> str:
        """A write token for the victim, revoked once the server took it, returned when the
        server refuses it (revocations reach a server within auth.refresh_s)."""
        text = self.token(name, ["write"], (self.victim,))
        token_id = text.split("_")[1]
        self.book.revoke(token_id)
        path = f"/ingest/{self.victim}/api/v2/write"
        wait_for(
            f"the server refuses revoked {name!r}",
            lambda: "revoked" in self.call("POST", path, text).text,
        )
        return text

    def call(self, method: str, path: str, token: str) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.rest.url}{path}",
            headers={"Authorization": f"Bearer {token}"},
            content=b"" if method == "POST" else None,
            timeout=30,
        )

    def assert_victim_empty(self) -> None:
        assert held_counts(self.rest, self.victim, 2**62) == {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Cluster]:
    for tool in (PROMETHEUS, VMAGENT, CHROMIUM):  # the real clients are the point: never skip
        if not Path(tool).exists():
            pytest.fail(f"{tool} not found: run scripts/system-deps.sh")
    tmp = tmp_path_factory.mktemp("authclients")
    base = cluster_settings(tmp, "kafka", flush_interval_s=1.0, kafka_bootstrap=kafka_bootstrap)
    settings = base.model_copy(
        update={
            "auth": base.auth.model_copy(update={"enabled": True}),
        }
    )
    for rest in start_rest(tmp, nodes=2, settings=settings):
        meta, columns = open_stores(settings)
        columns.close()
        book = TokenBook(meta)
        _, admin = book.create("tests-admin", ["admin"])
        rest.http.headers["Authorization"] = f"Bearer {admin}"
        wait_for("the admin token taken", lambda h=rest.http: h.get("/api/v1/cluster").is_success)
        victim = new_dataset(rest, kafka_bootstrap)
        yield Cluster(rest, book, kafka_bootstrap, admin, victim)
        meta.close()


def token_file(path: Path, token: str) -> Path:
    """The token in a file, as `filopy token create ... > FILE` writes it (a newline after)."""
    path.write_text(token + "\n")
    return path


# ----- Prometheus ------------------------------------------------------------------------------


def test_prometheus_remote_write_with_bearer_and_basic_auth(
    cluster: Cluster, tmp_path: Path
) -> None:
    """One Prometheus, five remote_write queues: `authorization: credentials_file` and
    `basic_auth: {username, password_file}` with write tokens of their datasets, each holding
    exactly what Prometheus holds; a read-scope token, a revoked one and a write token of
    another dataset, each refused (non-recoverable: counted failed, logged with the status),
    nothing of them stored."""
    rest = cluster.rest
    a, b = new_dataset(rest, cluster.kafka), new_dataset(rest, cluster.kafka)
    files = {
        "bearer": token_file(tmp_path / "bearer.token", cluster.token("prom-a", ["write"], (a,))),
        "basic": token_file(tmp_path / "basic.token", cluster.token("prom-b", ["write"], (b,))),
        "read": token_file(tmp_path / "read.token", cluster.token("prom-read", ["read"])),
        "revoked": token_file(tmp_path / "revoked.token", cluster.revoked("prom-revoked")),
    }
    refused = {  # remote name -> (status, what the answer says)
        "read-scope": ("403 Forbidden", "needs 'write'"),
        "revoked": ("401 Unauthorized", "was revoked"),
        "other-dataset": ("403 Forbidden", "is limited to datasets"),
    }
    port = free_port()
    victim_url = f"{rest.url}/ingest/{cluster.victim}/api/v1/write"
    config = f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["127.0.0.1:{port}"]
remote_write:
  - name: bearer
    url: {rest.url}/ingest/{a}/api/v1/write
    authorization:
      credentials_file: {files["bearer"]}
{prometheus.QUEUE}
  - name: basic
    url: {rest.url}/ingest/{b}/api/v1/write
    basic_auth:
      username: prometheus
      password_file: {files["basic"]}
{prometheus.QUEUE}
  - name: read-scope
    url: {victim_url}
    authorization:
      credentials_file: {files["read"]}
{prometheus.QUEUE}
  - name: revoked
    url: {victim_url}
    authorization:
      credentials_file: {files["revoked"]}
{prometheus.QUEUE}
  - name: other-dataset
    url: {victim_url}
    authorization:
      credentials_file: {files["bearer"]}
{prometheus.QUEUE}
"""
    with prometheus.running(config, tmp_path, port) as prom:

        def by_remote(metric: str) -> dict[str, float]:
            return {r["metric"]["remote_name"]: float(r["value"][1]) for r in prom.query(metric)}

        wait_for("8 scrapes", lambda: prom.scrapes() >= 8)
        end_ms = int(time.time() * 1000)
        end = end_ms / 1000

        def sent_past_end() -> bool:
            # In WAL order: once a later scrape's samples are sent, all up to `end` were.
            sent = by_remote("prometheus_remote_storage_queue_highest_sent_timestamp_seconds")
            return all(sent.get(r, 0) > end + 1 for r in ("bearer", "basic"))

        wait_for("samples after the range sent", sent_past_end)

        def failed() -> dict[str, float]:
            return by_remote("prometheus_remote_storage_samples_failed_total")

        wait_for("every refused queue counted failed samples", lambda: all(
            failed().get(r, 0) > 0 for r in refused))  # fmt: skip
        assert failed().get("bearer", 0) == failed().get("basic", 0) == 0, failed()
        want = prom.series_counts('{job="prometheus"}', at=end)
        assert prom.stop() == 0
    assert len(want) > 100 and sum(want.values()) > 8 * 100  # a real, varied workload
    log_text = prom.log()
    errors = [ln for ln in log_text.splitlines() if "non-recoverable error" in ln]
    for remote, (status, says) in refused.items():
        mine = [ln for ln in errors if f"remote_name={remote} " in ln]
        assert mine and all(status in ln and says in ln for ln in mine), (remote, errors[:10])
    assert not [ln for ln in errors if re.search(r"remote_name=(bearer|basic) ", ln)], errors[:5]
    for text in (f.read_text().strip() for f in files.values()):
        assert text.split("_", 2)[2] not in log_text  # the answers never echo a secret

    eventually(lambda: held_counts(rest, a, end_ms), want)
    eventually(lambda: held_counts(rest, b, end_ms), want)
    cluster.assert_victim_empty()
    for name in (a, b):
        rest.http.delete(f"/api/v1/datasets/{name}")


# ----- vmagent ---------------------------------------------------------------------------------


def _vmagent_requests(agent_url: str) -> dict[str, float]:
    """vmagent's remote-write requests by status code, all URLs summed."""
    counts: dict[str, float] = {}
    for line in httpx.get(f"{agent_url}/metrics", timeout=10).text.splitlines():
        m = re.match(r'vmagent_remotewrite_requests_total\{.*status_code="(\d+)".*\} (\S+)', line)
        if m:
            counts[m[1]] = counts.get(m[1], 0) + float(m[2])
    return counts


def test_vmagent_with_bearer_token_files(cluster: Cluster, tmp_path: Path) -> None:
    """Line protocol into vmagent, relayed to three URLs, each with its own
    `-remoteWrite.bearerTokenFile`: a write token of the dataset (read back exactly), a
    read-scope token (403) and a revoked one (401), both into the victim, which stays empty;
    vmagent logs each refusal and counts it, and keeps retrying (4xx but 400/409)."""
    rest = cluster.rest
    name = new_dataset(rest, cluster.kafka)
    good = token_file(tmp_path / "vm.token", cluster.token("vm", ["write"], (name,)))
    read = token_file(tmp_path / "read.token", cluster.token("vm-read", ["read"]))
    revoked = token_file(tmp_path / "revoked.token", cluster.revoked("vm-revoked"))
    victim_url = f"{rest.url}/ingest/{cluster.victim}/api/v1/write"
    t0 = (time.time_ns() // 1_000_000_000 - 600) * 1000  # ms, ten minutes ago
    with vmagent(
        tmp_path,
        [f"{rest.url}/ingest/{name}/api/v1/write", victim_url, victim_url],
        *[f"-remoteWrite.bearerTokenFile={f}" for f in (good, read, revoked)],
    ) as agent:
        sent = httpx.post(
            f"{agent.url}/api/v2/write",
            params={"bucket": "b", "org": "o", "precision": "ms"},
            content=f"vm,host=a value=1.5 {t0}\nvm,host=a value=-2 {t0 + 1000}\n",
        )
        assert sent.status_code == 204, sent.text
        eventually(
            lambda: held(rest, name, "vm_value"),
            {key(__name__="vm_value", host="a"): [(t0, 1.5), (t0 + 1000, -2.0)]},
        )
        wait_for(
            "vmagent counts the refusals",
            lambda: {"401", "403"} <= {k for k, v in _vmagent_requests(agent.url).items() if v},
        )
        counts = _vmagent_requests(agent.url)
        assert not {k for k, v in counts.items() if v} - {"204", "401", "403"}, counts
        log = agent.log.read_text()

        def logged(url: int, status: str, says: str) -> bool:
            """vmagent's line for a refused block: the URL by its 1-based number."""
            return any(
                f'to "{url}:{victim_url}"' in ln and f": {status}; " in ln and says in ln
                for ln in log.splitlines()
            )

        assert logged(2, "403", "needs 'write'"), agent.log_tail()
        assert logged(3, "401", "was revoked"), agent.log_tail()
        assert not re.search(r'to "1:[^"]*" during retry', log), agent.log_tail()
    cluster.assert_victim_empty()
    rest.http.delete(f"/api/v1/datasets/{name}")


# ----- Influx clients --------------------------------------------------------------------------


def test_influx_clients_send_their_tokens(cluster: Cluster) -> None:
    """The 2.x client's `token=` (`Authorization: Token`), the 1.x client's username/password
    (basic auth, the token as the password: its ping, CREATE DATABASE on /query and writes),
    and `?u=&p=` as InfluxDB 1.x's API takes it: with a write token of the dataset, written;
    with a read-scope token 403 and a revoked or unknown token 401, raised by the client, and
    nothing of them written."""
    rest = cluster.rest
    name = new_dataset(rest, cluster.kafka)
    write = cluster.token("influx", ["write"], (name,))
    read = cluster.token("influx-read", ["read"], (name,))
    revoked = cluster.revoked("influx-revoked")
    url = f"{rest.url}/ingest/{name}"

    with InfluxDBClient(url=url, token=write, org="filopy", enable_gzip=True) as client:
        client.write_api(write_options=SYNCHRONOUS).write(
            "b", record=Point("v2").tag("via", "token").field("ok", 1.0).time(T0, WritePrecision.S)
        )
    for token, status, says in ((read, 403, "needs 'write'"), (WRONG, 401, "is not valid")):
        with InfluxDBClient(url=url, token=token, org="filopy") as client:
            with pytest.raises(InfluxDBError) as refused:
                client.write_api(write_options=SYNCHRONOUS).write(
                    "b", record=f"v2,via=refused ok=1 {T0}", write_precision=WritePrecision.S
                )
            assert refused.value.response.status == status  # type: ignore[union-attr]
            assert says in refused.value.message, refused.value.message

    port = int(rest.url.rsplit(":", 1)[1])

    def v1(password: str) -> InfluxDBClientV1:
        return InfluxDBClientV1(
            host="127.0.0.1", port=port, path=f"ingest/{name}", database="telegraf",
            username="telegraf", password=password, gzip=True,
        )  # fmt: skip

    client = v1(write)
    try:
        assert client.ping() == "FiloPy"
        client.create_database("telegraf")  # POST /query: a write token's
        point = {"measurement": "v1", "tags": {"via": "basic"}, "fields": {"ok": 2.0}}
        assert client.write_points([point | {"time": T0 + 1}], time_precision="s")
    finally:
        client.close()
    for token, status, says in ((read, 403, "needs 'write'"), (revoked, 401, "was revoked")):
        client = v1(token)
        try:
            assert client.ping() == "FiloPy"  # open: clients ping before anything
            with pytest.raises(InfluxDBClientError) as refused:
                client.create_database("telegraf")
            assert refused.value.code == status and says in str(refused.value.content)
            point = {"measurement": "v1", "tags": {"via": "refused"}, "fields": {"ok": 0.0}}
            with pytest.raises(InfluxDBClientError) as refused:
                client.write_points([point | {"time": T0 + 1}], time_precision="s")
            assert refused.value.code == status and says in str(refused.value.content)
        finally:
            client.close()

    # InfluxDB 1.x's own API also takes u and p in the query string (curl, older clients).
    for token, status in ((write, 204), (read, 403), (revoked, 401)):
        via = "query" if status == 204 else "refused"
        resp = httpx.post(
            f"{url}/write",
            params={"db": "x", "u": "me", "p": token, "precision": "s"},
            content=f"v1,via={via} ok=3 {T0 + 2}",
        )
        assert resp.status_code == status, resp.text
    eventually(
        lambda: held(rest, name, '{__name__=~".+"}'),
        {
            key(__name__="v2_ok", via="token"): [(T0 * 1000, 1.0)],
            key(__name__="v1_ok", via="basic"): [(T0 * 1000 + 1000, 2.0)],
            key(__name__="v1_ok", via="query"): [(T0 * 1000 + 2000, 3.0)],
        },
    )
    cluster.assert_victim_empty()
    rest.http.delete(f"/api/v1/datasets/{name}")


# ----- OpenTelemetry ---------------------------------------------------------------------------


def test_otlp_exporter_with_an_authorization_header(cluster: Cluster) -> None:
    """The SDK's OTLP/HTTP exporter with `headers={"Authorization": "Bearer ..."}`: a write
    token of the dataset exports (SUCCESS, read back); a read-scope token (403) and a revoked
    one (401) fail the export at once (not retried), nothing of them written."""
    rest = cluster.rest
    name = new_dataset(rest, cluster.kafka)
    endpoint = f"{rest.url}/ingest/{name}/v1/metrics"
    tokens = {
        "ok": (cluster.token("otel", ["write"], (name,)), 200),
        "read": (cluster.token("otel-read", ["read"]), 403),
        "revoked": (cluster.revoked("otel-revoked"), 401),
    }
    for service, (token, status) in tokens.items():
        responses: list[requests.Response] = []
        session = requests.Session()
        session.hooks["response"].append(lambda r, *_a, seen=responses, **_k: seen.append(r))
        exporter = OTLPMetricExporter(
            endpoint=endpoint, headers={"Authorization": f"Bearer {token}"}, session=session
        )
        reader = InMemoryMetricReader()
        provider = MeterProvider(
            resource=Resource({"service.name": service}), metric_readers=[reader]
        )
        provider.get_meter("filopy.tests.auth").create_gauge("authed").set(7)
        data = reader.get_metrics_data()
        assert data is not None
        result = exporter.export(data)
        exporter.shutdown()
        provider.shutdown()
        want = MetricExportResult.SUCCESS if status == 200 else MetricExportResult.FAILURE
        assert result is want, service
        assert [r.status_code for r in responses] == [status], service
    eventually(
        lambda: instant(rest, name, "authed", now_ms()),
        {key(__name__="authed", job="ok"): 7.0},
    )
    every = instant(rest, name, '{__name__=~".+"}', now_ms())  # target_info and authed
    assert every and {json.loads(k)["job"] for k in every} == {"ok"}, every
    cluster.assert_victim_empty()
    rest.http.delete(f"/api/v1/datasets/{name}")


# ----- Grafana ---------------------------------------------------------------------------------


def test_grafana_calls_with_a_read_token(cluster: Cluster) -> None:
    """scripts/grafana_calls.py with a read token as Grafana sends one (a custom Authorization
    header with Bearer; basic auth with the token as the password; $FILOPY_TOKEN): every call
    answers; with a write token it stops at the first call, on 403; without a token, on 401."""
    rest = cluster.rest
    name = new_dataset(rest, cluster.kafka)
    now_ns = time.time_ns()
    lines = "\n".join(
        f"http_requests,_ns_=app{i % 3},_ws_=demo,path=/p{i} value={i} {now_ns - k * 15 * 10**9}"
        for i in range(6)
        for k in range(8)
    )
    assert rest.http.post(f"/ingest/{name}/write", content=lines).status_code == 204
    query = {"query": "count(http_requests)"}

    def stored() -> bool:
        got = rest.http.get(f"/promql/{name}/api/v1/query", params=query).json()
        return bool(got["data"]["result"]) and got["data"]["result"][0]["value"][1] == "6"

    wait_for("the samples queryable", stored)
    read = cluster.token("grafana", ["read"], (name,))
    write = cluster.token("grafana-write", ["write"], (name,))
    env = {k: v for k, v in os.environ.items() if k != "FILOPY_TOKEN"}

    def replay(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "grafana_calls.py"),
             f"{rest.url}/promql/{name}", "--label", "path", *args],
            capture_output=True, text=True, timeout=120,
            env=env | ({"FILOPY_TOKEN": token} if token else {}),
        )  # fmt: skip

    for done in (replay("--bearer", read), replay("--basic", f"grafana:{read}"),
                 replay(token=read)):  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "http_requests: 6 series, 6 values of path, 6 panel series" in done.stdout
    for done, status in ((replay("--bearer", write), 403), (replay(), 401),
                         (replay("--basic", f"grafana:{write}"), 403)):  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stderr.startswith(f"FAILED health check 1+1: HTTP {status}: "), done.stderr
    rest.http.delete(f"/api/v1/datasets/{name}")


# ----- the console -----------------------------------------------------------------------------

# The requests the page makes before it has a token: refused, expected (and only these).
BEFORE_LOGIN = "/api/v1/cluster"
LOAD_401 = "Failed to load resource: the server responded with a status of 401 (Unauthorized)"
# Counts the 401 answers the page's code has read (their bodies parsed): a wait on the count,
# polled in a later task, ends after the page's code reacted to the answer.
COUNT_401 = """() => {
  window.read401 = 0;
  const fetch = window.fetch;
  window.fetch = async (...args) => {
    const resp = await fetch(...args);
    if (resp.status === 401) {
      const json = resp.json.bind(resp);
      resp.json = () => json().finally(() => { window.read401++; });
    }
    return resp;
  };
}"""


def _watch(page: Page) -> list[str]:
    """Every error the browser reports (console errors, uncaught exceptions, failed requests,
    HTTP errors), as tests/rest/test_console.py watches them."""
    problems: list[str] = []
    page.on(
        "console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on(
        "requestfailed",
        lambda r: (
            problems.append(f"failed: {r.url} {r.failure}") if "/events" not in r.url else None
        ),
    )
    page.on(
        "response",
        lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
    )
    return problems


def test_console_asks_for_a_token_and_follows_the_cluster_with_it(cluster: Cluster) -> None:
    rest = cluster.rest
    name = new_dataset(rest, cluster.kafka)
    read = cluster.token("console", ["read"])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            problems = _watch(page)
            page.add_init_script(f"({COUNT_401})()")
            page.goto(f"{rest.url}/#{name}")
            page.wait_for_selector("#login", state="visible", timeout=WAIT_MS)
            assert page.text_content("#live") == "no token"
            assert "needs a token with scope 'read'" in page.text_content("#login-error")
            assert not page.query_selector_all("#grid .shard")

            for typed, says in ((WRONG, "fpy_0123456789ab is not valid"),
                                ("hunter2", "not a FiloPy token")):  # fmt: skip
                page.fill("#token", typed)
                page.click("#login button")
                page.wait_for_function(
                    f"document.querySelector('#login-error').textContent.includes({says!r})",
                    timeout=WAIT_MS,
                )
                assert page.is_visible("#login"), says
                assert not page.query_selector_all("#grid .shard")

            # A poll the page sends with the wrong token is answered only after the login (as
            # from a slow server): its late 401 must not bring the form back.
            late: list[Route] = []
            page.route(
                f"**{BEFORE_LOGIN}",
                lambda route: route.continue_() if late else late.append(route),
            )
            wait_for("a poll with the wrong token", lambda: page.evaluate("1") and late)
            refusal = late[0].fetch()  # sent now, with the wrong token's cookie
            assert refusal.status == 401, refusal.text()
            page.fill("#token", read)
            page.click("#login button")
            page.wait_for_selector("#login", state="hidden", timeout=WAIT_MS)
            page.wait_for_function(
                "document.querySelectorAll('#grid .shard[data-status=Active]').length === 4",
                timeout=WAIT_MS,
            )
            page.wait_for_function(
                "document.querySelector('#live').textContent === 'live'", timeout=WAIT_MS
            )
            seen = page.evaluate("window.read401")
            late[0].fulfill(response=refusal)
            page.wait_for_function(f"window.read401 > {seen}", timeout=WAIT_MS)
            assert page.is_hidden("#login"), page.text_content("#login-error")
            assert page.text_content("#live") == "live"
            assert page.input_value("#dataset") == name
            assert page.evaluate("document.cookie").startswith("filopy_token=")
            # Live: an operator stops a shard; the open page shows it, from the event stream.
            stop = rest.http.post(f"/api/v1/cluster/{name}/stopshards", json={"shardList": [1]})
            assert stop.is_success, stop.text
            page.wait_for_function(
                "document.querySelector('#grid .shard[data-shard=\"1\"]')"
                "?.dataset.status === 'Stopped'",
                timeout=WAIT_MS,
            )
            assert page.is_hidden("#login")
            assert page.text_content("#live") == "live"
        finally:
            browser.close()
    expected = {f"HTTP 401: {rest.url}{BEFORE_LOGIN}", f"console: {LOAD_401}"}
    assert [p for p in problems if p not in expected] == []
    assert expected <= set(problems)  # the refusals before the login were seen, and only those
    rest.http.delete(f"/api/v1/datasets/{name}")


# ----- schemathesis (last: it drains nodes and makes and deletes datasets) ---------------------

EXAMPLES = 3  # per operation and mode: every operation reached, kept short (it is slow)
OPEN = {"GET /__health", "GET /__liveness", "GET /ingest/{dataset}/ping"}


def _schema(cluster: Cluster, seed: str) -> Any:
    raw = httpx.get(f"{cluster.rest.url}/openapi.json", timeout=30).json()  # open: no token
    schema = schemathesis.openapi.from_dict(narrowed(raw, [seed], cluster.rest.nodes))
    return schema.exclude(path="/api/v1/cluster/{ds}/events")  # never ends by itself


def _operations(schema: Any) -> list[Any]:
    operations = [result.ok() for result in schema.get_all_operations()]
    operations.sort(key=lambda op: (op.method == "delete", op.path.endswith("/startshards")))
    return operations


def _run(operations: list[Any], modes: tuple[GenerationMode, ...], one: Any) -> dict[str, Any]:
    """`one(case)` on generated cases of every operation; the failures by operation."""
    failures: dict[str, BaseException] = {}
    for operation in operations:
        for mode in modes:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: Any) -> None:
                one(case)

            try:
                check()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # no parameters: nothing to get wrong
            except Exception as e:
                failures[f"{operation.label} ({mode.value})"] = e
    return failures


def test_schemathesis_without_a_token_is_401_but_on_the_open_routes(cluster: Cluster) -> None:
    """Valid requests without a token: 401 on every operation but the open ones, each a
    documented answer (the schema lists the middleware's 401 and 403), no 5xx."""
    seed = new_dataset(cluster.rest, cluster.kafka)
    answers: dict[str, set[int]] = {}

    def one(case: Any) -> None:
        health = case.operation.path == "/__health"  # 503 by design while a shard is not live
        excluded = [positive_data_acceptance, *([not_a_server_error] if health else [])]
        response = case.call_and_validate(base_url=cluster.rest.url, excluded_checks=excluded)
        answers.setdefault(case.operation.label, set()).add(response.status_code)

    operations = _operations(_schema(cluster, seed))
    failures = _run(operations, (GenerationMode.POSITIVE,), one)
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert answers.keys() == {op.label for op in operations}
    wrong = {
        label: codes
        for label, codes in answers.items()
        if (label in OPEN and (401 in codes or (max(codes) >= 500 and label != "GET /__health")))
        or (label not in OPEN and codes != {401})
    }
    assert not wrong, wrong


def test_schemathesis_with_an_admin_token_finds_no_server_error(cluster: Cluster) -> None:
    """As tests/rest/test_schemathesis.py, with the admin token sent, few examples."""
    rest = cluster.rest
    seed = new_dataset(rest, cluster.kafka)
    # The answers' schema names the seed's dataset only (narrowed): the others go.
    for ds in rest.http.get("/api/v1/cluster").json()["data"]:
        if ds != seed:
            assert rest.http.delete(f"/api/v1/datasets/{ds}").is_success
    headers = {"Authorization": f"Bearer {cluster.admin}"}
    answers: dict[tuple[str, int, str | None], int] = {}

    def one(case: Any) -> None:
        health = case.operation.path == "/__health"
        excluded = [positive_data_acceptance, *([not_a_server_error] if health else [])]
        if (
            "api/v1/" in case.operation.path
            and not case.operation.path.startswith("/api/v1/datasets")
            and "/cluster" not in case.operation.path
        ):
            excluded.append(negative_data_rejection)  # free-form query parameters
        response = case.call_and_validate(
            base_url=rest.url, headers=headers, excluded_checks=excluded
        )
        body = response.json() if response.status_code >= 400 else {}
        k = (case.operation.label, response.status_code, body.get("errorType"))
        answers[k] = answers.get(k, 0) + 1

    operations = _operations(_schema(cluster, seed))
    failures = _run(operations, (GenerationMode.POSITIVE, GenerationMode.NEGATIVE), one)
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert not [k for k in answers if k[1] >= 500 and k[0] != "GET /__health"], answers
    assert not [k for k in answers if k[1] in (401, 403)], answers  # admin may do anything
    reached = {label for label, status, kind in answers if status < 300 or kind in REASONS}
    assert {label for label, _, _ in answers} == {op.label for op in operations}
    assert len(reached) > len(operations) // 2, answers  # past validation, into the cluster

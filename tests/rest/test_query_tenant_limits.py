"""Per-tenant query limits through the real REST API of a real two-node cluster, auth on,
samples through real Kafka: a tenant whose query reads more than `query.tenant_max_samples` (or
`tenant_max_series`) gets 422 naming the limit, while another tenant's query of fewer samples
answers 200 exactly as a service without limits answers it; the refusals cross the nodes' query
channel as themselves; /metrics counts per tenant. A negative `@` time is a 400."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from core.config import QuerySettings
from core.dataset import Dataset, SourceSettings
from filopy.auth import TokenBook
from ingest.gateway import Gateway
from store import open_stores
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, start_rest
from tests.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

MAX_SAMPLES = 100
MAX_SERIES = 15
T = 1_760_000_000_000
STEP_MS = 60_000
EACH = 30  # samples per series, one a minute
END_S = (T + (EACH - 1) * STEP_MS) // 1000
BIG, SMALL = 20, 2  # series of tenant "big" and of tenant "small"


@dataclass
class Limited:
    rest: Rest
    dataset: str
    tokens: dict[str, str]

    def get(self, path: str, token: str, **params: str) -> httpx.Response:
        return self.rest.http.get(
            f"/promql/{self.dataset}/api/v1/{path}",
            params=params,
            headers={"Authorization": f"Bearer {self.tokens[token]}"},
        )

    def query(self, token: str, query: str) -> httpx.Response:
        return self.get("query", token, query=query, time=str(END_S))


def series(tenant: str, n: int) -> list[dict[str, str]]:
    return [{"_metric_": "cpu", "_ws_": tenant, "_ns_": "app", "host": f"h{i}"} for i in range(n)]


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Limited]:
    tmp: Path = tmp_path_factory.mktemp("qlimits")
    base = cluster_settings(tmp, "kafka", kafka_bootstrap=kafka_bootstrap)
    settings = base.model_copy(
        update={
            "auth": base.auth.model_copy(update={"enabled": True}),
            "query": QuerySettings(tenant_max_samples=MAX_SAMPLES, tenant_max_series=MAX_SERIES),
        }
    )
    for rest in start_rest(tmp, nodes=2, settings=settings):
        meta, columns = open_stores(settings)
        columns.close()
        book = TokenBook(meta)
        tokens = {
            "admin": book.create("tests-admin", ["admin"])[1],
            "reader": book.create("no tenant", ["read"])[1],
            "team-a": book.create("team a", ["read"], tenant="team-a")[1],
        }
        rest.http.headers["Authorization"] = f"Bearer {tokens['admin']}"
        wait_for("the admin token taken", lambda h=rest.http: h.get("/api/v1/cluster").is_success)
        yield Limited(rest, _load(rest, kafka_bootstrap), tokens)
        meta.close()


def _load(rest: Rest, kafka_bootstrap: str) -> str:
    """A dataset of both tenants' series, every sample through Kafka and ingested."""
    ds = Dataset(
        name=f"ql{uuid.uuid4().hex[:8]}",
        num_shards=4,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    rest.client.setup_dataset(ds)
    rest.wait_for("all shards active", lambda: rest.all_active(ds.name), 60)
    everything = series("big", BIG) + series("small", SMALL)
    with Gateway(ds) as gw:
        for labels in everything:
            gw.send((labels, T + k * STEP_MS, float(k)) for k in range(EACH))

    def ingested() -> bool:
        stats = rest.client.ingest_stats(ds.name)
        shards = [st for per_node in stats.values() for st in per_node.values()]
        return sum(st["memstore"].ingested for st in shards) == len(everything) * EACH

    rest.wait_for("every sample ingested", ingested, 120)
    return ds.name


def refusal(r: httpx.Response) -> str:
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["status"] == "error" and body["errorType"] == "execution", body
    return str(body["error"])


def test_a_tenant_over_its_samples_limit_gets_422_and_another_tenant_answers(
    limited: Limited,
) -> None:
    query = 'sum(count_over_time(cpu{_ws_="%s"}[1h]))'
    over = refusal(limited.query("team-a", query % "big"))  # the token's tenant counts
    assert f"query.tenant_max_samples = {MAX_SAMPLES}" in over and "'team-a'" in over
    over = refusal(limited.query("reader", query % "big"))  # no token tenant: the _ws_ pinned
    assert f"query.tenant_max_samples = {MAX_SAMPLES}" in over and "'big'" in over
    ok = limited.query("reader", query % "small")
    assert ok.status_code == 200, ok.text
    assert ok.json()["data"]["result"][0]["value"][1] == str(SMALL * EACH)


def test_a_tenant_over_its_series_limit_gets_422_naming_it(limited: Limited) -> None:
    """An instant selector reads a few samples of each series: the series are what is over."""
    over = refusal(limited.query("reader", 'cpu{_ws_="big"}'))
    assert f"query.tenant_max_series = {MAX_SERIES}" in over and "'big'" in over
    ok = limited.query("team-a", 'cpu{_ws_="small"}')
    assert ok.status_code == 200 and len(ok.json()["data"]["result"]) == SMALL


def test_a_query_under_the_limits_answers_as_without_them(limited: Limited) -> None:
    from coordinator.cluster_queries import cluster_query_service  # it imports Ray

    query = 'rate(cpu{_ws_="small"}[5m])'
    start, end = END_S - 600, END_S
    r = limited.get("query_range", "team-a", query=query, start=str(start), end=str(end), step="60")
    assert r.status_code == 200, r.text
    free = cluster_query_service(
        limited.rest.client, limits=QuerySettings(tenant_max_samples=0, tenant_max_series=0)
    )
    try:
        want = free.range(limited.dataset, query, start * 1000, end * 1000, 60_000)
    finally:
        free.close()
    got = {tuple(sorted(s["metric"].items())): s["values"] for s in r.json()["data"]["result"]}
    assert want.tenant is None and len(got) == SMALL
    for labels, row in zip(want.value.labels, want.value.values, strict=True):  # type: ignore[union-attr]
        values = got[tuple(sorted(labels.items()))]
        assert [float(v) for _, v in values] == pytest.approx(row.tolist())


def test_metrics_count_per_tenant(limited: Limited) -> None:
    refusal(limited.query("team-a", 'count_over_time(cpu{_ws_="big"}[1h])'))
    assert limited.query("reader", 'count_over_time(cpu{_ws_="small"}[1h])').status_code == 200
    reader = {"Authorization": f"Bearer {limited.tokens['reader']}"}
    text = httpx.get(f"{limited.rest.url}/metrics", headers=reader, timeout=30).text
    refused = [
        line
        for line in text.splitlines()
        if line.startswith('filopy_query_tenant_refused_total{limit="samples",tenant="team-a"}')
    ]
    assert refused and float(refused[0].split()[-1]) >= 1
    read = [
        line
        for line in text.splitlines()
        if line.startswith('filopy_query_tenant_samples_total{tenant="small"}')
    ]
    assert read and float(read[0].split()[-1]) >= SMALL * EACH


@pytest.mark.parametrize("path", ["query", "format_query"])
def test_a_negative_at_time_is_a_400(limited: Limited, path: str) -> None:
    r = limited.get(path, "reader", query="cpu @ -1")
    assert r.status_code == 400, r.text
    assert r.json()["errorType"] == "bad_data" and "must not be negative" in r.json()["error"]

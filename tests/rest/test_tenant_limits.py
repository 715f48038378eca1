"""Per-tenant limits on a real gateway app writing to Kafka: a tenant over its active-series
limit gets 429 with Retry-After (nothing of the request written) while another tenant's writes
go on; with a write token limited to a tenant, series of another `_ws_` are refused (403). The
per-tenant counters say who was refused and why."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.dataset import Dataset, SourceSettings
from filopy.auth import TokenBook
from filopy.ingest_http import create_gateway_app
from ingest.topics import ensure_topic
from store import open_stores
from tests.cluster import cluster_settings
from tests.rest.conftest import ServerThread, topic_batches

pytestmark = [pytest.mark.kafka]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str
) -> Iterator[tuple[str, Dataset, dict[str, str]]]:
    tmp: Path = tmp_path_factory.mktemp("tenants")
    base = cluster_settings(tmp, "kafka", kafka_bootstrap=kafka_bootstrap)
    settings = base.model_copy(
        update={
            "gateway": base.gateway.model_copy(
                update={"tenant_active_series": 10, "retry_after_s": 3}
            ),
            "auth": base.auth.model_copy(update={"enabled": True}),
        }
    )
    ds = Dataset(
        name=f"ten{uuid.uuid4().hex[:8]}",
        num_shards=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    ensure_topic(ds)
    meta, columns = open_stores(settings)
    columns.close()
    meta.create_dataset(ds)
    book = TokenBook(meta)
    tokens = {
        "any": book.create("any tenant", ["write"])[1],
        "team-a": book.create("team a only", ["write"], tenant="team-a")[1],
        "read": book.create("metrics", ["read"])[1],
    }
    with ServerThread(create_gateway_app(settings)) as url:
        yield url, ds, tokens
    meta.close()


def lines(tenant: str, hosts: range) -> str:
    return "\n".join(f"cpu,_ws_={tenant},_ns_=app,host=h{i} usage={i} 1760000000" for i in hosts)


def test_a_tenant_over_its_series_limit_gets_429_and_others_go_on(gateway: tuple) -> None:
    url, ds, tokens = gateway
    write = f"{url}/ingest/{ds.name}/api/v2/write?precision=s"
    auth = {"Authorization": f"Bearer {tokens['any']}"}
    with httpx.Client(headers=auth, timeout=60) as http:
        assert http.post(write, content=lines("a", range(8))).status_code == 204
        over = http.post(write, content=lines("a", range(8, 13)))  # a would have 13
        assert over.status_code == 429, over.text
        assert over.headers["Retry-After"] == "3"
        assert "over its limit of 10" in over.text
        assert http.post(write, content=lines("b", range(10))).status_code == 204
        assert http.post(write, content=lines("a", range(8))).status_code == 204  # known series
    reader = {"Authorization": f"Bearer {tokens['read']}"}
    metrics = httpx.get(f"{url}/metrics", headers=reader, timeout=30).text
    refused = 'filopy_http_ingest_tenant_refused_samples_total{limit="active_series",tenant="a"}'
    assert f"{refused} 5.0" in metrics
    assert 'filopy_http_ingest_tenant_samples_total{tenant="b"} 10.0' in metrics
    # In Kafka: a's first 8 series twice and b's 10, never the refused request's.
    hosts = sorted(s["host"] for b in topic_batches(ds) for s in b.series if s["_ws_"] == "a")
    assert hosts == sorted([f"h{i}" for i in range(8)] * 2)


def test_a_tenant_token_writes_only_its_tenant(gateway: tuple) -> None:
    url, ds, tokens = gateway
    write = f"{url}/ingest/{ds.name}/api/v2/write?precision=s"
    auth = {"Authorization": f"Bearer {tokens['team-a']}"}
    ok = httpx.post(write, content=lines("team-a", range(2)), headers=auth, timeout=60)
    assert ok.status_code == 204, ok.text
    other = httpx.post(write, content=lines("team-b", range(2)), headers=auth, timeout=60)
    assert other.status_code == 403, other.text
    assert "this token writes only _ws_='team-a'" in other.text

"""A dataset that names no Kafka uses the cluster's `kafka.bootstrap_servers` (issue 11, item 2).

The cluster here is configured with `localhost:PORT`, another name for the real broker, so a
definition that silently fell back to the built-in 127.0.0.1 default shows in the stored
definition, whichever way the dataset was created: REST, the Python client or the CLI.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from core.dataset import DatasetRef, SourceSettings
from filopy import Dataset
from filopy.cli import app as cli
from store import open_stores
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, start_rest

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

DATASETS = "/api/v1/datasets"


@pytest.fixture(scope="module")
def cluster_kafka(kafka_bootstrap: str) -> str:
    return "localhost:" + kafka_bootstrap.rsplit(":", 1)[1]


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, cluster_kafka: str) -> Iterator[Rest]:
    settings = cluster_settings(
        tmp_path_factory.mktemp("rest-bootstrap"), "kafka", kafka_bootstrap=cluster_kafka
    )
    yield from start_rest(tmp_path_factory.mktemp("rest-bootstrap"), nodes=2, settings=settings)


def _stored(rest: Rest, name: str) -> Dataset:
    """The definition as the cluster's MetaStore holds it."""
    meta, columns = open_stores(rest.cluster.settings)
    try:
        found = meta.get_dataset(DatasetRef(name=name))
    finally:
        meta.close()
        columns.close()
    assert found is not None
    return found


def _ingests(rest: Rest, name: str, bootstrap: str) -> None:
    """A record sent to the dataset's topic is read by its shard's ingester."""
    rest.wait_for("shards active", lambda: rest.all_active(name))
    topic = f"filopy-{name}"
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.produce(topic, b"up,_ws_=w,_ns_=n value=1 1700000000000000000", partition=0)
    assert producer.flush(30) == 0

    def read() -> bool:
        stats = rest.client.ingest_stats(name)
        return sum(s["messages"] for shards in stats.values() for s in shards.values()) == 1

    rest.wait_for("the message ingested", read)


def test_rest_dataset_without_bootstrap_uses_the_clusters_kafka(
    rest: Rest, cluster_kafka: str, kafka_bootstrap: str
) -> None:
    name = f"ds{uuid.uuid4().hex[:8]}"
    body = {"name": name, "num_shards": 2, "source": {"record_format": "influx-line"}}
    created = rest.http.post(DATASETS, json=body)
    assert created.status_code == 201, created.text
    assert created.json()["data"]["source"]["bootstrap_servers"] == cluster_kafka
    got = rest.http.get(f"{DATASETS}/{name}").json()["data"]
    assert got["source"]["bootstrap_servers"] == cluster_kafka
    assert _stored(rest, name).source.bootstrap_servers == cluster_kafka
    again = rest.http.post(DATASETS, json=body)  # the same request: still the same definition
    assert again.status_code == 200, again.text
    _ingests(rest, name, kafka_bootstrap)


def test_python_client_and_cli_datasets_use_the_clusters_kafka(
    rest: Rest, cluster_kafka: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"ds{uuid.uuid4().hex[:8]}"
    assert rest.client.setup_dataset(Dataset(name=name, num_shards=2))
    assert _stored(rest, name).source.bootstrap_servers == cluster_kafka
    assert not rest.client.setup_dataset(Dataset(name=name, num_shards=2))  # exists, same

    # The CLI's own settings name another Kafka: the cluster's wins.
    monkeypatch.setenv("FILOPY_RAY__NAMESPACE", rest.cluster.settings.ray.namespace)
    monkeypatch.setenv("FILOPY_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    other = f"ds{uuid.uuid4().hex[:8]}"
    args = ["dataset", "create", other, "--shards", "2", "--address", rest.cluster.ray.address]
    made = CliRunner().invoke(cli, args)
    assert made.exit_code == 0 and f"created: {other}" in made.output, made.output
    assert _stored(rest, other).source.bootstrap_servers == cluster_kafka


def test_a_dataset_naming_its_kafka_keeps_it(rest: Rest, kafka_bootstrap: str) -> None:
    name = f"ds{uuid.uuid4().hex[:8]}"
    source = {"bootstrap_servers": kafka_bootstrap}
    created = rest.http.post(DATASETS, json={"name": name, "num_shards": 2, "source": source})
    assert created.status_code == 201, created.text
    assert created.json()["data"]["source"]["bootstrap_servers"] == kafka_bootstrap
    assert _stored(rest, name).source.bootstrap_servers == kafka_bootstrap
    ds = Dataset(name=name, num_shards=2, source=SourceSettings(bootstrap_servers=kafka_bootstrap))
    assert not rest.client.setup_dataset(ds)  # the same definition

"""A real FiloPy cluster (local multi-node Ray, source "none") served over real HTTP by uvicorn.

The app runs in a uvicorn server on a thread of the test process (the Ray driver), so requests
and SSE streams go over real HTTP, as they do when the CLI serves the app. One cluster per test
module keeps the suite fast; tests use their own dataset names.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import uvicorn
from confluent_kafka import Consumer, TopicPartition
from fastapi import FastAPI

from core.config import Settings
from core.dataset import Dataset
from filopy.rest import create_app
from ingest.batch import SampleBatch
from ingest.wire.binary_format import decode_binary
from tests.cluster import (
    FiloPyCluster,
    cluster_settings,
    end_cluster,
    ray_pool,
    start_cluster,
)
from tests.waiting import DEADLINE_S, wait_for

if TYPE_CHECKING:
    from coordinator.client import FiloPyClient


class ServerThread:
    """uvicorn serving `app` on a free loopback port, on a daemon thread."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="rest-server", daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the REST server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)


@dataclass
class Rest:
    """The cluster, its REST server's base URL and an HTTP client bound to it."""

    cluster: FiloPyCluster
    url: str
    http: httpx.Client
    nodes: list[str]
    app: FastAPI

    @property
    def client(self) -> FiloPyClient:
        return self.cluster.client

    def wait_for(self, what: str, check: Any, timeout_s: float = DEADLINE_S) -> Any:
        return wait_for(what, check, timeout_s)

    def all_active(self, name: str) -> bool:
        return self.client.shard_map(name).is_healthy()


def start_rest(tmp_path: Path, nodes: int, settings: Settings | None = None) -> Iterator[Rest]:
    """A FiloPy cluster of `nodes` nodes with its REST server, on the process' warm Ray cluster
    (`ray_pool`)."""
    settings = settings or cluster_settings(tmp_path)
    ray_cluster, ids = ray_pool(nodes, settings.cluster.node_resource)
    cluster = start_cluster(ray_cluster, settings)
    try:
        yield from _serve(cluster, ids)
    finally:
        end_cluster(cluster)


def _serve(cluster: FiloPyCluster, ids: list[str]) -> Iterator[Rest]:
    cluster.wait_for(f"{len(ids)} members", lambda: set(cluster.client.members()) == set(ids))
    app = create_app(cluster.client, cluster.settings)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        yield Rest(cluster, url, http, ids, app)


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rest]:
    """A two-node cluster with its REST server, shared by the tests of one module."""
    yield from start_rest(tmp_path_factory.mktemp("rest"), nodes=2)


@pytest.fixture
def name() -> str:
    """A fresh dataset name."""
    return f"ds{uuid.uuid4().hex[:8]}"


def topic_batches(ds: Dataset) -> Iterator[SampleBatch]:
    """Every message of the dataset's topic as the ingesters decode it, partition by
    partition, read straight from Kafka."""
    consumer = Consumer(
        {
            "bootstrap.servers": ds.source.bootstrap_servers,
            "group.id": "tests",
            "enable.auto.commit": False,
        }
    )
    try:
        for p in range(ds.num_shards):
            end = consumer.get_watermark_offsets(TopicPartition(ds.topic, p), timeout=30)[1]
            consumer.assign([TopicPartition(ds.topic, p, 0)])
            offset = 0
            while offset < end:
                msg = consumer.poll(10)
                assert msg is not None, f"partition {p}: nothing at offset {offset} of {end}"
                assert msg.error() is None, msg.error()
                offset = msg.offset() + 1
                yield decode_binary(msg.value()).batch
    finally:
        consumer.close()

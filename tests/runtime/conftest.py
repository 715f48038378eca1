"""A FiloPy cluster on a real multi-node local Ray cluster: singleton on the head, nodes added."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.local_cluster import LocalRayCluster
from core.config import Settings
from tests.cluster import FiloPyCluster, cluster_settings, start_cluster


def on_backend(settings: Settings, request: pytest.FixtureRequest, kafka: str) -> Settings:
    """`settings` with the store backend the test is parametrized with (`request.param`:
    "sqlite", or "cassandra" in a keyspace of its own, Cassandra up or a loud failure) and the
    cluster's Kafka at `kafka`."""
    backend = request.param
    if backend == "cassandra":
        request.getfixturevalue("cassandra_address")
    return settings.model_copy(
        update={
            "store": settings.store.model_copy(update={"backend": backend}),
            "cassandra": settings.cassandra.model_copy(
                update={"keyspace": f"filopy_test_{uuid.uuid4().hex[:8]}"}
            ),
            "kafka": settings.kafka.model_copy(update={"bootstrap_servers": kafka}),
        }
    )


@pytest.fixture
def filopy_cluster(ray_cluster: LocalRayCluster, tmp_path: Path) -> Iterator[FiloPyCluster]:
    yield start_cluster(ray_cluster, cluster_settings(tmp_path))


@pytest.fixture
def quick_to_fail_cluster(ray_cluster: LocalRayCluster, tmp_path: Path) -> Iterator[FiloPyCluster]:
    """With the product's failure timeout (4 s, where other test clusters wait 60 s): for the
    tests of silence itself, a hung node and a busy machine."""
    settings = cluster_settings(tmp_path, failure_timeout_s=None)
    yield start_cluster(ray_cluster, settings)

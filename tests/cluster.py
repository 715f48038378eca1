"""A FiloPy test cluster: its settings, the pieces of it a test holds, and its start.

Ray-free to import, so modules collected by `make unit` can share it; only starting a cluster
imports Ray.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import Settings, load_settings
from tests.waiting import DEADLINE_S, wait_for

if TYPE_CHECKING:
    from coordinator.client import FiloPyClient
    from coordinator.local_cluster import LocalRayCluster


@dataclass
class FiloPyCluster:
    ray: LocalRayCluster
    settings: Settings
    client: FiloPyClient
    actor: Any

    def add_node(self, labels: dict[str, str] | None = None) -> Any:
        """A new Ray node offering the FiloPy node resource; returns Ray's node handle."""
        return self.ray.add_node(resources={self.settings.cluster.node_resource: 1}, labels=labels)

    def wait_for(self, what: str, check: Callable[[], Any], timeout_s: float = DEADLINE_S) -> Any:
        return wait_for(what, check, timeout_s)


def cluster_settings(
    tmp_path: Path, source: str = "none", rebalance: bool = False, **ingest: Any
) -> Settings:
    """Settings for one test cluster: its own SQLite file and Ray namespace.

    `source="none"` runs the control plane alone (shards are claimed and reported live without
    reading Kafka); the ingestion tests pass "kafka". Rebalancing is off unless asked for: the
    tests of failures, starts and stops pin where shards are (FiloDB's placement, where a node
    that joins gets nothing); tests/runtime/test_rebalance.py turns it on.
    """
    base = load_settings()
    return base.model_copy(
        update={
            "store": base.store.model_copy(update={"sqlite_path": tmp_path / "filopy.db"}),
            "ray": base.ray.model_copy(update={"namespace": f"filopy-{uuid.uuid4().hex[:8]}"}),
            "ingest": base.ingest.model_copy(update={"source": source, **ingest}),
            "rebalance": base.rebalance.model_copy(update={"enabled": rebalance}),
            "auth": base.auth.model_copy(update={"enabled": False}),
        }
    )


def start_cluster(ray_cluster: LocalRayCluster, settings: Settings) -> FiloPyCluster:
    """The singleton of a test cluster on `ray_cluster`, ready, with a client."""
    import ray

    from coordinator.client import FiloPyClient
    from coordinator.cluster_actor import start_cluster_actor

    actor = start_cluster_actor(settings)
    ray.get(actor.ready.remote(), timeout=60)
    return FiloPyCluster(ray_cluster, settings, FiloPyClient(actor, settings), actor)

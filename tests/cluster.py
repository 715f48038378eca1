"""A FiloPy test cluster: its settings, the pieces of it a test holds, and its start.

Ray-free to import, so modules collected by `make unit` can share it; only starting a cluster
imports Ray.
"""

from __future__ import annotations

import atexit
import contextlib
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
    tmp_path: Path,
    source: str = "none",
    rebalance: bool = False,
    kafka_bootstrap: str | None = None,
    **ingest: Any,
) -> Settings:
    """Settings for one test cluster: its own SQLite file and Ray namespace.

    `source="none"` runs the control plane alone (shards are claimed and reported live without
    reading Kafka); the ingestion tests pass "kafka" and the test broker's `kafka_bootstrap`
    (the fixture's). Rebalancing is off unless asked for: the
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
            "kafka": base.kafka.model_copy(
                update={"bootstrap_servers": kafka_bootstrap or base.kafka.bootstrap_servers}
            ),
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


# A warm Ray cluster kept by this test process (one driver per process: one Ray cluster at a
# time) and lent to the modules whose FiloPy cluster needs nothing of Ray's own but its nodes:
# each gets a fresh FiloPy cluster (its own Ray namespace, store and settings) on the same Ray
# processes, and ends it by killing its namespace's actors. A fresh FiloPy cluster on warm Ray
# nodes starts in about a quarter of a cold start's CPU (ray head, raylets, agents, workers).
_pool: LocalRayCluster | None = None
_pool_nodes: list[Any] = []


def ray_pool(nodes: int, node_resource: str) -> tuple[LocalRayCluster, list[str]]:
    """The process' warm Ray cluster with exactly `nodes` live nodes offering
    `node_resource`, and their ids; started (again) when there is none or it no longer fits."""
    global _pool
    import ray

    from coordinator.local_cluster import LocalRayCluster

    if _pool is not None:
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        ids = [n.node_id for n in _pool_nodes]
        if len(ids) > nodes or not set(ids) <= alive:
            release_ray_pool()
    if _pool is None:
        _pool = LocalRayCluster()
        _pool_nodes.clear()
        atexit.register(release_ray_pool)  # a script's (tests.compliance.harness) as well
    while len(_pool_nodes) < nodes:
        _pool_nodes.append(_pool.add_node(resources={node_resource: 1}))
    return _pool, [n.node_id for n in _pool_nodes]


def release_ray_pool() -> None:
    """Shut the warm Ray cluster down, if any: before a Ray cluster of a test's own, and at the
    end of the session."""
    global _pool
    if _pool is not None:
        pool, _pool = _pool, None
        _pool_nodes.clear()
        pool.shutdown()


def end_cluster(cluster: FiloPyCluster) -> None:
    """End a FiloPy cluster on the warm Ray cluster: kill every actor of its namespace (the
    singleton, the node coordinators; what they own dies with them) until none is left, so
    nothing of it keeps reading Kafka or writing its store. Killed again while listed: a
    singleton may start a coordinator between the listing and its own end."""
    import ray

    cluster.client.close()
    if _pool is None or not ray.is_initialized():
        return  # the warm cluster was shut down (a later test's own), and everything with it
    namespace = cluster.settings.ray.namespace
    with contextlib.suppress(ValueError):  # the singleton first: it restarts coordinators
        ray.kill(cluster.actor, no_restart=True)
    left: list[str] = []

    def gone() -> bool:
        actors = ray.util.list_named_actors(all_namespaces=True)
        left[:] = [a["name"] for a in actors if a["namespace"] == namespace]
        for name in left:
            with contextlib.suppress(ValueError):  # gone meanwhile
                ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
        return not left

    try:
        wait_for(f"the actors of {namespace} gone", gone, interval_s=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}; still listed: {left}") from None

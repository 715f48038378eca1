"""A FiloPy test cluster: its settings, the pieces of it a test holds, and its start.

Ray-free to import, so modules collected by `make unit` can share it; only starting a cluster
imports Ray.
"""

from __future__ import annotations

import atexit
import contextlib
import uuid
import warnings
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
    failure_timeout_s: float | None = 60.0,
    **ingest: Any,
) -> Settings:
    """Settings for one test cluster: its own SQLite file and Ray namespace.

    `source="none"` runs the control plane alone (shards are claimed and reported live without
    reading Kafka); the ingestion tests pass "kafka" and the test broker's `kafka_bootstrap`
    (the fixture's). Rebalancing is off unless asked for: the
    tests of failures, starts and stops pin where shards are (FiloDB's placement, where a node
    that joins gets nothing); tests/runtime/test_rebalance.py turns it on.

    A node is taken for failed after `failure_timeout_s` of silence: 60 s here, not the product's
    4 s, because on a loaded CI machine a healthy node can miss pings for over 4 s (a CI run saw
    4.3 s), and a node taken for dead moves its shards for a reason the test did not make (one
    extra move in a test counting moves). A killed node is seen at once all the same (its
    process' death or Ray's node list); the tests of silence itself (a hung node, a busy machine)
    pass None: the product's own timeout (config/filopy.toml).
    """
    base = load_settings()
    return base.model_copy(
        update={
            "store": base.store.model_copy(update={"sqlite_path": tmp_path / "filopy.db"}),
            "ray": base.ray.model_copy(update={"namespace": f"filopy-{uuid.uuid4().hex[:8]}"}),
            "ingest": base.ingest.model_copy(update={"source": source, **ingest}),
            "rebalance": base.rebalance.model_copy(update={"enabled": rebalance}),
            "cluster": base.cluster.model_copy(
                update={"failure_timeout_s": failure_timeout_s or base.cluster.failure_timeout_s}
            ),
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
# time) and lent to every test that needs a Ray cluster: each starts a fresh FiloPy cluster (its
# own Ray namespace, store and settings) on the same Ray head, and its nodes are added or removed
# to fit. A fresh FiloPy cluster on a warm Ray cluster starts in about a quarter of a cold
# start's CPU (ray head, raylets, agents, workers).
_pool: LocalRayCluster | None = None
_pool_nodes: list[Any] = []
_pool_resource: str | None = None


def ray_pool(nodes: int, node_resource: str) -> tuple[LocalRayCluster, list[str]]:
    """The process' warm Ray cluster with exactly `nodes` live worker nodes offering
    `node_resource`, and their ids: started when there is none, nodes added or removed to fit
    (a node a test killed is dropped, one offering another resource removed)."""
    global _pool_resource

    pool = _warm_pool()
    if node_resource != _pool_resource:
        _remove_pool_nodes()
        _pool_resource = node_resource
    # A node a test removed (killed) is gone from the pool's nodes at once.
    kept = {n.node_id for n in pool.worker_nodes}
    _pool_nodes[:] = [n for n in _pool_nodes if n.node_id in kept]
    if len(_pool_nodes) > nodes:
        _remove_nodes(_pool_nodes[nodes:])
        del _pool_nodes[nodes:]
    _settle()
    while len(_pool_nodes) < nodes:
        _pool_nodes.append(pool.add_node(resources={node_resource: 1}))
    return pool, [n.node_id for n in _pool_nodes]


def lend_ray_head() -> LocalRayCluster:
    """The warm Ray cluster with no worker node, for a test that adds and kills its own nodes
    (the `ray_cluster` fixture); `reclaim_ray_head` takes it back."""
    pool = _warm_pool()
    _remove_pool_nodes()
    return pool


def reclaim_ray_head() -> None:
    """After a test that had the warm Ray cluster to itself: every actor of every namespace
    killed (its FiloPy cluster, whatever it was called) and every worker node it added removed,
    so the next test starts on a bare head. If that fails (a test left Ray wedged), the whole
    Ray cluster is shut down, with a warning: the next test starts a new one."""
    import ray

    if _pool is None or not ray.is_initialized():
        return
    try:
        _kill_actors(None)
        _remove_pool_nodes()
    except Exception as e:
        warnings.warn(f"the warm Ray cluster, not cleared, shut down: {e}", stacklevel=2)
        release_ray_pool()


def _warm_pool() -> LocalRayCluster:
    global _pool
    if _pool is None:
        from coordinator.local_cluster import LocalRayCluster

        _pool = LocalRayCluster()
        _pool_nodes.clear()
        atexit.register(release_ray_pool)  # a script's (tests.compliance.harness) as well
    return _pool


def _remove_pool_nodes() -> None:
    _remove_nodes(_pool.worker_nodes if _pool else [])
    _pool_nodes.clear()


def _remove_nodes(nodes: list[Any]) -> None:
    """Stop `nodes`, gracefully: a stopped raylet tells Ray's control store at once (measured
    0.05 s, an actor on it or not), where a killed one is declared dead after missed health
    checks (2.5 s)."""
    for node in nodes if _pool else []:
        _pool.remove_node(node, graceful=True)
    _settle()


def _settle() -> None:
    """Wait until Ray's control store lists alive exactly the head and the nodes still running,
    as the next test counts live nodes (a CI run saw 5 where a bare head plus 2 were started:
    nodes removed by the test before, killed, still listed)."""
    import ray

    if _pool is None:
        return
    running = {_pool.head.node_id} | {n.node_id for n in _pool.worker_nodes}
    wait_for(
        "Ray's live nodes to be the ones running",
        lambda: {n["NodeID"] for n in ray.nodes() if n["Alive"]} == running,
        interval_s=0.2,
    )


def release_ray_pool() -> None:
    """Shut the warm Ray cluster down, if any: before a test that needs this process not
    connected to Ray, and at the end of the session."""
    global _pool, _pool_resource
    if _pool is not None:
        pool, _pool, _pool_resource = _pool, None, None
        _pool_nodes.clear()
        pool.shutdown()


def end_cluster(cluster: FiloPyCluster) -> None:
    """End a FiloPy cluster on the warm Ray cluster, which goes on with its nodes: every actor
    of its namespace killed, so nothing of it keeps reading Kafka or writing its store."""
    import ray

    cluster.client.close()
    if _pool is None or not ray.is_initialized():
        return  # the warm cluster was shut down (a later test's own), and everything with it
    _kill_actors(cluster.settings.ray.namespace)


def _kill_actors(namespace: str | None) -> None:
    """Kill the named actors of `namespace` (None: of every namespace; FiloPy names every actor
    it starts, and what they own dies with them) until none is left. The singletons first, as
    they start coordinators; killed again while listed, as one may have started a coordinator
    between the listing and its own end."""
    import ray

    from coordinator.names import CLUSTER_ACTOR_NAME

    left: list[tuple[str, str]] = []

    def listed() -> list[tuple[str, str]]:
        actors = ray.util.list_named_actors(all_namespaces=True)
        named = [(a["namespace"], a["name"]) for a in actors]
        mine = [a for a in named if namespace is None or a[0] == namespace]
        return sorted(mine, key=lambda a: a[1] != CLUSTER_ACTOR_NAME)

    def gone() -> bool:
        left[:] = listed()
        for ns, name in left:
            with contextlib.suppress(ValueError):  # gone meanwhile
                ray.kill(ray.get_actor(name, namespace=ns), no_restart=True)
        return not left

    try:
        wait_for(f"the actors of {namespace or 'every namespace'} gone", gone, interval_s=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}; still listed: {left}") from None

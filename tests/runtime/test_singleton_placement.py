"""The singleton runs on the Ray head node (docs/architecture.md), on a real multi-node cluster
whose FiloPy nodes exist before it is created (as with `filopy up`), and comes back on the head
after Ray restarts it (issue 11, item 12)."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from ray._private import state as ray_state

from coordinator.cluster_actor import start_cluster_actor
from coordinator.local_cluster import LocalRayCluster
from coordinator.names import CLUSTER_ACTOR_NAME
from tests.runtime.conftest import cluster_settings

pytestmark = pytest.mark.ray


def _singleton() -> tuple[str, int] | None:
    """The node id and pid of the live singleton process, from Ray's actor table (None while
    it is restarting). The test's Ray cluster holds one singleton only."""
    for info in ray_state.actors().values():
        if info.get("Name") == CLUSTER_ACTOR_NAME and info.get("State") == "ALIVE":
            return str(info["Address"]["NodeID"]), int(info["Pid"])
    return None


def test_the_singleton_runs_on_the_head_also_after_ray_restarts_it(
    ray_cluster: LocalRayCluster, tmp_path: Path
) -> None:
    settings = cluster_settings(tmp_path)
    workers = [
        ray_cluster.add_node(resources={settings.cluster.node_resource: 1}) for _ in range(3)
    ]
    head = ray_cluster.head.node_id
    assert head not in {w.node_id for w in workers}
    actor = start_cluster_actor(settings)
    started = ray.get(actor.ready.remote(), timeout=60)
    where = _singleton()
    assert where is not None
    assert where[0] == head, f"singleton on {where[0]}, head is {head}"

    ray.kill(actor, no_restart=False)  # the process dies; Ray restarts it
    restarted = ray.get(actor.ready.remote(), timeout=60)
    assert restarted != started  # a new incarnation
    again = _singleton()
    assert again is not None and again[1] != where[1]
    assert again[0] == head, f"restarted singleton on {again[0]}, head is {head}"


@ray.remote
class _NeverCreated:
    """Stands in for a singleton whose restart Ray sent to a dead node: it asks for a resource
    no node has, so Ray never creates it."""

    def ready(self) -> None:
        return None


def test_a_singleton_ray_does_not_create_again_is_created_anew_on_the_head(
    ray_cluster: LocalRayCluster, tmp_path: Path
) -> None:
    settings = cluster_settings(tmp_path)
    stuck = _NeverCreated.options(  # type: ignore[attr-defined]
        name=CLUSTER_ACTOR_NAME,
        namespace=settings.ray.namespace,
        lifetime="detached",
        resources={"nowhere": 1},
    ).remote()
    actor = start_cluster_actor(settings, restart_grace_s=2)
    ray.get(actor.ready.remote(), timeout=60)
    where = _singleton()
    assert where is not None and where[0] == ray_cluster.head.node_id
    with pytest.raises(ray.exceptions.RayActorError):  # ended, not left waiting
        ray.get(stuck.ready.remote(), timeout=60)

"""Ray is real: a three-node local cluster, an actor pinned to one node, that node lost."""

from __future__ import annotations

import time

import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.ray


class Where:
    """An actor (made one by the test: Ray is imported only where it runs)."""

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        import os

        return os.getpid()


def test_actor_on_chosen_node_dies_with_its_node(ray_cluster) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    where = ray.remote(num_cpus=0)(Where)
    a = ray_cluster.add_node()
    b = ray_cluster.add_node()
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert {ray_cluster.head.node_id, a.node_id, b.node_id} <= alive
    assert len(alive) == 3
    assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes())

    on_b = where.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=b.node_id, soft=False)
    ).remote()
    on_a = where.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=a.node_id, soft=False)
    ).remote()
    assert ray.get(on_b.node_id.remote(), timeout=60) == b.node_id
    assert ray.get(on_a.node_id.remote(), timeout=60) == a.node_id

    started = time.monotonic()
    ray_cluster.remove_node(b)
    with pytest.raises(ray.exceptions.RayActorError):
        # The first calls may race the node's death; the actor must be reported dead, not hang.
        while time.monotonic() - started < 60:
            ray.get(on_b.pid.remote(), timeout=10)
            time.sleep(0.2)
    assert time.monotonic() - started < 60

    # The node is gone from the cluster, and the actor on the other node is untouched.
    wait_for(
        "node b gone",
        lambda: b.node_id not in {n["NodeID"] for n in ray.nodes() if n["Alive"]},
        interval_s=0.5,
    )
    assert ray.get(on_a.node_id.remote(), timeout=30) == a.node_id

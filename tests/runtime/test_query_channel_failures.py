"""A node that hangs or dies while a query part waits on its query channel: the caller gets
NodeUnavailable at its deadline or at once, never a hang, and finds the node's replacement
(coordinator/query_channel.py, `SocketNodeCaller` in coordinator/cluster_queries.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from coordinator.cluster_queries import SocketNodeCaller
from coordinator.local_cluster import LocalRayCluster
from coordinator.names import node_actor_name
from core.dataset import Dataset
from query.executor import NodeQuery, ShardsNotHere
from query.promql import parse
from query.service import NodeUnavailable
from tests.runtime.conftest import FiloPyCluster, cluster_settings, start_cluster
from tests.waiting import wait_for

pytestmark = pytest.mark.ray


@pytest.fixture
def control_plane(ray_cluster: LocalRayCluster, tmp_path: Path) -> Iterator[FiloPyCluster]:
    """Two nodes, source "none" (shards claimed, nothing read): for killing a node."""
    c = start_cluster(ray_cluster, cluster_settings(tmp_path))
    ids = {c.add_node().node_id for _ in range(2)}
    c.wait_for("2 members", lambda: set(c.client.members()) == ids)
    c.client.setup_dataset(Dataset(name="m", num_shards=4, min_num_nodes=2))
    c.wait_for("shards active", lambda: c.client.shard_map("m").is_healthy(), 60)
    yield c


def _state(pid: int) -> str:
    """The process' state letter (T: stopped) from /proc."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_stopped(pid: int) -> None:
    """Until SIGSTOP has stopped the process (every thread: on a loaded machine a thread in
    an uninterruptible wait stops only when that wait ends)."""
    wait_for(f"process {pid} stopped", lambda: _state(pid) == "T", interval_s=0.01)


def test_a_node_that_hangs_or_dies_mid_query_is_unavailable_not_a_hang(
    control_plane: FiloPyCluster,
) -> None:
    c = control_plane
    namespace = c.settings.ray.namespace
    state = c.client.shard_map("m").snapshot()
    node = sorted({o for o in state.owners if o})[0]
    mine = [s for s in range(4) if state.owner(s) == node]
    ref = next(d.ref for d in c.client.datasets() if d.name == "m")
    request = NodeQuery("series", matchers=(parse("up").matchers,))
    caller = SocketNodeCaller(namespace)

    def connected() -> bool:
        """The caller's channel reaches the coordinator whose process `pid` is: on a loaded
        machine the singleton may have replaced a coordinator it judged failed."""
        nonlocal pid
        state = c.client.shard_map("m").snapshot()
        mine[:] = [s for s in range(4) if state.owner(s) == node]
        try:
            handle = ray.get_actor(node_actor_name(node), namespace=namespace)
            pid = ray.get(handle.ping.remote(), timeout=10).pid
            caller.forget(node)
            assert caller.submit(node, ref, mine, request).result(10).result == []
            endpoint = ray.get(handle.query_endpoint.remote(), timeout=10)
            return caller._pools[node].endpoint == endpoint and (
                ray.get(handle.ping.remote(), timeout=10).pid == pid
            )
        except (ValueError, KeyError, ray.exceptions.RayError, NodeUnavailable, ShardsNotHere):
            return False

    pid = 0
    c.wait_for("a channel to the node's coordinator", connected, 60)

    os.kill(pid, signal.SIGSTOP)  # hung: the request is sent, no answer comes
    try:
        _wait_stopped(pid)
        call = caller.submit(node, ref, mine, request)
        began = time.monotonic()
        with pytest.raises(NodeUnavailable, match="no answer within 1 s"):
            answer = call.result(1.0)
            pytest.fail(f"a stopped node ({_state(pid)}) answered: {answer}")
        assert time.monotonic() - began < 3
        call = caller.submit(node, ref, mine, request)  # in flight when the node dies
        time.sleep(0.2)
        began = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(NodeUnavailable, match=f"node {node} failed"):
            call.result(30)
        assert time.monotonic() - began < 5
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert node not in caller._pools  # forgotten: the next part looks the node up afresh

    # The singleton gives the Ray node a fresh coordinator, on a new port: found again (it
    # has none of the node's old shards: they moved while it was away).
    def answered() -> bool:
        try:
            caller.submit(node, ref, mine, request).result(5)
        except ShardsNotHere:
            pass
        except NodeUnavailable:
            return False
        return node in caller._pools

    c.wait_for("the new coordinator answers on its channel", answered, 60)

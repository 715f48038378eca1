"""A real multi-node Ray cluster on one machine, for tests and local experiments.

Every Ray node is a separate set of processes (raylet, workers, object store) started by
`ray.cluster_utils.Cluster`, so removing a node really kills its processes, as losing a machine
would. Everything binds to 127.0.0.1: left alone, Ray picks the host's network address.
"""

from __future__ import annotations

from typing import Any

from coordinator import ray_env
from coordinator.ray_start import started

# isort: split
import ray
from ray.cluster_utils import Cluster

LOOPBACK = "127.0.0.1"

# Ray's defaults declare a silent node dead after ~30 s; tests that remove nodes want seconds.
FAST_FAILURE_DETECTION: dict[str, Any] = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


class LocalRayCluster:
    """A head node plus worker nodes added on demand; this process connects as the driver."""

    def __init__(
        self,
        *,
        head_cpus: int = 1,
        head_resources: dict[str, float] | None = None,
        namespace: str | None = None,
        system_config: dict[str, Any] | None = None,
        log_to_driver: bool = True,
    ) -> None:
        """`log_to_driver=False` keeps Ray's workers' and raylets' output (a killed node's
        last log lines, state dumps) in the log files under `logs_dir` instead of this
        process' terminal."""
        ray_env.bind_loopback()
        self._cluster = started(
            lambda: Cluster(
                initialize_head=True,
                head_node_args={
                    "node_ip_address": LOOPBACK,
                    "num_cpus": head_cpus,
                    "resources": head_resources or {},
                    "include_dashboard": False,
                    "_system_config": {**FAST_FAILURE_DETECTION, **(system_config or {})},
                },
            ),
            "the Ray head",
        )
        self.head = self._cluster.head_node
        ray.init(
            address=self._cluster.address,
            _node_ip_address=LOOPBACK,
            namespace=namespace,
            logging_level="WARNING",
            log_to_driver=log_to_driver,
        )

    @property
    def logs_dir(self) -> str:
        """Where Ray writes the logs of this cluster's processes."""
        return str(self.head.get_logs_dir_path())

    @property
    def address(self) -> str:
        return self._cluster.address

    @property
    def worker_nodes(self) -> list[Any]:
        """Ray's handles of the nodes added (and not removed) so far."""
        return list(self._cluster.worker_nodes)

    def add_node(
        self,
        *,
        num_cpus: int = 1,
        resources: dict[str, float] | None = None,
        labels: dict[str, str] | None = None,
    ) -> Any:
        """Start another Ray node and wait until the cluster sees it. Returns Ray's node handle.
        `labels` are the node's Ray labels (as `ray start --labels`), e.g. `filopy.io/version`."""
        return started(
            lambda: self._cluster.add_node(
                node_ip_address=LOOPBACK,
                num_cpus=num_cpus,
                resources=resources or {},
                labels=labels or {},
            ),
            "a Ray node",
        )

    def remove_node(self, node: Any, *, graceful: bool = False) -> None:
        """Kill a node's processes; `graceful=False` is a crash, not a drain."""
        self._cluster.remove_node(node, allow_graceful=graceful)

    def shutdown(self) -> None:
        """Disconnect and kill every node at once (a graceful drain of Ray nodes that still run
        actors waits 30 s for nothing: FiloPy state lives in the store and Kafka)."""
        ray.shutdown()
        for node in list(self._cluster.worker_nodes):
            self._cluster.remove_node(node, allow_graceful=False)
        self._cluster.shutdown()

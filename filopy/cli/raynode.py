"""A Ray node of a FiloPy cluster, started in the foreground: `filopy head` and `filopy node join`.

`ray start` cannot do both jobs an operator needs: it rewrites a loopback head address into this
host's network address (so a node cannot join a head bound to 127.0.0.1, as `filopy up`'s is), and
with Ray's cluster switch off (how FiloPy keeps one-host clusters on loopback) it refuses to start
a worker at all. So this module starts the node the way `ray start` does once its checks pass, and
`ray.cluster_utils` does for FiloPy's tests: Ray's `Node` with explicit parameters, the address to
bind named by the operator (or, for a loopback head, loopback), never guessed.

The process stays in the foreground as long as the node runs and stops it on SIGTERM or SIGINT, so
a service manager (systemd, a container runtime) supervises it; if one of Ray's own processes
dies, it stops the rest and exits non-zero, for the manager to start it again.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from coordinator import ray_env
from coordinator.ray_start import started
from core.errors import Invalid, Unavailable

log = logging.getLogger("filopy.node")

DEFAULT_HEAD_PORT = 6379


class NodeStartError(Unavailable):
    """The Ray node could not be started (head unreachable, no route, Ray refused)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_address(address: str, default_port: int = DEFAULT_HEAD_PORT) -> tuple[str, int]:
    """`host[:port]` as a pair; a name is resolved here, so a typo fails before Ray starts."""
    host, sep, port = address.rpartition(":")
    if not sep:
        host, port = address, str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise Invalid(f"not an address: {address!r} (expected HOST:PORT)")
    try:
        resolved = socket.gethostbyname(host)
    except OSError as e:
        raise Invalid(f"cannot resolve {host!r}: {e}") from None
    return resolved, int(port)


def address_towards(host: str, port: int) -> str:
    """This host's address on the route to `host` (what the head will see us as)."""
    if is_loopback(host):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))  # UDP: picks the route, sends nothing
        except OSError as e:
            raise NodeStartError(f"no route to {host}: {e}") from None
        return str(s.getsockname()[0])


def wait_reachable(host: str, port: int, wait_s: float) -> None:
    """Wait until the head accepts connections: a node started beside its head (by a service
    manager, or compose) waits for it instead of failing; NodeStartError after `wait_s`."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            socket.create_connection((host, port), timeout=min(5.0, max(wait_s, 0.1))).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise NodeStartError(
                    f"the Ray head does not answer at {host}:{port} ({e}) after {wait_s:.0f} s"
                ) from None
            if not said:
                log.warning("waiting for the Ray head at %s:%d (%s)", host, port, e)
                said = True
            time.sleep(1.0)


@dataclass
class NodeSpec:
    """What to start: a head (no `head_address`) or a node joining one."""

    bind: str
    head_address: str | None = None  # host:port of the head's GCS; None starts a head
    port: int = DEFAULT_HEAD_PORT  # the head's GCS port
    num_cpus: int = 1
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    system_config: dict[str, Any] = field(default_factory=dict)
    # Ray's sessions, logs and sockets (default /tmp/ray). Nodes sharing a machine and file
    # system each need their own: Ray names a node's sockets by the first free number there.
    temp_dir: str | None = None


def start(spec: NodeSpec) -> Any:
    """Start the Ray node's processes; returns Ray's `Node` (its `gcs_address` is the cluster's
    address). Raises NodeStartError with a reason an operator can act on."""
    if is_loopback(spec.bind):
        ray_env.bind_loopback()
    import ray._private.node
    from ray._private.parameter import RayParams

    params: dict[str, Any] = {
        "node_ip_address": spec.bind,
        "num_cpus": spec.num_cpus,
        "resources": spec.resources,
        "labels": spec.labels,
        "include_dashboard": False,
        "temp_dir": spec.temp_dir,
    }
    if spec.head_address is None:
        params |= {"gcs_server_port": spec.port, "_system_config": spec.system_config}
    else:
        params["gcs_address"] = spec.head_address
    try:
        return started(
            lambda: ray._private.node.Node(
                RayParams(**params),  # fresh per attempt: the node fills it in
                head=spec.head_address is None,
                shutdown_at_exit=True,
                spawn_reaper=True,
            ),
            "the head" if spec.head_address is None else "this node",
        )
    except Exception as e:  # Ray raises bare exceptions with long messages
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NodeStartError(f"Ray could not start the node: {first}") from e


def run_until_stopped(node: Any) -> int:
    """Block while the node's processes live. SIGTERM/SIGINT stop it cleanly (exit 0); a Ray
    process that died stops the rest (exit 1), as `ray start --block` does."""
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = 0
    while not stopping:
        time.sleep(0.5)
        dead = [name for name, proc in node.dead_processes() if proc.returncode not in (0, -15)]
        if dead:
            log.error("Ray processes exited: %s; stopping the node", ", ".join(sorted(set(dead))))
            code = 1
            break
    node.kill_all_processes(check_alive=False, allow_graceful=True)
    return code

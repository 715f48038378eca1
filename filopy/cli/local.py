"""`filopy up` / `filopy down`: a long-lived local cluster on this machine.

`up` starts a supervisor process in the background and returns once the cluster serves: a Ray
head and N FiloPy nodes on 127.0.0.1, the singleton, the REST API, and the services the settings
need (Kafka for `ingest.source = "kafka"`, Cassandra for `store.backend = "cassandra"`) through
`scripts/services.sh`. Its state (pid, Ray address, REST URL, log) is a JSON file in the state
directory, which is how `down` and the other commands find it. `down` stops the supervisor, which
shuts the Ray cluster down and stops the services it started itself (not ones already running).
Datasets, checkpoints and chunks live in the store, so the next `up` recovers them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from coordinator import ray_env
from core.errors import Unavailable
from core.local_state import (
    ADMIN_TOKEN_FILE,
    STATE_FILE,
    LocalCluster,
    alive,
    ray_token_path,
    running,
    state_dir,
)

log = logging.getLogger("filopy.local")

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "scripts" / "services.sh"
LOG_FILE = "local-cluster.log"


class LocalClusterError(Unavailable):
    """The local cluster could not be started, found or stopped."""


def up(nodes: int, port: int, timeout_s: float = 180.0) -> LocalCluster:
    """Start the supervisor in the background and wait until the REST API answers."""
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    existing = running(directory)
    if existing is not None:
        raise LocalClusterError(
            f"a local cluster already runs (pid {existing.pid}, REST {existing.rest_url}); "
            "`filopy down` stops it"
        )
    (directory / STATE_FILE).unlink(missing_ok=True)
    if not _port_free(port):
        raise LocalClusterError(f"port {port} on 127.0.0.1 is in use; choose another with --port")
    log_path = directory / LOG_FILE
    # Ray's token authentication: only processes and drivers holding the state directory's
    # Ray token join or call this cluster (docs/security.md).
    ray_auth = ray_env.ray_token_env(ray_token_path(directory, create=True))
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "filopy.cli.local", "--nodes", str(nodes), "--port", str(port)],
            env={**os.environ, **ray_auth},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the terminal that ran `filopy up`
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            # One line (the CLI prints an error's first line): what the log ended with.
            raise LocalClusterError(
                f"the local cluster failed to start (exit {proc.returncode}): "
                f"{_last_line(log_path)} (the whole log: {log_path})"
            )
        cluster = running(directory)
        if cluster is not None and _port_open(port):
            return cluster
        time.sleep(0.2)
    proc.terminate()
    raise LocalClusterError(
        f"the local cluster did not come up in {timeout_s:.0f} s; see {log_path}"
    )


def down(timeout_s: float = 90.0) -> LocalCluster:
    """Stop the supervisor (it shuts the cluster and its services down) and wait for it."""
    cluster = running()
    if cluster is None:
        raise LocalClusterError(f"no local cluster runs from {state_dir().resolve()}")
    os.kill(cluster.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(cluster.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(cluster.pid):
        os.killpg(cluster.pid, signal.SIGKILL)
        raise LocalClusterError(
            f"the local cluster did not stop within {timeout_s:.0f} s and was killed; "
            f"see {cluster.log}"
        )
    return cluster


# ----- the supervisor (runs in the background process) ------------------------------------------


def _services(action: str, name: str) -> None:
    out = subprocess.run(
        ["bash", str(SERVICES), action, name], capture_output=True, text=True, check=False
    )
    print(out.stdout.strip(), out.stderr.strip(), sep="\n", flush=True)
    if out.returncode != 0:
        raise LocalClusterError(f"scripts/services.sh {action} {name} failed")


def _service_running(name: str) -> bool:
    out = subprocess.run(
        ["bash", str(SERVICES), "status", name], capture_output=True, text=True, check=False
    )
    return f"{name}: running" in out.stdout + out.stderr


def _supervise(nodes: int, port: int) -> None:
    from coordinator.local_cluster import LocalRayCluster  # sets Ray's loopback environment first
    from core.config import load_settings

    # isort: split
    import uvicorn

    from coordinator.client import FiloPyClient
    from coordinator.cluster_actor import start_cluster_actor
    from core.heap import keep_long_lived_frozen
    from filopy.auth import keep_admin_token
    from filopy.rest import create_app
    from filopy.serving import scheme, uvicorn_options

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # runs the cleanup below; uvicorn replaces it while serving

    signal.signal(signal.SIGTERM, stop)
    settings = load_settings()
    needed = ["kafka"] if settings.ingest.source == "kafka" else []
    if settings.store.backend == "cassandra":
        needed.append("cassandra")
    started: list[str] = []
    cluster: LocalRayCluster | None = None
    directory = state_dir()
    try:
        for name in needed:
            if not _service_running(name):
                _services("up", name)
                started.append(name)
        cluster = LocalRayCluster(namespace=settings.ray.namespace)
        for _ in range(nodes):
            cluster.add_node(resources={settings.cluster.node_resource: 1})
        import ray

        actor = start_cluster_actor(settings)
        ray.get(actor.ready.remote(), timeout=120)
        client = FiloPyClient(actor, settings)
        rest = create_app(client, settings)
        if rest.state.tokens is not None:  # auth on: an admin token for this directory's CLI
            keep_admin_token(rest.state.tokens, directory / ADMIN_TOKEN_FILE)
        server = uvicorn.Server(
            uvicorn.Config(
                rest, host="127.0.0.1", port=port, log_level="warning", **uvicorn_options(settings)
            )
        )
        keep_long_lived_frozen()
        state = LocalCluster(
            pid=os.getpid(),
            ray_address=cluster.address,
            rest_url=f"{scheme(settings)}://127.0.0.1:{port}",
            nodes=nodes,
            namespace=settings.ray.namespace,
            log=str((directory / LOG_FILE).resolve()),
            started_services=tuple(started),
        )
        tmp = directory / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(directory / STATE_FILE)
        print(f"local cluster up: {state}", flush=True)
        # Each in-process Ray node installed a SIGTERM handler that drains for 30 s and exits
        # without our cleanup: take SIGTERM back (uvicorn re-raises it here after serving).
        signal.signal(signal.SIGTERM, stop)
        server.run()  # until SIGTERM / SIGINT
    finally:
        (directory / STATE_FILE).unlink(missing_ok=True)
        if cluster is not None:
            _drain(settings.ray.namespace)
            cluster.shutdown()
        for name in reversed(started):
            _services("down", name)
        print("local cluster down", flush=True)


def _drain(namespace: str) -> None:
    """Have every node stop its ingesters cleanly (a final flush and checkpoint each), so the
    next `up` replays nothing; then the Ray cluster can go down at once."""
    import ray

    from coordinator.names import node_actor_name

    handles = []
    for node in ray.nodes():
        if node.get("Alive"):
            try:
                handles.append(ray.get_actor(node_actor_name(node["NodeID"]), namespace=namespace))
            except ValueError:
                continue  # not a FiloPy node (the head)
    try:
        stopped = ray.get([h.drain.remote() for h in handles], timeout=60)
        print(f"drained {len(handles)} nodes: {sum(stopped)} shards flushed", flush=True)
    except Exception as e:  # shutting down regardless: recovery replays from checkpoints
        print(f"draining failed ({e}); the next start replays from checkpoints", flush=True)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _last_line(path: Path) -> str:
    """The log's last non-blank line: after a failed start, the error that ended it."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return "(no log)"
    return next((line for line in reversed(lines) if line), "(the log is empty)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The local cluster's supervisor (filopy up).")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    _supervise(args.nodes, args.port)

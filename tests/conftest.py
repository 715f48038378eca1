"""Fixtures that give tests the real services FiloPy runs on.

Kafka and Cassandra are started through scripts/services.sh (the same script developers and CI
use) once per test session and left running for the next session. A test that needs a service
never skips: if the service cannot be started, the test fails with the script's message.
Ray clusters are real multi-node local clusters, bound to 127.0.0.1, torn down after each test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "scripts" / "services.sh"
KAFKA_PORT = int(os.environ.get("FILOPY_KAFKA_PORT", "9092"))
CASSANDRA_PORT = int(os.environ.get("FILOPY_CASSANDRA_PORT", "9042"))

_started: dict[str, str] = {}


def _ensure_service(name: str) -> None:
    """Start a service through the project's script (a no-op when it already runs)."""
    if name in _started:
        return
    proc = subprocess.run(
        [str(SERVICES), "up", name], capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0:
        pytest.fail(
            f"could not start {name} with {SERVICES} up {name}:\n{proc.stdout}\n{proc.stderr}",
            pytrace=False,
        )
    _started[name] = proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The bootstrap address of the real local Kafka broker."""
    _ensure_service("kafka")
    return f"127.0.0.1:{KAFKA_PORT}"


@pytest.fixture(scope="session")
def cassandra_address() -> tuple[str, int]:
    """Host and CQL port of the real local Cassandra node."""
    _ensure_service("cassandra")
    return ("127.0.0.1", CASSANDRA_PORT)


@pytest.fixture
def ray_cluster() -> Iterator[object]:
    """A real local Ray cluster (head only; tests add nodes), with this process as its driver."""
    from coordinator.local_cluster import LocalRayCluster  # Ray only where a test uses it

    cluster = LocalRayCluster()
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects, so `make unit` never needs a service
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the services its fixtures start, whatever markers it declares, and
    by the group of tests that must run in one process under `pytest -n` (`--dist loadgroup`):
    a module's tests share its fixtures (a cluster per module), and the many-hosts bed is one
    per session, so all its tests run in one worker."""
    needs = {"kafka_bootstrap": "kafka", "cassandra_address": "cassandra", "ray_cluster": "ray"}
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & needs.keys():
            item.add_marker(needs[fixture])
        path = Path(str(item.fspath)).relative_to(ROOT)
        group = "netbed" if path.parts[:2] == ("tests", "netbed") else str(path)
        item.add_marker(pytest.mark.xdist_group(group))

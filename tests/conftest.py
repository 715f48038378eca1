"""Fixtures that give tests the real services FiloPy runs on.

Kafka and Cassandra are started through scripts/services.sh (the same script developers and CI
use) once per test session and left running for the next session. A test that needs a service
never skips: if the service cannot be started, the test fails with the script's message.
Ray clusters are real multi-node local clusters, bound to 127.0.0.1, torn down after each test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "scripts" / "services.sh"
KAFKA_PORT = int(os.environ.get("FILOPY_KAFKA_PORT", "9092"))
CASSANDRA_PORT = int(os.environ.get("FILOPY_CASSANDRA_PORT", "9042"))

_started: dict[str, str] = {}
# `FILOPY_CPU_BY_TEST=1 make test`: where the suite's CPU goes, each test's processes counted.
if os.environ.get("FILOPY_CPU_BY_TEST") == "1":
    pytest_plugins = ["tests.cpu_by_test"]
NETBED = "tests/netbed"
# The many-hosts bed's modules, in two units of work of about equal time (each ~8 minutes of real
# fault timings, mostly waiting): each unit's worker makes a bed of its own (tests/netbed/
# conftest.py), so the two run side by side.
NETBED_UNITS = {"test_faults.py": f"{NETBED}[faults]", "test_bed.py": f"{NETBED}[faults]"}
NETBED_OTHERS = f"{NETBED}[others]"  # test_cassandra, test_security, the deployment page, compose

# The property tests (hypothesis) run the library's 100 examples each and no per-example deadline:
# on a loaded two-core machine a slow example is the machine, not a bug. Tests that need more
# examples to reach a rare case say so in their own @settings. After changing a fast path or a
# codec, `PYTEST_ADDOPTS=--hypothesis-profile=thorough make unit` runs ten times as many. Under
# CI, hypothesis' own "ci" profile (derandomised: a CI run is reproducible) is the base.
settings.register_profile(
    "filopy", settings.default, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", settings.get_profile("filopy"), max_examples=1000)
settings.load_profile("filopy")


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
    """A real local Ray cluster (head only; tests add nodes and may kill them), with this process
    as its driver: the process' warm Ray head (tests/cluster.py), bare, and bare again after the
    test (its actors killed, its nodes removed)."""
    from tests.cluster import lend_ray_head, reclaim_ray_head  # Ray only where a test uses it

    cluster = lend_ray_head()
    try:
        yield cluster
    finally:
        reclaim_ray_head()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects, so `make unit` never needs a service
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test by the services its fixtures start, whatever markers it declares."""
    needs = {"kafka_bootstrap": "kafka", "cassandra_address": "cassandra", "ray_cluster": "ray"}
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & needs.keys():
            item.add_marker(needs[fixture])


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under `pytest -n`, each worker takes whole test modules (a module's tests share its
    fixtures, a cluster per module), and the many-hosts bed's tests go in two units
    (`NETBED_UNITS`), each to a worker with a bed of its own; those units go first."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if not module.startswith(f"{NETBED}/"):
                return module
            return NETBED_UNITS.get(module.rsplit("/", 1)[1], NETBED_OTHERS)

        def _assign_work_unit(self, node: Any) -> None:
            # The bed's units first: the longest ones (~8 minutes of real fault timings each)
            # must not start late, or the other workers idle at the end.
            for unit in self.workqueue:
                if unit.startswith(NETBED):
                    self.workqueue.move_to_end(unit, last=False)
                    break
            super()._assign_work_unit(node)

    return ByModule(config, log)


@pytest.fixture(scope="session", autouse=True)
def _warm_ray_cluster_shut_down() -> Iterator[None]:
    """The warm Ray cluster modules share (tests/cluster.py `ray_pool`) ends with the session."""
    yield
    if "ray" in sys.modules:
        from tests.cluster import release_ray_pool

        release_ray_pool()


@pytest.fixture(scope="session", autouse=True)
def _unit_tests_import_no_ray() -> None:
    """`make unit` (FILOPY_UNIT_ONLY=1) collects without importing Ray: a test that needs no
    service must not pay for Ray's import, nor depend on it. Checked before the first test, so
    before any test imports Ray itself; service tests import it in their fixtures."""
    if os.environ.get("FILOPY_UNIT_ONLY") == "1" and "ray" in sys.modules:
        pytest.fail(
            "collecting the tests that need no service imported Ray: import it (or the "
            "coordinator module that imports it) inside the fixture or test that needs it",
            pytrace=False,
        )

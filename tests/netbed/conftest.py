"""Fixtures of the many-hosts bed: the bed itself, and a FiloPy cluster spread over its hosts.

The bed needs root and iproute2 + iptables (scripts/system-deps.sh installs them); without them
the tests fail, never skip. One bed serves a whole test session: it is made before the first
test that asks for it and removed after the last, and `Bed.create` first removes whatever an
earlier, killed run left behind. Under pytest-xdist each worker that runs the bed's tests has a
bed of its own (`bed_prefix`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netbed.bed import PREFIX, Bed
from tests.netbed.cluster import NetCluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects, so `make unit` never makes a bed
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker("netbed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the last lines of every host's log: what the cluster said
    is the first thing to read, and the bed is gone once the session ends."""
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("net_cluster")
    if report.failed and isinstance(cluster, NetCluster):
        report.sections.append(("the hosts' logs", cluster.logs(40)))


def bed_prefix() -> str:
    """The bed's prefix (`fpb-`, or FILOPY_NETBED_PREFIX) with the pytest-xdist worker's number in
    it (`fpb0-`, `fpb1-`, ...): the bed's tests run in two units on two workers at once
    (tests/conftest.py), each on a bed of its own."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"{PREFIX.rstrip('-')}{worker.removeprefix('gw')}-" if worker else PREFIX


@pytest.fixture(scope="session")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    missing = [t for t in ("ip", "iptables", "tc") if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(
            f"the many-hosts bed needs root and {', '.join(missing) or 'iproute2, iptables'} "
            "(scripts/system-deps.sh installs them)",
            pytrace=False,
        )
    # The bed's hosts reach no registry: fetch Kafka's and Cassandra's jars here first (a no-op
    # when cached), for the hosts to start them from the cache.
    fetch = subprocess.run(
        ["bash", str(ROOT / "scripts" / "services.sh"), "fetch"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if fetch.returncode != 0:
        pytest.fail(f"scripts/services.sh fetch failed:\n{fetch.stderr}", pytrace=False)
    the_bed = Bed(tmp_path_factory.mktemp("netbed"), prefix=bed_prefix()).create()
    try:
        yield the_bed
    finally:
        the_bed.remove()


@pytest.fixture(scope="module")
def net_cluster(bed: Bed, request: pytest.FixtureRequest) -> Iterator[NetCluster]:
    """Kafka, the head and three nodes, each on its own host (the SQLite store on the shared
    file system), with the test module's `CLUSTER_ENV` settings if it has any. Tests that change
    membership restore it before they end."""
    cluster = NetCluster(bed, ROOT, env=getattr(request.module, "CLUSTER_ENV", None))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()

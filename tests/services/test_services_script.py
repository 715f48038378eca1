"""scripts/services.sh keeps its promises: idempotent `up`, cached jars, clear usage errors."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import SERVICES


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SERVICES), *args], capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.kafka
@pytest.mark.cassandra
def test_second_up_reuses_running_services_and_cached_jars(
    kafka_bootstrap: str, cassandra_address: tuple[str, int]
) -> None:
    again = _run("up")
    assert again.returncode == 0, again.stderr
    assert "kafka already running" in again.stderr
    assert "cassandra already running" in again.stderr
    assert "fetching" not in again.stderr

    status = _run("status")
    assert status.returncode == 0
    assert "kafka: running" in status.stderr
    assert "cassandra: running" in status.stderr


def test_unknown_service_and_command_are_rejected() -> None:
    bad = _run("up", "zookeeper")
    assert bad.returncode != 0
    assert "unknown service 'zookeeper'" in bad.stderr
    usage = _run("frobnicate")
    assert usage.returncode == 2
    assert "up [kafka|cassandra|redis]" in usage.stdout

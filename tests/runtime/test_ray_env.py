"""Ray binds to loopback whatever a process imported first (issue 11, item 1).

The CLI's `filopy query` imported Ray (through the REST PromQL module) before `coordinator.ray_env`,
and failed on every fresh install; the suite missed it because pytest had imported
`coordinator.ray_env` long before and its subprocesses inherited Ray's switch. These run fresh
processes with an environment that has no trace of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from core.dataset import Dataset

pytestmark = pytest.mark.ray


def _clean_env(namespace: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "FILOPY_"))}
    env["FILOPY_RAY__NAMESPACE"] = namespace
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=180, check=False)


def test_client_connects_on_loopback_after_ray_was_imported_first(filopy_cluster) -> None:
    c = filopy_cluster
    c.add_node()
    c.wait_for("a member", lambda: len(c.client.members()) == 1)
    script = textwrap.dedent(
        f"""
        import ray.exceptions  # what filopy/rest/app.py did before coordinator.ray_env
        import filopy.rest.app
        import filopy
        from ray._private import ray_constants
        assert ray_constants.ENABLE_RAY_CLUSTER  # Ray read its switch on: imported too early
        client = filopy.connect({c.ray.address!r})
        import ray
        print("node ip", ray._private.worker.global_worker.node.node_ip_address)
        print("members", len(client.members()))
        """
    )
    proc = _run([sys.executable, "-c", script], _clean_env(c.settings.ray.namespace))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "node ip 127.0.0.1" in proc.stdout
    assert "members 1" in proc.stdout


def test_cli_query_in_a_fresh_process(filopy_cluster) -> None:
    c = filopy_cluster
    c.add_node()
    c.wait_for("a member", lambda: len(c.client.members()) == 1)
    c.client.setup_dataset(Dataset(name="metrics", num_shards=2, min_num_nodes=1))
    c.wait_for("healthy", lambda: c.client.shard_map("metrics").is_healthy())
    cli = [sys.executable, "-m", "filopy.cli"]
    env = _clean_env(c.settings.ray.namespace)
    proc = _run([*cli, "query", "metrics", "vector(42)", "--address", c.ray.address], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "42" in proc.stdout


def test_loopback_can_be_turned_off_for_a_multi_machine_cluster() -> None:
    script = textwrap.dedent(
        """
        import os, ray
        from coordinator import ray_env
        ray_env.bind_loopback()
        from ray._private import ray_constants
        print(ray_constants.ENABLE_RAY_CLUSTER, os.environ.get(ray_env.RAY_SWITCH))
        """
    )
    env = {**_clean_env("unused"), "FILOPY_RAY_LOOPBACK": "0"}
    proc = _run([sys.executable, "-c", script], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "None"]

"""`filopy up` / `filopy down`: a long-lived local cluster, driven as a user would, by processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.ray]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric_sum(http: httpx.Client, name: str, dataset: str) -> float:
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and f'dataset="{dataset}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_up_ingest_down_up_recovers_the_dataset_without_replay(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "FILOPY_STATE_DIR": str(tmp_path / "state"),
        "FILOPY_STORE__SQLITE_PATH": str(tmp_path / "filopy.db"),
        "FILOPY_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "FILOPY_KAFKA_PORT": kafka_bootstrap.rsplit(":", 1)[1],
        "FILOPY_RAY__NAMESPACE": f"up-{uuid.uuid4().hex[:6]}",
        "COLUMNS": "200",
    }
    port = _free_port()

    def filopy(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "filopy.cli", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    up = filopy("up", "--nodes", "2", "--port", str(port))
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"REST API http://127.0.0.1:{port}" in up.stdout
    state = json.loads((tmp_path / "state" / "local-cluster.json").read_text())
    try:
        again = filopy("up", "--port", str(port))
        assert again.returncode == 1 and "a local cluster already runs" in again.stderr
        # Auth on, as by default: `up` left an admin token in its state directory (0600).
        token_file = tmp_path / "state" / "admin-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        anonymous = httpx.get(f"http://127.0.0.1:{port}/api/v1/cluster", timeout=30)
        assert anonymous.status_code == 401, anonymous.text
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, headers=auth)
        name = f"up{uuid.uuid4().hex[:6]}"
        body = {
            "name": name,
            "num_shards": 4,
            "min_num_nodes": 2,
            "source": {"bootstrap_servers": kafka_bootstrap},
        }
        assert http.post("/api/v1/datasets", json=body).status_code == 201

        def active() -> bool:
            shards = http.get(f"/api/v1/cluster/{name}/status").json()["data"]
            return all(s["status"] == "Active" for s in shards)

        wait_for("all shards active", active)
        # Ray's token authentication: a driver without the state directory's Ray token is
        # refused at connect (the CLI below holds it and gets in).
        ray_token = tmp_path / "state" / "ray-token"
        assert ray_token.stat().st_mode & 0o777 == 0o600
        outsider = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address={state['ray_address']!r})"],
            env={
                **{k: v for k, v in env.items() if not k.startswith("RAY_AUTH")},
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # a loopback cluster (ray_env.py)
            },
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert outsider.returncode != 0
        assert "Authentication token is missing or incorrect" in outsider.stderr, outsider.stderr
        # The CLI finds the cluster from the state directory: no --address needed.
        status = filopy("status", name)
        assert status.returncode == 0, status.stderr
        assert "AAAA" in status.stdout and status.stdout.count(": 2 shards: ") == 2
        sent = filopy("ingest", name, "--series", "50", "--scrapes", "10")
        assert sent.returncode == 0, sent.stderr
        assert "sent 500 samples" in sent.stdout
        wait_for(
            "500 samples ingested",
            lambda: _metric_sum(http, "filopy_ingested_samples_total", name) == 500,
        )

        down = filopy("down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert "stopped" in down.stdout
        assert not (tmp_path / "state" / "local-cluster.json").exists()
        with pytest.raises(ProcessLookupError):
            os.kill(state["pid"], 0)
        log = (tmp_path / "state" / "local-cluster.log").read_text()
        assert "drained 2 nodes: 4 shards flushed" in log
        again = filopy("down")
        assert again.returncode == 1 and "no local cluster runs" in again.stderr

        # Up again: the dataset comes back from the store, and the drain's final flush means
        # the new ingesters start after the last checkpoint: nothing is replayed.
        up = filopy("up", "--nodes", "2", "--port", str(port))
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((tmp_path / "state" / "local-cluster.json").read_text())
        assert http.get("/api/v1/cluster").json()["data"] == [name]
        wait_for("all shards active again", active)
        time.sleep(1.0)
        assert _metric_sum(http, "filopy_ingested_samples_total", name) == 0
        assert _metric_sum(http, "filopy_consumer_lag_offsets", name) == 0
    finally:
        if (tmp_path / "state" / "local-cluster.json").exists():
            filopy("down")

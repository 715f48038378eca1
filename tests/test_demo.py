"""The README's main job, in its short form: `filopy demo --quick` must end with exact data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

ROOT = Path(__file__).resolve().parent.parent


def test_quick_demo_ingests_loses_a_node_and_reads_back_exactly(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "FILOPY_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "FILOPY_KAFKA_PORT": kafka_bootstrap.rsplit(":", 1)[1],
        "COLUMNS": "100",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "filopy.cli", "demo", "--quick"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "killing node" in out
    assert "moved and recovered from their checkpoints" in out
    assert "nothing lost, nothing duplicated" in out
    assert "A PromQL query" in out and "visits shards" in out
    assert "query result differs" not in out

"""The README's main job, in its short form: `filopy demo --quick` must end with exact data."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

ROOT = Path(__file__).resolve().parent.parent


# What Ray prints on a driver's terminal when a node dies (raylet log tails, state dumps, its
# workers' log lines): none of it belongs in the demo's story.
RAY_NOISE = re.compile(r"\(raylet\)|\[state-dump\]|pid=\d+\)|Raylet is terminated")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def _run_demo(tmp_path: Path, env: dict[str, str], tty: bool) -> tuple[int, str]:
    """`filopy demo --quick` with stdout a pipe, or a pseudo-terminal as a user's shell has."""
    cmd = [sys.executable, "-m", "filopy.cli", "demo", "--quick"]
    if not tty:
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        return proc.returncode, proc.stdout + proc.stderr
    main, child = pty.openpty()
    os.set_inheritable(child, True)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=child, stderr=child)
    os.close(child)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal: it exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    return proc.wait(timeout=600), b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("tty", [False, True], ids=["piped", "terminal"])
def test_quick_demo_ingests_loses_a_node_and_reads_back_exactly(
    kafka_bootstrap: str, tmp_path: Path, tty: bool
) -> None:
    env = {
        **os.environ,
        "FILOPY_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "FILOPY_KAFKA_PORT": kafka_bootstrap.rsplit(":", 1)[1],
        "COLUMNS": "100",
    }
    code, raw = _run_demo(tmp_path, env, tty)
    out = ANSI.sub("", raw)
    assert code == 0, out[-3000:]
    # The story, in order, as a reader follows it.
    story = [
        "1. Kafka",
        "2. A Ray cluster",
        "3. SetupDataset",
        "4. Ingesting",
        "killing node node-",
        "moved and recovered from their checkpoints",
        "6. Reading every series back",
        "nothing lost, nothing duplicated",
        "7. A PromQL query",
        "visits shards",
    ]
    at = [out.find(line) for line in story]
    assert -1 not in at and at == sorted(at), dict(zip(story, at, strict=True))
    assert "query result differs" not in out
    # Quiet: Ray's own output is in the log file the demo names, not on the terminal.
    assert not RAY_NOISE.search(out), RAY_NOISE.search(out)
    log = re.search(r"Ray's messages: (\S+\.log)", " ".join(out.split()))
    assert log and (tmp_path / log.group(1)).exists(), out[:2000]
    # Every line a line of its own (no progress line running into the next message).
    assert not re.search(r"samples/s\S", out), out

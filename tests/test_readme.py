"""Every shell block of README.md, run exactly as written, as a new user would run it.

Each shell block not listed in `EXCLUDED` (with the reason it cannot run here) runs as one
`bash -e -c` subprocess from the repository root, in an environment cleaned of what this test
process set up for itself (Ray's loopback switch, the virtual environment on PATH): a command
that only works because pytest imported something first fails here as it would on a fresh
install. Each block must exit 0 and print what shows it worked (`EXPECTED`). A new README block is
neither run nor excluded silently: the test fails until it is added to one of the two lists.

The local-cluster block starts its own `filopy up` and ends with `filopy down`; the test gives it
a private state directory, SQLite file, Ray namespace and REST port, so it cannot collide with
other tests or with a cluster the developer runs from the same checkout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
# Blocks that are not shell commands, with why they are not run here.
OTHER_LANGUAGES = {
    "mermaid": "a diagram",
    "python": "the Python client example, which follows a subscription until interrupted; "
    "`filopy.connect` from a fresh process is tests/runtime/test_ray_env.py's, the client's calls "
    "tests/runtime's",
}
BLOCK_TIMEOUT_S = 300

# Blocks that cannot run inside this test, by their first line, with the reason.
EXCLUDED = {
    "make demo": "holds `make test`, which is the suite running this test; `make demo`'s job is "
    "tests/test_demo.py's",
    "scripts/services.sh up": "its `down` stops the Kafka and Cassandra the rest of the suite runs "
    "on; tests/services/test_services_script.py runs `up` and `status`",
}

# What each block that runs must print, in this order (regular expressions, on stdout).
EXPECTED = {
    "source .venv/bin/activate": [
        r"local cluster up: 3 FiloPy nodes",
        r"created: prom",
        r"----- prom: 8 shards -----",
        r"sent 100,000 samples",
        r'cpu_usage.*host="a".*│\s+0\.5',  # the line sent by curl, read back
        r'\{_ns_="\w+"\}\s+│\s+\d',  # a result row of the PromQL query
        r"[1-9]\d* series; [\d,]+ samples scanned on 8 shards of 3 nodes",
        r"----- prom -----",  # `filopy watch`'s snapshot
        r"stopped shards \[3\] of prom",
        r"local cluster \(pid \d+\) stopped",
    ],
}


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block of the README, in order."""
    text = README.read_text()
    return [
        (m.group(1), m.group(2))
        for m in re.finditer(r"^```(\w*)\n(.*?)^```\s*$", text, re.S | re.M)
    ]


def shell_blocks() -> dict[str, str]:
    """Shell blocks by their first line (its command, without the comment)."""
    blocks: dict[str, str] = {}
    for language, body in readme_blocks():
        if language in SHELL_LANGUAGES:
            key = body.strip().splitlines()[0].split("#", 1)[0].strip()
            assert key not in blocks, f"two README shell blocks start with {key!r}"
            blocks[key] = body
    return blocks


def test_every_readme_shell_block_is_run_or_excluded_with_a_reason() -> None:
    languages = {language for language, _ in readme_blocks()}
    unknown = languages - SHELL_LANGUAGES - set(OTHER_LANGUAGES)
    assert not unknown, f"README blocks in an unknown language {unknown}: run them or say why not"
    blocks = set(shell_blocks())
    assert not set(EXCLUDED) & set(EXPECTED)
    assert blocks - set(EXPECTED) == set(EXCLUDED), (
        "the README's shell blocks changed: a block must be run (EXPECTED) or excluded with a "
        f"reason (EXCLUDED); not run: {sorted(blocks - set(EXPECTED))}"
    )
    assert set(EXPECTED) <= blocks, f"gone from the README: {sorted(set(EXPECTED) - blocks)}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fresh_env(tmp_path: Path, kafka_bootstrap: str) -> dict[str, str]:
    """This process's environment without what pytest's imports put there, plus a private
    state directory, store, namespace and REST port for `filopy up`."""
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "FILOPY_")) and k not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    env.update(
        {
            "FILOPY_STATE_DIR": str(tmp_path / "state"),
            "FILOPY_STORE__SQLITE_PATH": str(tmp_path / "filopy.db"),
            "FILOPY_RAY__NAMESPACE": f"readme-{uuid.uuid4().hex[:8]}",
            "FILOPY_REST_PORT": str(_free_port()),
            "FILOPY_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
            "FILOPY_KAFKA_PORT": kafka_bootstrap.rsplit(":", 1)[1],
            "COLUMNS": "200",  # rich wraps nothing
        }
    )
    return env


def _stop_leftover_cluster(env: dict[str, str]) -> None:
    """A block that failed before its `filopy down`: stop what its `filopy up` started."""
    state = Path(env["FILOPY_STATE_DIR"]) / "local-cluster.json"
    if not state.exists():
        return
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "filopy"), "down"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    if state.exists():  # the supervisor did not answer: end its process group
        pid = json.loads(state.read_text())["pid"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _topic_exists(bootstrap: str, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient

    return topic in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics


def _delete_topic(bootstrap: str, topic: str) -> None:
    """Leave Kafka as a fresh install finds it: the next run's dataset starts empty."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        with contextlib.suppress(Exception):  # absent already, or deleted meanwhile
            future.result(timeout=60)


@pytest.mark.kafka
@pytest.mark.ray
@pytest.mark.timeout(BLOCK_TIMEOUT_S + 180)
@pytest.mark.parametrize("block", sorted(EXPECTED))
def test_readme_block_runs_as_written(block: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    text = shell_blocks()[block]
    env = _fresh_env(tmp_path, kafka_bootstrap)
    # The README's dataset topic; deleted afterwards only if this test created it (a developer
    # following the README on this machine may have made it, with data of their own).
    topic = "filopy-prom" if "filopy dataset create prom" in text else None
    ours = topic is not None and not _topic_exists(kafka_bootstrap, topic)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", text],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            check=False,
        )
    finally:
        _stop_leftover_cluster(env)
        if topic is not None and ours:
            _delete_topic(kafka_bootstrap, topic)
    took = time.monotonic() - started
    shown = f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"README block failed after {took:.0f} s:\n{text}\n{shown}"
    position = 0
    for pattern in EXPECTED[block]:
        found = re.compile(pattern).search(proc.stdout, position)
        assert found, f"expected {pattern!r} after position {position} of the output\n{shown}"
        position = found.end()

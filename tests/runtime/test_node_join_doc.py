"""docs/operations.md's "Adding a node", as written: beside a `filopy up` cluster, the page's
block joins a third node by name; SIGTERM takes it out again. Both as subprocesses, as a new
operator runs them, in an environment cleaned of what pytest set up (tests/test_readme.py's)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.netbed.cluster import wait_for
from tests.test_readme import ROOT, _fresh_env, _stop_leftover_cluster

DOC = ROOT / "docs" / "operations.md"


def join_block() -> str:
    section = DOC.read_text().split("## Adding a node", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```\s*$", section, re.S | re.M)
    assert len(blocks) == 1, "the section has one command block"
    return blocks[0]


def _members(rest_url: str, token: str) -> set[str]:
    ask = urllib.request.Request(
        f"{rest_url}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(ask, timeout=10) as r:
        return {m["name"] for m in json.load(r)["data"]["members"]}


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_the_documented_join_adds_a_named_node_and_sigterm_takes_it_out(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = _fresh_env(tmp_path, kafka_bootstrap)
    filopy = str(ROOT / ".venv" / "bin" / "filopy")
    up = subprocess.run([filopy, "up", "--nodes", "2"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300, check=False)  # fmt: skip
    joined: subprocess.Popen[str] | None = None
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((Path(env["FILOPY_STATE_DIR"]) / "local-cluster.json").read_text())
        rest = state["rest_url"]
        token = (Path(env["FILOPY_STATE_DIR"]) / "admin-token").read_text().strip()
        wait_for("the two nodes of `up` members", lambda: len(_members(rest, token)) == 2, 120)
        joined = subprocess.Popen(
            ["bash", "-e", "-c", join_block()], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        members = wait_for("the joined node", lambda: "extra" in _members(rest, token), 180)
        assert members
        os.killpg(joined.pid, signal.SIGTERM)
        out, _ = joined.communicate(timeout=120)
        assert joined.returncode == 0, out
        assert re.search(
            r"FiloPy node extra at 127\.0\.0\.1 joined the cluster at 127\.0\.0\.1", out
        )
        wait_for("the stopped node gone", lambda: "extra" not in _members(rest, token), 120)
        assert len(_members(rest, token)) == 2
    finally:
        if joined is not None and joined.poll() is None:
            os.killpg(joined.pid, signal.SIGKILL)
        _stop_leftover_cluster(env)

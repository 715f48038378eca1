"""A cluster across hosts with Ray's token authentication, probed from a host outside it.

The head and two nodes run with one random Ray token (a 0600 file, RAY_AUTH_MODE=token in every
Ray process and driver, as docs/deployment.md says); `node-3` is a machine of the same network
that is not part of the cluster. From there, a Ray driver and `filopy node join` without the
token, or with a wrong one, are refused and change nothing; with the token both get in (the
positive control). A node's query channel, reached from `client` (no Ray at all), refuses an
unsigned frame, one signed with a wrong key, a correctly signed frame replayed and garbage,
each closing only its own connection: the node counts the refusals and answers real queries on.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.names import CLUSTER_ACTOR_NAME
from coordinator.ray_env import AUTH_MODE_VAR, TOKEN_PATH_VAR
from core.local_state import write_private
from tests.netbed.bed import Bed
from tests.netbed.cluster import HEAD_ADDRESS, NODES, NetCluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = NODES[:2]
OUTSIDER = NODES[2]  # a machine of the bed that is not part of the cluster
REFUSED = "Authentication token is missing or incorrect"  # what Ray says (tests/test_local.py)
DATASET = "sec"
SERIES, SCRAPES = 50, 10
# A Ray driver as any program would be one: join, find the singleton, call it.
DRIVER = f"""
import sys, ray
ray.init(address=sys.argv[1], namespace="filopy", logging_level="WARNING")
actor = ray.get_actor({CLUSTER_ACTOR_NAME!r}, namespace="filopy")
ray.get(actor.ready.remote(), timeout=60)
print("called the singleton")
"""


@pytest.fixture(scope="module")
def net_cluster(bed: Bed) -> Iterator[NetCluster]:
    """Kafka, the head and two nodes with Ray's token authentication on, shared by the module."""
    cluster = NetCluster(bed, ROOT, nodes=MEMBERS, ray_token=True)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _env(c: NetCluster, token: Path | None) -> dict[str, str]:
    """The cluster's environment without its Ray token: with `token` instead if given."""
    env = {k: v for k, v in c.env.items() if k not in (AUTH_MODE_VAR, TOKEN_PATH_VAR)}
    if token is not None:
        env |= {AUTH_MODE_VAR: "token", TOKEN_PATH_VAR: str(token)}
    return env


def _wrong_token(c: NetCluster) -> Path:
    path = c.dir / "wrong-ray-token"
    if not path.exists():
        write_private(path, secrets.token_hex(32))
    return path


def _driver(c: NetCluster, host: str, token: Path | None) -> subprocess.CompletedProcess[str]:
    python = str(ROOT / ".venv" / "bin" / "python")
    argv = [python, "-c", DRIVER, HEAD_ADDRESS]
    return c.bed.sh(host, argv, env=_env(c, token), timeout=180, check=False)


def test_a_driver_without_the_ray_token_is_refused_from_another_host(
    net_cluster: NetCluster,
) -> None:
    c = net_cluster
    assert c.ray_token is not None and c.ray_token.stat().st_mode & 0o777 == 0o600
    for token in (None, _wrong_token(c)):
        started = time.monotonic()
        proc = _driver(c, OUTSIDER, token)
        took = time.monotonic() - started
        assert proc.returncode != 0, f"a driver with {token} got in:\n{proc.stdout}"
        assert REFUSED in proc.stderr, proc.stderr[-3000:]
        assert "called the singleton" not in proc.stdout
        assert took < 120, f"refused, but only after {took:.0f} s"
    # The positive control: the same driver, with the token, on a machine of the cluster.
    proc = _driver(c, "head", c.ray_token)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "called the singleton" in proc.stdout


def test_a_node_without_the_ray_token_does_not_join(net_cluster: NetCluster) -> None:
    c = net_cluster
    members = set(MEMBERS)
    assert c.members() == members
    argv = [c.filopy_bin, "node", "join", "--address", HEAD_ADDRESS, "--name", OUTSIDER]
    for token in (None, _wrong_token(c)):
        log = f"outsider-join-{'none' if token is None else 'wrong'}.log"
        proc = c.bed.spawn(OUTSIDER, argv, env=_env(c, token), log=log)
        try:
            end = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < end:
                assert c.members() == members, f"a node joined with {token}"
                time.sleep(1.0)
            said = (c.bed.workdir / log).read_text(errors="replace")
            assert proc.returncode not in (None, 0), f"`node join` with {token} ran on:\n{said}"
            assert REFUSED in said, said[-3000:]
        finally:
            c.bed.kill(OUTSIDER)
            shutil.rmtree(c.bed.ray_dir(OUTSIDER), ignore_errors=True)  # a clean machine
        assert c.members() == members
        assert not c.rest("/api/v1/nodes")["refused"]
    # The positive control: with the token, the same command joins; a driver there gets in.
    c.bed.spawn(OUTSIDER, argv, env=c.env, log="outsider-join-token.log")
    try:
        c.wait_members(members | {OUTSIDER})
        proc = _driver(c, OUTSIDER, c.ray_token)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "called the singleton" in proc.stdout
    finally:
        c.bed.kill(OUTSIDER)
    c.wait_members(members)


def test_a_node_query_channel_refuses_bad_frames_from_another_host(
    net_cluster: NetCluster,
) -> None:
    c = net_cluster
    c.cli("dataset", "create", DATASET, "--shards", "4", "--min-nodes", "2",
          "--address", HEAD_ADDRESS)  # fmt: skip
    c.wait_active(DATASET)
    start_ms = 1_700_000_000_000
    c.cli("ingest", DATASET, "--series", str(SERIES), "--scrapes", str(SCRAPES),
          "--start-ms", str(start_ms), "--address", HEAD_ADDRESS, timeout=300)  # fmt: skip
    at = str(start_ms // 1000 + SCRAPES * 15)
    expected = float(SERIES * SCRAPES)
    wait_for("every sample answered", lambda: _count(c, at) == expected, 120)

    node = MEMBERS[0]
    shards = [s["shard"] for s in c.shards(DATASET) if s["node"] == node]
    assert shards, f"{node} owns shards"
    before = _endpoint(c, node)
    assert before["host"] == c.bed.ip(node), "the channel listens on the node's own address"
    key_file = c.dir / "channel-key"
    write_private(key_file, before["key"])
    probe = [str(ROOT / ".venv" / "bin" / "python"), "-m", "tests.netbed.channel_probe",
             "frames", before["host"], str(before["port"]), str(key_file), DATASET,
             *map(str, shards)]  # fmt: skip
    out = c.bed.sh("client", probe, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=180)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "unsigned": "closed",
        "wrong_key": "closed",
        "garbage": "closed",
        "signed": "ok",  # the key the cluster hands out through Ray works from here
        "replayed_on_its_connection": "closed",
        "replayed_on_another_connection": "closed",
    }
    after = _endpoint(c, node)
    assert after["alive"], f"{node} answers its pings"
    assert (after["host"], after["port"], after["key"]) == (
        before["host"],
        before["port"],
        before["key"],
    ), "the same channel, not a restarted node"
    refused = after["stats"]["refused"] - before["stats"]["refused"]
    assert refused == 5, f"five refusals counted by the node, not {refused}"
    assert c.members() == set(MEMBERS)
    # Real queries go on through the node's channel, answered in full.
    served = after["stats"]["served"]
    assert _count(c, at) == expected
    assert _endpoint(c, node)["stats"]["served"] > served, "answered through the channel"


def _endpoint(c: NetCluster, node: str) -> dict[str, Any]:
    """`tests/netbed/channel_probe.py endpoint`, as a driver on the head (with the token)."""
    argv = [str(ROOT / ".venv" / "bin" / "python"), "-m", "tests.netbed.channel_probe",
            "endpoint", node, "--address", HEAD_ADDRESS]  # fmt: skip
    proc = c.bed.sh("head", argv, env={**c.env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=120)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _count(c: NetCluster, at: str) -> float:
    query = urllib.parse.urlencode(
        {"query": f"sum(count_over_time({{__name__=~'.+'}}[{SCRAPES}m]))", "time": at}
    )
    result = c.rest(f"/promql/{DATASET}/api/v1/query?{query}")["result"]
    return float(result[0]["value"][1]) if result else 0.0

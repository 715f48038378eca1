"""Readable node names on a real Ray cluster: from the Ray node's `filopy.io/name` label, else
the host name and the start of the Ray id; unique (a duplicate is refused and says why); shown by
`filopy status` (run as a user types it) and accepted wherever a node is named."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from coordinator.node_coordinator import NAME_LABEL
from filopy import Dataset
from tests.runtime.conftest import FiloPyCluster

pytestmark = pytest.mark.ray


def _cli(c: FiloPyCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FILOPY_RAY__NAMESPACE": c.settings.ray.namespace}
    cmd = [sys.executable, "-m", "filopy.cli", *args, "--address", c.ray.address]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_nodes_go_by_unique_readable_names(filopy_cluster: FiloPyCluster) -> None:
    c = filopy_cluster
    alpha = c.add_node(labels={NAME_LABEL: "alpha"})
    plain = c.add_node()
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    names = c.client.node_names()
    host = socket.gethostname().split(".")[0]
    assert names == {alpha.node_id: "alpha", plain.node_id: f"{host}-{plain.node_id[:6]}"}

    # A second "alpha" is refused, with why, and gets no shards.
    twin = c.add_node(labels={NAME_LABEL: "alpha"})

    def refusal() -> str | None:
        return dict(c.client.nodes().refused).get(twin.node_id)

    why = c.wait_for("the twin refused", refusal, 30)
    assert "'alpha'" in why and alpha.node_id in why, why
    assert twin.node_id not in c.client.members()
    # The members with their names and the refused nodes, as one reading (REST /api/v1/nodes).
    found = c.client.nodes()
    assert {m.node: m.name for m in found.members} == names, found
    assert dict(found.refused) == {twin.node_id: why}, found
    assert c.client.setup_dataset(Dataset(name="named", num_shards=4, min_num_nodes=2))
    c.wait_for("all shards active", lambda: c.client.shard_map("named").is_healthy(), 60)
    assert c.client.shard_map("named").shards_for_node(twin.node_id) == []

    # Names wherever a node is named: resolving one, and the status a user reads.
    assert c.client.node("alpha") == alpha.node_id
    shown = _cli(c, "status", "named")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # as wrapped to the terminal's width
    assert "alpha: 2 shards" in text and f"{host}-{plain.node_id[:6]}: 2 shards" in text, text
    assert f"refused {twin.node_id}: name 'alpha' is taken" in text, text
    as_json = json.loads(_cli(c, "status", "named", "--json").stdout)
    assert {s["node"] for s in as_json["shards"]} == {"alpha", f"{host}-{plain.node_id[:6]}"}
    assert as_json["refused"] == {twin.node_id: why}

    # Once the first alpha is gone, the twin may join under the name.
    c.ray.remove_node(alpha)
    c.wait_for("the twin to join", lambda: twin.node_id in c.client.members(), 60)
    assert c.client.node_names()[twin.node_id] == "alpha"
    assert c.client.nodes().refused == ()

"""The `filopy` CLI against a real cluster: output, and one-line errors with a non-zero exit."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from core.dataset import Dataset
from filopy.cli import app
from tests.cluster import release_ray_pool

pytestmark = pytest.mark.ray
runner = CliRunner()


def test_unreachable_cluster_is_one_clear_line() -> None:
    import ray

    release_ray_pool()  # connected to a cluster, the CLI would use that one, as `connect` says
    assert not ray.is_initialized()
    result = runner.invoke(app, ["status", "metrics", "--address", "127.0.0.1:1"])
    assert result.exit_code == 1
    assert "no Ray cluster answers at 127.0.0.1:1" in result.output
    assert "Traceback" not in result.output


def test_cli_against_a_running_cluster(filopy_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    c = filopy_cluster
    monkeypatch.setenv("FILOPY_RAY__NAMESPACE", c.settings.ray.namespace)
    nodes = [c.add_node() for _ in range(2)]
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    c.client.setup_dataset(Dataset(name="metrics", num_shards=4, min_num_nodes=2))
    c.wait_for("healthy", lambda: c.client.shard_map("metrics").is_healthy())
    addr = ["--address", c.ray.address]

    listed = runner.invoke(app, ["dataset", "list", *addr])
    assert listed.exit_code == 0, listed.output
    assert listed.output.split() == ["metrics"]
    shown = runner.invoke(app, ["dataset", "show", "metrics", *addr])
    assert json.loads(shown.output)["num_shards"] == 4

    status = runner.invoke(app, ["status", "metrics", "--json", *addr])
    shards = json.loads(status.output)["shards"]
    assert [s["status"] for s in shards] == ["Active"] * 4
    assert {s["address"] for s in shards} == {n.node_id for n in nodes}

    grid = runner.invoke(app, ["status", "metrics", *addr])
    assert "AAAA" in grid.output
    names = {s["address"]: s["node"] for s in shards}  # the grid shows nodes by name
    for n in nodes:
        assert f"{names[n.node_id]}: 2 shards: " in grid.output

    stopped = runner.invoke(app, ["shards", "stop", "metrics", "1", *addr])
    assert stopped.exit_code == 0 and "stopped shards [1]" in stopped.output
    bad = runner.invoke(app, ["shards", "stop", "metrics", "9", *addr])
    assert bad.exit_code == 1
    assert "error:" in bad.output and "Traceback" not in bad.output
    unknown = runner.invoke(app, ["status", "nope", *addr])
    assert unknown.exit_code == 1 and "unknown dataset 'nope'" in unknown.output
    owner = c.client.shard_map("metrics").shards_for_node(nodes[0].node_id)
    target = nodes[0].node_id if len(owner) < 2 else nodes[1].node_id
    # A node is named by its name as `filopy status` shows it (its id works as well).
    started = runner.invoke(app, ["shards", "start", "metrics", names[target], "1", *addr])
    assert started.exit_code == 0, started.output
    assert f"on {names[target]}" in started.output
    c.wait_for("shard 1 back", lambda: c.client.shard_map("metrics").owner(1) == target)


def test_cli_dataset_create_and_delete(
    filopy_cluster, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    c = filopy_cluster
    monkeypatch.setenv("FILOPY_RAY__NAMESPACE", c.settings.ray.namespace)
    c.add_node()
    c.wait_for("a member", lambda: len(c.client.members()) == 1)
    addr = ["--address", c.ray.address]
    create_web = ["dataset", "create", "web", "--shards", "4", "--spread", "2"]
    create_web += ["--format", "influx-line", *addr]
    made = runner.invoke(app, create_web)
    assert made.exit_code == 0 and "created: web" in made.output, made.output
    (ds,) = c.client.datasets()
    assert (ds.num_shards, ds.spread.default, ds.source.record_format.value) == (
        4,
        2,
        "influx-line",
    )
    again = runner.invoke(app, create_web)
    assert "already exists (same definition)" in again.output
    conflict = runner.invoke(app, ["dataset", "create", "web", "--shards", "8", *addr])
    assert conflict.exit_code == 1 and "different definition" in conflict.output
    bad = runner.invoke(app, ["dataset", "create", "web2", "--shards", "6", *addr])
    assert bad.exit_code == 1
    assert "num_shards must be a power of two, got 6" in bad.output
    assert "Traceback" not in bad.output
    definition = tmp_path / "ds.json"
    definition.write_text('{"name": "fromjson", "num_shards": 2, "spread": {"default": 0}}')
    from_json = runner.invoke(
        app, ["dataset", "create", "x", "--from-json", str(definition), *addr]
    )
    assert from_json.exit_code == 0 and "created: fromjson" in from_json.output
    gone = runner.invoke(app, ["dataset", "delete", "web", *addr])
    assert gone.exit_code == 0 and "deleted: web" in gone.output
    assert sorted(d.name for d in c.client.datasets()) == ["fromjson"]
    missing = runner.invoke(app, ["dataset", "delete", "web", *addr])
    assert missing.exit_code == 1 and "unknown dataset 'web'" in missing.output

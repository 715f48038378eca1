"""Deleting series end to end (Prometheus' delete_series): samples through real Kafka into a
two-node cluster, some series deleted by matcher over REST; queries and /series no longer
return them while the others are untouched, restarting the shards (a replay from the
checkpoints) does not bring them back, and samples sent afterwards make a new series; the CLI
does the same as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.dataset import Dataset, SourceSettings, StoreOptions
from core.shard_status import Stopped
from ingest.gateway import Gateway
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, start_rest

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

MIN = 60_000
FILOPY = str(Path(sys.executable).parent / "filopy")
HOUR = 60 * MIN


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    settings = cluster_settings(
        tmp_path_factory.mktemp("del"),
        "kafka",
        flush_interval_s=1.0,
        kafka_bootstrap=kafka_bootstrap,
    )
    yield from start_rest(tmp_path_factory.mktemp("del"), nodes=2, settings=settings)


def _dataset(rest: Rest, name: str, kafka_bootstrap: str) -> Dataset:
    """A dataset of two shards, every series' samples on both, set up and active."""
    ds = Dataset(
        name=name,
        num_shards=2,
        spread={"default": 1},  # hosts on both shards
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
        store=StoreOptions(memory_retention_ms=4 * HOUR, flush_interval_s=1.0),
    )
    rest.client.setup_dataset(ds)
    rest.wait_for("all shards active", lambda: rest.all_active(name), 60)
    return ds


def _labels(metric: str, host: str) -> dict[str, str]:
    return {"_metric_": metric, "_ws_": "w", "_ns_": "n", "host": host}


def _counts(rest: Rest, name: str, query: str) -> dict[str, int]:
    """Samples per host the cluster answers for `query` (a count_over_time)."""
    resp = rest.http.get(
        f"/promql/{name}/api/v1/query", params={"query": query, "time": f"{time.time():.3f}"}
    )
    assert resp.status_code == 200, resp.text
    return {r["metric"]["host"]: int(r["value"][1]) for r in resp.json()["data"]["result"]}


def _series(rest: Rest, name: str, match: str) -> list[dict[str, Any]]:
    resp = rest.http.get(f"/promql/{name}/api/v1/series", params={"match[]": match})
    assert resp.status_code == 200, resp.text
    return sorted(resp.json()["data"], key=lambda s: (s["__name__"], s["host"]))


def test_deleted_series_are_gone_for_good_and_others_untouched(rest: Rest, kafka_bootstrap: str):
    name = f"del{uuid.uuid4().hex[:8]}"
    ds = _dataset(rest, name, kafka_bootstrap)
    now = int(time.time() * 1000)
    times = [now - i * MIN for i in range(30, 0, -1)]
    hosts = ["a", "b", "c", "d"]
    with Gateway(ds) as gw:
        gw.send(
            (_labels(m, h), t, float(i))
            for m in ("cpu", "mem")
            for h in hosts
            for i, t in enumerate(times)
        )
    total = 2 * len(hosts) * len(times)

    def ingested() -> bool:
        stats = rest.client.ingest_stats(name)
        shards = [st for per_node in stats.values() for st in per_node.values()]
        return sum(st["memstore"].ingested for st in shards) == total

    rest.wait_for("every sample ingested", ingested, 120)
    every = {h: len(times) for h in hosts}
    assert _counts(rest, name, "count_over_time(cpu[1h])") == every

    url = f"/promql/{name}/api/v1/admin/tsdb/delete_series"
    # Bad input: 400 with a message, nothing deleted.
    for bad in ({}, {"match[]": "cpu{"}, {"match[]": "cpu", "end": "100"}):
        resp = rest.http.post(url, data=bad)
        assert resp.status_code == 400, (bad, resp.text)
        assert resp.json()["error"]
    assert rest.http.post(f"/promql/nosuch{name}/api/v1/admin/tsdb/delete_series",
                          data={"match[]": "cpu"}).status_code == 404  # fmt: skip

    resp = rest.http.post(url, data={"match[]": ['cpu{host=~"a|b"}', 'mem{host="c"}']})
    assert resp.status_code == 204, resp.text
    ok = rest.http.post(f"/promql/{name}/api/v1/admin/tsdb/clean_tombstones")
    assert ok.status_code == 204, ok.text

    def check_deleted() -> None:
        assert _counts(rest, name, "count_over_time(cpu[1h])") == {"c": 30, "d": 30}
        assert _counts(rest, name, "count_over_time(mem[1h])") == {"a": 30, "b": 30, "d": 30}
        assert [s["host"] for s in _series(rest, name, "cpu")] == ["c", "d"]
        assert [s["host"] for s in _series(rest, name, "mem")] == ["a", "b", "d"]

    check_deleted()

    # Restart every shard: each replays from its checkpoints and reloads the store's part keys.
    rest.client.stop_shards(name, [0, 1])
    rest.wait_for(
        "both shards stopped",
        lambda: all(isinstance(rest.client.shard_map(name).status(s), Stopped) for s in (0, 1)),
        60,
    )
    rest.client.start_shards(name, rest.nodes[0], [0, 1])
    rest.wait_for("all shards active again", lambda: rest.all_active(name), 120)
    check_deleted()

    # Samples after the delete: a new series, holding only them.
    later = [now + i * 1000 for i in range(1, 6)]
    with Gateway(ds) as gw:
        gw.send((_labels("cpu", "a"), t, 1.0) for t in later)
    rest.wait_for(
        "the new series answers",
        lambda: _counts(rest, name, "count_over_time(cpu[2h])").get("a") == len(later),
        60,
    )
    assert _counts(rest, name, "count_over_time(cpu[2h])") == {"a": 5, "c": 30, "d": 30}


def test_the_cli_deletes_series_over_rest_and_over_ray_and_asks_first(
    rest: Rest, kafka_bootstrap: str
):
    """`filopy series delete` as a user types it: a subprocess, over the REST API (`--url`) and
    as a Ray driver (`--address`); a bad selector and a "no" at the prompt delete nothing."""
    name = f"cli{uuid.uuid4().hex[:8]}"
    ds = _dataset(rest, name, kafka_bootstrap)
    now = int(time.time() * 1000)
    with Gateway(ds) as gw:
        gw.send((_labels(m, h), now - i * MIN, 1.0)
                for m in ("cpu", "mem") for h in "abc" for i in range(5))  # fmt: skip
    rest.wait_for(
        "every series answers",
        lambda: (
            _counts(rest, name, "count_over_time(cpu[1h])") == {"a": 5, "b": 5, "c": 5}
            and _counts(rest, name, "count_over_time(mem[1h])") == {"a": 5, "b": 5, "c": 5}
        ),
        120,
    )
    env = {**os.environ, "FILOPY_RAY__NAMESPACE": rest.cluster.settings.ray.namespace}

    def filopy(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([FILOPY, "series", "delete", name, *args], input=stdin, env=env,
                              capture_output=True, text=True, timeout=180)  # fmt: skip

    bad = filopy("cpu{", "--yes", "--url", rest.url)
    assert bad.returncode == 1 and "error:" in bad.stderr, bad
    assert "Traceback" not in bad.stdout + bad.stderr
    said_no = filopy('cpu{host="a"}', "--url", rest.url, stdin="n\n")
    assert said_no.returncode == 1 and "cannot be undone" in said_no.stdout, said_no
    assert _counts(rest, name, "count_over_time(cpu[1h])") == {"a": 5, "b": 5, "c": 5}

    over_rest = filopy('cpu{host="a"}', "--yes", "--url", rest.url)
    assert over_rest.returncode == 0, over_rest.stderr
    assert _counts(rest, name, "count_over_time(cpu[1h])") == {"b": 5, "c": 5}

    over_ray = filopy("mem", 'cpu{host="b"}', "--address", rest.cluster.ray.address, stdin="y\n")
    assert over_ray.returncode == 0, over_ray.stderr
    assert "deleted 4 series" in over_ray.stdout, over_ray.stdout
    assert _counts(rest, name, "count_over_time(cpu[1h])") == {"c": 5}
    assert _counts(rest, name, "count_over_time(mem[1h])") == {}

"""Retention on a live dataset of a real local cluster, through REST and the CLI: set at
creation, changed later (the singleton's sweep follows at once and drops the old SQLite bucket),
bytes stored shown by the retention route, `filopy dataset show` and /metrics; a size limit
drops the oldest bucket; bad input 400."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from core.dataset import DatasetRef
from filopy.cli import app
from store import INT64_MAX, INT64_MIN, ChunkRecord, encode_part_key, open_stores
from tests.rest.test_datasets import error_of

pytestmark = pytest.mark.ray

DATASETS = "/api/v1/datasets"
DAY = 86_400_000
runner = CliRunner()


def _chunk(host: str, end: int) -> ChunkRecord:
    key = encode_part_key({"_metric_": "cpu", "_ws_": "w", "_ns_": "n", "host": host})
    return ChunkRecord.from_samples(key, [end - 30_000, end - 15_000, end], [1.0, 2.0, 3.0])


def test_retention_of_a_live_dataset_over_rest_and_the_cli(
    rest, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    definition = {"name": name, "num_shards": 2, "spread": {"default": 0}}
    assert error_of(rest.http.post(DATASETS, params={"retention": "soon"}, json=definition),
                    400, "bad_data")  # fmt: skip
    listed = rest.http.get(DATASETS).json()["data"]
    assert all(d["name"] != name for d in listed)  # refused before anything was created
    created = rest.http.post(DATASETS, params={"retention": "2d"}, json=definition)
    assert created.status_code == 201, created.text
    shown = rest.http.get(f"{DATASETS}/{name}/retention").json()["data"]
    assert (shown["retention_ms"], shown["own_retention_ms"]) == (2 * DAY, 2 * DAY)
    assert shown["bytes"] == 0
    # Each downsampled resolution of the settings, with its bytes (none yet) and retention.
    down = rest.cluster.settings.downsample
    assert shown["downsampled"] == {
        str(res): {"bytes": 0, "retention_ms": down.retention_ms(res)}
        for res in down.resolutions_ms
    }

    # Chunks in the cluster's own store, as the nodes' flushes write them, one five days old:
    # written while the dataset keeps everything (past 2d it would not be written at all).
    put = rest.http.put(f"{DATASETS}/{name}/retention", json={"retention": "0"})
    assert put.json()["data"]["retention_ms"] == 0
    now = int(time.time() * 1000)
    old, new = _chunk("old", now - 5 * DAY), _chunk("new", now - 60_000)
    meta, column = open_stores(rest.cluster.settings)
    ref = DatasetRef(name=name)
    try:
        column.write_chunks(ref, 0, [old, new])
        keys = [old.part_key, new.part_key]
        assert len(column.read_chunks(ref, 0, keys, INT64_MIN, INT64_MAX)) == 2
        shown = rest.http.get(f"{DATASETS}/{name}/retention").json()["data"]
        assert shown["bytes"] == len(old.data) + len(new.data)
        assert len(shown["buckets"]) == 2

        # Shorter on the live dataset: reads stop answering the old chunk at once, and the
        # sweep that follows the change drops its bucket.
        put = rest.http.put(f"{DATASETS}/{name}/retention", json={"retention": "1d"})
        assert put.status_code == 200, put.text
        data = put.json()["data"]
        assert (data["retention_ms"], data["own_retention_ms"]) == (DAY, DAY)
        assert data["bytes"] == len(new.data)
        assert data["sweep"]["buckets_dropped"] == 1
        assert data["sweep"]["bytes_freed"] == len(old.data)
        assert data["sweep"]["last_error"] is None
        assert list(column.read_chunks(ref, 0, keys, INT64_MIN, INT64_MAX)) == [new.part_key]

        metrics = rest.http.get("/metrics").text
        assert f'filopy_store_bytes{{dataset="{name}"}} {float(len(new.data))}' in metrics
        assert f'filopy_retention_seconds{{dataset="{name}"}} 86400.0' in metrics

        # Bad input is a 400 with a message; an unknown dataset a 404.
        bad = rest.http.put(f"{DATASETS}/{name}/retention", json={"retention": "-3d"})
        assert "retention" in error_of(bad, 400, "bad_data")
        error_of(rest.http.put(f"{DATASETS}/{name}/retention", json={}), 400, "bad_data")
        missing = rest.http.put(f"{DATASETS}/nosuch/retention", json={"retention": "1d"})
        error_of(missing, 404, "not_found")

        # The CLI: show, change, back to the cluster default.
        monkeypatch.setenv("FILOPY_RAY__NAMESPACE", rest.cluster.settings.ray.namespace)
        addr = ["--address", rest.cluster.ray.address]
        out = runner.invoke(app, ["dataset", "show", name, *addr])
        assert out.exit_code == 0, out.output
        storage = json.loads(out.output)["storage"]
        assert (storage["retention"], storage["retention_from"]) == ("1d", "dataset")
        assert storage["bytes"] == len(new.data)
        out = runner.invoke(app, ["dataset", "retention", name, "12h", *addr])
        assert out.exit_code == 0, out.output
        assert "retention 12h (its own)" in out.output
        assert meta.get_retention(ref) == DAY // 2
        out = runner.invoke(app, ["dataset", "retention", name, "default", *addr])
        assert "retention forever (the cluster default)" in out.output
        assert meta.get_retention(ref) is None
        out = runner.invoke(app, ["dataset", "retention", name, "whenever", *addr])
        assert out.exit_code == 1 and "Traceback" not in out.output

        # A size limit (SQLite): over it, the sweep that follows drops the oldest bucket first
        # and says so (counted in /metrics); the newest stays.
        older = _chunk("older", now - 3 * DAY)
        column.write_chunks(ref, 0, [older])
        put = rest.http.put(f"{DATASETS}/{name}/retention", json={"max_bytes": len(new.data)})
        assert put.status_code == 200, put.text
        data = put.json()["data"]
        assert (data["max_bytes"], data["bytes"]) == (len(new.data), len(new.data))
        assert data["sweep"]["size_buckets_dropped"] == 1
        assert data["sweep"]["size_bytes_freed"] == len(older.data)
        assert data["retention_ms"] == 0  # the retention was left as it was
        metrics = rest.http.get("/metrics").text
        line = f'filopy_retention_size_dropped_bytes_total{{dataset="{name}"}}'
        assert f"{line} {float(len(older.data))}" in metrics
        error_of(rest.http.put(f"{DATASETS}/{name}/retention", json={"max_bytes": 0}),
                 400, "bad_data")  # fmt: skip
        out = runner.invoke(app, ["dataset", "retention", name, "--max-bytes", "2GiB", *addr])
        assert out.exit_code == 0 and "at most" in out.output, out.output
        assert meta.get_size_limit(ref) == 2 << 30
        out = runner.invoke(app, ["dataset", "retention", name, "--max-bytes", "none", *addr])
        assert out.exit_code == 0 and meta.get_size_limit(ref) is None
        out = runner.invoke(app, ["dataset", "retention", name, "--max-bytes", "lots", *addr])
        assert out.exit_code == 1 and "Traceback" not in out.output
    finally:
        meta.close()
        column.close()
        rest.http.delete(f"{DATASETS}/{name}")

"""A node killed while its shards downsample, on real Kafka and a real Ray cluster.

Every shard downsamples minute periods as fast as its data comes (no delay, a round every
50 ms) while 2 h 20 min of scrapes stream in; the node holding the most shards is killed
(its Ray node removed: SIGKILL) once its shards' marks have moved, with the rest of the data
still to come. The new owners recover (checkpoints, snapshots, Kafka), go on from the dead
node's marks and redo what it left half done. Then every minute-aligned window, answered from
the stored periods, equals the raw answer over the samples produced: a gap or a period counted
twice would show in `count_over_time` and `sum_over_time`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from coordinator.local_cluster import LocalRayCluster
from core.dataset import SourceSettings
from filopy import Dataset
from query.functions import SampleBatch, range_function
from store import open_stores
from tests.ingest.test_cluster_ingest import (
    T0,
    batches,
    expected,
    labels,
    produce_pausing,
    start_three,
    wait_exact,
)
from tests.runtime.conftest import FiloPyCluster, cluster_settings, on_backend, start_cluster

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

SERIES = 120
SCRAPES = 560  # 15 s apart: 2 h 20 min
PER_CALL = 4
MIN = 60_000


@pytest.fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.cassandra)])
def downsampling_cluster(
    request: pytest.FixtureRequest,
    ray_cluster: LocalRayCluster,
    tmp_path: Path,
    kafka_bootstrap: str,
) -> Iterator[FiloPyCluster]:
    settings = cluster_settings(tmp_path, "kafka", flush_interval_s=0.2, groups_per_shard=4)
    settings = settings.model_copy(
        update={
            "downsample": settings.downsample.model_copy(
                update={
                    "resolutions_ms": [MIN],
                    "retention_days": [0.0],
                    "delay_s": 0.0,
                    "interval_s": 0.05,
                }
            )
        }
    )
    yield start_cluster(ray_cluster, on_backend(settings, request, kafka_bootstrap))


def _produced() -> tuple[list[dict[str, str]], list[np.ndarray], list[np.ndarray]]:
    """Each series' samples as the producer sends them."""
    ts: list[list[np.ndarray]] = [[] for _ in range(SERIES)]
    vals: list[list[np.ndarray]] = [[] for _ in range(SERIES)]
    for b in batches(SERIES, SCRAPES, per_call=PER_CALL):
        for i in range(SERIES):
            mine = b.series_idx == i
            ts[i].append(b.timestamps[mine])
            vals[i].append(b.values[mine])
    return (
        [labels(i) for i in range(SERIES)],
        [np.concatenate(t) for t in ts],
        [np.concatenate(v) for v in vals],
    )


def test_a_node_killed_while_downsampling_leaves_no_gap_and_no_duplicate(
    downsampling_cluster: FiloPyCluster, kafka_bootstrap: str
) -> None:
    c = downsampling_cluster
    ds = Dataset(
        name=f"dc{uuid.uuid4().hex[:8]}",
        num_shards=8,
        min_num_nodes=3,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    nodes = start_three(c, ds)
    spare = c.add_node()
    c.wait_for("the spare joined", lambda: spare.node_id in c.client.members())

    all_batches = list(batches(SERIES, SCRAPES, per_call=PER_CALL))
    producer, killed = produce_pausing(ds, kafka_bootstrap, all_batches, len(all_batches) * 3 // 4)
    victim = max(nodes, key=lambda n: len(c.client.shard_map(ds.name).shards_for_node(n.node_id)))
    moved = c.client.shard_map(ds.name).shards_for_node(victim.node_id)
    meta, _ = open_stores(c.settings)
    try:

        def marks_moved() -> bool:
            return all(meta.read_downsample_marks(ds.ref, s).get(MIN, 0) > T0 for s in moved)

        c.wait_for("the victim's shards downsampled a first slice", marks_moved, 90)
        c.ray.remove_node(victim)  # SIGKILL for its processes, downsampling all the while
        killed.set()
        producer.join(timeout=120)
        c.wait_for("the victim gone", lambda: victim.node_id not in c.client.members())
        wait_exact(c, ds, expected(SERIES, SCRAPES), timeout_s=150)

        end = T0 + 15_000 * (SCRAPES - 1)
        last = end // MIN * MIN - 24 * MIN  # past the last whole slice's start: all marks here

        def all_downsampled() -> bool:
            return all(meta.read_downsample_marks(ds.ref, s).get(MIN, 0) >= last for s in range(8))

        c.wait_for("every shard downsampled to its last whole slice", all_downsampled, 120)
    finally:
        meta.close()

    from coordinator.cluster_queries import cluster_query_service  # it imports Ray

    names, ts, vals = _produced()
    bounds = np.concatenate([[0], np.cumsum([len(t) for t in ts])]).astype(np.int64)
    raw = SampleBatch(names, np.concatenate(ts), np.concatenate(vals), bounds)
    times = np.arange((T0 // MIN + 6) * MIN, last + 1, MIN, dtype=np.int64)
    svc = cluster_query_service(c.client)
    try:
        for func in ("count_over_time", "sum_over_time", "max_over_time", "changes"):
            got = svc.range(ds.name, f'{func}({{_ws_="demo"}}[5m])', int(times[0]),
                            int(times[-1]), MIN)  # fmt: skip
            want, present = range_function(func, raw, times, 5 * MIN, 0)
            rows = {
                lb["instance"]: np.where(got.value.present[i], got.value.values[i], np.nan)
                for i, lb in enumerate(got.value.labels)
            }
            assert len(rows) == SERIES
            for i in range(SERIES):
                np.testing.assert_allclose(
                    rows[f"i{i}"], np.where(present[i], want[i], np.nan), rtol=1e-9, err_msg=func
                )
            # and from the periods: far fewer raw samples read than the windows hold
            assert got.samples_scanned < len(raw.ts) / 4, (func, got.samples_scanned)
    finally:
        svc.close()

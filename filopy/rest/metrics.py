"""Prometheus metrics of a FiloPy cluster, gathered from the cluster at scrape time.

Shard statuses and reassignment counts come from the singleton; ingestion counters from each
node coordinator's ingesters. Nothing is cached between scrapes, so every value is as fresh as
the scrape, and a value the cluster does not track is not exported (docs/rest.md lists them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from confluent_kafka.admin import AdminClient
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from core.dataset import Dataset
from core.errors import DatasetUnknownError
from ingest.topics import KafkaUnavailable, admin_client, end_offsets

if TYPE_CHECKING:
    from coordinator.client import FiloPyClient

log = logging.getLogger("filopy.rest")
END_OFFSETS_TIMEOUT_S = 2.0  # a scrape must answer even when Kafka does not

STATUSES = (
    "Unassigned",
    "Assigned",
    "Recovery",
    "Active",
    "Degraded",
    "Handoff",
    "Error",
    "Stopped",
    "Down",
)


class ClusterCollector(Collector):
    """Asks the cluster for its state on every scrape (blocking: run `generate_latest` in a
    worker thread). If the singleton does not answer, only `filopy_cluster_up 0` is exported."""

    def __init__(self, client: FiloPyClient) -> None:
        self._client = client
        self._admins: dict[str, AdminClient] = {}  # by bootstrap servers, kept across scrapes

    def describe(self) -> list[Metric]:
        return []  # collected live; describing would call the cluster at registration

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "filopy_cluster_up", "1 if the cluster singleton answered this scrape, else 0."
        )
        try:
            families = self._collect()
        except Exception as e:  # a scrape must not fail: report the cluster as down instead
            log.warning("metrics: the cluster did not answer: %s", e)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _collect(self) -> list[Metric]:
        c = self._client
        members = GaugeMetricFamily("filopy_cluster_members", "FiloPy nodes in the cluster.")
        members.add_metric([], len(c.members()))
        shards = GaugeMetricFamily(
            "filopy_shards", "Shards per status per dataset.", labels=["dataset", "status"]
        )
        moves = CounterMetricFamily(
            "filopy_shard_reassignments",
            "Shards offered to another node after an ingestion error (done), and such moves "
            "skipped because the shard had moved within cluster.reassignment_min_interval_s "
            "(skipped). Counted by the singleton since it last started.",
            labels=["dataset", "outcome"],
        )
        per_shard = ["dataset", "shard", "node"]
        samples = CounterMetricFamily(
            "filopy_ingested_samples",
            "Samples ingested into the memstore by this shard's ingester on this node.",
            labels=per_shard,
        )
        messages = CounterMetricFamily(
            "filopy_ingested_messages", "Kafka messages consumed by the ingester.", labels=per_shard
        )
        bad = CounterMetricFamily(
            "filopy_bad_records",
            "Records skipped as malformed, by reason.",
            labels=[*per_shard, "reason"],
        )
        dropped = CounterMetricFamily(
            "filopy_dropped_samples",
            "Samples not ingested: out_of_order (older than the series' last sample) or "
            "invalid_series (labels that cannot form a shard key).",
            labels=[*per_shard, "reason"],
        )
        misrouted = CounterMetricFamily(
            "filopy_misrouted_samples",
            "Samples ingested by a shard their series' shard key does not hash to (written to "
            "the partition directly, not routed by FiloPy's hash): kept, but queries routed by "
            "shard key do not look for them here.",
            labels=per_shard,
        )
        memory = GaugeMetricFamily(
            "filopy_memstore_samples", "Samples held in memory by the shard.", labels=per_shard
        )
        lost = CounterMetricFamily(
            "filopy_offsets_lost",
            "Kafka offsets that retention dropped before they were checkpointed.",
            labels=per_shard,
        )
        lag = GaugeMetricFamily(
            "filopy_consumer_lag_offsets",
            "Kafka offsets of the shard's partition not yet read by its ingester: the broker's "
            "end offset at the scrape (the ingester's last fetch if the broker did not answer) "
            "minus the ingester's next offset.",
            labels=per_shard,
        )
        lag_s = GaugeMetricFamily(
            "filopy_consumer_lag_seconds",
            "How far behind in time the shard's ingester reads: 0 when it has read everything, "
            "else the age of the newest record it read (by the record's Kafka timestamp).",
            labels=per_shard,
        )
        recovery = GaugeMetricFamily(
            "filopy_recovery_duration_seconds",
            "How long the shard's ingester took from start (epoch claim, checkpoint recovery, "
            "replay) to IngestionStarted on this node.",
            labels=per_shard,
        )
        flush = SummaryMetricFamily(
            "filopy_flush_duration_seconds",
            "Flush group writes (chunks, part keys, fenced checkpoint) of the shard.",
            labels=per_shard,
        )
        flush_failures = CounterMetricFamily(
            "filopy_flush_failures",
            "Flush attempts that failed with a store error; each is retried with backoff while "
            "the shard keeps ingesting into memory.",
            labels=per_shard,
        )
        flushed = CounterMetricFamily(
            "filopy_flushed_samples", "Samples written to the ColumnStore.", labels=per_shard
        )
        degraded = GaugeMetricFamily(
            "filopy_shard_degraded",
            "1 while the shard's ingester cannot flush (store unavailable) or reach Kafka: it "
            "keeps ingesting into memory and retries; 0 when healthy.",
            labels=per_shard,
        )
        paused = GaugeMetricFamily(
            "filopy_consumption_paused",
            "1 while the ingester has stopped reading Kafka because more than "
            "ingest.max_unflushed_samples samples wait for the store.",
            labels=per_shard,
        )
        unflushed = GaugeMetricFamily(
            "filopy_unflushed_samples",
            "Samples in memory not yet written to the store.",
            labels=per_shard,
        )
        stale = CounterMetricFamily(
            "filopy_stale_epoch_rejections",
            "Checkpoint commits the store rejected because another node had claimed the shard "
            "(the ingester stopped), counted by the node's process since it started.",
            labels=per_shard,
        )
        stored = GaugeMetricFamily(
            "filopy_store_bytes",
            "Encoded chunk bytes the dataset holds in the store (counted at write).",
            labels=["dataset"],
        )
        down_stored = GaugeMetricFamily(
            "filopy_downsampled_bytes",
            "Encoded bytes of the dataset's downsampled periods in the store, per resolution "
            "(seconds; counted at write).",
            labels=["dataset", "resolution"],
        )
        down_rounds = CounterMetricFamily(
            "filopy_downsample_rounds",
            "Slices the shard's downsampler summarised and stored, since the shard started here.",
            labels=per_shard,
        )
        down_failures = CounterMetricFamily(
            "filopy_downsample_failures",
            "Downsampling rounds that failed (retried at the next interval; the last error is in "
            "the shard's stats), since the shard started here.",
            labels=per_shard,
        )
        down_mark = GaugeMetricFamily(
            "filopy_downsampled_until_timestamp_seconds",
            "The end of the shard's last period downsampled and stored, per resolution: "
            "time() minus this is how far downsampling is behind.",
            labels=[*per_shard, "resolution"],
        )
        retention = GaugeMetricFamily(
            "filopy_retention_seconds",
            "The dataset's raw data retention in force (0: kept forever).",
            labels=["dataset"],
        )
        sweeps = CounterMetricFamily(
            "filopy_retention_sweeps",
            "Retention sweeps by the singleton since it started, by outcome (ok, error).",
            labels=["dataset", "outcome"],
        )
        swept = CounterMetricFamily(
            "filopy_retention_swept_bytes",
            "Chunk bytes the retention sweeps freed since the singleton started.",
            labels=["dataset"],
        )
        size_dropped = CounterMetricFamily(
            "filopy_retention_size_dropped_bytes",
            "Chunk bytes dropped (oldest buckets first) because the dataset was over its size "
            "limit, since the singleton started.",
            labels=["dataset"],
        )
        last_sweep = GaugeMetricFamily(
            "filopy_retention_last_sweep_timestamp_seconds",
            "When the dataset's last successful retention sweep ended.",
            labels=["dataset"],
        )
        datasets = {d.name: d for d in c.datasets()}
        names = sorted(datasets)
        node_names = c.node_names()
        reassigned = c.reassignment_stats()
        for name in names:
            try:
                mapper = c.shard_map(name)
            except DatasetUnknownError:
                continue  # removed during the scrape
            counts = dict.fromkeys(STATUSES, 0)
            for s in range(mapper.num_shards):
                counts[type(mapper.status(s)).__name__] += 1
            for status, n in counts.items():
                shards.add_metric([name, status], n)
            try:
                info = c.storage(name)
            except DatasetUnknownError:
                continue
            stored.add_metric([name], info["bytes"])
            for res, down in info.get("downsampled", {}).items():
                down_stored.add_metric([name, str(int(res) // 1000)], down["bytes"])
            retention.add_metric([name], info["retention_ms"] / 1000)
            sweep = info["sweep"]
            sweeps.add_metric([name, "ok"], sweep.get("runs", 0))
            sweeps.add_metric([name, "error"], sweep.get("errors", 0))
            swept.add_metric([name], sweep.get("bytes_freed", 0))
            size_dropped.add_metric([name], sweep.get("size_bytes_freed", 0))
            if sweep.get("last_ms") is not None:
                last_sweep.add_metric([name], sweep["last_ms"] / 1000)
            done, skipped = reassigned.get(name, (0, 0))
            moves.add_metric([name, "done"], done)
            moves.add_metric([name, "skipped"], skipped)
            for node_id, counts in sorted(c.stale_epoch_rejections(name).items()):
                for shard, n in sorted(counts.items()):
                    stale.add_metric([name, str(shard), node_names.get(node_id, node_id)], n)
            ends = self._end_offsets(datasets[name])
            now = time.time()
            for node_id, by_shard in sorted(c.ingest_stats(name).items()):
                node = node_names.get(node_id, node_id)  # its readable name (docs/operations.md)
                for shard, st in sorted(by_shard.items()):
                    labels = [name, str(shard), node]
                    mem = st["memstore"]
                    samples.add_metric(labels, mem.ingested)
                    messages.add_metric(labels, st["messages"])
                    memory.add_metric(labels, st["memory_samples"])
                    lost.add_metric(labels, st["offsets_lost"])
                    dropped.add_metric([*labels, "out_of_order"], mem.out_of_order)
                    dropped.add_metric([*labels, "invalid_series"], mem.invalid_series)
                    misrouted.add_metric(labels, mem.misrouted)
                    for reason, n in sorted(st["bad_records"].items()):
                        bad.add_metric([*labels, reason], n)
                    behind, behind_s = consumer_lag(st, ends.get(shard), now)
                    if behind is not None:
                        lag.add_metric(labels, behind)
                    if behind_s is not None:
                        lag_s.add_metric(labels, behind_s)
                    if st.get("recovery_s") is not None:
                        recovery.add_metric(labels, st["recovery_s"])
                    f = st.get("flush")
                    if f is not None:
                        flush.add_metric(labels, f.flushes, f.total_duration_s)
                        flush_failures.add_metric(labels, f.failures)
                        flushed.add_metric(labels, f.samples)
                    d = st.get("downsample")
                    if d is not None:
                        down_rounds.add_metric(labels, d["rounds"])
                        down_failures.add_metric(labels, d["failures"])
                        for res, mark in sorted(d["marks"].items()):
                            down_mark.add_metric([*labels, str(res // 1000)], mark / 1000)
                    if "degraded" in st:
                        degraded.add_metric(labels, 0 if st["degraded"] is None else 1)
                        paused.add_metric(labels, 1 if st["paused"] else 0)
                        unflushed.add_metric(labels, st["unflushed_samples"])
        return [
            members,
            shards,
            moves,
            samples,
            messages,
            bad,
            dropped,
            misrouted,
            memory,
            lost,
            lag,
            lag_s,
            recovery,
            flush,
            flush_failures,
            flushed,
            degraded,
            paused,
            unflushed,
            stale,
            stored,
            down_stored,
            down_rounds,
            down_failures,
            down_mark,
            retention,
            sweeps,
            swept,
            size_dropped,
            last_sweep,
        ]

    def _end_offsets(self, dataset: Dataset) -> dict[int, int]:
        """The broker's end offset of each of the dataset's partitions ({} if Kafka does not
        answer: lag then falls back to what each ingester learnt from its last fetch)."""
        bootstrap = dataset.source.bootstrap_servers
        admin = self._admins.get(bootstrap)
        if admin is None:
            admin = self._admins[bootstrap] = admin_client(
                bootstrap, END_OFFSETS_TIMEOUT_S, self._client.settings.kafka
            )
        try:
            return end_offsets(admin, dataset.topic, dataset.num_shards, END_OFFSETS_TIMEOUT_S)
        except KafkaUnavailable as e:
            log.info("metrics: consumer lag from the ingesters' own view: %s", e)
            return {}


def consumer_lag(
    stats: dict[str, Any], end: int | None, now: float
) -> tuple[int | None, float | None]:
    """How far an ingester is behind, in offsets and in seconds (None: not known). Against the
    broker's end offset when the scrape got it: an ingester on a slow link learns of new records
    only from the fetch that brings them, so its own view (`stats["lag"]`) says it is caught up
    while they crawl. In seconds, while records wait: how old the oldest of them can be, the
    time since the newest record read was written or since the ingester last knew it had read
    everything, whichever is later (a shard whose fetches stall reads nothing, so only the
    latter grows)."""
    read_to = stats.get("next_offset")
    behind = stats.get("lag") if end is None or read_to is None else max(0, end - read_to)
    if behind is None:
        return None, None
    if behind == 0:
        return 0, 0.0
    known = [t for t in (stats.get("read_ts_ms"), stats.get("current_ms")) if t is not None]
    return behind, max(0.0, now - max(known) / 1000) if known else None

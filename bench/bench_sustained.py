"""Sustained ingestion of one node process, with flushing and checkpointing on, side by side with
VictoriaMetrics in the same run (issue 15). Run on demand.

Needs Kafka from `scripts/services.sh up kafka` and Debian's victoria-metrics package
(/usr/bin/victoria-metrics). Two phases, one after the other, fed the same samples:

1. FiloPy. A 1-partition dataset and topic; a producer process sends one `SampleBatch` per
   scrape of all `--series` series (15 s scrape timestamps, synthetic time advancing one scrape
   per batch; half the series gauges with 1-2 decimals, half monotone counters) through
   `Gateway.send_batch`, paced to `--rate` samples/s (when it cannot keep up, it sends as fast as
   it can and the achieved rate is reported). One `KafkaShardIngester` runs in its own process,
   with the SQLite store in a temporary directory (`--store cassandra`: the local Cassandra, in a
   keyspace of the run's own), `ingest.flush_interval_s` =
   `--flush-interval-s` and the config's chunk settings; every second it writes a row: samples
   ingested/s, consumer lag (end offset - next offset, times samples per message), RSS, CPU,
   unflushed samples, samples in memory, the lowest committed checkpoint. After `--duration-s`
   the producer stops; once the ingester has read everything (at most `--drain-timeout-s`), it is
   killed with SIGKILL (a crash), and a fresh ingester process on the same store and topic
   recovers: the offsets it read again, the open samples loaded from snapshots, the seconds until
   it was live. Then it stops cleanly (flushing everything as chunks), and the store must
   hold exactly the samples produced (else the run fails), at some bytes per sample.
2. VictoriaMetrics (single node, temporary storage, loopback port). A feeder process sends the
   same samples (same labels, `_metric_` as `__name__`, timestamps and values) for the same
   duration at the same offered rate as Prometheus remote write 1.0 bodies with
   `--vm-block-scrapes` samples per series per request (built with NumPy: each sample is 18
   fixed bytes of protobuf), over `--vm-connections` keep-alive connections. Every second: rows
   inserted/s (`vm_rows_inserted_total`), lag = samples due by the offered schedule that VM has
   not answered yet, RSS and CPU of the VM process. At the end `/internal/force_flush` and a
   `count_over_time` over everything must find every sample sent.

What each acknowledges differs: FiloPy's ingested samples are durable in Kafka (acks=all) and
checkpointed within one flush interval (the crash replays at most that); VictoriaMetrics answers
once samples are parsed into its in-memory buffers (written to disk within seconds, not
fsynced).

Results: bench/results/sustained.txt (summary), sustained.csv (both servers' per-second rows),
sustained.png (samples/s, lag and RSS over time). `--duration-s 60` checks it quickly.

`--retention-s R` (issue 33, docs/storage.md#retention): FiloPy only, twice with the same load,
first kept forever, then with a retention of R s on the dataset (`MetaStore.set_retention`).
Timestamps follow the wall clock (a scrape every series/rate s), since retention counts back
from now; both sides store chunks in SQLite buckets of `--bucket-s` (`store.sqlite_bucket_ms`),
and the parent process, standing in for the singleton on a connection of its own, sweeps every
`--sweep-interval-s` (`store.retention_sweep_interval_s`) and samples every second the SQLite
file's size, its WAL's and the dataset's stored chunk bytes (`ColumnStore.stored_bytes`). The
store must hold every sample produced without retention, and the retention side must have
dropped buckets. Results: sustained-retention.{txt,csv,png}: disk over time for both sides, and
the ratio of their ingest rates.

`--downsample` (issue 33, docs/lifecycle.md): FiloPy only, twice with the same load and synthetic
time, first without downsampling, then with 5-minute and hourly periods (the config's delay and
interval), each shard's rounds on their own thread. Synthetic time runs hundreds of times faster
than the clock, so every round has hours of data to summarise: a harder load than a real
cluster's, where a round finds one slice at a time. Results: sustained-downsample.{txt,csv}: the
ingest rate, ingester CPU, the most unflushed samples and the longest checkpoint stall side by
side as ratios, and how far each resolution's mark got with its records and bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import csv
import http.client
import json
import logging
import multiprocessing as mp
import os
import platform
import queue
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # bench_ingest_http's series

from procstat import cpu_seconds  # noqa: E402

BOOTSTRAP = f"127.0.0.1:{os.environ.get('FILOPY_KAFKA_PORT', '9092')}"
VICTORIA = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
RESULTS = ROOT / "bench" / "results"
SCRAPE_MS = 15_000
PAGE = os.sysconf("SC_PAGE_SIZE")
FIELDS = [
    "server",
    "phase",
    "elapsed_s",
    "offered_per_s",
    "samples_per_s",
    "lag_samples",
    "rss_mib",
    "cpu_pct",
    "host_cpu_pct",
    "unflushed_samples",
    "memory_samples",
    "checkpoint",
    "db_bytes",  # --retention-s: the SQLite file's size, sampled by the parent
    "wal_bytes",  # --retention-s: its write-ahead log's
    "stored_bytes",  # --retention-s: the dataset's chunk bytes (ColumnStore.stored_bytes)
]


# ----- the samples ---------------------------------------------------------------------------


def series_labels(n: int) -> list[dict[str, str]]:
    """`n` series of a node-exporter-like fleet, 8 labels each: bench_ingest_http.py's, with
    `_metric_` (FiloPy's metric name label; VictoriaMetrics gets it as `__name__`)."""
    from bench_ingest_http import series_labels as fleet  # the same fleet as the HTTP bench

    return [{("_metric_" if k == "__name__" else k): v for k, v in labels} for labels in fleet(n)]


class Scrapes:
    """The synthetic scrapes of `n` series, in order, the same for every instance with the same
    arguments. Scrape k of series i is at t0 + 15 s * k + the series' host's scrape phase; even
    series are gauges (a random walk rounded to 1 or 2 decimals), odd series monotone counters
    (integer increments)."""

    def __init__(self, n: int, t0: int, seed: int = 1, scrape_ms: int = SCRAPE_MS) -> None:
        rng = np.random.default_rng(seed)
        self.n, self.t0, self.k, self.scrape_ms = n, t0, 0, scrape_ms
        i = np.arange(n)
        self.gauge = i % 2 == 0
        self.scale = np.where(rng.random(n) < 0.5, 10.0, 100.0)
        self.level = rng.uniform(0, 1000, n)
        self.step = np.maximum(self.level * 0.002, 0.05)
        self.counter = np.floor(rng.uniform(0, 1e6, n))
        self.inc = rng.exponential(20.0, n)
        self.phase = ((i // 500) * 7_919 % scrape_ms).astype(np.int64)  # per host
        self.rng = np.random.default_rng(seed + 1)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """The next scrape: (timestamps int64[n], values float64[n])."""
        ts = self.t0 + self.k * self.scrape_ms + self.phase
        self.k += 1
        self.level += self.rng.normal(0.0, 1.0, self.n) * self.step
        self.counter += self.rng.poisson(self.inc)
        gauges = np.round(self.level * self.scale) / self.scale  # nearest double to 1-2 decimals
        return ts, np.where(self.gauge, gauges, self.counter)


def scrapes_in(duration_s: float, series: int, rate: float) -> int:
    """Scrapes offered in the run: scrape k is due k * series / rate seconds after the start."""
    return int(np.ceil(duration_s * rate / series - 1e-9))


# ----- small helpers -------------------------------------------------------------------------


def rss_mib(pid: int | str = "self") -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
    except OSError:
        return float("nan")


def host_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat (iowait counts as idle)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(f[:8])
    return total - f[3] - f[4], total


def host_pct(a: tuple[int, int], b: tuple[int, int]) -> float:
    """Busy % of all the machine's CPUs between two `host_cpu()` readings."""
    return 100.0 * (b[0] - a[0]) / max(1, b[1] - a[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs ({model}), {mem:.0f} GiB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def kafka_pid() -> int | None:
    """The broker scripts/services.sh started (None if its pid file is missing)."""
    try:
        return int((ROOT / ".services" / "run" / "kafka.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_of(pids: dict[str, int | None]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items() if pid is not None}


def code_version() -> str:
    """The commit the run used, and whether ingest/ or filopy/ had uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "ingest", "filopy"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return rev + (" (ingest/ or filopy/ with uncommitted changes)" if dirty else "")


def orphaned(parent: int) -> bool:
    """The parent died (a child must then stop by itself)."""
    return os.getppid() != parent


class Shared:
    """Counters the processes of a phase share (one int64 slot each, no lock: one writer)."""

    NAMES = (
        "produced",  # samples handed to the gateway / answered by VM
        "messages",  # Kafka messages produced
        "scrapes",  # scrapes sent
        "done",  # the producer finished (1) or failed (2)
        "next_offset",
        "end_offset",
        "ingested",
        "live",
        "generated",  # VM feeder: samples built and queued
        "held_ms",  # the producer waited for the ingester's lag to shrink
        "cpu_ms",  # the producer's / feeder's own CPU time, set when it finishes
    )

    def __init__(self, ctx: Any) -> None:
        self._a = ctx.RawArray("q", len(self.NAMES))
        self.start = ctx.RawValue("d", 0.0)  # time.monotonic() of the phase's start

    def __getattr__(self, name: str) -> int:
        if name in Shared.NAMES:
            return int(self._a[Shared.NAMES.index(name)])
        raise AttributeError(name)

    def set(self, name: str, value: int) -> None:
        self._a[Shared.NAMES.index(name)] = value


# ----- FiloPy: the dataset, the producer, the ingester ----------------------------------------


def make_dataset(name: str) -> Any:
    from core.dataset import Dataset, SourceSettings, SpreadSettings

    return Dataset(
        name=name,
        num_shards=1,
        spread=SpreadSettings(default=0),
        source=SourceSettings(bootstrap_servers=BOOTSTRAP),
    )


def produce_filopy(
    ds_name: str,
    series: int,
    rate: float,
    duration_s: float,
    t0: int,
    per_batch: int,
    max_lag: float,
    shared: Shared,
    go: Any,
    scrape_ms: int = SCRAPE_MS,
) -> None:
    """The producer process: one KeyedBatch per `per_batch` scrapes of all series, paced to
    `rate`, held back while the ingester's lag exceeds `max_lag` samples. `t0` 0: the data's
    time is the wall clock's from the start on (retention, which counts from now, needs it)."""
    from ingest.batch import KeyedBatch, new_series_key
    from ingest.gateway import Gateway

    parent = os.getppid()
    labels = series_labels(series)
    keys = [new_series_key() for _ in labels]  # the gateway's cheap series-cache lookup
    gen = Scrapes(series, t0, scrape_ms=scrape_ms)
    total = scrapes_in(duration_s, series, rate)
    try:
        with Gateway(make_dataset(ds_name), BOOTSTRAP) as gw:
            go.wait()
            start = shared.start.value
            if not t0:
                gen.t0 = int(time.time() * 1000)
            sent = messages = 0
            held = 0.0
            for k0 in range(0, total, per_batch):
                k1 = min(total, k0 + per_batch)
                due = start + (k1 - 1) * series / rate
                while True:
                    now = time.monotonic()
                    if now - start >= duration_s or orphaned(parent):
                        break
                    lag = (messages - shared.next_offset) * (sent / messages if messages else 0)
                    if lag <= max_lag:
                        break
                    time.sleep(0.02)
                    held += time.monotonic() - now
                    shared.set("held_ms", int(held * 1000))
                if now - start >= duration_s or orphaned(parent):
                    break  # could not keep up: what was sent by the end is what it achieved
                if due > now:
                    time.sleep(due - now)
                cols = [gen.next() for _ in range(k0, k1)]
                ts = np.concatenate([c[0] for c in cols])
                vals = np.concatenate([c[1] for c in cols])
                idx = np.tile(np.arange(series, dtype=np.int32), k1 - k0)
                sent += gw.send_batch(KeyedBatch(labels, idx, ts, vals, keys=keys))
                messages = gw.messages_per_shard[0]
                shared.set("produced", sent)
                shared.set("messages", messages)
                shared.set("scrapes", k1)
            gw.flush(120)
            shared.set("messages", gw.messages_per_shard[0])
            if gw.progress().samples_acked != sent or gw.skipped:
                raise RuntimeError(f"Kafka acked {gw.progress().samples_acked} of {sent} samples")
        shared.set("cpu_ms", int(time.process_time() * 1000))
        shared.set("done", 1)
    except BaseException:
        shared.set("done", 2)
        raise


CASSANDRA_PREFIX = "cassandra:"


DOWNSAMPLE_RESOLUTIONS_MS = [300_000, 3_600_000]


def downsample_settings(on: bool = True) -> Any:
    """Downsampling for a run: 5-minute and hourly periods with the config's delay and interval,
    or off."""
    from core.config import DownsampleSettings, load_settings

    base = load_settings().downsample
    return DownsampleSettings(
        resolutions_ms=DOWNSAMPLE_RESOLUTIONS_MS if on else [],
        delay_s=base.delay_s,
        interval_s=base.interval_s,
        retention_days=[90.0, 730.0] if on else [],
    )


def open_stores(spec: str, bucket_ms: int = 0) -> tuple[Any, Any]:
    """The bench's stores: an SQLite file path, or `cassandra:<keyspace>` on the local
    Cassandra (scripts/services.sh up cassandra). `bucket_ms` 0: SQLite's default buckets."""
    if spec.startswith(CASSANDRA_PREFIX):
        from store.cassandra import open_cassandra_stores

        return open_cassandra_stores(["127.0.0.1"], keyspace=spec[len(CASSANDRA_PREFIX) :])
    from store.sqlite import open_sqlite_stores

    return open_sqlite_stores(spec, **({"bucket_ms": bucket_ms} if bucket_ms else {}))


def cassandra_counts(keyspace: str) -> tuple[int, int, int, int, int]:
    """Samples, chunk bytes, chunks, snapshots and part keys in the run's keyspace (all of it is
    this run's), read with paging; the keyspace is dropped after."""
    from cassandra.cluster import Cluster

    cluster = Cluster(["127.0.0.1"])
    try:
        session = cluster.connect()
        session.default_timeout = 120
        samples = nbytes = chunks = 0
        rows = session.execute(f"SELECT num_samples, data FROM {keyspace}.chunks")
        for n, data in rows:
            samples += n
            nbytes += len(data)
            chunks += 1
        snaps = session.execute(f"SELECT count(*) FROM {keyspace}.open_snapshots").one()[0]
        keys = session.execute(f"SELECT count(*) FROM {keyspace}.part_keys").one()[0]
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        return samples, nbytes, chunks, snaps, keys
    finally:
        cluster.shutdown()


def run_ingester(
    mode: str,
    ds_name: str,
    db: str,
    flush_interval_s: float,
    consume_batch: int,
    rows_path: str,
    result_path: str,
    shared: Shared,
    go: Any,
    ready: Any,
    spawned_at: float,
    bucket_ms: int = 0,
    downsample: bool = False,
) -> None:
    """The ingester process. mode "run": ingest, writing a row every second, until killed.
    mode "recover": start on the store a killed one left, note the recovery, go on writing rows
    until the parent says stop (`shared.done` = 3), then stop cleanly (flushing everything) and
    write what it found to `result_path`."""
    import ingest.ingester as ingester_module
    from core.config import load_settings
    from core.shard_status import IngestionError
    from ingest.ingester import KafkaShardIngester

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    parent = os.getppid()
    plans: list[Any] = []
    recover_shard = ingester_module.recover_shard

    def recording_recover_shard(*args: Any, **kwargs: Any) -> Any:
        plan = recover_shard(*args, **kwargs)
        plans.append(plan)
        return plan

    ingester_module.recover_shard = recording_recover_shard  # to read plan.open_samples_loaded

    base = load_settings()
    overrides: dict[str, Any] = {"flush_interval_s": flush_interval_s}
    if consume_batch:
        overrides["consume_batch"] = consume_batch
    settings = base.model_copy(update={"ingest": base.ingest.model_copy(update=overrides)})
    # Downsampling as the run asks: on (--downsample's second side) or off (every other run,
    # whatever the config's default).
    settings = settings.model_copy(update={"downsample": downsample_settings(downsample)})
    groups = settings.ingest.groups_per_shard
    meta, columns = open_stores(db, bucket_ms)
    errors: list[str] = []

    def report(event: Any) -> None:
        if isinstance(event, IngestionError):
            errors.append(event.message)

    ing = KafkaShardIngester(
        make_dataset(ds_name),
        0,
        f"bench-{mode}",
        meta=meta,
        columns=columns,
        settings=settings,
        report=report,
    )
    mem = ing.memstore
    stop_rows = threading.Event()

    def write_rows() -> None:
        """A row every second of the phase's clock, from this thread (reads only counters)."""
        go.wait()
        pid = os.getpid()
        with open(rows_path, "a", newline="") as f:
            out = csv.writer(f)
            start = shared.start.value
            last_t, last_ingested = time.monotonic(), mem.stats.ingested
            last_produced, last_cpu, last_host = shared.produced, cpu_seconds(pid), host_cpu()
            tick = int(last_t - start) + 1
            while not stop_rows.wait(max(0.0, start + tick - time.monotonic())):
                tick += 1
                now = time.monotonic()
                dt = now - last_t
                ingested, produced, cpu = mem.stats.ingested, shared.produced, cpu_seconds(pid)
                host = host_cpu()
                # The partition's end: the messages produced (the topic is new; librdkafka's
                # cached end offset lags behind by up to a fetch, or more under load).
                messages = shared.messages
                nxt, end = ing.next_offset or 0, max(messages, ing.end_offset or 0)
                per_message = produced / messages if messages else 0
                checkpoint = ""
                if ing.flusher is not None:
                    try:
                        done = list(ing.flusher.checkpoints.values())
                    except RuntimeError:  # the dict changed while we read it
                        done = []
                    if len(done) == groups:
                        checkpoint = str(min(done))
                if mode == "run":
                    phase = "run" if shared.done == 0 else "drain"
                else:
                    phase = "recovery" if shared.live == 0 else "after recovery"
                out.writerow(
                    [
                        "FiloPy",
                        phase,
                        round(now - start, 2),
                        round((produced - last_produced) / dt),
                        round((ingested - last_ingested) / dt),
                        round(max(0, end - nxt) * per_message) if ing.next_offset else "",
                        round(rss_mib(), 1),
                        round(100 * (cpu - last_cpu) / dt, 1),
                        round(host_pct(last_host, host), 1),
                        mem.unflushed_samples(),
                        mem.memory_samples(),
                        checkpoint,
                    ]
                )
                f.flush()
                shared.set("next_offset", nxt)
                shared.set("end_offset", end)
                shared.set("ingested", ingested)
                last_t, last_ingested, last_produced, last_cpu = now, ingested, produced, cpu
                last_host = host

    rows = threading.Thread(target=write_rows, daemon=True)
    rows.start()
    asyncio.run(ing.start())
    while ing.recovery_s is None:
        if errors or orphaned(parent):
            raise RuntimeError(f"the ingester failed before it was live: {errors}")
        time.sleep(0.005)
    live_at = time.monotonic()
    result: dict[str, Any] = {}
    if mode == "recover":
        plan = plans[0]
        result = {
            "spawn_to_live_s": live_at - spawned_at,
            "recovery_s": ing.recovery_s,
            "replayed_offsets": ing.replayed_offsets,
            "replayed_from": ing.replayed_from,
            "end_offset_at_start": plan.replay_until + 1,
            "open_samples_loaded": plan.open_samples_loaded,
            "series_loaded": plan.series_loaded,
            "checkpoints_min": min(plan.checkpoints.values()) if plan.checkpoints else None,
            "checkpoints_max": max(plan.checkpoints.values()) if plan.checkpoints else None,
            "replay_ingested": mem.stats.ingested,
            "replay_skipped": mem.stats.skipped_replay + mem.stats.skipped_flushed,
            "replay_out_of_order": mem.stats.out_of_order,
            "memory_samples_at_live": mem.memory_samples(),
            "rss_mib_at_live": rss_mib(),
        }
    shared.set("live", 1)
    ready.set()
    while not (orphaned(parent) or (mode == "recover" and shared.done == 3)):
        if errors:
            raise RuntimeError(f"ingestion failed: {errors}")
        time.sleep(0.05)
    stop_rows.set()
    rows.join()
    t = time.perf_counter()
    asyncio.run(ing.stop())  # flushes everything as chunks
    result["stop_flush_s"] = time.perf_counter() - t
    result["ingested_total"] = mem.stats.ingested
    result["errors"] = errors
    meta.close()
    columns.close()
    Path(result_path).write_text(json.dumps(result))


def file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # a WAL not there yet
        return 0


class DiskWatch:
    """The --retention-s mode's stand-in for the singleton, in the parent process on its own
    connection: sets the dataset's retention, sweeps every `sweep_s` (what
    `store.retention_sweep_interval_s` does in a cluster), and samples the SQLite files' size
    and the dataset's stored bytes every second of the phase's clock."""

    def __init__(
        self, db: Path, ds: Any, bucket_ms: int, retention_ms: int, sweep_s: float
    ) -> None:
        self.db, self.ref, self.sweep_s = db, ds.ref, sweep_s
        self.meta, self.columns = open_stores(str(db), bucket_ms)
        if retention_ms:
            self.meta.set_retention(self.ref, retention_ms)
        self.samples: list[tuple[float, int, int, int]] = []  # elapsed s, file, WAL, stored
        self.sweeps = self.buckets_dropped = self.bytes_freed = 0
        self.sweep_time_s = 0.0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, start: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(start,), daemon=True)
        self._thread.start()

    def _run(self, start: float) -> None:
        next_sweep, tick = start + self.sweep_s, 1
        while not self._stop.wait(max(0.0, start + tick - time.monotonic())):
            tick += 1
            if time.monotonic() >= next_sweep:
                next_sweep += self.sweep_s
                t = time.perf_counter()
                try:
                    r = self.columns.sweep(self.ref)
                except Exception as e:  # a locked store: counted, the next sweep retries
                    self.errors.append(repr(e))
                else:
                    self.sweeps += 1
                    self.buckets_dropped += r.buckets_dropped
                    self.bytes_freed += r.bytes_freed
                self.sweep_time_s += time.perf_counter() - t
            stored = self.columns.stored_bytes(self.ref).bytes
            wal = file_bytes(self.db.with_name(self.db.name + "-wal"))
            self.samples.append((time.monotonic() - start, file_bytes(self.db), wal, stored))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        self.meta.close()
        self.columns.close()

    def annotate(self, rows: list[list[str]]) -> None:
        """Append to each row the latest sample taken by its time."""
        times = [sample[0] for sample in self.samples]
        for r in rows:
            i = bisect.bisect_right(times, _f(r[2]) + 0.5) - 1
            r += [str(x) for x in self.samples[i][1:]] if i >= 0 else ["", "", ""]


@dataclass
class FiloPyResult:
    dataset: str
    offered_scrapes: int
    produced: int = 0
    messages: int = 0
    produce_s: float = 0.0
    held_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds while producing
    host_pct: float = 0.0
    drained: bool = True
    drain_s: float = 0.0
    kill_at_s: float = 0.0
    crashed_next_offset: int = 0
    crashed_ingested: int = 0
    recovery: dict[str, Any] = field(default_factory=dict)
    stored_samples: int = 0
    stored_bytes: int = 0
    chunks: int = 0
    snapshots_left: int = 0
    part_keys: int = 0
    db_bytes: int = 0
    rows: list[list[str]] = field(default_factory=list)
    retention_ms: int = 0
    disk: DiskWatch | None = None
    downsample: bool = False
    # --downsample: per resolution, how far its mark reached (ms), its records and bytes
    down_marks: dict[int, int] = field(default_factory=dict)
    down_records: dict[int, int] = field(default_factory=dict)
    down_bytes: dict[int, int] = field(default_factory=dict)


def run_filopy(
    args: argparse.Namespace,
    t0: int,
    tmp: Path,
    ctx: Any,
    retention_ms: int | None = None,
    downsample: bool | None = None,
) -> FiloPyResult:
    """One FiloPy phase. `retention_ms` not None (--retention-s, both sides; 0: kept forever):
    a directory of its own, buckets of --bucket-s, and a `DiskWatch` sweeping and sampling.
    `downsample` not None (--downsample, both sides): a directory of its own, downsampling
    on or off; what it wrote and how far it got is read from the store after."""
    from confluent_kafka.admin import AdminClient

    from ingest.kafka_config import kafka_client_config
    from ingest.topics import ensure_topic

    ds = make_dataset(f"sustained{uuid.uuid4().hex[:8]}")
    ensure_topic(ds, BOOTSTRAP)
    res = FiloPyResult(ds.name, scrapes_in(args.duration_s, args.series, args.rate))
    lifecycle = retention_ms is not None
    bucket_ms = round(args.bucket_s * 1000) if lifecycle else 0
    if lifecycle:
        tmp = tmp / f"retention-{retention_ms}"
        tmp.mkdir()
        res.retention_ms = retention_ms or 0
    if downsample is not None:
        tmp = tmp / f"downsample-{'on' if downsample else 'off'}"
        tmp.mkdir()
        res.downsample = downsample
    db, rows_path = tmp / "filopy.db", tmp / "filopy-rows.csv"
    store = str(db)
    if args.store == "cassandra":
        store = f"{CASSANDRA_PREFIX}bench_sustained_{ds.name[-8:]}"
    procs: list[Any] = []
    try:
        shared, go, ready = Shared(ctx), ctx.Event(), ctx.Event()
        common = (ds.name, store, args.flush_interval_s, args.consume_batch, str(rows_path))
        if lifecycle:
            res.disk = DiskWatch(db, ds, bucket_ms, res.retention_ms, args.sweep_interval_s)
        ing = ctx.Process(
            target=run_ingester,
            args=(
                "run",
                *common,
                str(tmp / "run.json"),
                shared,
                go,
                ready,
                time.monotonic(),
                bucket_ms,
                res.downsample,
            ),
            name="filopy-ingester",
        )
        prod = ctx.Process(
            target=produce_filopy,
            args=(
                ds.name,
                args.series,
                args.rate,
                args.duration_s,
                t0,
                args.scrapes_per_batch,
                args.max_lag_s * args.rate,
                shared,
                go,
                args.scrape_ms if lifecycle else SCRAPE_MS,
            ),
            name="filopy-producer",
        )
        procs += [ing, prod]
        shared.start.value = time.monotonic() + 3600  # rows wait for the real start
        ing.start()
        prod.start()
        if not ready.wait(120):
            raise RuntimeError("the ingester did not get live within 120 s")
        time.sleep(3.0)  # the producer builds its labels and connects meanwhile
        pids = {"ingester": ing.pid, "Kafka broker": kafka_pid()}
        cpu0, host0 = cpu_of(pids), host_cpu()
        shared.start.value = start = time.monotonic()
        if res.disk is not None:
            res.disk.start(start)
        go.set()
        print(f"FiloPy: producing for {args.duration_s:.0f} s at {args.rate:,.0f} samples/s")
        while prod.is_alive():
            prod.join(1.0)
            if not ing.is_alive():
                raise RuntimeError("the ingester process died")
        if prod.exitcode != 0 or shared.done != 1:
            raise RuntimeError(f"the producer failed (exit code {prod.exitcode})")
        res.produce_s = time.monotonic() - start
        cpu1 = cpu_of(pids)
        res.cpu = {k: cpu1[k] - cpu0[k] for k in cpu0 if k in cpu1}
        res.cpu["producer (all its life)"] = shared.cpu_ms / 1000
        res.host_pct = host_pct(host0, host_cpu())
        res.produced, res.messages = shared.produced, shared.messages
        res.held_s = shared.held_ms / 1000
        # Let the ingester read everything (a crash under load, not after idling).
        t = time.monotonic()
        while shared.next_offset < res.messages:
            if not ing.is_alive():
                raise RuntimeError("the ingester process died")
            if time.monotonic() - t > args.drain_timeout_s:
                res.drained = False
                break
            time.sleep(0.05)
        res.drain_s = time.monotonic() - t
        res.kill_at_s = time.monotonic() - start
        res.crashed_next_offset, res.crashed_ingested = shared.next_offset, shared.ingested
        os.kill(ing.pid, signal.SIGKILL)
        ing.join(30)
        print(
            f"FiloPy: killed the ingester at {res.kill_at_s:.1f} s "
            f"(next offset {res.crashed_next_offset} of {res.messages}); recovering"
        )
        shared.set("live", 0)
        ready2 = ctx.Event()
        rec = ctx.Process(
            target=run_ingester,
            args=(
                "recover",
                *common,
                str(tmp / "recover.json"),
                shared,
                go,
                ready2,
                time.monotonic(),
                bucket_ms,
                res.downsample,
            ),
            name="filopy-recovery",
        )
        procs.append(rec)
        rec.start()
        if not ready2.wait(max(600.0, args.duration_s)):
            raise RuntimeError("the new ingester did not get live")
        time.sleep(2.5)  # a few rows after it is live
        shared.set("done", 3)
        rec.join(600)
        if rec.exitcode != 0:
            raise RuntimeError(f"the recovering ingester failed (exit code {rec.exitcode})")
        res.recovery = json.loads((tmp / "recover.json").read_text())
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        if res.disk is not None:
            res.disk.stop()
        admin = AdminClient(kafka_client_config(None, BOOTSTRAP))
        try:
            admin.delete_topics([ds.topic], operation_timeout=30)[ds.topic].result(60)
        except Exception as e:  # report, go on cleaning up
            print(f"could not delete topic {ds.topic}: {e}", file=sys.stderr)
    if store.startswith(CASSANDRA_PREFIX):
        counts = cassandra_counts(store[len(CASSANDRA_PREFIX) :])
        res.stored_samples, res.stored_bytes, res.chunks, res.snapshots_left, res.part_keys = counts
    else:
        with sqlite3.connect(db) as con:
            n = nbytes = chunks = 0
            # One chunks table per time bucket (store/sqlite.py), listed in chunk_buckets.
            buckets = con.execute("SELECT tbl FROM chunk_buckets WHERE dataset = ?", (ds.name,))
            for (tbl,) in buckets.fetchall():
                a, b, c = con.execute(
                    f'SELECT sum(num_samples), sum(length(data)), count(*) FROM "{tbl}"'
                ).fetchone()
                n, nbytes, chunks = n + (a or 0), nbytes + (b or 0), chunks + c
            res.stored_samples, res.stored_bytes, res.chunks = n, nbytes, chunks
            res.snapshots_left = con.execute("SELECT count(*) FROM open_snapshots").fetchone()[0]
            res.part_keys = con.execute("SELECT count(*) FROM part_keys").fetchone()[0]
            for r in DOWNSAMPLE_RESOLUTIONS_MS if res.downsample else ():
                tables = con.execute(
                    "SELECT tbl FROM chunk_buckets WHERE dataset = ?", (f"{ds.name}@{r}",)
                ).fetchall()
                for (tbl,) in tables:
                    b, c = con.execute(
                        f'SELECT sum(length(data)), count(*) FROM "{tbl}"'
                    ).fetchone()
                    res.down_bytes[r] = res.down_bytes.get(r, 0) + (b or 0)
                    res.down_records[r] = res.down_records.get(r, 0) + c
        if res.downsample:
            meta, _ = open_stores(str(db))
            res.down_marks = meta.read_downsample_marks(ds.ref, 0)
        res.db_bytes = sum(p.stat().st_size for p in tmp.glob("filopy.db*"))
    with rows_path.open() as f:
        res.rows = [r for r in csv.reader(f) if r]
    if res.disk is not None:
        res.disk.annotate(res.rows)
        if res.retention_ms:
            for r in res.rows:
                r[0] = "FiloPy+retention"
    return res


# ----- VictoriaMetrics: the server, the remote write feeder -----------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


class RemoteWriteBodies:
    """Prometheus remote write 1.0 `WriteRequest`s of many samples per series, encoded by hand:
    each series' labels once, then each sample as 18 fixed bytes (field 2, length 16: the double
    value, the timestamp as a 6-byte varint), built for a whole block at once with NumPy."""

    SAMPLE = 18

    def __init__(self, labels: list[dict[str, str]]) -> None:
        self.labels = []
        for lab in labels:
            pairs = sorted(("__name__" if k == "_metric_" else k, v) for k, v in lab.items())
            self.labels.append(
                b"".join(
                    _field(0x0A, _field(0x0A, k.encode()) + _field(0x12, v.encode()))
                    for k, v in pairs
                )
            )

    def body(self, lo: int, ts: np.ndarray, vals: np.ndarray) -> bytes:
        """One request: series lo.. of the block's (series, samples) arrays."""
        n, m = ts.shape
        if ts.min() < 1 << 35 or ts.max() >= 1 << 42:
            raise ValueError("timestamps must take exactly 6 varint bytes")
        buf = np.empty((n, m, self.SAMPLE), np.uint8)
        buf[:, :, 0], buf[:, :, 1], buf[:, :, 2] = 0x12, 16, 0x09
        buf[:, :, 3:11] = vals.astype("<f8").view(np.uint8).reshape(n, m, 8)
        buf[:, :, 11] = 0x10
        t = ts.astype(np.uint64)
        for j in range(6):
            buf[:, :, 12 + j] = ((t >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        buf[:, :, 12:17] |= 0x80
        samples = buf.reshape(n, m * self.SAMPLE)
        parts = []
        for i in range(n):
            lab = self.labels[lo + i]
            content = lab + samples[i].tobytes()
            parts.append(b"\x0a" + _varint(len(content)) + content)
        return b"".join(parts)


def feed_victoria(
    port: int,
    series: int,
    rate: float,
    duration_s: float,
    t0: int,
    block: int,
    per_request: int,
    connections: int,
    shared: Shared,
    go: Any,
) -> None:
    """The feeder process: blocks of `block` scrapes, each cut into requests of about
    `per_request` samples (whole series), sent when the block's last scrape is due."""
    import cramjam

    parent = os.getppid()
    enc = RemoteWriteBodies(series_labels(series))
    gen = Scrapes(series, t0)
    total = scrapes_in(duration_s, series, rate)
    per_req_series = max(1, per_request // block)
    work: queue.Queue[tuple[bytes, int] | None] = queue.Queue(maxsize=2 * connections)
    lock = threading.Lock()
    acked = [0]
    failures: list[str] = []
    headers = {
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "snappy",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }

    def sender() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            while (item := work.get()) is not None:
                body, n = item
                conn.request("POST", "/api/v1/write", body=body, headers=headers)
                r = conn.getresponse()
                answer = r.read()
                if r.status != 204:
                    failures.append(f"{r.status} {answer[:300]!r}")
                with lock:
                    acked[0] += n
                    shared.set("produced", acked[0])
        except Exception as e:  # reported to the parent through failures
            failures.append(repr(e))
        finally:
            conn.close()

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(connections)]
    for th in threads:
        th.start()
    try:
        go.wait()
        start = shared.start.value
        generated = 0
        for k0 in range(0, total, block):
            k1 = min(total, k0 + block)
            due = start + (k1 - 1) * series / rate
            now = time.monotonic()
            if now - start >= duration_s or failures or orphaned(parent):
                break
            if due > now:
                time.sleep(due - now)
            cols = [gen.next() for _ in range(k0, k1)]
            ts = np.stack([c[0] for c in cols], axis=1)  # (series, scrapes)
            vals = np.stack([c[1] for c in cols], axis=1)
            for lo in range(0, series, per_req_series):
                hi = min(series, lo + per_req_series)
                raw = enc.body(lo, ts[lo:hi], vals[lo:hi])
                work.put((bytes(cramjam.snappy.compress_raw(raw)), (hi - lo) * (k1 - k0)))
            generated += series * (k1 - k0)
            shared.set("generated", generated)
            shared.set("scrapes", k1)
        for _ in threads:
            work.put(None)
        for th in threads:
            th.join()
        if failures:
            raise RuntimeError(f"VictoriaMetrics refused a request: {failures[0]}")
        shared.set("cpu_ms", int(time.process_time() * 1000))
        shared.set("done", 1)
    except BaseException:
        shared.set("done", 2)
        raise


def vm_get(port: int, path: str, timeout: float = 600.0) -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def vm_metric(text: str, name: str, label_part: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in "{ " and label_part in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class VictoriaResult:
    offered_scrapes: int
    produced: int = 0
    generated: int = 0
    produce_s: float = 0.0
    inserted: int = 0
    counted: int = 0
    count_query_s: float = 0.0
    data_bytes: int = 0
    version: str = ""
    cpu: dict[str, float] = field(default_factory=dict)
    host_pct: float = 0.0
    rows: list[list[str]] = field(default_factory=list)


def run_victoria(args: argparse.Namespace, t0: int, tmp: Path, ctx: Any) -> VictoriaResult:
    res = VictoriaResult(scrapes_in(args.duration_s, args.series, args.rate))
    port = free_port()
    data = tmp / "vm-data"
    log = (tmp / "vm.log").open("wb")
    vm = subprocess.Popen(
        [
            VICTORIA,
            f"-storageDataPath={data}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=10y",
            "-search.maxQueryDuration=600s",
            "-loggerLevel=ERROR",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    feeder = None
    try:
        deadline = time.monotonic() + 60
        while True:
            if vm.poll() is not None:
                raise RuntimeError(f"victoria-metrics exited with {vm.returncode}")
            try:
                if vm_get(port, "/health", 2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("victoria-metrics not ready in 60 s")
            time.sleep(0.2)
        res.version = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "victoria-metrics"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        shared, go = Shared(ctx), ctx.Event()
        feeder = ctx.Process(
            target=feed_victoria,
            args=(
                port,
                args.series,
                args.rate,
                args.duration_s,
                t0,
                args.vm_block_scrapes,
                args.vm_request_samples,
                args.vm_connections,
                shared,
                go,
            ),
            name="vm-feeder",
        )
        feeder.start()
        time.sleep(3.0)  # the feeder builds its label bytes meanwhile
        pids = {"VictoriaMetrics": vm.pid}
        cpu0, host0 = cpu_of(pids), host_cpu()
        shared.start.value = start = time.monotonic()
        go.set()
        print(f"VictoriaMetrics: feeding for {args.duration_s:.0f} s")
        last_t, last_rows, last_cpu, last_produced = start, 0.0, cpu_seconds(vm.pid), 0
        last_host = host_cpu()
        tick = 1
        while True:
            time.sleep(max(0.0, start + tick - time.monotonic()))
            tick += 1
            now = time.monotonic()
            rows = vm_metric(vm_get(port, "/metrics")[1], "vm_rows_inserted_total")
            cpu, produced, host = cpu_seconds(vm.pid), shared.produced, host_cpu()
            dt = now - last_t
            due_k = min(res.offered_scrapes, int((now - start) * args.rate / args.series) + 1)
            finished = shared.done != 0
            res.rows.append(
                [
                    "VictoriaMetrics",
                    "run" if not finished else "drain",
                    f"{now - start:.2f}",
                    str(round((produced - last_produced) / dt)),
                    str(round((rows - last_rows) / dt)),
                    str(max(0, due_k * args.series - produced) if not finished else 0),
                    f"{rss_mib(vm.pid):.1f}",
                    f"{100 * (cpu - last_cpu) / dt:.1f}",
                    f"{host_pct(last_host, host):.1f}",
                    "",
                    "",
                    "",
                ]
            )
            last_t, last_rows, last_cpu, last_produced = now, rows, cpu, produced
            last_host = host
            if finished and rows >= produced:
                break
            if finished and shared.done != 1:
                raise RuntimeError(f"the VM feeder failed (exit code {feeder.exitcode})")
            if vm.poll() is not None:
                raise RuntimeError("victoria-metrics died")
        feeder.join(30)
        res.produce_s = now - start
        cpu1 = cpu_of(pids)
        res.cpu = {k: cpu1[k] - cpu0[k] for k in cpu0 if k in cpu1}
        res.cpu["feeder (all its life)"] = shared.cpu_ms / 1000
        res.host_pct = host_pct(host0, host_cpu())
        res.produced, res.generated = shared.produced, shared.generated
        res.inserted = int(rows)
        if vm_get(port, "/internal/force_flush")[0] != 200:
            raise RuntimeError("force_flush failed")
        span_s = (res.offered_scrapes + 2) * SCRAPE_MS // 1000 + 3600
        end_s = (t0 + res.offered_scrapes * SCRAPE_MS) // 1000 + 3600
        query = urllib.parse.urlencode(
            {
                "query": f'sum(count_over_time({{__name__=~"node_metric_.*"}}[{span_s}s]))',
                "time": str(end_s),
                "nocache": "1",
            }
        )
        t = time.perf_counter()
        status, body = vm_get(port, f"/api/v1/query?{query}")
        res.count_query_s = time.perf_counter() - t
        if status != 200:
            raise RuntimeError(f"count query failed: {status} {body[:300]}")
        result = json.loads(body)["data"]["result"]
        res.counted = int(float(result[0]["value"][1])) if result else 0
        metrics = vm_get(port, "/metrics")[1]
        res.data_bytes = int(vm_metric(metrics, "vm_data_size_bytes"))
    finally:
        if feeder is not None and feeder.is_alive():
            feeder.kill()
            feeder.join(10)
        if vm.poll() is None:
            vm.terminate()
            try:
                vm.wait(30)
            except subprocess.TimeoutExpired:
                vm.kill()
                vm.wait(10)
        log.close()
    return res


# ----- the report ----------------------------------------------------------------------------


def _f(x: str) -> float:
    return float(x) if x not in ("", None) else float("nan")


def at(rows: list[list[str]], t: float, col: str) -> float:
    """The value of `col` in the row nearest to elapsed second `t` (run rows only)."""
    i = FIELDS.index(col)
    run = [r for r in rows if r[1] in ("run", "drain")] or rows
    best = min(run, key=lambda r: abs(_f(r[2]) - t))
    return _f(best[i])


def rate_between(rows: list[list[str]], a: float, b: float, col: str = "samples_per_s") -> float:
    """Mean of `col` over the rows with a < elapsed <= b."""
    i = FIELDS.index(col)
    vals = [_f(r[i]) for r in rows if a < _f(r[2]) <= b and r[1] in ("run", "drain")]
    return float(np.mean(vals)) if vals else float("nan")


def unflushed_and_stall(fp: FiloPyResult) -> tuple[float, float]:
    """The most samples waiting for a flush, and the longest stretch (s) without the lowest
    checkpoint moving, while producing and draining."""
    live_rows = [r for r in fp.rows if r[1] in ("run", "drain")]
    max_unflushed = max((_f(r[FIELDS.index("unflushed_samples")]) for r in live_rows), default=0)
    stall, since, last_cp = 0.0, 0.0, None
    for r in live_rows:
        cp, t = r[FIELDS.index("checkpoint")], _f(r[2])
        if cp != last_cp:
            since, last_cp = t, cp
        stall = max(stall, t - since)
    return max_unflushed, stall


def downsample_summary(
    args: argparse.Namespace,
    t0: int,
    sides: list[FiloPyResult],
    load: tuple[float, float],
    wall_s: float,
) -> tuple[str, list[str]]:
    """--downsample: the two runs' figures side by side (on / off as ratios), what downsampling
    did, then each run's full summary."""
    off, on = sides
    d = args.duration_s
    figures = []
    for fp in sides:
        unflushed, stall = unflushed_and_stall(fp)
        cpu = fp.cpu.get("ingester", float("nan"))
        rss = max((_f(r[FIELDS.index("rss_mib")]) for r in fp.rows if r[1] == "run"), default=0)
        figures.append((rate_between(fp.rows, 0, d), cpu, unflushed, stall, rss))
    names = (
        "ingested, run mean (samples/s)",
        "ingester CPU seconds while producing",
        "most unflushed samples",
        "longest checkpoint stall (s)",
        "largest RSS (MiB)",
    )
    down = downsample_settings()
    newest = t0 + (on.offered_scrapes - 1) * SCRAPE_MS
    out = [
        "Downsampling's cost under sustained ingestion (issue 33): the same load twice, "
        "downsampling off, then on",
        f"{time.strftime('%Y-%m-%d %H:%M')}; {machine()}",
        "command: " + shlex.join(["python", "bench/bench_sustained.py", *sys.argv[1:]]),
        f"code: git {args.code_version} at the start; load average {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end; run took {wall_s / 60:.1f} min",
        f"{args.series:,} series, offered {args.rate:,.0f} samples/s for {d:g} s each; synthetic "
        f"time (a scrape of all series every {args.series / args.rate:.3f} s), so data time "
        f"runs {SCRAPE_MS / 1000 * args.rate / args.series:,.0f}x the clock: "
        f"{(newest - t0) / 3_600_000:.1f} hours of data per run",
        f"downsampling: resolutions {', '.join(f'{r // 60_000} min' for r in down.resolutions_ms)}"
        f", delay_s {down.delay_s:g}, interval_s {down.interval_s:g} "
        "(a round per interval, on the shard's own thread)",
        "",
        f"  {'':40} {'off':>14} {'on':>14} {'on / off':>9}",
    ]
    for i, name in enumerate(names):
        a, b = figures[0][i], figures[1][i]
        out.append(f"  {name:40} {a:>14,.0f} {b:>14,.0f} {b / a if a else float('nan'):>9.3f}")
    out.append("")
    problems = []
    for r in down.resolutions_ms:
        mark = on.down_marks.get(r)
        reached = "no period yet" if mark is None else (
            f"periods done to {(mark - t0) / 3_600_000:.1f} h of data "
            f"({(newest - mark) / 60_000:,.0f} min behind the newest sample)"
        )  # fmt: skip
        out.append(
            f"  {r // 60_000:>3} min: {reached}; {on.down_records.get(r, 0):,} records, "
            f"{on.down_bytes.get(r, 0):,} bytes (raw chunks {on.stored_bytes:,} bytes)"
        )
    if not on.down_marks:
        problems.append("downsampling did nothing")
    if args.note:
        out.append(f"  note: {args.note}")
    out += ["", "== downsampling off", ""]
    for name, fp in (("off", off), ("on", on)):
        if name == "on":
            out += ["", "== downsampling on", ""]
        text, more = summary(args, t0, fp, None, load, wall_s)
        lines = text.splitlines()
        out += lines[lines.index("") + 1 :]  # its own section, without the common header
        problems += [f"{name}: {p}" for p in more]
    return "\n".join(out) + "\n", problems


def summary(
    args: argparse.Namespace,
    t0: int,
    fp: FiloPyResult,
    vm: VictoriaResult | None,
    load: tuple[float, float],
    wall_s: float,
) -> tuple[str, list[str]]:
    d = args.duration_s
    problems = []
    rec = fp.recovery
    mid, end = d / 2, d
    fp_mean = rate_between(fp.rows, 0, d)
    fp_steady = rate_between(fp.rows, d / 2, d)
    spm = fp.produced / fp.messages if fp.messages else 0.0
    max_unflushed, stall = unflushed_and_stall(fp)
    reread = max(0, fp.crashed_next_offset - rec["replayed_from"])
    drain = [_f(r[FIELDS.index("samples_per_s")]) for r in fp.rows if r[1] == "drain"]
    drain_rate = float(np.mean(drain[1:])) if len(drain) > 1 else float("nan")
    fp_cpu = fp.cpu.get("ingester", float("nan"))
    fp_per_cpu = fp_mean * d / fp_cpu if fp_cpu else float("nan")
    out = [
        "Sustained ingestion: one FiloPy ingester process (Kafka, flushing and checkpointing to "
        f"{'Cassandra' if args.store == 'cassandra' else 'SQLite'}) and VictoriaMetrics "
        "single-node, the same samples",
        f"{time.strftime('%Y-%m-%d %H:%M')}; {machine()}",
        "command: " + shlex.join(["python", "bench/bench_sustained.py", *sys.argv[1:]]),
        f"code: git {args.code_version} at the start",
        f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end; run took "
        f"{wall_s / 60:.1f} min. The {os.cpu_count()} CPUs were shared by Kafka, the producer "
        "and the ingester (FiloPy phase), then by the feeder and VictoriaMetrics (the phase after),"
        " and all along by other work running on the machine at the same time.",
        f"{args.series:,} series x 8 labels, one sample every 15 s each (synthetic time: a "
        f"scrape of all series every {args.series / args.rate:.3f} s), half gauges with 1-2 "
        "decimals, half integer counters; offered "
        f"{args.rate:,.0f} samples/s for {d:.0f} s = {fp.offered_scrapes:,} scrapes, data from "
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(t0 / 1000))} UTC",
        "",
        f"FiloPy (dataset {fp.dataset}: 1 shard, flush_interval_s={args.flush_interval_s:g}, "
        f"{args.groups} flush groups, max_chunk_samples={args.max_chunk_samples}, "
        f"chunk_span_ms={args.chunk_span_ms}, consume_batch={args.consume_batch_used}; "
        "binary format via Gateway.send_batch, "
        f"{args.scrapes_per_batch} scrape(s) of all series per batch: {fp.messages:,} messages, "
        f"{spm:,.0f} samples each)",
        f"  producer achieved   {fp.produced / fp.produce_s:>12,.0f} samples/s "
        f"({fp.produced:,} samples in {fp.produce_s:.1f} s"
        + ("" if fp.produced == args.series * fp.offered_scrapes else ": behind the offered rate")
        + (
            f"; held back {fp.held_s:.0f} s while the lag exceeded --max-lag-s "
            f"{args.max_lag_s:g} s of the offered rate = {args.max_lag_s * args.rate:,.0f} samples"
            if fp.held_s
            else ""
        )
        + ")",
        f"  ingested, run mean  {fp_mean:>12,.0f} samples/s (seconds 0-{d:.0f}); "
        f"second half {fp_steady:,.0f}; {fp_per_cpu:,.0f} per ingester CPU second; "
        f"{drain_rate:,.0f} while draining the backlog (producer stopped)",
        f"  consumer lag        {at(fp.rows, 10, 'lag_samples'):>12,.0f} samples at 10 s, "
        f"{at(fp.rows, mid, 'lag_samples'):,.0f} at {mid:.0f} s, "
        f"{at(fp.rows, end, 'lag_samples'):,.0f} at {end:.0f} s",
        f"  RSS                 {at(fp.rows, 10, 'rss_mib'):>12,.0f} MiB at 10 s, "
        f"{at(fp.rows, mid, 'rss_mib'):,.0f} at {mid:.0f} s, "
        f"{at(fp.rows, end, 'rss_mib'):,.0f} at {end:.0f} s",
        f"  unflushed samples   {at(fp.rows, mid, 'unflushed_samples'):>12,.0f} at {mid:.0f} s, "
        f"{at(fp.rows, end, 'unflushed_samples'):,.0f} at {end:.0f} s; in memory "
        f"{at(fp.rows, end, 'memory_samples'):,.0f} at {end:.0f} s",
        f"  most unflushed      {max_unflushed:>12,.0f} samples "
        f"(= {max_unflushed / max(1.0, fp_mean):.0f} s of the run's mean ingest rate); "
        f"longest time without the lowest checkpoint moving {stall:.0f} s",
        f"  ingester CPU        {rate_between(fp.rows, 0, d, 'cpu_pct'):>12.0f} % of one core "
        f"(mean over the run; the whole machine {rate_between(fp.rows, 0, d, 'host_cpu_pct'):.0f}"
        " % busy)",
        "  CPU seconds while producing: "
        + ", ".join(f"{k} {v:.0f}" for k, v in fp.cpu.items())
        + f" (of {(os.cpu_count() or 1) * fp.produce_s:.0f} on {os.cpu_count()} CPUs; the "
        f"machine was {fp.host_pct:.0f} % busy)",
        f"  drained the backlog in {fp.drain_s:.1f} s after the producer stopped"
        + ("" if fp.drained else f" -- NOT drained within --drain-timeout-s {args.drain_timeout_s}")
        + f"; SIGKILL at {fp.kill_at_s:.1f} s (next offset {fp.crashed_next_offset:,})",
        "  after the kill, a fresh ingester process on the same store and topic:",
        f"    live after        {rec['spawn_to_live_s']:>12.2f} s from spawning the process "
        f"({rec['recovery_s']:.2f} s in KafkaShardIngester: claim, recover_shard, replay)",
        f"    replayed          {rec['replayed_offsets']:>12,} offsets (killed, it noted no "
        "release: all it may have read, up to the end offset at the claim; "
        f"= {rec['replayed_offsets'] * spm:,.0f} samples); read from offset "
        f"{rec['replayed_from']:,} to {rec['end_offset_at_start']:,}: "
        f"{rec['end_offset_at_start'] - rec['replayed_from']:,} offsets, {reread:,} of them read "
        f"before by the killed ingester (= {reread * spm:,.0f} samples), "
        f"{rec['end_offset_at_start'] - max(fp.crashed_next_offset, rec['replayed_from']):,} "
        "never read",
        f"    {'':18}{rec['replay_ingested']:>12,} samples ingested again, "
        f"{rec['replay_skipped']:,} skipped as already stored, "
        f"{rec['open_samples_loaded']:,} open samples loaded from the snapshots",
        f"    checkpoints at kill: lowest {rec['checkpoints_min']}, highest "
        f"{rec['checkpoints_max']} (one flush interval = "
        f"{args.flush_interval_s * fp_mean / spm if spm else 0:,.0f} offsets at the run's rate)",
        f"    at live: {rec['memory_samples_at_live']:,} samples in memory, RSS "
        f"{rec['rss_mib_at_live']:,.0f} MiB; clean stop (flush everything as chunks) "
        f"{rec['stop_flush_s']:.2f} s",
        f"  stored: {fp.stored_samples:,} samples in {fp.chunks:,} chunks "
        f"(produced {fp.produced:,}: "
        + ("equal" if fp.stored_samples == fp.produced else "MISMATCH")
        + f"), {fp.stored_bytes / max(1, fp.stored_samples):.2f} chunk bytes/sample, "
        f"{fp.stored_samples / max(1, fp.chunks):.1f} samples per chunk on average; "
        f"{fp.snapshots_left} snapshots left"
        + (f"; SQLite files {fp.db_bytes / 2**20:,.0f} MiB" if fp.db_bytes else ""),
    ]
    if fp.stored_samples != fp.produced:
        problems.append(f"FiloPy stored {fp.stored_samples:,} samples, produced {fp.produced:,}")
    if vm is not None:
        vm_mean = rate_between(vm.rows, 0, d)
        vm_steady = rate_between(vm.rows, d / 2, d)
        vm_cpu = vm.cpu.get("VictoriaMetrics", float("nan"))
        vm_per_cpu = vm_mean * d / vm_cpu if vm_cpu else float("nan")
        out += [
            "",
            f"VictoriaMetrics {vm.version} (single node; remote write 1.0, "
            f"{args.vm_block_scrapes} samples per series per request, ~"
            f"{args.vm_request_samples:,} samples per request, {args.vm_connections} "
            "connections)",
            f"  feeder achieved     {vm.produced / vm.produce_s:>12,.0f} samples/s "
            f"({vm.produced:,} samples answered in {vm.produce_s:.1f} s)",
            f"  inserted, run mean  {vm_mean:>12,.0f} samples/s (seconds 0-{d:.0f}); "
            f"second half {vm_steady:,.0f}; {vm_per_cpu:,.0f} per VictoriaMetrics CPU second",
            f"  lag (due, not yet answered) {at(vm.rows, 10, 'lag_samples'):>4,.0f} samples at "
            f"10 s, {at(vm.rows, mid, 'lag_samples'):,.0f} at {mid:.0f} s, "
            f"{at(vm.rows, end - 1, 'lag_samples'):,.0f} at {end - 1:.0f} s",
            f"  RSS                 {at(vm.rows, 10, 'rss_mib'):>12,.0f} MiB at 10 s, "
            f"{at(vm.rows, mid, 'rss_mib'):,.0f} at {mid:.0f} s, "
            f"{at(vm.rows, end, 'rss_mib'):,.0f} at {end:.0f} s",
            f"  VictoriaMetrics CPU {rate_between(vm.rows, 0, d, 'cpu_pct'):>12.0f} % of one core "
            "(mean over the run; the whole machine "
            f"{rate_between(vm.rows, 0, d, 'host_cpu_pct'):.0f} % busy)",
            "  CPU seconds while feeding: "
            + ", ".join(f"{k} {v:.0f}" for k, v in vm.cpu.items())
            + f" (of {(os.cpu_count() or 1) * vm.produce_s:.0f}; the machine was "
            f"{vm.host_pct:.0f} % busy)",
            f"  stored: {vm.counted:,} samples by count_over_time after force_flush "
            f"({vm.count_query_s:.1f} s), vm_rows_inserted_total {vm.inserted:,} (sent "
            f"{vm.produced:,}: "
            + ("equal" if vm.counted == vm.produced == vm.inserted else "MISMATCH")
            + f"); vm_data_size_bytes {vm.data_bytes / max(1, vm.counted):.2f} bytes/sample "
            "(right after force_flush, before background merges)",
            "",
            f"ratio FiloPy/VictoriaMetrics of sustained samples/s: {fp_mean / vm_mean:.2f} "
            f"(run means), {fp_steady / vm_steady:.2f} (second halves); of samples per server "
            f"CPU second: {fp_per_cpu / vm_per_cpu:.3f}",
            "  FiloPy's rate counts samples ingested from Kafka (durable there: acks=all) into "
            "the memstore, which the flushes write and checkpoint (every "
            f"{args.flush_interval_s:g} s per group when they keep up; the longest stretch "
            f"without the lowest checkpoint moving was {stall:.0f} s here, and that is what a "
            "crash replays); VictoriaMetrics' counts rows parsed into its in-memory buffers (on "
            "disk within seconds, not fsynced). Each figure is capped by the offered rate when "
            "that server kept up (lag flat).",
        ]
        if vm.counted != vm.produced:
            problems.append(f"VictoriaMetrics counted {vm.counted:,} samples, sent {vm.produced:,}")
    if args.note:
        out += ["", args.note]
    return "\n".join(out) + "\n", problems


def plot(path: Path, fp: FiloPyResult, vm: VictoriaResult | None, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    series = [("FiloPy", fp.rows, "tab:blue")]
    if vm is not None:
        series.append(("VictoriaMetrics", vm.rows, "tab:orange"))
    for name, rows, color in series:
        t = np.array([_f(r[2]) for r in rows])
        for ax, col, scale in (
            (axes[1], "lag_samples", 1e6),
            (axes[2], "rss_mib", 1.0),
        ):
            i = FIELDS.index(col)
            ax.plot(t, [_f(r[i]) / scale for r in rows], color=color, lw=1, label=name)
        for col, style, what in (
            ("samples_per_s", "-", "ingested"),
            ("offered_per_s", ":", "sent"),
        ):
            v = np.array([_f(r[FIELDS.index(col)]) for r in rows]) / 1e3
            axes[0].plot(t, v, color=color, lw=0.4, ls=style, alpha=0.5)
            smooth = np.convolve(v, np.ones(5) / 5, mode="same") if len(v) >= 5 else v
            axes[0].plot(t, smooth, color=color, lw=1.3, ls=style, label=f"{name} {what} (5 s)")
    axes[0].axhline(args.rate / 1e3, color="grey", lw=0.8, ls="--", label="offered rate")
    for ax in axes:
        ax.axvline(fp.kill_at_s, color="tab:red", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("samples/s (thousands)")
    axes[1].set_ylabel("lag (M samples)")
    axes[2].set_ylabel("RSS (MiB)")
    axes[2].set_xlabel("seconds since the phase's start (red: SIGKILL of the FiloPy ingester)")
    axes[0].legend(fontsize=8, ncol=3)
    axes[0].set_title(
        f"Sustained ingestion, {args.series:,} series, offered {args.rate:,.0f} samples/s, "
        f"flush interval {args.flush_interval_s:g} s"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def retention_summary(
    args: argparse.Namespace,
    sides: list[FiloPyResult],
    load: tuple[float, float],
    wall_s: float,
) -> tuple[str, list[str]]:
    """The --retention-s mode's results: each side's rate and disk over time, then the ratio."""
    d, problems = args.duration_s, []
    mib, nan = 2**20, float("nan")
    out = [
        "Sustained ingestion with a short retention: one FiloPy ingester process (Kafka, "
        "flushing and checkpointing to SQLite), the same load without and then with retention",
        f"{time.strftime('%Y-%m-%d %H:%M')}; {machine()}",
        "command: " + shlex.join(["python", "bench/bench_sustained.py", *sys.argv[1:]]),
        f"code: git {args.code_version} at the start",
        f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end; run took "
        f"{wall_s / 60:.1f} min. The {os.cpu_count()} CPUs were shared by Kafka, the producer, "
        "the ingester and the sweeper, and by other work running on the machine at the same time.",
        f"{args.series:,} series x 8 labels, a sample every {args.scrape_ms} ms each, timestamped "
        f"by the wall clock (retention counts from now); offered {args.rate:,.0f} samples/s for "
        f"{d:.0f} s per side; flush_interval_s={args.flush_interval_s:g}, {args.groups} flush "
        f"groups, max_chunk_samples={args.max_chunk_samples}; both sides with "
        f"store.sqlite_bucket_ms={round(args.bucket_s * 1000)} and a sweep every "
        f"{args.sweep_interval_s:g} s (store.retention_sweep_interval_s; run by the bench's "
        "parent process on its own connection, as the singleton would); the second side's "
        f"dataset has a retention of {args.retention_s:g} s (MetaStore.set_retention)",
    ]
    rates = []
    for fp in sides:
        disk = fp.disk
        assert disk is not None
        mean, steady = rate_between(fp.rows, 0, d), rate_between(fp.rows, d / 2, d)
        cpu = fp.cpu.get("ingester", float("nan"))
        per_cpu = mean * d / cpu if cpu else float("nan")
        rates.append((mean, steady, per_cpu))
        half = [b for t, b, _, _ in disk.samples if d / 2 < t <= d]
        marks = sorted({10.0, args.retention_s, d / 2, 3 * d / 4, d})
        name = f"retention {args.retention_s:g} s" if fp.retention_ms else "kept forever"
        out += [
            "",
            f"FiloPy, {name} (dataset {fp.dataset})",
            f"  producer achieved   {fp.produced / fp.produce_s:>12,.0f} samples/s "
            f"({fp.produced:,} samples in {fp.produce_s:.1f} s"
            + (f"; held back {fp.held_s:.0f} s by the lag" if fp.held_s else "")
            + ")",
            f"  ingested, run mean  {mean:>12,.0f} samples/s (seconds 0-{d:.0f}); second half "
            f"{steady:,.0f}; {per_cpu:,.0f} per ingester CPU second "
            f"({rate_between(fp.rows, 0, d, 'cpu_pct'):.0f} % of one core; the machine "
            f"{rate_between(fp.rows, 0, d, 'host_cpu_pct'):.0f} % busy)",
            f"  consumer lag        {at(fp.rows, d, 'lag_samples'):>12,.0f} samples at {d:.0f} s; "
            f"RSS {at(fp.rows, d, 'rss_mib'):,.0f} MiB",
            "  SQLite file         "
            + ", ".join(f"{at(fp.rows, t, 'db_bytes') / mib:,.0f} MiB at {t:.0f} s" for t in marks)
            + (
                f"; {min(half) / mib:,.0f}-{max(half) / mib:,.0f} MiB in the second half"
                if half
                else ""
            ),
            "  its WAL             "
            + ", ".join(
                f"{at(fp.rows, t, 'wal_bytes') / mib:,.0f} MiB at {t:.0f} s" for t in marks
            ),
            "  stored chunk bytes  "
            + ", ".join(
                f"{at(fp.rows, t, 'stored_bytes') / mib:,.1f} MiB at {t:.0f} s" for t in marks
            ),
            f"  sweeps              {disk.sweeps:>12,} ({disk.sweep_time_s:.1f} s in all), "
            f"{disk.buckets_dropped:,} buckets dropped, {disk.bytes_freed / mib:,.1f} MiB of "
            f"chunks freed, {len(disk.errors)} failed"
            + (f" ({disk.errors[0]})" if disk.errors else ""),
            f"  at the end          {fp.stored_samples:,} samples in {fp.chunks:,} chunks "
            f"stored of {fp.produced:,} produced; SQLite files {fp.db_bytes / mib:,.0f} MiB "
            "(after the crash, the recovery and the clean stop)",
        ]
        if fp.retention_ms:
            if disk.buckets_dropped == 0:
                problems.append("the retention side dropped no bucket")
        elif fp.stored_samples != fp.produced:
            problems.append(
                f"FiloPy stored {fp.stored_samples:,} samples, produced {fp.produced:,}"
            )
    (m0, s0, c0), (m1, s1, c1) = rates
    out += [
        "",
        f"ratio with/without retention of ingested samples/s: {m1 / m0 if m0 else nan:.3f} (run "
        f"means), {s1 / s0 if s0 else nan:.3f} (second halves), {c1 / c0 if c0 else nan:.3f} "
        "(per ingester CPU second)",
        "  Each rate is capped by the offered rate where the ingester kept up (lag flat); the "
        "two sides ran one after the other, so other work on the machine may differ between "
        "them (the per-CPU-second figure is the least sensitive to it).",
    ]
    if args.note:
        out += ["", args.note]
    return "\n".join(out) + "\n", problems


def plot_retention(path: Path, sides: list[FiloPyResult], args: argparse.Namespace) -> None:
    """Disk over time (SQLite files and stored chunk bytes) and the ingest rate, both sides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    for fp, color in zip(sides, ("tab:blue", "tab:green"), strict=True):
        name = f"retention {args.retention_s:g} s" if fp.retention_ms else "kept forever"
        t = np.array([_f(r[2]) for r in fp.rows])
        for col, style, what in (
            ("db_bytes", "-", "SQLite file"),
            ("wal_bytes", "--", "its WAL"),
            ("stored_bytes", ":", "chunks stored"),
        ):
            v = [_f(r[FIELDS.index(col)]) / 2**20 for r in fp.rows]
            axes[0].plot(t, v, color=color, lw=1.3, ls=style, label=f"{name}: {what}")
        v = np.array([_f(r[FIELDS.index("samples_per_s")]) for r in fp.rows]) / 1e3
        smooth = np.convolve(v, np.ones(5) / 5, mode="same") if len(v) >= 5 else v
        axes[1].plot(t, v, color=color, lw=0.4, alpha=0.5)
        axes[1].plot(t, smooth, color=color, lw=1.3, label=f"{name}: ingested (5 s)")
    axes[1].axhline(args.rate / 1e3, color="grey", lw=0.8, ls="--", label="offered rate")
    for ax in axes:
        ax.axvline(args.retention_s, color="tab:grey", lw=0.8, ls=":")
        ax.axvline(args.duration_s, color="tab:red", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("MiB on disk")
    axes[1].set_ylabel("samples/s (thousands)")
    axes[1].set_xlabel(
        "seconds since the phase's start (grey: the retention; red: the producer stops, then "
        "drain, SIGKILL, recovery)"
    )
    axes[0].set_title(
        f"Sustained ingestion, {args.series:,} series, offered {args.rate:,.0f} samples/s:\n"
        f"retention {args.retention_s:g} s vs kept forever (buckets {args.bucket_s:g} s, sweep "
        f"every {args.sweep_interval_s:g} s)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--series", type=int, default=20_000)
    p.add_argument("--rate", type=float, default=400_000, help="offered samples/s")
    p.add_argument("--duration-s", type=float, default=600)
    p.add_argument("--flush-interval-s", type=float, default=10.0)
    p.add_argument(
        "--drain-timeout-s",
        type=float,
        default=None,
        help="after the producer stops, wait at most this long for the ingester to read "
        "everything before the kill (default: the duration)",
    )
    p.add_argument(
        "--consume-batch",
        type=int,
        default=0,
        help="ingest.consume_batch for the ingester (0: the config's)",
    )
    p.add_argument(
        "--scrapes-per-batch",
        type=int,
        default=1,
        help="scrapes of all series per SampleBatch sent to FiloPy (1: one message per scrape)",
    )
    p.add_argument(
        "--max-lag-s",
        type=float,
        default=30.0,
        help="the FiloPy producer holds back while the consumer lag exceeds this many seconds of "
        "the offered rate (bounds the backlog left at the kill, which the recovery holds in "
        "memory); 0: never",
    )
    p.add_argument("--servers", default="filopy,vm", help="filopy, or filopy,vm")
    p.add_argument(
        "--store",
        choices=("sqlite", "cassandra"),
        default="sqlite",
        help="FiloPy's store: SQLite in a temporary directory, or the local Cassandra "
        "(a keyspace of the run's own, dropped after)",
    )
    p.add_argument("--vm-block-scrapes", type=int, default=10)
    p.add_argument("--vm-request-samples", type=int, default=20_000)
    p.add_argument("--vm-connections", type=int, default=2)
    p.add_argument(
        "--retention-s",
        type=float,
        default=0,
        help="the retention mode: FiloPy only, wall-clock timestamps, the same load without "
        "and then with this retention on the dataset; disk sampled every second (0: off)",
    )
    p.add_argument("--bucket-s", type=float, default=10.0, help="retention mode: SQLite bucket")
    p.add_argument(
        "--sweep-interval-s", type=float, default=5.0, help="retention mode: sweep interval"
    )
    p.add_argument(
        "--downsample",
        action="store_true",
        help="the downsampling mode: FiloPy only, the same load without and then with "
        "downsampling (5 min and 1 h, the config's delay and interval)",
    )
    p.add_argument("--note", default="", help="a line for the results file")
    p.add_argument("--out", default="", help="results path prefix (default: sustained[-retention])")
    args = p.parse_args(argv)
    mode = "-retention" if args.retention_s else "-downsample" if args.downsample else ""
    args.out = args.out or str(RESULTS / f"sustained{mode}")
    args.scrape_ms = max(1, round(args.series * 1000 / args.rate))
    if args.drain_timeout_s is None:
        args.drain_timeout_s = args.duration_s
    if args.max_lag_s <= 0:
        args.max_lag_s = float("inf")
    from core.config import load_settings

    ingest = load_settings().ingest
    args.code_version = code_version()
    args.groups = ingest.groups_per_shard
    args.consume_batch_used = args.consume_batch or ingest.consume_batch
    args.max_chunk_samples, args.chunk_span_ms = ingest.max_chunk_samples, ingest.chunk_span_ms

    scrapes = scrapes_in(args.duration_s, args.series, args.rate)
    hour = 3_600_000
    # Data ends at least 2 hours ago (VictoriaMetrics refuses far-future samples).
    t0 = (int(time.time() * 1000) - (scrapes + 1) * SCRAPE_MS - 2 * hour) // hour * hour
    ctx = mp.get_context("spawn")
    tmp = Path(tempfile.mkdtemp(prefix="bench-sustained-"))
    load0, wall = os.getloadavg()[0], time.monotonic()
    vm = None
    if args.retention_s:
        try:
            sides = [run_filopy(args, 0, tmp, ctx, ms) for ms in (0, round(args.retention_s * 1e3))]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        wall_s = time.monotonic() - wall
        out = Path(args.out)
        with out.with_suffix(".csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(FIELDS)
            for fp in sides:
                w.writerows(fp.rows)
        text, problems = retention_summary(args, sides, (load0, os.getloadavg()[0]), wall_s)
        out.with_suffix(".txt").write_text(text)
        plot_retention(out.with_suffix(".png"), sides, args)
        print(text)
        if problems:
            raise SystemExit("FAILED: " + "; ".join(problems))
        return
    if args.downsample:
        try:
            sides = [run_filopy(args, t0, tmp, ctx, downsample=on) for on in (False, True)]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        text, problems = downsample_summary(
            args, t0, sides, (load0, os.getloadavg()[0]), time.monotonic() - wall
        )
        out = Path(args.out)
        out.with_suffix(".txt").write_text(text)
        with out.with_suffix(".csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(FIELDS)
            for fp, name in zip(sides, ("off", "on"), strict=True):
                w.writerows([[f"FiloPy-downsample-{name}", *r[1:]] for r in fp.rows])
        print(text)
        if problems:
            raise SystemExit("FAILED: " + "; ".join(problems))
        return
    try:
        fp = run_filopy(args, t0, tmp, ctx)
        if "vm" in args.servers:
            vm = run_victoria(args, t0, tmp, ctx)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text, problems = summary(args, t0, fp, vm, (load0, os.getloadavg()[0]), time.monotonic() - wall)
    out = Path(args.out)
    out.with_suffix(".txt").write_text(text)
    with out.with_suffix(".csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        w.writerows(fp.rows)
        if vm is not None:
            w.writerows(vm.rows)
    plot(out.with_suffix(".png"), fp, vm, args)
    print(text)
    if problems:
        raise SystemExit("FAILED: " + "; ".join(problems))


if __name__ == "__main__":
    main()

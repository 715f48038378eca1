"""Ingestion throughput of one ingester process from real Kafka (run on demand).

Needs Kafka from `scripts/services.sh up kafka`. Fills a 1-partition topic, then times the real
`KafkaShardIngester` (consumer → decode → memstore) reading it all:
- the binary batch format and Influx line protocol, into the memstore (flushes held: the
  ingester replays the backlog as a recovery, exactly as after a failover);
- a sweep of librdkafka fetch settings for the binary format;
- end to end with flushing to SQLite (chunks + checkpoints), until everything is checkpointed;
- memory held per million samples.
Results: bench/results/ingest.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from core.config import load_settings  # noqa: E402
from core.dataset import Dataset, RecordFormat, SourceSettings, SpreadSettings  # noqa: E402
from ingest.batch import SampleBatch  # noqa: E402
from ingest.gateway import Gateway  # noqa: E402
from ingest.ingester import KafkaShardIngester  # noqa: E402
from ingest.kafka_config import kafka_client_config  # noqa: E402
from ingest.topics import ensure_topic  # noqa: E402
from store.sqlite import open_sqlite_stores  # noqa: E402

BOOTSTRAP = f"127.0.0.1:{os.environ.get('FILOPY_KAFKA_PORT', '9092')}"
SERIES = 10_000
SCRAPES = 200  # 2M samples in the binary runs
LINE_SCRAPES = 40  # 400k samples of line protocol
T0 = 1_700_000_000_000


def labels(i: int) -> dict[str, str]:
    return {
        "_metric_": f"metric_{i % 50}",
        "_ws_": "bench",
        "_ns_": f"app{i % 10}",
        "instance": f"host-{i}",
        "job": "node",
    }


def make_dataset(fmt: RecordFormat) -> Dataset:
    return Dataset(
        name=f"bench{uuid.uuid4().hex[:8]}",
        num_shards=1,
        spread=SpreadSettings(default=0),
        source=SourceSettings(bootstrap_servers=BOOTSTRAP, record_format=fmt),
    )


def fill_binary(ds: Dataset) -> int:
    series = [labels(i) for i in range(SERIES)]
    rng = np.random.default_rng(1)
    with Gateway(ds, BOOTSTRAP) as gw:
        for k in range(0, SCRAPES, 10):
            idx = np.tile(np.arange(SERIES, dtype=np.int32), 10)
            ts = np.repeat(T0 + 15_000 * np.arange(k, k + 10, dtype=np.int64), SERIES)
            gw.send_batch(SampleBatch(series, idx, ts, rng.normal(size=len(ts))))
    return SERIES * SCRAPES


def fill_lines(ds: Dataset) -> int:
    producer = Producer({**kafka_client_config(None, BOOTSTRAP), "linger.ms": 20})
    tags = [
        ",".join(f"{t}={v}" for t, v in sorted(labels(i).items()) if t != "_metric_")
        for i in range(SERIES)
    ]
    metrics = [labels(i)["_metric_"] for i in range(SERIES)]
    for k in range(LINE_SCRAPES):
        ns = (T0 + 15_000 * k) * 1_000_000
        lines = [f"{metrics[i]},{tags[i]} value={k}.25 {ns}" for i in range(SERIES)]
        for j in range(0, SERIES, 1000):  # 1000 lines per message, as Telegraf batches
            producer.produce(ds.topic, "\n".join(lines[j : j + 1000]).encode(), partition=0)
            producer.poll(0)
    assert producer.flush(60) == 0
    return SERIES * LINE_SCRAPES


def run(ds: Dataset, expected: int, flush: bool, **ingest: object) -> tuple[float, float, float]:
    """Seconds to ingest `expected` samples (and, with `flush`, to checkpoint them all),
    memory bytes per million samples held, and samples/s."""
    base = load_settings()
    settings = base.model_copy(
        update={
            "ingest": base.ingest.model_copy(
                update={"flush_interval_s": 1.0 if flush else 3600.0, **ingest}
            )
        }
    )
    meta, columns = open_sqlite_stores(Path(tempfile.mkdtemp()) / "bench.db")
    ing = KafkaShardIngester(
        ds, 0, "bench-node", meta=meta, columns=columns, settings=settings, report=lambda e: None
    )

    held: list[float] = []

    async def go() -> float:
        t = time.perf_counter()
        await ing.start()
        while ing.memstore.stats.ingested < expected:
            await asyncio.sleep(0.005)
        if flush:
            await ing.stop()  # flushes everything that is left and checkpoints it
        elapsed = time.perf_counter() - t
        if not flush:
            # While ingesting (before stop() seals and flushes): bytes per million samples held.
            held.append(ing.memstore.memory_bytes() / max(1, ing.memstore.memory_samples()) * 1e6)
            await ing.stop()
        return elapsed

    elapsed = asyncio.run(go())
    per_million = held[0] if held else 0.0
    meta.close()
    columns.close()
    return elapsed, per_million, expected / elapsed


LINE_RUNS = 3  # the line protocol row is the best of these (one run is 1-2 s: noisy)


def lines_only(runs: int) -> None:
    """Only the line protocol row, `runs` times (nothing written): for before/after figures
    of the line protocol decoder. Prints each run and the load average."""
    lines = make_dataset(RecordFormat.INFLUX)
    ensure_topic(lines, BOOTSTRAP)
    n_lines = fill_lines(lines)
    rates = []
    for _ in range(runs):
        t, _, rate = run(lines, n_lines, flush=False)
        rates.append(rate)
        load = os.getloadavg()[0]
        print(f"line protocol -> memstore {rate:>8,.0f} samples/s  ({t:.2f} s)  load {load:.2f}")
    print(f"best of {runs}: {max(rates):,.0f} samples/s; median {sorted(rates)[runs // 2]:,.0f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines-only", action="store_true", help="only the line protocol row")
    p.add_argument("--runs", type=int, default=LINE_RUNS, help="line protocol runs (best)")
    args = p.parse_args()
    if args.lines_only:
        lines_only(args.runs)
        return
    binary, lines = make_dataset(RecordFormat.BINARY), make_dataset(RecordFormat.INFLUX)
    for ds in (binary, lines):
        ensure_topic(ds, BOOTSTRAP)
    n_bin, n_lines = fill_binary(binary), fill_lines(lines)

    out = [
        "FiloPy ingestion benchmark: one KafkaShardIngester, real Kafka 4.3 on loopback",
        f"{time.strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs (broker on the same machine)",
        f"{SERIES:,} series; binary: {n_bin:,} samples in messages of 10 scrapes "
        f"(100k samples); line protocol: {n_lines:,} samples, 1000 lines per message",
        "",
    ]
    sweeps = [
        ("defaults from config/filopy.toml", {}),
        ("queued.min.messages=1000", {"queued_min_messages": 1000}),
        ("fetch.wait.max.ms=100", {"fetch_wait_max_ms": 100}),
        ("fetch.queue.backoff.ms=1000", {"fetch_queue_backoff_ms": 1000}),
        ("consume_batch=100", {"consume_batch": 100}),
    ]
    for label, kw in sweeps:
        t, per_m, rate = min(
            (run(binary, n_bin, flush=False, **kw) for _ in range(2)), key=lambda r: r[0]
        )
        out.append(f"binary -> memstore   {rate:>12,.0f} samples/s  ({t:.2f} s)  [{label}]")
    t, per_m, rate = min(
        (run(lines, n_lines, flush=False) for _ in range(args.runs)), key=lambda r: r[0]
    )
    out.append(
        f"line protocol -> memstore {rate:>8,.0f} samples/s  ({t:.2f} s)  "
        f"[best of {args.runs}; load average {os.getloadavg()[0]:.1f}]"
    )
    t, _, rate = run(binary, n_bin, flush=True)
    out.append(
        f"binary end to end with flush + checkpoints to SQLite {rate:,.0f} samples/s ({t:.2f} s)"
    )
    t, per_m, rate = run(binary, n_bin, flush=False)
    out.append(
        f"memory held: {per_m / 2**20:.1f} MiB per million samples "
        "(sample buffers + encoded chunks; series index excluded)"
    )
    text = "\n".join(out) + "\n"
    (ROOT / "bench" / "results" / "ingest.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

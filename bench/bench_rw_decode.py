"""Remote write 1.0 gateway CPU per sample, in one process (no HTTP, no Kafka).

The steady state of a gateway fed by Prometheus: requests of 2,000 series, one sample each,
the same series every scrape (10 labels each, as a node-exporter fleet has). Times, per sample
and best of `--rounds` (thread CPU time):

- decode: `remote_write_v1.decode` of decompressed bodies whose series are all known;
- send: `Gateway.send_batch` of those decoded batches (routing, encoding), its producer a stub
  that keeps the messages: their SHA-256 is printed, so a change to the encoding path can be
  checked to give the same bytes.

Usage: .venv/bin/python bench/bench_rw_decode.py [--series 50000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import cramjam
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.dataset import Dataset  # noqa: E402
from ingest.gateway import Gateway  # noqa: E402
from ingest.wire import remote_write_v1  # noqa: E402
from ingest.wire.prompb.remote_pb2 import WriteRequest  # noqa: E402

SAMPLES_PER_REQUEST = 2_000
SHARDS = 8
T0 = 1_700_000_000_000


def series_labels(n: int) -> list[list[tuple[str, str]]]:
    """`n` node-exporter-like series, 10 labels each, sorted by name (`__name__` first)."""
    modes = ["idle", "user", "system", "iowait", "irq", "softirq", "steal", "nice"]
    out = []
    for i in range(n):
        host = i // 500
        labels = {
            "__name__": f"node_metric_{i % 100}",
            "cluster": f"c{host % 4}",
            "cpu": str(i % 16),
            "datacenter": f"dc-{host % 7}",
            "env": "prod",
            "instance": f"host-{host:04d}.example.net:9100",
            "job": "node",
            "mode": modes[(i // 16) % len(modes)],
            "rack": f"r{host % 40:02d}",
            "region": ["eu-west-1", "us-east-1", "ap-south-1"][host % 3],
        }
        out.append(sorted(labels.items()))
    return out


def bodies(n_series: int, scrape: int) -> list[bytes]:
    """One scrape of every series as decompressed remote write 1.0 bodies (a round trip through
    snappy, as the gateway receives them); every 10th value zero (left out on the wire)."""
    rng = np.random.default_rng(scrape)
    series = series_labels(n_series)
    out = []
    for lo in range(0, n_series, SAMPLES_PER_REQUEST):
        req = WriteRequest()
        for i in range(lo, min(lo + SAMPLES_PER_REQUEST, n_series)):
            ts = req.timeseries.add()
            for name, value in series[i]:
                lb = ts.labels.add()
                lb.name, lb.value = name, value
            s = ts.samples.add()
            s.value = 0.0 if i % 10 == 0 else round(float(rng.uniform(0, 1000)), 3)
            s.timestamp = T0 + 15_000 * scrape
        raw = cramjam.snappy.compress_raw(req.SerializeToString())
        out.append(bytes(cramjam.snappy.decompress_raw(raw)))
    return out


class StubProducer:
    """Takes the messages a Gateway produces (a digest of them with `digest`), answers nothing."""

    def __init__(self, digest: bool = False) -> None:
        self.digest = hashlib.sha256() if digest else None
        self.messages = 0

    def produce(self, topic: str, value: bytes, partition: int, on_delivery: Any) -> None:
        if self.digest is not None:
            self.digest.update(partition.to_bytes(4, "little") + len(value).to_bytes(4, "little"))
            self.digest.update(value)
        self.messages += 1

    def poll(self, timeout_s: float) -> int:
        return 0

    def flush(self, timeout_s: float) -> int:
        return 0


def best_of(rounds: int, work: list[bytes], step: Any) -> float:
    """Best thread CPU seconds of `rounds` passes of `step` over `work`."""
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        for x in work:
            step(x)
        best = min(best, time.thread_time() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--series", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    warm, timed = bodies(args.series, 0), bodies(args.series, 1)
    column = "_metric_"
    for raw in warm:
        remote_write_v1.decode(raw, column)
    n = args.series
    decode = best_of(args.rounds, timed, lambda raw: remote_write_v1.decode(raw, column))
    batches = [remote_write_v1.decode(raw, column).batch for raw in timed]
    ds = Dataset(name="bench_rw_decode", num_shards=SHARDS)
    gw = Gateway(ds, "127.0.0.1:1", verify_topic=False)
    stub = StubProducer()
    gw._producer = stub  # type: ignore[assignment]
    for b in batches:  # learns the series and the compression ratio
        gw.send_batch(b)
    send = best_of(args.rounds, batches, gw.send_batch)
    both = best_of(
        args.rounds, timed, lambda raw: gw.send_batch(remote_write_v1.decode(raw, column).batch)
    )
    check = StubProducer(digest=True)  # a new gateway: its compression ratio learnt afresh
    gw = Gateway(ds, "127.0.0.1:1", verify_topic=False)
    gw._producer = check  # type: ignore[assignment]
    for b in batches:
        gw.send_batch(b)
    print(
        f"{n:,} series x 10 labels, {len(timed)} requests of {SAMPLES_PER_REQUEST:,} samples; "
        f"best of {args.rounds}; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"decode             {decode / n * 1e9:7.0f} ns/sample")
    print(f"send_batch         {send / n * 1e9:7.0f} ns/sample")
    print(f"decode+send_batch  {both / n * 1e9:7.0f} ns/sample")
    assert check.digest is not None
    print(f"messages of one pass: {check.messages}, sha256 {check.digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()

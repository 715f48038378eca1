"""A synthetic Prometheus-like workload: many series scraped every 15 s, as SampleBatches."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ingest.batch import Labels, SampleBatch

SCRAPE_MS = 15_000
JOBS = ("node", "api", "db", "cache")
METRICS = ("cpu_seconds_total", "http_requests_total", "memory_bytes")


def series_labels(i: int, workspace: str = "demo") -> Labels:
    """Series `i`: a metric, a workspace, a namespace per job, and an instance."""
    job = JOBS[i % len(JOBS)]
    return {
        "_metric_": METRICS[i % len(METRICS)],
        "_ws_": workspace,
        "_ns_": job,
        "instance": f"{job}-{i // len(JOBS):04d}",
    }


def scrapes(
    n_series: int, n_scrapes: int, per_batch: int, start_ms: int, seed: int = 42
) -> Iterator[SampleBatch]:
    """`n_scrapes` scrapes of `n_series` series from `start_ms`, `per_batch` scrapes per batch."""
    series = [series_labels(i) for i in range(n_series)]
    rng = np.random.default_rng(seed)
    for k in range(0, n_scrapes, per_batch):
        m = min(per_batch, n_scrapes - k)
        idx = np.tile(np.arange(n_series, dtype=np.int32), m)
        ts = np.repeat(start_ms + SCRAPE_MS * np.arange(k, k + m, dtype=np.int64), n_series)
        yield SampleBatch(series, idx, ts, rng.random(len(ts)) * 100)

"""Deterministic `demo_*` series for the compliance harness.

The official suite's data come from three instances of the PromLabs demo service scraped every
5 s; those services are not reachable here, so this module makes series of the same families
and shapes: CPU counters (one instance resets mid-way), memory and disk gauges, a request
duration histogram (`_bucket{le}`, `_sum`, `_count`), a batch job's last-success timestamp
(a step function), CPU counts, and `demo_intermittent_metric`, present only part of the time.
Scrape times carry a fixed per-instance offset and jitter, as real scrapes do.

Everything is a function of `end_s` alone, so both systems and every run see the same samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

INSTANCES = ("demo.promlabs.com:10000", "demo.promlabs.com:10001", "demo.promlabs.com:10002")
JOB = "demo"
SCRAPE_S = 5
SPAN_S = 2 * 3600  # two hours up to the end time: room for [1h] windows and offsets
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class Series:
    labels: dict[str, str]  # including __name__
    timestamps_ms: np.ndarray  # int64, increasing
    values: np.ndarray  # float64

    @property
    def name(self) -> str:
        return self.labels["__name__"]


def scrape_times(end_s: int, instance: int, span_s: int = SPAN_S) -> np.ndarray:
    """Millisecond scrape times of one instance over the span, ending before `end_s`."""
    start_ms = (end_s - span_s) * 1000
    n = span_s // SCRAPE_S
    rng = np.random.default_rng(1000 + instance)
    jitter = rng.integers(-40, 40, size=n)
    return start_ms + np.arange(n, dtype=np.int64) * SCRAPE_S * 1000 + 1234 * instance + jitter


def generate(end_s: int, instances: int = len(INSTANCES), span_s: int = SPAN_S) -> list[Series]:
    """Every demo series, deterministic in its arguments: the suite's three instances, or as
    many as asked (`demo.promlabs.com:10000` and up; 94 series each) for benchmarks."""
    return list(_generate(end_s, instances, span_s))


def _generate(end_s: int, instances: int, span_s: int) -> Iterator[Series]:
    for i in range(instances):
        instance = f"demo.promlabs.com:{10000 + i}"
        ts = scrape_times(end_s, i, span_s)
        t = (ts - ts[0]) / 1000.0
        rng = np.random.default_rng(i)
        base = {"instance": instance, "job": JOB}

        def series(
            name: str, values: np.ndarray, times: np.ndarray = ts, base: dict = base, **labels: str
        ) -> Series:
            return Series({"__name__": name, **base, **labels}, times, values.astype(np.float64))

        # Counters: CPU seconds per mode; the second instance restarts half-way (a reset).
        for j, (mode, rate) in enumerate((("idle", 3.2), ("user", 0.41), ("system", 0.13))):
            inc = rate * SCRAPE_S * (1 + 0.3 * rng.random(len(ts)))
            values = np.cumsum(inc) + 1000 * (j + 1)
            if i == 1:
                half = len(ts) // 2
                values[half:] -= values[half - 1] - inc[half]
            yield series("demo_cpu_usage_seconds_total", values, mode=mode)
        yield series("demo_num_cpus", np.full(len(ts), 4.0 * (i + 1)))

        # Gauges: memory by type, with a slow wave and noise; disk usage creeping up.
        total = 16e9
        used = 6e9 + 2e9 * np.sin(t / 900 + i) + 1e8 * rng.standard_normal(len(ts))
        cached, buffers = 3e9 + 5e8 * np.cos(t / 600), np.full(len(ts), 4.5e8 + 1e7 * i)
        free = total - used - cached - buffers
        for kind, values in (("used", used), ("cached", cached), ("buffers", buffers)):
            yield series("demo_memory_usage_bytes", np.round(values), type=kind)
        yield series("demo_memory_usage_bytes", np.round(free), type="free")
        yield series("demo_disk_total_bytes", np.full(len(ts), 1e11 * (i + 1)))
        yield series("demo_disk_usage_bytes", np.round(4e10 + 1e5 * t + 1e6 * i))

        # A batch job: the time of its last success moves in steps (every 3 to 5 minutes).
        succeeded = ts[0] / 1000 - 60 + np.floor(t / (180 + 60 * i)) * (180 + 60 * i)
        yield series("demo_batch_last_success_timestamp_seconds", np.floor(succeeded))
        yield series("demo_batch_last_run_processed_bytes", np.round(1e6 + 1e5 * np.sin(t / 300)))

        # Requests in progress: small integers, often zero.
        yield series("demo_api_http_requests_in_progress", rng.poisson(1.5, len(ts)).astype(float))

        # A request duration histogram per method, path and status.
        for method, path, status, rps in (
            ("GET", "/api/foo", "200", 12.0),
            ("GET", "/api/foo", "500", 0.4),
            ("POST", "/api/foo", "200", 3.0),
            ("GET", "/api/bar", "200", 6.0),
            ("POST", "/api/bar", "503", 0.2),
        ):
            labels = {"method": method, "path": path, "status": status}
            counts = rng.poisson(rps * SCRAPE_S, len(ts)).astype(float)
            # Latencies: log-normal around a per-path median, in seconds.
            median = 0.004 if path == "/api/foo" else 0.03
            cdf = np.array([_lognormal_cdf(b, median) for b in BUCKETS])
            per_bucket = np.floor(np.outer(counts, cdf))  # cumulative count per bucket
            cum = np.cumsum(per_bucket, axis=0)
            total_count = np.cumsum(counts)
            for k, le in enumerate(BUCKETS):
                yield series(
                    "demo_api_request_duration_seconds_bucket", cum[:, k], le=_le(le), **labels
                )
            yield series(
                "demo_api_request_duration_seconds_bucket", total_count, le="+Inf", **labels
            )
            yield series("demo_api_request_duration_seconds_count", total_count, **labels)
            yield series(
                "demo_api_request_duration_seconds_sum",
                np.round(np.cumsum(counts * median * 1.3), 6),
                **labels,
            )

        # Present for five minutes, then absent for seven (longer than the 5 m lookback).
        present = (t % 720) < 300
        yield series("demo_intermittent_metric", np.full(int(present.sum()), 1.0 + i), ts[present])


def _le(bound: float) -> str:
    """Bucket bounds as Prometheus' client libraries write them."""
    return repr(bound)


def _lognormal_cdf(x: float, median: float, sigma: float = 1.0) -> float:
    from math import erf, log, sqrt

    return 0.5 * (1 + erf((log(x) - log(median)) / (sigma * sqrt(2))))


def openmetrics(series: list[Series]) -> Iterator[str]:
    """The series as OpenMetrics text for `promtool tsdb create-blocks-from openmetrics`: each
    family's lines together, timestamps in seconds with millisecond precision, `# EOF` last."""
    by_family: dict[str, list[Series]] = {}
    for s in series:
        by_family.setdefault(s.name, []).append(s)
    for name, members in by_family.items():
        yield f"# TYPE {name} unknown\n"
        for s in members:
            labels = ",".join(
                f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()) if k != "__name__"
            )
            head = f"{name}{{{labels}}} "
            for t, v in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True):
                yield f"{head}{_float(v)} {t // 1000}.{t % 1000:03d}\n"
    yield "# EOF\n"


def _float(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

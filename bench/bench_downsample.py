"""Downsampling benchmark: what summarising costs and what it saves, against raw chunks.

1,000 series of one day of 15 s scrapes (5 ms jitter; half gauges, half counters, as in
bench_stores.py): 5.76 million samples. Reports, for the 5 minute and 1 hour resolutions:

* summarise: samples/s of `summarise` over all series at once (best of --repeats, CPU time);
* records: CPU time to encode every series' periods (`encode_records`, one record each), and
  their bytes against the series' raw chunks (`encode_chunk`, one chunk per series-day);
* answer: a day of `rate(x[1h])` at 1 h steps for every series, from raw samples
  (`range_function`) and from the 1 h periods (`downsampled.answer`), and the ratio.

Run from the repository root:

    .venv/bin/python bench/bench_downsample.py [--out bench/results/downsample.txt]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_stores import make_series

from query.downsampled import answer
from query.functions import SampleBatch, range_function
from store.downsample import encode_records, period_ends, summarise
from store.encoding import encode_chunk

N_SERIES, N_SAMPLES = 1_000, 5_760  # a day of 15 s scrapes
RESOLUTIONS = (("5m", 300_000), ("1h", 3_600_000))


def best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    series = make_series(N_SERIES, N_SAMPLES, jitter_ms=5.0)
    ts = np.concatenate([s[2] for s in series])
    vals = np.concatenate([s[3] for s in series])
    bounds = np.arange(N_SERIES + 1, dtype=np.int64) * N_SAMPLES
    raw_bytes = sum(len(encode_chunk(s[2], s[3])) for s in series)
    lines = [
        f"# bench_downsample: {N_SERIES} series x {N_SAMPLES} samples (a day of 15 s scrapes)",
        f"# {platform.platform()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
        f"raw chunks: {raw_bytes / ts.size:.3f} bytes/sample, {raw_bytes / 1e6:.2f} MB",
    ]
    by_res = {}
    for name, res in RESOLUTIONS:
        secs = best(lambda res=res: summarise(ts, vals, bounds, res), args.repeats)
        periods = summarise(ts, vals, bounds, res)
        by_res[name] = periods
        enc = best(lambda p=periods: encode_records(p), args.repeats)
        size = sum(len(r) for r in encode_records(periods))
        lines.append(
            f"{name}: summarise {ts.size / secs / 1e6:.1f} M samples/s; {len(periods)} periods, "
            f"encoded {enc / N_SERIES * 1e6:.0f} us a record, {size / 1e6:.3f} MB = raw / "
            f"{raw_bytes / size:.1f}"
        )
    batch = SampleBatch([{}] * N_SERIES, ts, vals, bounds)
    t0 = int(period_ends(np.array([ts.min()]), 3_600_000)[0])
    steps = t0 + 3_600_000 * np.arange(1, 25, dtype=np.int64)
    raw_s = best(lambda: range_function("rate", batch, steps, 3_600_000, 0), args.repeats)
    down_s = best(lambda: answer("rate", by_res["1h"], steps, 3_600_000), args.repeats)
    lines.append(
        f"rate(x[1h]) at 1h steps over the day, every series: raw {raw_s * 1e3:.1f} ms, "
        f"from 1h periods {down_s * 1e3:.1f} ms: raw / downsampled = {raw_s / down_s:.1f}"
    )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

"""Codec benchmark: the reference `encode_chunk` chunk by chunk against the fast path
`encode_chunks` (compiled loops, encoding_fast.py) on the whole batch, and the same for decoding:
`decode_chunk` chunk by chunk against `decode_chunks`.

A flush encodes thousands of chunks at once. `encode_chunk` costs 30-400 us per chunk whatever
its size (hundreds of NumPy calls on small arrays); `encode_chunks` makes the same choices in
compiled loops and writes the same bytes. This benchmark is what keeps the fast path: it must
beat the reference here, or go. Data as in bench_stores.py: 15 s scrapes with 5 ms jitter, half
gauges (1-2 decimals, percentages, memory pages, small integers, flags) and half counters.
Reports samples/s of both, their ratio, bytes/sample (checked equal, chunk by chunk), and both
decoders' samples/s (the batch decoder serves reads of many chunks: queries' cache misses,
downsampling), its output checked bit-exact against the samples encoded. The kernels are
compiled (or loaded from numba's cache) before timing. Run from the repository root:

    .venv/bin/python bench/bench_codec.py [--out bench/results/codec.txt]

Times are CPU seconds of this process (time.process_time), the best of --repeats runs with the
two encoders alternating: the machine may be shared, and CPU time is steadier than the wall
clock under load (the load average is printed before and after).
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

from store.encoding import decode_chunk, encode_chunk
from store.encoding_fast import decode_chunks, encode_chunks

CASES = [  # (name, chunks, samples per chunk)
    ("realistic flush: 10,000 chunks x 120 samples (30 min of 15 s scrapes)", 10_000, 120),
    ("one-minute flush: 10,000 chunks x 4 samples", 10_000, 4),
    ("long chunks: 3,000 chunks x 400 samples", 3_000, 400),
]
SWEEP = [5, 10, 30, 100, 1_000, 10_000]  # chunks of 120 samples per call


def _best(fs: list[Callable[[], object]], repeats: int) -> list[float]:
    """The best CPU time of each function, running them in turn `repeats` times."""
    best = [float("inf")] * len(fs)
    for _ in range(repeats):
        for i, f in enumerate(fs):
            t = time.process_time()
            f()
            best[i] = min(best[i], time.process_time() - t)
    return best


def _flatten(
    series: list[tuple[str, str, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ts = np.concatenate([s[2] for s in series])
    x = np.concatenate([s[3] for s in series])
    bounds = np.concatenate(([0], np.cumsum([len(s[2]) for s in series])))
    return ts, x, bounds


def bench_case(name: str, chunks: int, n: int, repeats: int, out: Callable[[str], None]) -> None:
    series = make_series(chunks, n, 5.0)
    ts, x, bounds = _flatten(series)
    total = len(ts)
    one: list[bytes] = []
    batch: list[bytes] = []

    def per_chunk() -> None:
        one[:] = [encode_chunk(s[2], s[3]) for s in series]

    def batched() -> None:
        batch[:] = encode_chunks(ts, x, bounds)

    t1, tb = _best([per_chunk, batched], repeats)
    same = sum(a == b for a, b in zip(one, batch, strict=True))
    size1, sizeb = sum(map(len, one)), sum(map(len, batch))
    td1, tdb = _best(
        [lambda: [decode_chunk(b) for b in batch], lambda: decode_chunks(batch)], repeats
    )
    dts, dx, _ = decode_chunks(batch)
    exact = np.array_equal(dts, ts) and np.array_equal(dx.view(np.uint64), x.view(np.uint64))
    out(name)
    us1, usb = t1 * 1e6 / chunks, tb * 1e6 / chunks
    out(
        f"  encode_chunk per chunk {total / t1:>12,.0f} samples/s  ({us1:6.1f} us/chunk)"
        f"  {size1 / total:.3f} bytes/sample"
    )
    out(
        f"  encode_chunks          {total / tb:>12,.0f} samples/s  ({usb:6.1f} us/chunk)"
        f"  {sizeb / total:.3f} bytes/sample   x{t1 / tb:.1f}"
    )
    out(f"  identical bytes: {same:,} of {chunks:,} chunks")
    ud1, udb = td1 * 1e6 / chunks, tdb * 1e6 / chunks
    out(f"  decode_chunk per chunk {total / td1:>12,.0f} samples/s  ({ud1:6.1f} us/chunk)")
    out(
        f"  decode_chunks          {total / tdb:>12,.0f} samples/s  ({udb:6.1f} us/chunk)"
        f"   x{td1 / tdb:.1f}   bit-exact: {exact}"
    )
    out("")


def bench_sweep(repeats: int, out: Callable[[str], None]) -> None:
    out("batch size (120-sample chunks per call): encode_chunk loop vs encode_chunks, samples/s")
    series = make_series(max(SWEEP), 120, 5.0)
    for c in SWEEP:
        part = series[:c]
        ts, x, bounds = _flatten(part)
        t1, tb = _best(
            [
                lambda part=part: [encode_chunk(s[2], s[3]) for s in part],
                lambda ts=ts, x=x, b=bounds: encode_chunks(ts, x, b),
            ],
            repeats,
        )
        out(f"  {c:>6,} chunks  {len(ts) / t1:>12,.0f}  {len(ts) / tb:>12,.0f}   x{t1 / tb:.1f}")
    out("")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, help="also write the report to this file")
    args = ap.parse_args(argv)
    lines: list[str] = []

    def out(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    out(
        f"FiloPy codec benchmark, {time.strftime('%Y-%m-%d %H:%M')}, Python "
        f"{platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs"
    )
    out(
        "command: .venv/bin/python bench/bench_codec.py"
        + (f" --out {args.out}" if args.out else "")
    )
    load = os.getloadavg()[0]
    out(f"load average (1 min) before: {load:.1f} (the machine is shared: absolute figures vary)")
    out("15 s scrapes, 5 ms jitter; half gauges, half counters (bench_stores.make_series)")
    out(f"CPU time of this process, best of {args.repeats} alternating runs")
    out("")
    decode_chunks(encode_chunks(np.arange(10), np.arange(10) / 10, [0, 2, 10]))  # compile/load
    for name, chunks, n in CASES:
        bench_case(name, chunks, n, args.repeats, out)
    bench_sweep(args.repeats, out)
    out(f"load average (1 min) after: {os.getloadavg()[0]:.1f}")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

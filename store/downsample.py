"""Downsampling: many series' raw samples summarised per period of a coarser resolution.

A period of resolution `r` is the left-open interval (p - r, p] for p a multiple of r, the shape
of a PromQL range window: a window (t - range, t] whose end t and length are multiples of r is
exactly the union of whole periods, so a range function over it can be computed from the
periods alone. Each period keeps what the functions answered from it need (docs/lifecycle.md):

* gauges: count, sum, min, max (avg = sum / count), the last sample (`last_over_time`);
* counters: the first and last sample, the values added back at resets inside the period
  (`corrections`) and how many resets and changes it holds: with the joins between neighbouring
  periods (a reset or change from one period's last sample to the next one's first), that is all
  of Prometheus's extrapolated `rate`, `increase` and `delta`, `resets` and `changes` need;
* the second-to-last sample, for `irate` and `idelta`.

Every column is computed for every series (the store does not know a gauge from a counter, and
a classic histogram's buckets are counters like any other). Staleness markers are not samples to
range functions, so they are dropped first; other NaNs are values, kept as Prometheus keeps them
(a NaN in a sum makes it NaN; min and max ignore NaN unless all are). Pure NumPy: no loop per
sample or per series.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import zstandard

from core.staleness import is_stale
from store import encoding

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

MINUTE_MS = 60_000
DEFAULT_RESOLUTIONS_MS = (5 * MINUTE_MS, 60 * MINUTE_MS)
NO_TIME = np.iinfo(np.int64).min  # `prev_t` of a period with one sample


@dataclass(frozen=True, eq=False)
class Periods:
    """The periods of many series: series i owns rows `bounds[i]:bounds[i + 1]`, ascending by
    `end`; only periods holding at least one sample exist."""

    resolution_ms: int
    end: I64  # p: the period is (p - resolution_ms, p]
    count: I64
    first_t: I64
    first_v: F64
    last_t: I64
    last_v: F64
    prev_t: I64  # the second-to-last sample (NO_TIME and NaN when count == 1)
    prev_v: F64
    min: F64
    max: F64
    sum: F64
    corrections: F64  # sum of the value before each drop inside the period (counter resets)
    resets: I64  # pairs inside the period whose value dropped
    changes: I64  # pairs inside the period whose value changed (two NaNs are no change)
    bounds: I64

    @property
    def n_series(self) -> int:
        return len(self.bounds) - 1

    def __len__(self) -> int:
        return len(self.end)


def period_ends(ts: I64, resolution_ms: int) -> I64:
    """The end of the period holding each time: the least multiple of the resolution >= t."""
    if resolution_ms <= 0:
        raise ValueError(f"resolution must be positive, got {resolution_ms} ms")
    return -(-np.asarray(ts, np.int64) // resolution_ms) * resolution_ms


def summarise(ts: I64, vals: F64, bounds: I64, resolution_ms: int) -> Periods:
    """The periods of the series whose samples are `ts[bounds[i]:bounds[i + 1]]` (ascending
    times per series), staleness markers dropped."""
    ts = np.asarray(ts, np.int64)
    vals = np.asarray(vals, np.float64)
    bounds = np.asarray(bounds, np.int64)
    keep = ~is_stale(vals)
    if not keep.all():
        ts, vals = ts[keep], vals[keep]
        bounds = np.concatenate([[0], np.cumsum(keep)])[bounds].astype(np.int64)
    ends = period_ends(ts, resolution_ms)
    n = len(ts)
    series_of = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    starts_group = np.ones(n, bool)
    if n > 1:
        starts_group[1:] = (ends[1:] != ends[:-1]) | (series_of[1:] != series_of[:-1])
    starts = np.flatnonzero(starts_group)
    stops = np.append(starts[1:], n)
    count = (stops - starts).astype(np.int64)
    last = stops - 1
    has_prev = count >= 2
    prev = np.where(has_prev, stops - 2, 0)
    pair = ~starts_group  # sample k closes a pair (k - 1, k) inside its period
    a = np.concatenate([[np.nan], vals[:-1]]) if n else vals
    with np.errstate(invalid="ignore"):
        drop = pair & (vals < a)
        change = pair & (vals != a) & ~(np.isnan(a) & np.isnan(vals))
    group_of_series = np.searchsorted(starts, bounds, side="left")
    if n == 0:
        empty_f, empty_i = np.empty(0, np.float64), np.empty(0, np.int64)
        return Periods(
            resolution_ms, empty_i, empty_i, empty_i, empty_f, empty_i, empty_f, empty_i,
            empty_f, empty_f, empty_f, empty_f, empty_f, empty_i, empty_i,
            np.zeros(len(bounds), np.int64),
        )  # fmt: skip
    return Periods(
        resolution_ms=resolution_ms,
        end=ends[starts],
        count=count,
        first_t=ts[starts],
        first_v=vals[starts],
        last_t=ts[last],
        last_v=vals[last],
        prev_t=np.where(has_prev, ts[prev], NO_TIME),
        prev_v=np.where(has_prev, vals[prev], np.nan),
        min=np.fmin.reduceat(vals, starts),
        max=np.fmax.reduceat(vals, starts),
        sum=np.add.reduceat(vals, starts),
        corrections=np.add.reduceat(np.where(drop, a, 0.0), starts),
        resets=np.add.reduceat(drop.astype(np.int64), starts),
        changes=np.add.reduceat(change.astype(np.int64), starts),
        bounds=group_of_series.astype(np.int64),
    )


# ------------------------------------------------------------------------------------- records

_RECORD_VERSION = 2
# A period's row, little-endian: the end (a delta from the series' previous period, the first
# end itself), six int32s, seven float64s XORed with the series' previous row: 88 bytes.
_ROW = np.dtype(
    [("end", "<i8"), ("count", "<i4"), ("first_t", "<i4"), ("last_t", "<i4"),
     ("prev_t", "<i4"), ("resets", "<i4"), ("changes", "<i4"), ("first_v", "<u8"),
     ("last_v", "<u8"), ("prev_v", "<u8"), ("min", "<u8"), ("max", "<u8"), ("sum", "<u8"),
     ("corrections", "<u8")]
)  # fmt: skip
_FLOATS = ("first_v", "last_v", "prev_v", "min", "max", "sum", "corrections")
_MAX_RECORD_PERIODS = 1 << 20  # bounds what a corrupt header can make the decoder allocate


class _Zstd(threading.local):
    """zstd (de)compressors are not shared between threads."""

    def __init__(self) -> None:
        self.c = zstandard.ZstdCompressor(level=3)
        self.d = zstandard.ZstdDecompressor()


_zstd = _Zstd()


def series_periods(periods: Periods, i: int) -> Periods:
    """Series `i`'s periods alone."""
    a, b = int(periods.bounds[i]), int(periods.bounds[i + 1])
    cols = {name: getattr(periods, name)[a:b] for name in _ARRAYS}
    return Periods(periods.resolution_ms, **cols, bounds=np.array([0, b - a], np.int64))


def encode_records(periods: Periods) -> list[bytes]:
    """Every series' periods as one record each (b"" for a series without any).

    Rows of fixed width, transformed for all series at once (times as small offsets inside
    their periods, ends and floats as differences from the series' previous row, so steady
    series give runs of zero bytes), then each record's rows transposed byte by byte (byte
    planes: what changes little lines up) and zstd-compressed. Bit-exact (NaN payloads
    included). One zstd call and a few NumPy slices a record, no loop per period: cheap enough
    to run on the flush thread (bench/bench_downsample.py)."""
    res, n = periods.resolution_ms, len(periods)
    if res >= 1 << 31:
        raise ValueError(f"a resolution fits int32 milliseconds, got {res}")
    firsts = periods.bounds[:-1][periods.bounds[:-1] < periods.bounds[1:]]
    rows = np.empty(n, _ROW)
    end = periods.end
    rows["end"] = np.diff(end, prepend=0)
    rows["end"][firsts] = end[firsts]
    rows["count"] = periods.count
    rows["first_t"] = periods.first_t - (end - res)
    rows["last_t"] = end - periods.last_t
    rows["prev_t"] = np.where(periods.count < 2, 0, end - periods.prev_t)
    rows["resets"] = periods.resets
    rows["changes"] = periods.changes
    for name in _FLOATS:
        bits = getattr(periods, name).view(np.uint64)
        before = np.concatenate([np.zeros(1, np.uint64), bits[:-1]])
        before[firsts] = 0
        rows[name] = bits ^ before
    raw = rows.view(np.uint8).reshape(n, _ROW.itemsize)
    out = []
    for a, b in zip(periods.bounds[:-1].tolist(), periods.bounds[1:].tolist(), strict=True):
        if a == b:
            out.append(b"")
            continue
        frame = _zstd.c.compress(raw[a:b].T.tobytes())
        head = bytearray((_RECORD_VERSION,))
        for v in (res, b - a, len(frame)):
            encoding.uvarint(v, head)
        out.append(bytes(head) + frame)
    return out


def encode_periods(periods: Periods) -> bytes:
    """One series' periods (`series_periods`) as a record (`encode_records`)."""
    if periods.n_series != 1 or len(periods) == 0:
        raise ValueError("encode_periods takes the non-empty periods of one series")
    return encode_records(periods)[0]


def decode_periods(data: bytes) -> Periods:
    """The periods a record holds; ValueError if the bytes are corrupt."""
    r = encoding.HeadReader(data)
    if r.uvarint() != _RECORD_VERSION:
        raise ValueError("unsupported downsampled record version")
    res, n, frame_size = r.uvarint(), r.uvarint(), r.uvarint()
    if not 0 < res < 1 << 31 or not 1 <= n <= _MAX_RECORD_PERIODS:
        raise ValueError(f"corrupt downsampled record: resolution {res}, {n} periods")
    frame = r.rest()
    if len(frame) != frame_size:
        raise ValueError("corrupt downsampled record: truncated or trailing bytes")
    size = n * _ROW.itemsize
    try:
        raw = _zstd.d.decompress(frame, max_output_size=size)
    except zstandard.ZstdError as e:
        raise ValueError(f"corrupt downsampled record: {e}") from e
    if len(raw) != size:
        raise ValueError("corrupt downsampled record: wrong size")
    rows = np.frombuffer(raw, np.uint8).reshape(_ROW.itemsize, n).T.copy().view(_ROW).ravel()
    end = np.cumsum(rows["end"].astype(np.int64))
    count = rows["count"].astype(np.int64)
    floats = {
        name: np.bitwise_xor.accumulate(rows[name].astype(np.uint64)).view(np.float64)
        for name in _FLOATS
    }
    return Periods(
        res, end=end, count=count,
        first_t=end - res + rows["first_t"], last_t=end - rows["last_t"],
        prev_t=np.where(count < 2, NO_TIME, end - rows["prev_t"]),
        resets=rows["resets"].astype(np.int64), changes=rows["changes"].astype(np.int64),
        **floats, bounds=np.array([0, n], np.int64),
    )  # fmt: skip


_ARRAYS = (
    "end", "count", "first_t", "first_v", "last_t", "last_v", "prev_t", "prev_v",
    "min", "max", "sum", "corrections", "resets", "changes",
)  # fmt: skip


def within(periods: Periods, first_end: int, last_end: int) -> Periods:
    """The periods (of one or many series) whose ends are in [first_end, last_end]."""
    keep = (periods.end >= first_end) & (periods.end <= last_end)
    if keep.all():
        return periods
    kept = np.concatenate([[0], np.cumsum(keep)])[periods.bounds].astype(np.int64)
    cols = {name: getattr(periods, name)[keep] for name in _ARRAYS}
    return Periods(periods.resolution_ms, **cols, bounds=kept)


def concat_series(per_series: Sequence[Sequence[Periods]], resolution_ms: int) -> Periods:
    """One batch of many series from each series' parts (single-series periods, in time order,
    not overlapping): series i is the concatenation of `per_series[i]`."""
    parts = [p for series in per_series for p in series]
    sizes = np.array([sum(len(p) for p in series) for series in per_series], np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if not parts:
        return summarise(np.empty(0, np.int64), np.empty(0), bounds, resolution_ms)
    cols = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _ARRAYS}
    return Periods(resolution_ms, **cols, bounds=bounds)


# Decoded records, most recently used first: dashboards ask for the same windows again and again
# (as `store.api` caches decoded chunks). Keyed by the record's bytes, which never change.
@functools.lru_cache(maxsize=4096)
def decoded_periods(data: bytes) -> Periods:
    """`decode_periods`, cached (the arrays are shared: read only)."""
    periods = decode_periods(data)
    for name in _ARRAYS:
        getattr(periods, name).flags.writeable = False
    return periods

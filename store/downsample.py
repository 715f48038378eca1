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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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

_RECORD_VERSION = 1
_INT_COLUMNS = ("count", "resets", "changes")
_FLOAT_COLUMNS = ("first_v", "last_v", "prev_v", "min", "max", "sum", "corrections")


def series_periods(periods: Periods, i: int) -> Periods:
    """Series `i`'s periods alone."""
    a, b = int(periods.bounds[i]), int(periods.bounds[i + 1])
    cols = {name: getattr(periods, name)[a:b] for name in _ARRAYS}
    return Periods(periods.resolution_ms, **cols, bounds=np.array([0, b - a], np.int64))


def encode_periods(periods: Periods) -> bytes:
    """One series' periods (`series_periods`) as bytes, with the chunk format's streams: the
    ends as deltas, the sample times as small offsets inside their periods, every float
    bit-exact."""
    if periods.n_series != 1 or len(periods) == 0:
        raise ValueError("encode_periods takes the non-empty periods of one series")
    res = periods.resolution_ms
    out = bytearray((_RECORD_VERSION,))
    encoding.uvarint(res, out)
    encoding.uvarint(len(periods), out)
    encoding.put_int_column(periods.end, out)
    encoding.put_int_column(periods.first_t - (periods.end - res), out)
    encoding.put_int_column(periods.end - periods.last_t, out)
    one = periods.count < 2
    encoding.put_int_column(np.where(one, 0, periods.end - periods.prev_t), out)
    for name in _INT_COLUMNS:
        encoding.put_int_column(getattr(periods, name), out)
    for name in _FLOAT_COLUMNS:
        encoding.put_float_column(getattr(periods, name), out)
    return bytes(out)


def decode_periods(data: bytes) -> Periods:
    """The periods `encode_periods` wrote; ValueError if the bytes are corrupt."""
    r = encoding.ColumnReader(data)
    if r.uvarint() != _RECORD_VERSION:
        raise ValueError("unsupported downsampled record version")
    res, n = r.uvarint(), r.uvarint()
    if res <= 0 or not 1 <= n <= encoding.MAX_SAMPLES:
        raise ValueError(f"corrupt downsampled record: resolution {res}, {n} periods")
    end = r.ints(n)
    first_t = end - res + r.ints(n)
    last_t = end - r.ints(n)
    prev_offset = r.ints(n)
    ints = {name: r.ints(n) for name in _INT_COLUMNS}
    floats = {name: r.floats(n) for name in _FLOAT_COLUMNS}
    r.finish()
    prev_t = np.where(ints["count"] < 2, NO_TIME, end - prev_offset)
    return Periods(
        res, end=end, first_t=first_t, last_t=last_t, prev_t=prev_t, **ints, **floats,
        bounds=np.array([0, n], np.int64),
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

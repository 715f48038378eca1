"""Sample windows of many series at many steps, and the PromQL functions computed on them.

Everything here works on a `SampleBatch` (all selected series concatenated into flat arrays) and
returns a values array of shape (n_series, n_steps) with NaN where a step has no value. Windows are
found for all (series, step) pairs with one `searchsorted` over series-tagged keys, and window
reductions loop only over the offset within a window, so no Python loop runs per sample, per
series or per step.

Windows are left-open, as in Prometheus 3: an instant selector sees samples in
(t - offset - lookback, t - offset], a range selector in (t - offset - range, t - offset].
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

# Largest search key: series are processed in chunks so that keys stay below it.
_KEY_LIMIT = 1 << 62


class _SeriesLike(Protocol):
    labels: Mapping[str, str]
    ts: npt.NDArray[np.int64]
    vals: npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class SampleBatch:
    """Raw samples of many series: series i owns `ts[bounds[i]:bounds[i + 1]]` (ascending)."""

    labels: list[dict[str, str]]
    ts: I64
    vals: F64
    bounds: I64

    @property
    def n_series(self) -> int:
        return len(self.labels)

    @classmethod
    def from_series(cls, series: Iterable[_SeriesLike], start_ms: int, end_ms: int) -> SampleBatch:
        """Concatenate the samples in [start_ms, end_ms] of each series.

        NaN samples are dropped: FiloPy has no staleness markers, and NaN means "no value" in
        every result, so a NaN sample is treated as absent rather than as a value.
        """
        labels: list[dict[str, str]] = []
        ts_parts: list[I64] = []
        val_parts: list[F64] = []
        for s in series:
            ts = np.asarray(s.ts, dtype=np.int64)
            vals = np.asarray(s.vals, dtype=np.float64)
            keep = (ts >= start_ms) & (ts <= end_ms) & ~np.isnan(vals)
            if not keep.any():
                continue
            labels.append(dict(s.labels))
            ts_parts.append(ts[keep])
            val_parts.append(vals[keep])
        sizes = np.array([len(t) for t in ts_parts], dtype=np.int64)
        bounds = np.concatenate([np.zeros(1, np.int64), np.cumsum(sizes)])
        if ts_parts:
            return cls(labels, np.concatenate(ts_parts), np.concatenate(val_parts), bounds)
        return cls(labels, np.empty(0, np.int64), np.empty(0, np.float64), bounds)


def window_bounds(batch: SampleBatch, upper: I64, width: int) -> tuple[I64, I64]:
    """Sample index ranges [lo, hi) of the windows (upper - width, upper] of every series.

    Both results have shape (n_series, n_steps) and index into the batch's flat arrays.
    Keys `series * M + (ts - base)` are ascending over the whole batch, so one searchsorted finds
    every boundary; series are processed in chunks small enough for the keys to fit int64.
    """
    n, m = batch.n_series, len(upper)
    lo = np.zeros((n, m), np.int64)
    hi = np.zeros((n, m), np.int64)
    if n == 0 or m == 0:
        return lo, hi
    base = int(upper.min()) - width - 1
    span = int(upper.max()) - base + 1
    stride = span + 1
    rel_ts = np.clip(batch.ts - base, 0, span)  # clipping keeps out-of-window samples outside
    q_lo = (upper - width - base).astype(np.int64)
    q_hi = (upper - base).astype(np.int64)
    per_chunk = max(1, _KEY_LIMIT // stride)
    for s0 in range(0, n, per_chunk):
        s1 = min(n, s0 + per_chunk)
        a, b = int(batch.bounds[s0]), int(batch.bounds[s1])
        sid = np.repeat(np.arange(s1 - s0, dtype=np.int64), np.diff(batch.bounds[s0 : s1 + 1]))
        keys = sid * stride + rel_ts[a:b]
        offs = np.arange(s1 - s0, dtype=np.int64)[:, None] * stride
        lo[s0:s1] = np.searchsorted(keys, offs + q_lo[None, :], side="right") + a
        hi[s0:s1] = np.searchsorted(keys, offs + q_hi[None, :], side="right") + a
    return lo, hi


def window_reduce(vals: F64, lo: I64, hi: I64, how: str) -> F64:
    """Sum, min or max of `vals[lo:hi]` for every window (empty windows give the identity).

    Windows are folded one sample offset at a time, over all windows still that long: the work
    is the number of window samples, and each window is summed left to right, so its result
    never depends on which other series share the batch (as it would with padded blocks).
    """
    fill = {"sum": 0.0, "min": np.inf, "max": -np.inf}[how]
    shape = lo.shape
    lo_f, width = lo.ravel(), (hi - lo).ravel()
    out = np.full(len(lo_f), fill)
    rows = np.flatnonzero(width > 0)
    k = 0
    while len(rows):
        x = vals[lo_f[rows] + k]
        if how == "sum":
            out[rows] += x
        elif how == "min":
            out[rows] = np.minimum(out[rows], x)
        else:
            out[rows] = np.maximum(out[rows], x)
        k += 1
        rows = rows[width[rows] > k]
    return out.reshape(shape)


def instant_values(batch: SampleBatch, times: I64, offset_ms: int, lookback_ms: int) -> F64:
    """The latest sample in (t - offset - lookback, t - offset] per series and step."""
    lo, hi = window_bounds(batch, times - offset_ms, lookback_ms)
    if len(batch.vals) == 0:
        return np.full(lo.shape, np.nan)
    return np.where(hi > lo, batch.vals[np.maximum(hi - 1, 0)], np.nan)


def range_function(func: str, batch: SampleBatch, times: I64, range_ms: int, offset_ms: int) -> F64:
    """`func` over the range window (t - offset - range, t - offset] per series and step."""
    upper = times - offset_ms
    lo, hi = window_bounds(batch, upper, range_ms)
    count = hi - lo
    if len(batch.vals) == 0:
        return np.full(lo.shape, np.nan)
    vals = batch.vals
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        match func:
            case "count_over_time":
                return np.where(count > 0, count.astype(np.float64), np.nan)
            case "sum_over_time":
                return np.where(count > 0, window_reduce(vals, lo, hi, "sum"), np.nan)
            case "avg_over_time":
                return np.where(count > 0, window_reduce(vals, lo, hi, "sum") / count, np.nan)
            case "min_over_time":
                return np.where(count > 0, window_reduce(vals, lo, hi, "min"), np.nan)
            case "max_over_time":
                return np.where(count > 0, window_reduce(vals, lo, hi, "max"), np.nan)
            case "last_over_time":
                return np.where(count > 0, vals[np.maximum(hi - 1, 0)], np.nan)
            case "irate":
                return _irate(batch, lo, hi)
            case "rate" | "increase" | "delta":
                counter = func != "delta"
                return _extrapolated_rate(batch, lo, hi, upper, range_ms, counter, func == "rate")
    raise ValueError(f"not a range function: {func}")


def _reset_corrections(batch: SampleBatch) -> F64:
    """Per sample: the previous value if the counter reset there (Prometheus adds it back)."""
    vals = batch.vals
    corr = np.zeros(len(vals))
    if len(vals) < 2:
        return corr
    reset = vals[1:] < vals[:-1]
    corr[1:] = np.where(reset, vals[:-1], 0.0)
    starts = batch.bounds[:-1]
    corr[starts[starts < len(vals)]] = 0.0  # a series' first sample has no predecessor
    return corr


def _extrapolated_rate(
    batch: SampleBatch,
    lo: I64,
    hi: I64,
    upper: I64,
    range_ms: int,
    counter: bool,
    per_second: bool,
) -> F64:
    """Prometheus's extrapolatedRate for rate, increase (counters) and delta (gauges)."""
    count = hi - lo
    ok = count >= 2
    i0 = np.where(ok, lo, 0)
    i1 = np.where(ok, hi - 1, 0)
    v0, v1 = batch.vals[i0], batch.vals[i1]
    t0, t1 = batch.ts[i0], batch.ts[i1]
    result = v1 - v0
    if counter:
        corr = _reset_corrections(batch)
        if corr.any():
            result = result + window_reduce(corr, lo + 1, np.maximum(hi, lo + 1), "sum")
    dur_start = (t0 - (upper - range_ms)[None, :]) / 1000.0
    dur_end = (upper[None, :] - t1) / 1000.0
    sampled = (t1 - t0) / 1000.0
    avg_interval = sampled / np.maximum(count - 1, 1)
    threshold = avg_interval * 1.1
    dur_start = np.where(dur_start >= threshold, avg_interval / 2, dur_start)
    if counter:
        # Counters cannot go below zero: do not extrapolate the start past the zero point.
        to_zero = sampled * (v0 / result)
        use_zero = (result > 0) & (v0 >= 0) & (to_zero < dur_start)
        dur_start = np.where(use_zero, to_zero, dur_start)
    dur_end = np.where(dur_end >= threshold, avg_interval / 2, dur_end)
    factor = (sampled + dur_start + dur_end) / sampled
    if per_second:
        factor = factor / (range_ms / 1000.0)
    return np.where(ok, result * factor, np.nan)


def _irate(batch: SampleBatch, lo: I64, hi: I64) -> F64:
    """Per-second rate between the last two samples; after a reset, the last value itself."""
    ok = (hi - lo) >= 2
    i1 = np.where(ok, hi - 1, 0)
    i0 = np.where(ok, hi - 2, 0)
    v0, v1 = batch.vals[i0], batch.vals[i1]
    dt = (batch.ts[i1] - batch.ts[i0]) / 1000.0
    diff = np.where(v1 < v0, v1, v1 - v0)
    return np.where(ok & (dt != 0), diff / np.where(dt != 0, dt, 1.0), np.nan)


def math_function(func: str, values: F64, bound: F64 | None = None) -> F64:
    """Elementwise functions of an instant vector; `bound` is clamp_*'s per-step scalar."""
    with np.errstate(invalid="ignore"):
        match func:
            case "abs":
                return np.abs(values)
            case "ceil":
                return np.ceil(values)
            case "floor":
                return np.floor(values)
            case "round":
                return np.floor(values + 0.5)  # Prometheus rounds halves up, not to even
            case "clamp_min" | "clamp_max":
                assert bound is not None
                clamp = np.maximum if func == "clamp_min" else np.minimum
                return np.where(np.isnan(values), np.nan, clamp(values, bound[None, :]))
    raise ValueError(f"not a math function: {func}")

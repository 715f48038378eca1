"""Sample windows of many series at many steps, and the PromQL functions computed on them.

Everything here works on a `SampleBatch` (all selected series concatenated into flat arrays) and
returns a values array of shape (n_series, n_steps) and the mask of where a step has a value
(NaN is a value: a stored NaN sample, or `sqrt(-1)`; where there is none the values hold NaN).
Windows are found for all (series, step) pairs by one compiled kernel, and window reductions
loop only over the offset within a window, so no Python loop runs per sample, per series or per
step.

Windows are left-open, as in Prometheus 3: an instant selector sees samples in
(t - offset - lookback, t - offset], a range selector in (t - offset - range, t - offset].
Prometheus's staleness marker (`STALE_NAN`, one NaN bit pattern) ends a series: an instant
selector whose latest sample is one has no value, and range functions never see one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from core.jit import float_kernel, kernel, warms
from core.staleness import is_stale

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


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
        """Concatenate the samples in [start_ms, end_ms] of each series (NaN samples and
        staleness markers included: instant selectors need the markers, `without_stale` drops
        them for range functions)."""
        labels: list[dict[str, str]] = []
        ts_parts: list[I64] = []
        val_parts: list[F64] = []
        for s in series:
            ts = np.asarray(s.ts, dtype=np.int64)
            vals = np.asarray(s.vals, dtype=np.float64)
            a = int(np.searchsorted(ts, start_ms, side="left"))
            b = int(np.searchsorted(ts, end_ms, side="right"))
            if b <= a:
                continue
            labels.append(dict(s.labels))
            ts_parts.append(ts[a:b])
            val_parts.append(vals[a:b])
        sizes = np.array([len(t) for t in ts_parts], dtype=np.int64)
        bounds = np.concatenate([np.zeros(1, np.int64), np.cumsum(sizes)])
        if ts_parts:
            return cls(labels, np.concatenate(ts_parts), np.concatenate(val_parts), bounds)
        return cls(labels, np.empty(0, np.int64), np.empty(0, np.float64), bounds)

    def without_stale(self) -> SampleBatch:
        """The batch without staleness markers (what range functions see); series left with no
        sample keep their (empty) place, so rows still line up with `labels`."""
        stale = is_stale(self.vals)
        if not stale.any():
            return self
        kept = np.concatenate([[0], np.cumsum(~stale)])[self.bounds]
        return SampleBatch(self.labels, self.ts[~stale], self.vals[~stale], kept.astype(np.int64))


def window_bounds(batch: SampleBatch, upper: I64, width: int) -> tuple[I64, I64]:
    """Sample index ranges [lo, hi) of the windows (upper - width, upper] of every series.

    Both results have shape (n_series, n_steps) and index into the batch's flat arrays. One
    compiled pass (`_window_bounds`): on a small query the dozen NumPy calls this used to take
    were a fifth of a node's part in a live profile, mostly their fixed cost."""
    n, m = batch.n_series, len(upper)
    if n == 0 or m == 0:
        return np.zeros((n, m), np.int64), np.zeros((n, m), np.int64)
    return _window_bounds(
        np.ascontiguousarray(batch.ts, np.int64),
        np.ascontiguousarray(batch.bounds, np.int64),
        np.ascontiguousarray(upper, np.int64),
        np.int64(width),
    )


@kernel
def _after(ts: I64, a: int, b: int, x: int) -> int:
    """The first index in [a, b) of the ascending `ts` whose time is past `x` (else b)."""
    while a < b:
        mid = (a + b) >> 1
        if ts[mid] <= x:
            a = mid + 1
        else:
            b = mid
    return a


@kernel
def _window_bounds(ts: I64, bounds: I64, upper: I64, width: np.int64) -> tuple[I64, I64]:
    """Per series s and step j: the first sample past `upper[j] - width` and the first past
    `upper[j]`, searched in the series' samples; with ascending steps each search starts where
    the step before found its bound (a range query's windows move forward)."""
    n, m = bounds.shape[0] - 1, upper.shape[0]
    lo = np.empty((n, m), np.int64)
    hi = np.empty((n, m), np.int64)
    ascending = True
    for j in range(1, m):
        if upper[j] < upper[j - 1]:
            ascending = False
    for s in range(n):
        a, b = bounds[s], bounds[s + 1]
        p = q = a
        for j in range(m):
            if not ascending:
                p = q = a
            p = _after(ts, p, b, upper[j] - width)
            q = _after(ts, max(p, q), b, upper[j])
            lo[s, j] = p
            hi[s, j] = q
    return lo, hi


@warms
def _warm() -> None:
    """The window kernels, loaded (or compiled) before a node's first query needs them."""
    one, two = np.zeros(1, np.int64), np.array([0, 1], np.int64)
    lo, hi = _window_bounds(one, two, one, np.int64(0))
    _rate_windows(one, np.zeros(1), two, lo, hi, one, np.int64(1), True, True)


def window_offsets(lo: I64, hi: I64) -> Iterator[tuple[I64, I64]]:
    """For k = 0, 1, ...: the flat indices of the windows longer than k, and the sample index
    `lo + k` of their k-th sample. Folding a window reduction over these visits every window
    sample once, in time order, with no loop per sample, series or step."""
    lo_f, width = lo.ravel(), (hi - lo).ravel()
    rows = np.flatnonzero(width > 0)
    k = 0
    while len(rows):
        yield rows, lo_f[rows] + k
        k += 1
        rows = rows[width[rows] > k]


def window_reduce(vals: F64, lo: I64, hi: I64, how: str) -> F64:
    """Sum, min or max of `vals[lo:hi]` for every window (empty windows give 0 or NaN).

    Each window is folded left to right from 0.0 (sum) or NaN (min, max: fmin/fmax, so a NaN
    sample counts only if all are NaN, as in Prometheus), so its result never depends on which
    other series share the batch (as it would with padded blocks or pairwise sums). The work
    is the number of window samples: the first samples of every window, as many as the
    shortest non-empty window holds, are gathered at once (one row per offset) and folded row
    by row; the longer windows' rest is folded one offset at a time over those still that long.
    """
    op = {"sum": np.add, "min": np.fmin, "max": np.fmax}[how]
    lo_f, width = lo.ravel(), (hi - lo).ravel()
    out = np.full(lo.size, 0.0 if how == "sum" else np.nan)
    rows = np.flatnonzero(width > 0)
    k = int(width[rows].min()) if len(rows) else 0
    if k >= 2:
        offsets = np.arange(k)[:, None]
        per_block = max(1, _GATHER_SAMPLES // k)
        for r0 in range(0, len(rows), per_block):
            block_rows = rows[r0 : r0 + per_block]
            block = vals[lo_f[block_rows] + offsets]  # row j: each window's j-th sample
            acc = op(out[block_rows], block[0])
            for j in range(1, k):
                op(acc, block[j], out=acc)
            out[block_rows] = acc
        rows = rows[width[rows] > k]
    else:
        k = 0
    while len(rows):
        out[rows] = op(out[rows], vals[lo_f[rows] + k])
        k += 1
        rows = rows[width[rows] > k]
    return out.reshape(lo.shape)


# Window samples `window_reduce` gathers at once (8 bytes each): 16 MiB.
_GATHER_SAMPLES = 1 << 21


def _kahan_inc(inc: F64, total: F64, comp: F64) -> tuple[F64, F64]:
    """One step of Neumaier-compensated summation, as Prometheus's kahansum.Inc."""
    t = total + inc
    big = np.abs(total) >= np.abs(inc)
    c = comp + np.where(big, (total - t) + inc, (inc - t) + total)
    return t, np.where(np.isinf(t), 0.0, c)


def instant_values(
    batch: SampleBatch, times: I64, offset_ms: int, lookback_ms: int
) -> tuple[F64, Mask]:
    """The latest sample in (t - offset - lookback, t - offset] per series and step, and where
    there is one (a staleness marker there means none)."""
    lo, hi = window_bounds(batch, times - offset_ms, lookback_ms)
    if len(batch.vals) == 0:
        return np.full(lo.shape, np.nan), np.zeros(lo.shape, bool)
    latest = batch.vals[np.maximum(hi - 1, 0)]
    present = (hi > lo) & ~is_stale(latest)
    return np.where(present, latest, np.nan), present


def instant_timestamps(
    batch: SampleBatch, times: I64, offset_ms: int, lookback_ms: int
) -> tuple[F64, Mask]:
    """The timestamp (unix seconds) of the sample `instant_values` picks, per series and step."""
    lo, hi = window_bounds(batch, times - offset_ms, lookback_ms)
    if len(batch.ts) == 0:
        return np.full(lo.shape, np.nan), np.zeros(lo.shape, bool)
    last = np.maximum(hi - 1, 0)
    present = (hi > lo) & ~is_stale(batch.vals[last])
    return np.where(present, batch.ts[last] / 1000.0, np.nan), present


def range_function(
    func: str,
    batch: SampleBatch,
    times: I64,
    range_ms: int,
    offset_ms: int,
    param: F64 | None = None,
) -> tuple[F64, Mask]:
    """`func` over the range window (t - offset - range, t - offset] per series and step, and
    where it has a value; `param` is the per-step scalar of quantile_over_time and
    predict_linear. Staleness markers are not samples here."""
    batch = batch.without_stale()
    upper = times - offset_ms
    lo, hi = window_bounds(batch, upper, range_ms)
    count = hi - lo
    if len(batch.vals) == 0:
        return np.full(lo.shape, np.nan), np.zeros(lo.shape, bool)
    if func in ("deriv", "predict_linear", "rate", "increase", "delta"):
        present = count >= 2
    elif func in ("irate", "idelta"):
        i1, i0 = np.maximum(hi - 1, 0), np.maximum(hi - 2, 0)
        present = (count >= 2) & (batch.ts[i1] != batch.ts[i0])
    else:
        present = count > 0
    values = _range_values(func, batch, lo, hi, upper, range_ms, param, times)
    return np.where(present, values, np.nan), present


def _range_values(
    func: str,
    batch: SampleBatch,
    lo: I64,
    hi: I64,
    upper: I64,
    range_ms: int,
    param: F64 | None,
    times: I64,
) -> F64:
    vals = batch.vals
    count = hi - lo
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        match func:
            case "count_over_time":
                return count.astype(np.float64)
            case "present_over_time":
                return np.ones(lo.shape)
            case "sum_over_time":
                return window_reduce(vals, lo, hi, "sum")
            case "avg_over_time":
                return window_reduce(vals, lo, hi, "sum") / count
            case "min_over_time":
                return window_reduce(vals, lo, hi, "min")
            case "max_over_time":
                return window_reduce(vals, lo, hi, "max")
            case "last_over_time":
                return vals[np.maximum(hi - 1, 0)]
            case "stddev_over_time" | "stdvar_over_time":
                var = _window_variance(vals, lo, hi)
                return np.sqrt(var) if func == "stddev_over_time" else var
            case "quantile_over_time":
                assert param is not None
                return _window_quantile(vals, lo, hi, param)
            case "changes" | "resets":
                return _count_steps(batch, lo, hi, func)
            case "deriv":
                slope, _ = _linear_regression(batch, lo, hi, batch.ts[np.where(count > 0, lo, 0)])
                return slope
            case "predict_linear":
                assert param is not None
                origin = np.broadcast_to(times[None, :], lo.shape)
                slope, intercept = _linear_regression(batch, lo, hi, origin)
                return slope * param[None, :] + intercept
            case "irate" | "idelta":
                return _last_two(batch, lo, hi, per_second=func == "irate")
            case "rate" | "increase" | "delta":
                counter = func != "delta"
                return _extrapolated_rate(batch, lo, hi, upper, range_ms, counter, func == "rate")
    raise ValueError(f"not a range function: {func}")


def _window_variance(vals: F64, lo: I64, hi: I64) -> F64:
    """Population variance per window, by Welford's method with compensated sums in the order
    Prometheus's stdvar_over_time uses, so results agree with it to the last bit."""
    n = lo.size
    count, mean, c_mean, aux, c_aux = (np.zeros(n) for _ in range(5))
    for rows, idx in window_offsets(lo, hi):
        f = vals[idx]
        count[rows] += 1.0
        delta = f - (mean[rows] + c_mean[rows])
        mean[rows], c_mean[rows] = _kahan_inc(delta / count[rows], mean[rows], c_mean[rows])
        spread = delta * (f - (mean[rows] + c_mean[rows]))
        aux[rows], c_aux[rows] = _kahan_inc(spread, aux[rows], c_aux[rows])
    var = np.where(count > 0, (aux + c_aux) / np.maximum(count, 1.0), np.nan)
    return var.reshape(lo.shape)


# Window samples gathered at once by quantile_over_time (bounds its memory on long queries).
_QUANTILE_CHUNK = 1 << 22


def _window_quantile(vals: F64, lo: I64, hi: I64, q: F64) -> F64:
    """Prometheus's quantile (linear interpolation between the closest ranks) of each window.

    The samples of a chunk of windows are gathered into one flat array, tagged with their window
    and sorted by (window, value) with one lexsort; each window's two ranks are then picked."""
    shape = lo.shape
    lo_f, width = lo.ravel(), (hi - lo).ravel()
    q_f = np.broadcast_to(q[None, :], shape).ravel()
    out = np.full(lo_f.size, np.nan)
    windows = np.flatnonzero(width > 0)
    ends = np.cumsum(width[windows])
    start = 0
    while start < len(windows):
        done = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, done + _QUANTILE_CHUNK, side="right")))
        w = windows[start:stop]
        sizes = width[w]
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]])  # each window's start in `flat`
        owner = np.repeat(np.arange(len(w)), sizes)
        flat = vals[lo_f[w][owner] + (np.arange(len(owner)) - first[owner])]
        flat = flat[np.lexsort((flat, ~np.isnan(flat), owner))]  # NaN first, as Go sorts
        n = sizes.astype(np.float64)
        qw = q_f[w]
        rank = qw * (n - 1)
        lower = np.clip(np.floor(rank), 0, n - 1)
        upper = np.minimum(n - 1, lower + 1)
        weight = rank - np.floor(rank)
        ok = ~np.isnan(rank)
        lo_i = first + np.where(ok, lower, 0).astype(np.int64)
        hi_i = first + np.where(ok, upper, 0).astype(np.int64)
        res = flat[lo_i] * (1 - weight) + flat[hi_i] * weight
        res = np.where(qw < 0, -np.inf, np.where(qw > 1, np.inf, res))
        out[w] = np.where(np.isnan(qw), np.nan, res)
        start = stop
    return out.reshape(shape)


def _count_steps(batch: SampleBatch, lo: I64, hi: I64, func: str) -> F64:
    """changes (consecutive samples that differ) or resets (that decrease) per window, from a
    running count over the batch: the pairs inside [lo, hi) are those ending in (lo, hi)."""
    vals = batch.vals
    flag = np.zeros(len(vals), np.int64)
    if len(vals) > 1:
        a, b = vals[:-1], vals[1:]
        with np.errstate(invalid="ignore"):  # two NaNs in a row are no change (Prometheus)
            step = (b != a) & ~(np.isnan(a) & np.isnan(b)) if func == "changes" else b < a
        flag[1:] = step
        starts = batch.bounds[:-1]
        flag[starts[starts < len(vals)]] = 0  # a series' first sample has no predecessor
    running = np.concatenate([np.zeros(1, np.int64), np.cumsum(flag)])
    n = running[hi] - running[np.minimum(lo + 1, hi)]
    return np.where(hi > lo, n.astype(np.float64), np.nan)


def _linear_regression(
    batch: SampleBatch, lo: I64, hi: I64, origin_ms: npt.ArrayLike
) -> tuple[F64, F64]:
    """Least-squares slope (per second) and intercept at `origin_ms` of each window with two or
    more samples (NaN elsewhere), with Prometheus's sums: compensated, x in seconds from the
    origin, and a constant window giving slope 0 (NaN if the constant is infinite)."""
    shape = lo.shape
    origin = np.asarray(origin_ms, dtype=np.int64).ravel()
    sums = {k: np.zeros(lo.size) for k in ("x", "y", "xy", "x2")}
    comp = {k: np.zeros(lo.size) for k in sums}
    n = np.zeros(lo.size)
    first = batch.vals[np.where(hi > lo, lo, 0).ravel()]
    const = np.ones(lo.size, bool)
    for rows, idx in window_offsets(lo, hi):
        y = batch.vals[idx]
        x = (batch.ts[idx] - origin[rows]) / 1e3
        const[rows] &= y == first[rows]
        n[rows] += 1.0
        for key, inc in (("x", x), ("y", y), ("xy", x * y), ("x2", x * x)):
            sums[key][rows], comp[key][rows] = _kahan_inc(inc, sums[key][rows], comp[key][rows])
    sx, sy, sxy, sx2 = (sums[k] + comp[k] for k in ("x", "y", "xy", "x2"))
    cov = sxy - sx * sy / n
    var = sx2 - sx * sx / n
    slope = cov / var
    intercept = sy / n - slope * sx / n
    inf_const = np.isinf(first)
    slope = np.where(const, np.where(inf_const, np.nan, 0.0), slope)
    intercept = np.where(const, np.where(inf_const, np.nan, first), intercept)
    enough = n >= 2
    return (
        np.where(enough, slope, np.nan).reshape(shape),
        np.where(enough, intercept, np.nan).reshape(shape),
    )


def _extrapolated_rate(
    batch: SampleBatch,
    lo: I64,
    hi: I64,
    upper: I64,
    range_ms: int,
    counter: bool,
    per_second: bool,
) -> F64:
    """Prometheus's extrapolatedRate for rate, increase (counters) and delta (gauges): one
    compiled pass over every window (`_rate_windows`), bit for bit the NumPy formulation it
    replaced (tests/query/test_window_reduce.py)."""
    c = np.ascontiguousarray
    return _rate_windows(
        c(batch.ts, np.int64), c(batch.vals, np.float64), c(batch.bounds, np.int64),
        c(lo, np.int64), c(hi, np.int64), c(upper, np.int64),
        np.int64(range_ms), counter, per_second,
    )  # fmt: skip


@float_kernel
def _rate_windows(
    ts: I64,
    vals: F64,
    bounds: I64,
    lo: I64,
    hi: I64,
    upper: I64,
    range_ms: np.int64,
    counter: bool,
    per_second: bool,
) -> F64:
    """Each window's extrapolated rate (NaN under two samples). A counter's resets add back
    the value before the drop (summed from 0.0 in time order, as Prometheus does); if the
    batch holds no reset at all, nothing is added (so -0.0 stays -0.0, as before)."""
    n, m = lo.shape
    out = np.empty((n, m), np.float64)
    resets = False
    if counter:
        for s in range(n):
            for k in range(bounds[s] + 1, bounds[s + 1]):
                if vals[k] < vals[k - 1] and vals[k - 1] != 0.0:
                    resets = True
    for s in range(n):
        for j in range(m):
            a, b = lo[s, j], hi[s, j]
            count = b - a
            if count < 2:
                out[s, j] = np.nan
                continue
            v0, v1 = vals[a], vals[b - 1]
            result = v1 - v0
            if resets:
                added = 0.0
                for k in range(a + 1, b):
                    if vals[k] < vals[k - 1]:  # (else + 0.0: no change, `added` is never -0.0)
                        added = added + vals[k - 1]
                result = result + added
            out[s, j] = extrapolate(
                result, v0, ts[a], ts[b - 1], count, upper[j], range_ms, counter, per_second
            )
    return out


@float_kernel
def extrapolate(
    result: float,
    v0: float,
    t0: int,
    t1: int,
    count: int,
    upper: int,
    range_ms: np.int64,
    counter: bool,
    per_second: bool,
) -> float:
    """Prometheus's extrapolation of a window's raw increase `result` (first sample `v0` at
    `t0`, last at `t1`, `count` samples in (upper - range, upper]) to the whole window; per
    second for rate. Shared by raw windows and downsampled ones (query/downsampled.py)."""
    dur_start = np.float64(t0 - (upper - range_ms)) / 1000.0
    dur_end = np.float64(upper - t1) / 1000.0
    sampled = np.float64(t1 - t0) / 1000.0
    avg_interval = sampled / np.float64(count - 1)
    threshold = avg_interval * 1.1
    if dur_start >= threshold:
        dur_start = avg_interval / 2
    if counter:
        # Counters cannot go below zero: do not extrapolate the start past the zero point.
        to_zero = sampled * (v0 / result)
        if result > 0 and v0 >= 0 and to_zero < dur_start:
            dur_start = to_zero
    if dur_end >= threshold:
        dur_end = avg_interval / 2
    factor = (sampled + dur_start + dur_end) / sampled
    if per_second:
        factor = factor / (np.float64(range_ms) / 1000.0)
    return result * factor


def _last_two(batch: SampleBatch, lo: I64, hi: I64, per_second: bool) -> F64:
    """irate: per-second rate between the last two samples (after a reset, the last value
    itself); idelta: their difference. Nothing where they share a timestamp."""
    ok = (hi - lo) >= 2
    i1 = np.where(ok, hi - 1, 0)
    i0 = np.where(ok, hi - 2, 0)
    v0, v1 = batch.vals[i0], batch.vals[i1]
    dt = (batch.ts[i1] - batch.ts[i0]) / 1000.0
    rate = np.where(v1 < v0, v1, v1 - v0) / np.where(dt != 0, dt, 1.0)
    return np.where(ok & (dt != 0), rate if per_second else v1 - v0, np.nan)


_UNARY = {
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "sqrt": np.sqrt,
    "exp": np.exp,
    "ln": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
}


def math_function(
    func: str, values: F64, present: Mask, params: Sequence[F64] = ()
) -> tuple[F64, Mask]:
    """Elementwise functions of an instant vector, and where the result has a value (where the
    argument has one; clamp has none at steps where max < min); `params` are the per-step
    scalars of clamp_min/clamp_max (the bound), clamp (min, max) and round (to_nearest)."""
    if func == "clamp":
        low, high = (p[None, :] for p in params)
        present = present & ~(high < low)
        out = np.maximum(low, np.minimum(high, values))
        return np.where(present, out, np.nan), present
    return np.where(present, _math_values(func, values, params), np.nan), present


def _math_values(func: str, values: F64, params: Sequence[F64]) -> F64:
    rows = [p[None, :] for p in params]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if func in _UNARY:
            return _UNARY[func](values)
        match func:
            case "round":  # halves go up, not to even; the inverse is Prometheus's, for accuracy
                inverse = 1.0 / rows[0] if rows else 1.0
                return np.floor(values * inverse + 0.5) / inverse
            case "sgn":  # zeros keep their sign, as in Go
                return np.where(values == 0, values, np.sign(values))
            case "deg":
                return values * 180 / np.pi
            case "rad":
                return values * np.pi / 180
            case "clamp_min":
                return np.maximum(values, rows[0])
            case "clamp_max":
                return np.minimum(values, rows[0])
    raise ValueError(f"not a math function: {func}")


# Unix seconds beyond this are not dated (Go's int64 conversion is undefined there).
_MAX_DATE_S = 2.0**62


def unix_seconds(times_ms: I64) -> F64:
    """Evaluation times in whole seconds, truncated toward zero as Go's `ts / 1000`."""
    return np.trunc(times_ms / 1000.0)


def date_function(func: str, values: F64) -> F64:
    """A calendar field (UTC, proleptic Gregorian) of each value as unix seconds, truncated to a
    whole second as Prometheus does. Non-finite values and values past 2**62 s give nothing."""
    ok = np.isfinite(values) & (np.abs(values) < _MAX_DATE_S)
    secs = np.where(ok, np.trunc(np.where(ok, values, 0.0)), 0.0).astype(np.int64)
    days, rem = np.divmod(secs, 86_400)
    if func == "hour":
        out = rem // 3600
    elif func == "minute":
        out = rem % 3600 // 60
    elif func == "day_of_week":
        out = (days + 4) % 7  # 1970-01-01 was a Thursday; Sunday is 0
    else:
        year, month, day = _civil(days)
        leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
        match func:
            case "year":
                out = year
            case "month":
                out = month
            case "day_of_month":
                out = day
            case "days_in_month":
                out = np.where(month == 2, 28 + leap, 30 + ((month + (month > 7)) % 2))
            case "day_of_year":
                before = np.array([0, 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334])
                out = before[month] + day + ((month > 2) & leap)
            case _:
                raise ValueError(f"not a date function: {func}")
    return np.where(ok, out.astype(np.float64), np.nan)


def _civil(days: I64) -> tuple[I64, I64, I64]:
    """(year, month, day) of days since 1970-01-01, by Howard Hinnant's civil_from_days."""
    z = days + 719_468
    era = np.floor_divide(z, 146_097)
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    return year, month, day

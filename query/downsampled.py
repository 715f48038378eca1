"""PromQL range functions answered from downsampled periods (store/downsample.py) instead of
raw samples.

A window (t - range, t] whose end and length are multiples of the resolution is a union of whole
periods, so these functions give the raw answer from the periods (`EXACT`; up to the order of
floating-point additions for the sums, docs/lifecycle.md): the windows are found on the periods'
ends by the same kernel as raw windows (`window_bounds`), folded by the same reductions, and the
counter functions use the same extrapolation (`extrapolate`). Other functions (quantiles,
standard deviations, regressions) need every sample: `answer` refuses them, and the caller reads
raw data or says the answer is approximate.
"""

from __future__ import annotations

import numpy as np

from core.jit import float_kernel
from query.functions import F64, I64, Mask, SampleBatch, extrapolate, window_bounds, window_reduce
from store.downsample import Periods

EXACT = frozenset(
    {
        "count_over_time",
        "present_over_time",
        "sum_over_time",
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "last_over_time",
        "changes",
        "resets",
        "rate",
        "increase",
        "delta",
        "irate",
        "idelta",
    }
)


def aligned(resolution_ms: int, times: I64, range_ms: int, offset_ms: int) -> bool:
    """Whether every window (t - offset - range, t - offset] is a union of whole periods."""
    upper = np.asarray(times, np.int64) - offset_ms
    whole = range_ms > 0 and range_ms % resolution_ms == 0
    return whole and bool((upper % resolution_ms == 0).all())


def answer(
    func: str,
    periods: Periods,
    times: I64,
    range_ms: int,
    offset_ms: int = 0,
    approximate: bool = False,
) -> tuple[F64, Mask]:
    """`func` over (t - offset - range, t - offset] per series and step, from the periods, and
    where it has a value: the same shapes and values as `functions.range_function` on the raw
    samples the periods came from. `approximate`: windows need not be whole periods; each
    takes the periods whose ends it holds (off by less than a period at either end)."""
    if func not in EXACT:
        raise ValueError(f"{func} is not answered exactly from downsampled data")
    if not approximate and not aligned(periods.resolution_ms, times, range_ms, offset_ms):
        raise ValueError(
            f"windows of {range_ms} ms ending at the steps are not whole periods of "
            f"{periods.resolution_ms} ms"
        )
    upper = np.asarray(times, np.int64) - offset_ms
    if len(periods) == 0:
        shape = (periods.n_series, len(upper))
        return np.full(shape, np.nan), np.zeros(shape, bool)
    rows = SampleBatch([{}] * periods.n_series, periods.end, periods.last_v, periods.bounds)
    lo, hi = window_bounds(rows, upper, range_ms)
    n_periods = hi - lo
    running = np.concatenate([[0], np.cumsum(periods.count)])
    count = running[hi] - running[lo]
    last = np.maximum(hi - 1, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        match func:
            case "count_over_time":
                values = count.astype(np.float64)
            case "present_over_time":
                values = np.ones(lo.shape)
            case "sum_over_time":
                values = window_reduce(periods.sum, lo, hi, "sum")
            case "avg_over_time":
                values = window_reduce(periods.sum, lo, hi, "sum") / count
            case "min_over_time":
                values = window_reduce(periods.min, lo, hi, "min")
            case "max_over_time":
                values = window_reduce(periods.max, lo, hi, "max")
            case "last_over_time":
                values = periods.last_v[last]
            case "changes" | "resets":
                values = _steps(periods, lo, hi, func).astype(np.float64)
            case "irate" | "idelta":
                values = _last_two(periods, lo, hi, per_second=func == "irate")
            case _:  # rate, increase, delta
                values = _rate(periods, lo, hi, count, upper, range_ms, func)
    if func in ("rate", "increase", "delta"):
        present = count >= 2
    elif func in ("irate", "idelta"):
        present = (count >= 2) & _distinct_last_two(periods, lo, hi)
    else:
        present = n_periods > 0
    return np.where(present, values, np.nan), present


def _joins(periods: Periods) -> tuple[F64, I64, I64]:
    """Per period, what the pair (previous period's last sample, its first sample) adds: the
    value added back if it is a reset, and whether it is a reset, a change (0 for a series'
    first period)."""
    n = len(periods)
    corr, resets, changes = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.int64)
    if n > 1:
        a, b = periods.last_v[:-1], periods.first_v[1:]
        with np.errstate(invalid="ignore"):
            drop = b < a
            change = (b != a) & ~(np.isnan(a) & np.isnan(b))
        corr[1:] = np.where(drop, a, 0.0)
        resets[1:] = drop
        changes[1:] = change
        firsts = periods.bounds[:-1]
        firsts = firsts[firsts < n]
        corr[firsts], resets[firsts], changes[firsts] = 0.0, 0, 0
    return corr, resets, changes


def _steps(periods: Periods, lo: I64, hi: I64, func: str) -> I64:
    """changes or resets per window: those inside its periods and at the joins between them."""
    _, join_resets, join_changes = _joins(periods)
    inner, join = (
        (periods.resets, join_resets) if func == "resets" else (periods.changes, join_changes)
    )
    run_inner = np.concatenate([[0], np.cumsum(inner)])
    run_join = np.concatenate([[0], np.cumsum(join)])
    return (run_inner[hi] - run_inner[lo]) + (run_join[hi] - run_join[np.minimum(lo + 1, hi)])


def _rate(
    periods: Periods, lo: I64, hi: I64, count: I64, upper: I64, range_ms: int, func: str
) -> F64:
    counter = func != "delta"
    join_corr, join_resets, _ = _joins(periods)
    first, last = np.minimum(lo, len(periods) - 1), np.maximum(hi - 1, 0)
    result = periods.last_v[last] - periods.first_v[first]
    if counter and bool(periods.resets.any() or join_resets.any()):
        added = window_reduce(periods.corrections, lo, hi, "sum") + window_reduce(
            join_corr, np.minimum(lo + 1, hi), hi, "sum"
        )
        result = result + added
    return _extrapolate_all(
        result,
        periods.first_v[first],
        periods.first_t[first],
        periods.last_t[last],
        count,
        upper,
        np.int64(range_ms),
        counter,
        func == "rate",
    )


@float_kernel
def _extrapolate_all(
    result: F64,
    v0: F64,
    t0: I64,
    t1: I64,
    count: I64,
    upper: I64,
    range_ms: np.int64,
    counter: bool,
    per_second: bool,
) -> F64:
    n, m = result.shape
    out = np.full((n, m), np.nan)
    for s in range(n):
        for j in range(m):
            if count[s, j] >= 2:
                out[s, j] = extrapolate(
                    result[s, j], v0[s, j], t0[s, j], t1[s, j], count[s, j], upper[j],
                    range_ms, counter, per_second,
                )  # fmt: skip
    return out


def _last_two_samples(periods: Periods, lo: I64, hi: I64) -> tuple[I64, F64, I64, F64]:
    """Each window's last two samples (times and values; meaningless under two samples)."""
    last = np.maximum(hi - 1, 0)
    before = np.maximum(hi - 2, 0)
    inside = periods.count[last] >= 2
    t0 = np.where(inside, periods.prev_t[last], periods.last_t[before])
    v0 = np.where(inside, periods.prev_v[last], periods.last_v[before])
    return t0, v0, periods.last_t[last], periods.last_v[last]


def _distinct_last_two(periods: Periods, lo: I64, hi: I64) -> Mask:
    t0, _, t1, _ = _last_two_samples(periods, lo, hi)
    return t0 != t1


def _last_two(periods: Periods, lo: I64, hi: I64, per_second: bool) -> F64:
    """irate and idelta from the window's last two samples, as `functions._last_two`."""
    t0, v0, t1, v1 = _last_two_samples(periods, lo, hi)
    dt = (t1 - t0) / 1000.0
    rate = np.where(v1 < v0, v1, v1 - v0) / np.where(dt != 0, dt, 1.0)
    return np.where(dt != 0, rate if per_second else v1 - v0, np.nan)

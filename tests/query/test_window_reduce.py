"""Window sums, minima and maxima (sum/avg/min/max_over_time, rate's reset corrections) fold
every window's samples left to right from 0.0 or NaN, as Prometheus does: the gathered fast
path of `query.functions.window_reduce` must give those results to the last bit, for any
windows."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from query import functions as fn

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 1e-308, 0.1, 3.0]),
)


OPS = {"sum": (np.add, 0.0), "min": (np.fmin, np.nan), "max": (np.fmax, np.nan)}


def _sequential(vals: np.ndarray, lo: np.ndarray, hi: np.ndarray, how: str) -> np.ndarray:
    op, start = OPS[how]
    out = np.zeros(lo.size)
    for i, (a, b) in enumerate(zip(lo.ravel().tolist(), hi.ravel().tolist(), strict=True)):
        total = np.float64(start)
        for x in vals[a:b]:
            total = op(total, x)
        out[i] = total
    return out.reshape(lo.shape)


def _bits(x: np.ndarray, signed_zero: bool = True) -> list[int]:
    """The values' bits: any NaN as one NaN; 0.0 and -0.0 alike unless `signed_zero` (which of
    two equal zeros fmin/fmax keep differs between NumPy's vector and scalar loops)."""
    x = np.where(np.isnan(x), np.nan, x)
    if not signed_zero:
        x = np.where(x == 0, 0.0, x)
    return x.view(np.int64).ravel().tolist()


@given(
    vals=st.lists(VALUES, min_size=1, max_size=60),
    windows=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 12)), min_size=1, max_size=24),
    rows=st.sampled_from([1, 2, 3, 4]),
    block=st.sampled_from([1, 3, 1 << 21]),
    how=st.sampled_from(sorted(OPS)),
)
def test_window_folds_are_the_sequential_folds_bit_for_bit(
    vals: list[float], windows: list[tuple[int, int]], rows: int, block: int, how: str
) -> None:
    v = np.array(vals)
    n = len(v)
    lo = np.array([min(a, n) for a, _ in windows], np.int64)
    hi = np.minimum(lo + np.array([w for _, w in windows], np.int64), n)
    whole = len(lo) - len(lo) % rows or len(lo)  # as (series, steps) when it divides
    shape = (-1, rows) if whole % rows == 0 else (-1, 1)
    lo, hi = lo[:whole].reshape(shape), hi[:whole].reshape(shape)
    old = fn._GATHER_SAMPLES
    fn._GATHER_SAMPLES = block  # small blocks: the blocking too
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            got = fn.window_reduce(v, lo, hi, how)
            want = _sequential(v, lo, hi, how)
    finally:
        fn._GATHER_SAMPLES = old
    assert got.shape == lo.shape
    assert _bits(got, how == "sum") == _bits(want, how == "sum")


def test_a_window_of_negative_zeros_sums_to_positive_zero() -> None:
    """0.0 + -0.0 is 0.0: the fast path adds its first sample to 0.0 as the fold does."""
    v = np.array([-0.0, -0.0, -0.0, 5.0])
    got = fn.window_reduce(v, np.array([[0, 0]]), np.array([[3, 2]]), "sum")
    assert np.signbit(got).tolist() == [[False, False]]


@given(
    series=st.lists(
        st.lists(st.integers(-50, 50), max_size=12).map(sorted), min_size=1, max_size=5
    ),
    upper=st.lists(st.integers(-80, 80), min_size=1, max_size=8),
    ascending=st.booleans(),
    width=st.integers(0, 40),
)
def test_window_bounds_are_each_series_searched_alone(
    series: list[list[int]], upper: list[int], ascending: bool, width: int
) -> None:
    """The compiled `window_bounds` finds what `searchsorted` on each series alone finds, for
    ascending steps (a range query: searches resume) and any others, repeated times included."""
    sizes = [len(s) for s in series]
    bounds = np.zeros(len(series) + 1, np.int64)
    np.cumsum(sizes, out=bounds[1:])
    ts = np.array([t for s in series for t in s], np.int64)
    batch = fn.SampleBatch([{} for _ in series], ts, np.zeros(len(ts)), bounds)
    steps = np.array(sorted(upper) if ascending else upper, np.int64)
    lo, hi = fn.window_bounds(batch, steps, width)
    for i, s in enumerate(series):
        own = np.array(s, np.int64)
        a = int(bounds[i])
        assert lo[i].tolist() == (a + np.searchsorted(own, steps - width, "right")).tolist()
        assert hi[i].tolist() == (a + np.searchsorted(own, steps, "right")).tolist()


def _numpy_rate(
    batch: fn.SampleBatch,
    lo: np.ndarray,
    hi: np.ndarray,
    upper: np.ndarray,
    range_ms: int,
    counter: bool,
    per_second: bool,
) -> np.ndarray:
    """Prometheus's extrapolatedRate as the engine computed it in NumPy before the kernel (the
    formulation the kernel must match bit for bit)."""
    vals = batch.vals
    count = hi - lo
    ok = count >= 2
    i0, i1 = np.where(ok, lo, 0), np.where(ok, hi - 1, 0)
    v0, v1 = vals[i0], vals[i1]
    t0, t1 = batch.ts[i0], batch.ts[i1]
    result = v1 - v0
    if counter:
        corr = np.zeros(len(vals))
        if len(vals) >= 2:
            corr[1:] = np.where(vals[1:] < vals[:-1], vals[:-1], 0.0)
            starts = batch.bounds[:-1]
            corr[starts[starts < len(vals)]] = 0.0
        if corr.any():
            result = result + fn.window_reduce(corr, lo + 1, np.maximum(hi, lo + 1), "sum")
    dur_start = (t0 - (upper - range_ms)[None, :]) / 1000.0
    dur_end = (upper[None, :] - t1) / 1000.0
    sampled = (t1 - t0) / 1000.0
    avg_interval = sampled / np.maximum(count - 1, 1)
    threshold = avg_interval * 1.1
    dur_start = np.where(dur_start >= threshold, avg_interval / 2, dur_start)
    if counter:
        to_zero = sampled * (v0 / result)
        use_zero = (result > 0) & (v0 >= 0) & (to_zero < dur_start)
        dur_start = np.where(use_zero, to_zero, dur_start)
    dur_end = np.where(dur_end >= threshold, avg_interval / 2, dur_end)
    factor = (sampled + dur_start + dur_end) / sampled
    if per_second:
        factor = factor / (range_ms / 1000.0)
    return np.where(ok, result * factor, np.nan)


@given(
    series=st.lists(
        st.lists(st.tuples(st.integers(0, 40), VALUES), max_size=10), min_size=1, max_size=4
    ),
    upper=st.lists(st.integers(0, 60), min_size=1, max_size=5).map(sorted),
    range_ms=st.integers(1, 40),
    func=st.sampled_from(["rate", "increase", "delta"]),
)
def test_rate_kernel_is_the_numpy_formulation_bit_for_bit(
    series: list[list[tuple[int, float]]], upper: list[int], range_ms: int, func: str
) -> None:
    """rate, increase and delta over any windows (resets, NaN, infinities, signed zeros,
    repeated times, windows of 0, 1 or more samples) equal the NumPy formulation's bits."""
    rows = [sorted(s, key=lambda p: p[0]) for s in series]
    bounds = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(r) for r in rows], out=bounds[1:])
    ts = np.array([t * 1000 for r in rows for t, _ in r], np.int64)
    vals = np.array([v for r in rows for _, v in r], np.float64)
    assume(len(vals))  # (range_function answers a batch without samples before this)
    batch = fn.SampleBatch([{} for _ in rows], ts, vals, bounds)
    steps = np.array(upper, np.int64) * 1000
    width = range_ms * 1000
    lo, hi = fn.window_bounds(batch, steps, width)
    counter, per_second = func != "delta", func == "rate"
    with np.errstate(all="ignore"):
        want = _numpy_rate(batch, lo, hi, steps, width, counter, per_second)
        got = fn._extrapolated_rate(batch, lo, hi, steps, width, counter, per_second)
    assert _bits(got) == _bits(want)

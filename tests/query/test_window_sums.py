"""Window sums (sum_over_time, avg_over_time, rate's reset corrections) are every window's
samples added left to right from 0.0, as Prometheus adds them: the gathered fast path of
`query.functions._window_sums` must give those sums to the last bit, for any windows."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from query import functions as fn

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 1e-308, 0.1, 3.0]),
)


def _sequential(vals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    out = np.zeros(lo.size)
    for i, (a, b) in enumerate(zip(lo.ravel().tolist(), hi.ravel().tolist(), strict=True)):
        total = 0.0
        for x in vals[a:b].tolist():
            total += x
        out[i] = total
    return out.reshape(lo.shape)


def _bits(x: np.ndarray) -> list[int]:
    return np.where(np.isnan(x), np.nan, x).view(np.int64).ravel().tolist()  # any NaN is NaN


@settings(max_examples=300, deadline=None)
@given(
    vals=st.lists(VALUES, min_size=1, max_size=60),
    windows=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 12)), min_size=1, max_size=24),
    rows=st.sampled_from([1, 2, 3, 4]),
    block=st.sampled_from([1, 3, 1 << 21]),
)
def test_window_sums_are_the_sequential_sums_bit_for_bit(
    vals: list[float], windows: list[tuple[int, int]], rows: int, block: int
) -> None:
    v = np.array(vals)
    n = len(v)
    lo = np.array([min(a, n) for a, _ in windows], np.int64)
    hi = np.minimum(lo + np.array([w for _, w in windows], np.int64), n)
    whole = len(lo) - len(lo) % rows or len(lo)  # as (series, steps) when it divides
    shape = (-1, rows) if whole % rows == 0 else (-1, 1)
    lo, hi = lo[:whole].reshape(shape), hi[:whole].reshape(shape)
    old = fn._SUM_BLOCK
    fn._SUM_BLOCK = block  # small blocks: the blocking too
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            got = fn.window_reduce(v, lo, hi, "sum")
    finally:
        fn._SUM_BLOCK = old
    assert got.shape == lo.shape
    assert _bits(got) == _bits(_sequential(v, lo, hi))


def test_a_window_of_negative_zeros_sums_to_positive_zero() -> None:
    """0.0 + -0.0 is 0.0: the fast path adds its first sample to 0.0 as the fold does."""
    v = np.array([-0.0, -0.0, -0.0, 5.0])
    got = fn.window_reduce(v, np.array([[0, 0]]), np.array([[3, 2]]), "sum")
    assert np.signbit(got).tolist() == [[False, False]]

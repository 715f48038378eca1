"""Range functions from downsampled periods against the same functions on the raw samples the
periods came from: on aligned windows every function in `EXACT` gives the raw answer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.staleness import STALE_NAN
from query.downsampled import EXACT, aligned, answer
from query.functions import SampleBatch, range_function
from store.downsample import (
    Periods,
    decode_periods,
    encode_periods,
    period_ends,
    series_periods,
    summarise,
)

RES = 60_000  # one period: a minute (the same arithmetic as 5 m or 1 h, with fewer samples)


@st.composite
def series(draw: st.DrawFn, counters: bool) -> tuple[np.ndarray, np.ndarray]:
    """A series over about an hour: irregular gaps (some longer than a period), integer-valued
    counters with resets or float gauges, a few NaNs and staleness markers."""
    n = draw(st.integers(0, 120))
    gaps = draw(st.lists(st.sampled_from([1, 7, 15_000, 30_000, 59_999, 60_000, 61_000, 400_000]),
                         min_size=n, max_size=n))  # fmt: skip
    ts = 1_700_000_000_000 + np.cumsum(np.array(gaps, np.int64))
    if counters:
        steps = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
        vals = np.cumsum(np.array(steps, np.float64))
        for i in draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=4)) if n else []:
            vals[i:] -= vals[i] - draw(st.integers(0, 5))  # a reset to a small value
    else:
        vals = np.array(
            draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=n, max_size=n)),
            np.float64,
        )
    for i in draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=3)) if n else []:
        vals[i] = draw(st.sampled_from([np.nan, STALE_NAN, np.inf]))
    return ts, vals


def batch_of(many: list[tuple[np.ndarray, np.ndarray]]) -> SampleBatch:
    sizes = [len(t) for t, _ in many]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ts = np.concatenate([t for t, _ in many]) if many else np.empty(0, np.int64)
    vals = np.concatenate([v for _, v in many]) if many else np.empty(0)
    return SampleBatch([{"i": str(i)} for i in range(len(many))], ts.astype(np.int64), vals, bounds)


def assert_same(func: str, batch: SampleBatch, periods: Periods, times, range_ms: int, exact: bool):
    raw, raw_present = range_function(func, batch, times, range_ms, 0)
    down, down_present = answer(func, periods, times, range_ms, 0)
    np.testing.assert_array_equal(down_present, raw_present, err_msg=func)
    if exact:
        np.testing.assert_array_equal(down, raw, err_msg=func)  # NaNs in the same places
    else:
        np.testing.assert_allclose(down, raw, rtol=1e-9, atol=1e-6, equal_nan=True, err_msg=func)


def windows(batch: SampleBatch, periods_per_range: int) -> tuple[np.ndarray, int]:
    """Aligned steps covering the batch and a little beyond, and the range."""
    t0 = int(period_ends(np.array([1_700_000_000_000]), RES)[0])
    times = t0 + RES * np.arange(-2, 90, dtype=np.int64)
    return times, periods_per_range * RES


COUNTER_FUNCS = sorted(EXACT)
GAUGE_FUNCS = sorted(
    EXACT - {"rate", "increase", "resets", "irate"}
)  # counters' functions on floats: exact arithmetic is only promised up to rounding


@settings(max_examples=150)
@given(st.lists(series(counters=True), max_size=4), st.sampled_from([1, 2, 5, 15]))
def test_counters_answer_exactly_as_raw(many, periods_per_range) -> None:
    """Integer-valued counters (every sum exact in floating point): bit for bit the raw answer,
    across resets, gaps, NaNs, infinities and staleness markers."""
    batch = batch_of(many)
    periods = summarise(batch.ts, batch.vals, batch.bounds, RES)
    times, range_ms = windows(batch, periods_per_range)
    for func in COUNTER_FUNCS:
        assert_same(func, batch, periods, times, range_ms, exact=True)


@settings(max_examples=150)
@given(st.lists(series(counters=False), max_size=4), st.sampled_from([1, 3, 60]))
def test_gauges_answer_as_raw_up_to_rounding(many, periods_per_range) -> None:
    batch = batch_of(many)
    periods = summarise(batch.ts, batch.vals, batch.bounds, RES)
    times, range_ms = windows(batch, periods_per_range)
    for func in GAUGE_FUNCS:
        exact = func not in ("sum_over_time", "avg_over_time", "delta")
        assert_same(func, batch, periods, times, range_ms, exact=exact)


def test_a_period_is_left_open_like_a_window() -> None:
    """A sample at a period's end belongs to it, one a millisecond later to the next."""
    ts = np.array([0, 1, 60_000, 60_001, 120_000], np.int64)
    p = summarise(ts, np.arange(5.0), np.array([0, 5]), RES)
    assert p.end.tolist() == [0, 60_000, 120_000]
    assert p.count.tolist() == [1, 2, 2]
    assert p.first_v.tolist() == [0.0, 1.0, 3.0] and p.last_v.tolist() == [0.0, 2.0, 4.0]


def test_staleness_markers_are_dropped_and_empty_series_keep_their_place() -> None:
    ts = np.array([10, 20, 30], np.int64)
    p = summarise(ts, np.array([STALE_NAN, STALE_NAN, 1.0]), np.array([0, 2, 2, 3]), RES)
    assert p.n_series == 3 and len(p) == 1
    assert p.bounds.tolist() == [0, 0, 0, 1]
    values, present = answer("count_over_time", p, np.array([60_000]), RES)
    assert present[:, 0].tolist() == [False, False, True] and values[2, 0] == 1.0


def test_refuses_what_it_cannot_answer_exactly() -> None:
    p = summarise(np.array([1], np.int64), np.array([1.0]), np.array([0, 1]), RES)
    with pytest.raises(ValueError, match="not answered exactly"):
        answer("quantile_over_time", p, np.array([60_000]), RES)
    with pytest.raises(ValueError, match="not whole periods"):
        answer("rate", p, np.array([90_000]), RES)
    assert aligned(RES, np.array([120_000]), 2 * RES, 0)
    assert not aligned(RES, np.array([120_000]), 90_000, 0)
    assert not aligned(RES, np.array([120_000]), RES, 30_000)


@given(series(counters=True), st.sampled_from([1, 60_000, 300_000, 3_600_000]))
def test_a_series_periods_round_trip_through_bytes_bit_for_bit(one, resolution_ms) -> None:
    ts, vals = one
    periods = summarise(ts, vals, np.array([0, len(ts)]), resolution_ms)
    if len(periods) == 0:
        with pytest.raises(ValueError, match="non-empty"):
            encode_periods(periods)
        return
    back = decode_periods(encode_periods(series_periods(periods, 0)))
    for name in ("end", "count", "first_t", "last_t", "prev_t", "resets", "changes"):
        np.testing.assert_array_equal(getattr(back, name), getattr(periods, name), err_msg=name)
    for name in ("first_v", "last_v", "prev_v", "min", "max", "sum", "corrections"):
        assert getattr(back, name).tobytes() == getattr(periods, name).tobytes(), name
    assert back.resolution_ms == resolution_ms


def test_corrupt_records_are_value_errors() -> None:
    p = summarise(np.array([1, 2, 70_000], np.int64), np.array([1.0, 0.5, 3.0]), [0, 3], RES)
    data = encode_periods(p)
    for bad in (data[:-1], data + b"\0", b"\x07" + data[1:], b"", data[:4] + b"\0" * 20):
        with pytest.raises(ValueError):
            decode_periods(bad)

"""The Prometheus API's time and duration parameters (what parses, and 400s for the rest), and
sample values as Prometheus writes them."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filopy.rest.errors import ApiError
from filopy.rest.promql import (
    MAX_TIME_MS,
    MIN_TIME_MS,
    _format_slow,
    format_value,
    parse_duration,
    parse_time,
    result_json,
)
from query.values import StepMatrix


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1700000000", 1_700_000_000_000),
        ("1700000000.25", 1_700_000_000_250),
        ("2023-11-14T22:13:20Z", 1_700_000_000_000),
        ("2023-11-14T22:13:20.5+00:00", 1_700_000_000_500),
        ("-1", -1000),
    ],
)
def test_times(text: str, ms: int) -> None:
    assert parse_time(text, "time") == ms


@pytest.mark.parametrize("text", ["INF", "-Inf", "nan", "1e300", "yesterday", ""])
def test_bad_times_are_400s_naming_the_parameter(text: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_time(text, "start")
    assert info.value.status == 400 and 'invalid parameter "start"' in str(info.value)


def test_series_endpoints_accept_infinite_bounds() -> None:
    assert parse_time("-Inf", "start", open_ended=True) == MIN_TIME_MS
    assert parse_time("+Inf", "end", open_ended=True) == MAX_TIME_MS


@pytest.mark.parametrize(
    ("text", "ms"),
    [("15", 15_000), ("0.5", 500), ("5m", 300_000), ("1h30m", 5_400_000), ("100ms", 100)],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration(text, "step") == ms


@pytest.mark.parametrize("text", ["inf", "nan", "1e300", "5 m", "m", "1.5m"])
def test_bad_durations_are_400s(text: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_duration(text, "step")
    assert info.value.status == 400 and 'invalid parameter "step"' in str(info.value)


@pytest.mark.parametrize(
    ("v", "text"),
    [
        (1.0, "1"),
        (0.5, "0.5"),
        (1e20, "100000000000000000000"),
        (float("nan"), "NaN"),
        (float("inf"), "+Inf"),
        (float("-inf"), "-Inf"),
        (-2.25, "-2.25"),
    ],
)
def test_values_are_written_as_prometheus_does(v: float, text: str) -> None:
    assert format_value(v) == text


@given(st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-0.0, 5e-324, 1e16]))
def test_the_fast_value_format_is_the_positional_shortest_form(v: float) -> None:
    """`repr`'s digits, out of exponent form, are NumPy's shortest positional digits."""
    assert format_value(v) == _format_slow(v)


@settings(max_examples=200)
@given(
    cells=st.lists(
        st.lists(
            st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
            min_size=2,
            max_size=2,
        ),
        min_size=1,
        max_size=3,
    ),
    start_ms=st.integers(-(10**12), 10**13),
    step_ms=st.integers(1, 10**6),
)
def test_a_matrix_answer_encodes_as_the_plain_one(
    cells: list[list[float | None]], start_ms: int, step_ms: int
) -> None:
    """The HTTP answer's pre-encoded points read back as the CLI's plain lists."""
    values = np.array([[np.nan if c is None else c for c in row] for row in cells])
    present = np.array([[c is not None for c in row] for row in cells])
    times = start_ms + step_ms * np.arange(2, dtype=np.int64)
    labels = [{"__name__": "m", "i": str(i)} for i in range(len(cells))]
    m = StepMatrix(times, labels, values, present)
    plain = result_json(m)
    assert json.loads(orjson.dumps(result_json(m, fragments=True))) == plain

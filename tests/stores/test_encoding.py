"""The chunk codec: bit-exact round trips of anything, compact on real-looking data."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import ChunkRecord, decode_chunk, encode_chunk, encoding

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
U64_MAX = (1 << 64) - 1


def _bits_of(x: float) -> int:
    return int(np.float64(x).view(np.uint64))


# A value is drawn as its bit pattern, so NaN payloads and -0.0 survive generation.
value_bits = st.one_of(
    st.integers(0, U64_MAX),  # any pattern: NaN payloads, signalling NaNs, subnormals
    st.floats(allow_nan=True, allow_infinity=True).map(_bits_of),
    st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 1.7976931348623157e308]).map(
        _bits_of
    ),
    st.integers(-(10**9), 10**9).map(lambda k: _bits_of(k / 100)),  # decimals
    st.integers(-(2**53), 2**53).map(lambda k: _bits_of(float(k))),  # integers, counters
)


@st.composite
def arbitrary_chunks(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    ts = sorted(draw(st.sets(st.integers(INT64_MIN, INT64_MAX), min_size=1, max_size=200)))
    bits = draw(st.lists(value_bits, min_size=len(ts), max_size=len(ts)))
    return np.array(ts, dtype=np.int64), np.array(bits, dtype=np.uint64).view(np.float64)


@st.composite
def scrape_like_chunks(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Regular timestamps with jitter and gaps; counters or decimal gauges with odd values in."""
    n = draw(st.integers(1, 400))
    step = draw(st.sampled_from([1, 1000, 10_000, 15_000, 60_000]))
    jitter = draw(st.integers(0, max(0, step // 3 - 1)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = np.full(n, step, dtype=np.int64)
    steps[rng.random(n) < 0.02] *= draw(st.integers(2, 50))  # missed scrapes
    ts = draw(st.integers(0, 2**42)) + np.cumsum(steps)
    ts += rng.integers(-jitter, jitter + 1, n)
    kind = draw(st.sampled_from(["counter", "gauge", "int-gauge", "constant"]))
    decimals = draw(st.integers(0, 6))
    if kind == "counter":
        x = np.cumsum(rng.poisson(draw(st.sampled_from([1, 30, 10**5])), n)).astype(np.float64)
        x[rng.random(n) < 0.01] = 0.0  # resets
    elif kind == "gauge":
        x = np.round(np.cumsum(rng.normal(0, 10, n)), decimals)
    elif kind == "int-gauge":
        x = rng.integers(0, 1 << 40, n).astype(np.float64) * 4096
    else:
        x = np.full(n, draw(st.floats(allow_nan=False)))
    odd = draw(st.lists(st.tuples(st.integers(0, n - 1), value_bits), max_size=5))
    for i, b in odd:
        x.view(np.uint64)[i] = b
    return ts, x


def _assert_round_trip(ts: np.ndarray, x: np.ndarray) -> bytes:
    data = encode_chunk(ts, x)
    ts2, x2 = decode_chunk(data)
    assert ts2.dtype == np.int64 and x2.dtype == np.float64
    np.testing.assert_array_equal(ts2, ts)
    np.testing.assert_array_equal(x2.view(np.uint64), x.view(np.uint64))
    return data


@given(arbitrary_chunks())
def test_any_samples_round_trip_bit_exactly(chunk: tuple[np.ndarray, np.ndarray]) -> None:
    _assert_round_trip(*chunk)


@given(scrape_like_chunks())
def test_scrape_like_samples_round_trip_bit_exactly(chunk: tuple[np.ndarray, np.ndarray]) -> None:
    _assert_round_trip(*chunk)


@given(st.one_of(arbitrary_chunks(), scrape_like_chunks()).filter(lambda c: len(c[0]) < 8))
def test_small_chunks_round_trip_and_take_the_smallest_difference_order(
    chunk: tuple[np.ndarray, np.ndarray],
) -> None:
    """Below 8 samples (a minute's flush of 15 s scrapes) the encoder writes every difference
    order and keeps the shortest: any such chunk decodes bit-exactly, and its timestamps take no
    more bytes than either order would."""
    data = _assert_round_trip(*chunk)
    ts = chunk[0]
    for order in (1, 2):
        alone = bytearray((order,))
        encoding._put_diffs(ts, order, alone)
        assert data.startswith(bytes((1, len(ts)))) and len(alone) >= _timestamps_size(data)


def _timestamps_size(data: bytes) -> int:
    """Bytes of a small chunk's timestamp section: what the decoder reads after the header."""
    r = encoding._Reader(data)
    r.take(2)  # version, n (one byte below 128)
    order = r.u8()
    encoding._get_diffs(r, data[1], order)
    return r.pos - 2


def test_special_values_and_extreme_timestamps() -> None:
    bits = [
        0x7FF8000000000000,  # quiet NaN
        0xFFF8000000000000,  # negative quiet NaN
        0x7FF0000000000001,  # signalling NaN
        0x7FF00000DEADBEEF,  # NaN with a payload
        _bits_of(-0.0),
        _bits_of(0.0),
        _bits_of(np.inf),
        _bits_of(-np.inf),
        1,  # smallest subnormal
        _bits_of(0.1),
    ]
    x = np.array(bits, dtype=np.uint64).view(np.float64)
    ts = np.array([INT64_MIN, -1, 0, 1, 2, 3, 10**15, 10**18, INT64_MAX - 1, INT64_MAX])
    _assert_round_trip(ts, x)
    _assert_round_trip(np.array([INT64_MAX]), np.array([np.nan]))


@pytest.mark.parametrize(
    ("ts", "match"),
    [
        ([1000, 1000], "strictly increasing: ts\\[1\\]=1000 after ts\\[0\\]=1000"),
        ([1000, 2000, 1500], "strictly increasing: ts\\[2\\]=1500"),
        ([], "1 to"),
    ],
)
def test_equal_out_of_order_or_no_timestamps_are_rejected(ts: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_chunk(np.array(ts, dtype=np.int64), np.zeros(len(ts)))


def test_malformed_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="values of shape"):
        encode_chunk([1, 2], [1.0])
    with pytest.raises(ValueError, match="integer"):
        encode_chunk([1.5, 2.5], [1.0, 2.0])
    with pytest.raises(ValueError, match="int64"):
        encode_chunk(np.array([1, 1 << 63], dtype=np.uint64), [1.0, 2.0])


def test_truncated_or_garbled_chunks_raise_value_error() -> None:
    rng = np.random.default_rng(7)
    ts = 1_700_000_000_000 + np.arange(120) * 15_000 + rng.integers(-9, 10, 120)
    for x in (np.cumsum(rng.poisson(30, 120)).astype(float), rng.random(120)):
        data = encode_chunk(ts, x)
        for cut in range(len(data)):
            with pytest.raises(ValueError):
                decode_chunk(data[:cut])
        with pytest.raises(ValueError, match="trailing"):
            decode_chunk(data + b"\0")
        with pytest.raises(ValueError, match="version"):
            decode_chunk(b"\x09" + data[1:])
        for i in range(3, len(data)):  # past the sample count: any byte may be garbled
            garbled = bytearray(data)
            garbled[i] ^= 0xA5
            with contextlib.suppress(ValueError):
                decode_chunk(bytes(garbled))


def _jittered(n: int, rng: np.random.Generator) -> np.ndarray:
    return 1_700_000_000_000 + np.arange(n) * 15_000 + np.rint(rng.normal(0, 5, n)).astype(int)


@pytest.mark.parametrize(
    "make",
    [
        lambda rng, n: np.cumsum(rng.poisson(40, n)).astype(float),  # request counter
        lambda rng, n: np.round(1000 + np.cumsum(rng.gamma(2, 0.05, n)), 2),  # cpu seconds
        lambda rng, n: np.round(50 + np.cumsum(rng.normal(0, 0.5, n)), 1),  # temperature
        lambda rng, n: (250_000 + np.cumsum(rng.integers(-50, 51, n))) * 4096.0,  # memory
        lambda rng, n: np.ones(n),  # up
    ],
)
def test_real_looking_series_take_under_two_bytes_per_sample(make: object) -> None:
    rng = np.random.default_rng(11)
    n = 240  # an hour at 15 s
    ts = _jittered(n, rng)
    x = make(rng, n)  # type: ignore[operator]
    data = _assert_round_trip(ts, x)
    assert len(data) / n < 2.0


def test_chunk_record_from_samples() -> None:
    c = ChunkRecord.from_samples('{"a":"b"}', [10, 20, 35], [1.0, np.nan, 3.0])
    assert (c.start_time, c.end_time, c.num_samples) == (10, 35, 3)
    ts, x = c.samples()
    assert ts.tolist() == [10, 20, 35] and np.isnan(x[1])
    with pytest.raises(ValueError):
        ChunkRecord('{"a":"b"}', 10, 5, 1, b"")

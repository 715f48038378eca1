"""The batch chunk encoder (the compiled fast path of encoding_fast.py): many chunks at once,
each decoding bit-exactly with `decode_chunk` and equal, byte for byte, to what the reference
`encode_chunk` writes for it alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import encoding_fast
from store.encoding import decode_chunk, encode_chunk
from store.encoding_fast import encode_chunks

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
U64_MAX = (1 << 64) - 1
SPECIAL_BITS = [
    0x7FF8000000000000,  # quiet NaN
    0xFFF8000000000000,  # negative quiet NaN
    0x7FF0000000000001,  # signalling NaN
    0x7FF00000DEADBEEF,  # NaN with a payload
    0x8000000000000000,  # -0.0
    0x0000000000000000,  # 0.0
    0x7FF0000000000000,  # inf
    0xFFF0000000000000,  # -inf
    0x0000000000000001,  # smallest subnormal
    0x000FFFFFFFFFFFFF,  # largest subnormal
    0x7FEFFFFFFFFFFFFF,  # largest finite
]
KINDS = [
    "gauge",
    "counter",
    "int-gauge",
    "constant",
    "full-precision",
    "random-bits",
    "special",
    "huge-and-tiny",
]


def _timestamps(rng: np.random.Generator, n: int, style: str) -> np.ndarray:
    if style == "scrape":  # 15 s with a few ms jitter and the odd missed scrape
        steps = np.full(n, 15_000, dtype=np.int64)
        steps[rng.random(n) < 0.02] *= int(rng.integers(2, 50))
        ts = 1_700_000_000_000 + np.cumsum(steps) + rng.integers(-5, 6, n)
        return ts
    if style == "dense":  # consecutive milliseconds
        return int(rng.integers(-(10**15), 10**15)) + np.arange(n, dtype=np.int64)
    if style == "extreme":  # anywhere in int64, the ends included
        inner = rng.integers(INT64_MIN + 1, INT64_MAX, n, dtype=np.int64, endpoint=False)
        ts = np.unique(np.concatenate((inner, [INT64_MIN, INT64_MAX])))
        pick = np.sort(rng.choice(len(ts), n, replace=False))
        return ts[pick]
    # irregular: random positive gaps of any scale
    gaps = rng.integers(1, 1 << int(rng.integers(1, 40)), n, dtype=np.int64)
    return int(rng.integers(-(2**50), 2**50)) + np.cumsum(gaps)


def _values(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    if kind == "gauge":
        return np.round(rng.uniform(-1e4, 1e4) + np.cumsum(rng.normal(0, 3, n)), rng.integers(0, 4))
    if kind == "counter":  # with resets
        x = np.cumsum(rng.poisson(rng.choice([1, 30, 10**5]), n)).astype(np.float64)
        resets = rng.random(n) < 0.02
        if resets.any():
            x -= np.maximum.accumulate(np.where(resets, x, 0.0))
        return x + float(rng.integers(0, 10**9)) * (rng.random() < 0.5)
    if kind == "int-gauge":
        return rng.integers(0, 1 << 40, n).astype(np.float64) * 4096
    if kind == "constant":
        return np.full(n, rng.choice([0.0, 1.0, 3.25, 1e300, -7.0, 0.1]))
    if kind == "full-precision":
        return np.cumsum(rng.normal(0, 1, n)) * 10.0 ** int(rng.integers(-5, 6))
    if kind == "random-bits":
        return rng.integers(0, U64_MAX, n, dtype=np.uint64, endpoint=True).view(np.float64)
    if kind == "special":
        return np.array(SPECIAL_BITS, dtype=np.uint64)[rng.integers(0, len(SPECIAL_BITS), n)].view(
            np.float64
        )
    # huge-and-tiny: integers beyond 2**53 / 10**e next to many-digit decimals
    x = np.where(
        rng.random(n) < 0.5, 1e15 + rng.integers(0, 1000, n), rng.integers(0, 10**6, n) / 1e6
    )
    return x.astype(np.float64)


@st.composite
def batches(draw: st.DrawFn, max_chunks: int = 12) -> list[tuple[np.ndarray, np.ndarray]]:
    """A flush's worth of chunks: sizes 1..500 (often under 8), mixed timestamp styles and value
    kinds, with special values sprinkled in."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    chunks = []
    for _ in range(draw(st.integers(1, max_chunks))):
        n = draw(st.one_of(st.integers(1, 7), st.integers(8, 10), st.integers(1, 500)))
        ts = _timestamps(rng, n, draw(st.sampled_from(["scrape", "dense", "extreme", "irregular"])))
        x = _values(rng, n, draw(st.sampled_from(KINDS)))
        for _ in range(draw(st.integers(0, 3))):
            x.view(np.uint64)[rng.integers(0, n)] = SPECIAL_BITS[rng.integers(len(SPECIAL_BITS))]
        chunks.append((ts, x))
    return chunks


def _flatten(chunks: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    ts = np.concatenate([c[0] for c in chunks])
    x = np.concatenate([c[1] for c in chunks])
    bounds = np.concatenate(([0], np.cumsum([len(c[0]) for c in chunks])))
    return ts, x, bounds


def _check(chunks: list[tuple[np.ndarray, np.ndarray]]) -> list[bytes]:
    blobs = encode_chunks(*_flatten(chunks))
    assert len(blobs) == len(chunks)
    for (ts, x), blob in zip(chunks, blobs, strict=True):
        ts2, x2 = decode_chunk(blob)
        np.testing.assert_array_equal(ts2, ts)
        np.testing.assert_array_equal(x2.view(np.uint64), x.view(np.uint64))
        assert blob == encode_chunk(ts, x)  # the same choices, hence the same bytes
    return blobs


@settings(max_examples=150)
@given(batches())
def test_batches_round_trip_bit_exactly_and_equal_encode_chunk(
    chunks: list[tuple[np.ndarray, np.ndarray]],
) -> None:
    _check(chunks)


def test_small_chunks_and_single_samples() -> None:
    rng = np.random.default_rng(5)
    chunks = []
    for n in [1, 1, 2, 3, 4, 5, 6, 7, 8, 1]:
        chunks.append((_timestamps(rng, n, "scrape"), _values(rng, n, "gauge")))
    chunks.append((np.array([INT64_MAX]), np.array([np.nan])))
    chunks.append((np.array([INT64_MIN, INT64_MAX]), np.array([-0.0, 5e-324])))
    _check(chunks)


def test_a_realistic_flush() -> None:
    """Many 120-sample chunks of gauges and counters, the case the batch encoder is for."""
    rng = np.random.default_rng(9)
    chunks = [
        (_timestamps(rng, 120, "scrape"), _values(rng, 120, ["gauge", "counter"][i % 2]))
        for i in range(300)
    ]
    blobs = _check(chunks)
    assert sum(map(len, blobs)) / (300 * 120) < 3.0


def test_bounds_and_timestamps_are_validated() -> None:
    ts = np.array([10, 20, 30, 5, 6], dtype=np.int64)
    x = np.zeros(5)
    assert len(encode_chunks(ts, x, [0, 3, 5])) == 2  # going back across chunks is fine
    assert encode_chunks(np.zeros(0, dtype=np.int64), np.zeros(0), [0]) == []
    with pytest.raises(
        ValueError, match=r"strictly increasing: ts\[3\]=5 after ts\[2\]=30 in chunk 0"
    ):
        encode_chunks(ts, x, [0, 5])
    with pytest.raises(
        ValueError, match=r"strictly increasing: ts\[1\]=20 after ts\[0\]=20 in chunk 1"
    ):
        encode_chunks(np.array([1, 20, 20]), np.zeros(3), [0, 1, 3])
    with pytest.raises(ValueError, match="1 to"):
        encode_chunks(ts, x, [0, 3, 3, 5])  # an empty chunk
    with pytest.raises(ValueError, match="bounds"):
        encode_chunks(ts, x, [0, 3])  # does not cover the samples
    with pytest.raises(ValueError, match="bounds"):
        encode_chunks(ts, x, [1, 5])
    with pytest.raises(ValueError, match="bounds"):
        encode_chunks(ts, x, [0, 4, 3, 5])
    with pytest.raises(ValueError, match="values of shape"):
        encode_chunks(ts, x[:4], [0, 5])
    with pytest.raises(ValueError, match="integer"):
        encode_chunks(ts.astype(float), x, [0, 5])
    with pytest.raises(ValueError, match="int64"):
        encode_chunks(np.array([1, 1 << 63], dtype=np.uint64), [1.0, 2.0], [0, 2])


def test_chunks_the_kernels_leave_to_the_reference_are_the_same() -> None:
    """Where the reference tries zstd (a byte-aligned int stream of 24+ bytes; XOR values) the
    fast path hands the chunk or its values to the reference: the bytes are still the same."""
    rng = np.random.default_rng(4)
    n = 120
    ts = _timestamps(rng, n, "scrape")
    chunks = [
        (ts, rng.integers(0, 256, n).astype(np.float64)),  # 8-bit values: a zstd candidate
        (ts, _values(rng, n, "random-bits")),  # XOR, zstd tried
        (ts[:2], _values(rng, 2, "full-precision")),  # XOR, too short for zstd
        (ts, _values(rng, n, "counter")),
    ]
    flat = _flatten(chunks)
    _, _, _, flags = encoding_fast._encode_all(*flat, np.empty(0, np.uint8))
    assert flags.tolist() == [encoding_fast._REFERENCE, 1, 1, 0]
    _check(chunks)


def test_a_zstd_frame_declaring_a_huge_size_is_refused_not_allocated() -> None:
    """python-zstandard allocates the content size a frame header declares (MemoryError for
    a garbled one); chunk frames never declare it, so the decoder refuses such a frame."""
    garbled = bytes.fromhex(
        "010801ac8aadfef96204a8ea010a090209010128f0001d0100d8ffff010101010000ffff000fff0008f8f008"
        "00007f00007f7f808002002b1808c00b"
    )
    with pytest.raises(ValueError, match="corrupt"):
        decode_chunk(garbled)

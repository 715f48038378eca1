"""The batch chunk decoder (`encoding_fast.decode_chunks`, compiled): many chunks at once, bit for
bit what the reference `decode_chunk` gives for each, and on corrupt input the reference's
ValueError, never a crash or a different answer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import encoding, encoding_fast
from store.encoding import decode_chunk, encode_chunk
from store.encoding_fast import decode_chunks, encode_chunks
from tests.stores.test_encoding_batch import SPECIAL_BITS, _timestamps, _values, batches


def _reference(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    parts = [decode_chunk(b) for b in blobs]
    bounds = np.concatenate(([0], np.cumsum([len(p[0]) for p in parts]))).astype(np.int64)
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.float64), bounds
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), bounds


def _assert_same(blobs: list[bytes]) -> None:
    ts, x, bounds = decode_chunks(blobs)
    rts, rx, rbounds = _reference(blobs)
    assert ts.dtype == np.int64 and x.dtype == np.float64 and bounds.dtype == np.int64
    np.testing.assert_array_equal(bounds, rbounds)
    np.testing.assert_array_equal(ts, rts)
    np.testing.assert_array_equal(x.view(np.uint64), rx.view(np.uint64))  # NaN payloads too


def _encoded(chunks: list[tuple[np.ndarray, np.ndarray]]) -> list[bytes]:
    return [encode_chunk(ts, x) for ts, x in chunks]


def _kernel_flags(blobs: list[bytes]) -> list[int]:
    """Which chunks the kernels leave to the reference (1)."""
    starts = np.concatenate(([0], np.cumsum([len(b) for b in blobs]))).astype(np.int64)
    buf = np.frombuffer(b"".join(blobs), np.uint8)
    return encoding_fast._decode_all(buf, starts)[3].tolist()


@settings(max_examples=150)
@given(batches())
def test_batches_decode_bit_exactly_as_the_reference(
    chunks: list[tuple[np.ndarray, np.ndarray]],
) -> None:
    _assert_same(_encoded(chunks))


@contextmanager
def _paths_taken() -> Iterator[set[str]]:
    """The encoder's paths the reference decoder walks through (read off as it decodes)."""
    seen: set[str] = set()
    saved = {f: getattr(encoding, f) for f in ("_get_ints", "_get_decimal", "_get_xor")}

    def peek(r: Any, at: int = 0) -> int:
        return encoding._Reader(r.buf[r.pos + at :]).uvarint()

    def get_ints(r: Any, n: int) -> Any:
        head = peek(r)
        flags = [("zstd", 0x80), ("gcd", 0x100), ("patch", 0x200)]
        seen.update(k for k, bit in flags if head & bit)
        return saved["_get_ints"](r, n)

    def get_decimal(r: Any, n: int) -> Any:
        seen.add(f"decimal order {r.buf[r.pos + 1]}")
        x = saved["_get_decimal"](r, n)
        if (~np.isfinite(x)).any() or (x.view(np.uint64) == 1 << 63).any():
            seen.add("exceptions")
        return x

    def get_xor(r: Any, n: int) -> Any:
        seen.add("xor zstd" if r.buf[r.pos] else "xor")
        return saved["_get_xor"](r, n)

    replaced: dict[str, Callable[..., Any]] = {
        "_get_ints": get_ints,
        "_get_decimal": get_decimal,
        "_get_xor": get_xor,
    }
    for name, f in replaced.items():
        setattr(encoding, name, f)
    try:
        yield seen
    finally:
        for name, f in saved.items():
            setattr(encoding, name, f)


def _timestamp_order(blob: bytes) -> int:
    r = encoding._Reader(blob)
    r.u8()
    r.uvarint()
    return r.u8()


def test_every_encoder_path_decodes_as_the_reference() -> None:
    """A corpus that walks every path of the format (checked as the reference decodes it),
    decoded in one batch and chunk by chunk."""
    rng = np.random.default_rng(11)
    chunks = []
    for n in [1, 2, 3, 7, 8, 9, 120, 500]:
        for style in ["scrape", "dense", "extreme", "irregular"]:
            for kind in ["gauge", "counter", "int-gauge", "constant", "full-precision"]:
                chunks.append((_timestamps(rng, n, style), _values(rng, n, kind)))
            x = _values(rng, n, "random-bits")
            chunks.append((_timestamps(rng, n, style), x))
            x = _values(rng, n, "gauge")
            x.view(np.uint64)[rng.integers(0, n, 2)] = SPECIAL_BITS[rng.integers(len(SPECIAL_BITS))]
            chunks.append((_timestamps(rng, n, style), x))
    ts = _timestamps(rng, 120, "scrape")
    chunks += [
        (ts, rng.integers(0, 256, 120).astype(np.float64)),  # an int stream zstd-compressed
        (ts, np.arange(120) * 1000.0),  # steady counter: delta-of-deltas zero
        (ts, (rng.integers(0, 50, 120) * 3).astype(np.float64)),  # gcd 3
        (np.arange(120, dtype=np.int64) * 15_000, np.full(120, np.nan)),  # all exceptions
        (ts, np.where(rng.random(120) < 0.05, 1e6, 1.0)),  # patches
        (ts, np.array(SPECIAL_BITS * 11, np.uint64)[:120].view(np.float64)),
    ]
    blobs = _encoded(chunks)
    with _paths_taken() as seen:
        _assert_same(blobs)
    assert {_timestamp_order(b) for b in blobs} == {1, 2}
    wanted = {"zstd", "gcd", "patch", "exceptions", "xor", "xor zstd"}
    wanted |= {f"decimal order {o}" for o in range(3)}
    assert wanted <= seen
    for b in blobs:
        _assert_same([b])
    assert 0 < sum(_kernel_flags(blobs)) < len(blobs) // 4  # zstd only goes to the reference


def test_batches_of_every_size() -> None:
    _assert_same([])
    rng = np.random.default_rng(3)
    many = [
        (_timestamps(rng, 120, "scrape"), _values(rng, 120, ["gauge", "counter"][i % 2]))
        for i in range(2000)
    ]
    blobs = encode_chunks(
        np.concatenate([c[0] for c in many]),
        np.concatenate([c[1] for c in many]),
        np.concatenate(([0], np.cumsum([120] * len(many)))),
    )
    _assert_same(blobs)
    zstd = []
    for b in blobs:
        with _paths_taken() as seen:
            decode_chunk(b)
        zstd.append(int(bool({"zstd", "xor zstd"} & seen)))
    assert _kernel_flags(blobs) == zstd  # only zstd is left to the reference
    assert sum(zstd) < len(blobs) // 100
    # A long chunk, and one whose samples outnumber what its few bytes make plausible (a
    # corrupt header could claim that many: the reference decodes it).
    ts = _timestamps(rng, 200_000, "scrape")
    long = encode_chunk(ts, _values(rng, len(ts), "gauge"))
    steady = encode_chunk(np.arange(1 << 20, dtype=np.int64) * 1000, np.zeros(1 << 20))
    _assert_same([blobs[0], long, steady, blobs[1]])
    assert _kernel_flags([steady]) == [1]


def _outcome(blob: bytes) -> tuple[np.ndarray, np.ndarray] | str:
    try:
        return decode_chunk(blob)
    except ValueError as e:
        return str(e)


def _same_error(got: str, want: str) -> bool:
    """The same message; zstd's own words may differ: the reference's per-thread decompressor
    words a corrupt frame after another error differently, now and then (its history, not ours)."""
    zstd = "corrupt chunk: decompression error:"
    return got == want or (got.startswith(zstd) and want.startswith(zstd))


def _mutants(rng: np.random.Generator, blob: bytes) -> list[bytes]:
    """Truncations, flipped bytes and bits, and inserted or deleted bytes."""
    b = bytearray(blob)
    out = [bytes(b[: int(rng.integers(0, len(b)))]), blob + bytes([int(rng.integers(256))])]
    for _ in range(6):
        m = bytearray(b)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(len(m)))
            if rng.random() < 0.5:
                m[i] ^= 1 << int(rng.integers(8))
            else:
                m[i] = int(rng.integers(256))
        out.append(bytes(m))
    i = int(rng.integers(len(b)))
    out.append(bytes(b[:i] + b[i + 1 :]))
    out.append(bytes(b[:i] + bytes([int(rng.integers(256))]) + b[i:]))
    return out


@settings(max_examples=120)
@given(batches(max_chunks=6), st.integers(0, 2**32 - 1))
def test_corrupt_chunks_decode_as_the_reference_or_raise_its_error(
    chunks: list[tuple[np.ndarray, np.ndarray]], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    good = _encoded(chunks)
    mutants = [m for g in good for m in _mutants(rng, g)]
    outcomes = [_outcome(m) for m in mutants]
    for m, want in zip(mutants, outcomes, strict=True):
        if isinstance(want, str):
            with pytest.raises(ValueError) as e:
                decode_chunks([good[0], m, good[-1]])
            assert _same_error(str(e.value), want)
        else:
            _assert_same([good[0], m, good[-1]])
    fine = [m for m, o in zip(mutants, outcomes, strict=True) if not isinstance(o, str)]
    _assert_same(fine)  # all the survivors at once
    first = next((o for o in outcomes if isinstance(o, str)), None)
    if first is not None:  # a batch raises the first corrupt chunk's error
        with pytest.raises(ValueError) as e:
            decode_chunks(mutants)
        assert _same_error(str(e.value), first)


def test_hand_made_corruptions() -> None:
    """Headers the kernels must refuse without reading past the buffer: varints that never end
    or exceed 64 bits, counts beyond the chunk, lengths past its end."""
    blob = encode_chunk(np.arange(10) * 15_000, np.arange(10) / 10)
    cases = [
        b"",
        b"\x02",
        b"\x01",
        b"\x01\x80",
        b"\x01" + b"\xff" * 12,
        b"\x01\x00",
        b"\x01\x01\x03",
        b"\x01\x01\x01" + b"\xff" * 9 + b"\x02",  # a seed beyond 64 bits
        b"\x01\x01\x01\x00\x7f\x00",  # width 127
        b"\x01\x01\x01\x00\x80\x04\x00",  # head beyond its 10 bits
        b"\x01\x05\x01\x00\x40\x00",  # 64-bit width, payload missing
        b"\x01\x05\x01\x00\x81\x02\x00\x05",  # zstd, length past the end
        blob[:-1],
        blob + b"\x00",
        b"\x01\xff\xff\xff\x0f" + blob[2:],  # more samples than MAX_SAMPLES
    ]
    for case in cases:
        want = _outcome(case)
        assert isinstance(want, str), case
        with pytest.raises(ValueError) as e:
            decode_chunks([blob, case])
        assert _same_error(str(e.value), want)

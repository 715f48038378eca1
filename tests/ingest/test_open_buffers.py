"""The open-buffer snapshot codec: bit-exact round trips of many series' open samples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.open_buffers import OpenBuffers, decode_open_buffers, encode_open_buffers
from store import encode_part_key

_SPECIAL = [
    float("nan"),
    float("-inf"),
    float("inf"),
    -0.0,
    5e-324,
    np.uint64(0x7FF0000000000002).view(np.float64).item(),  # Prometheus' staleness marker
    np.uint64(0x7FF4000000000001).view(np.float64).item(),  # a signalling NaN with a payload
    np.uint64(0xFFF8000000000123).view(np.float64).item(),  # a negative NaN with a payload
]


@st.composite
def open_buffers(draw: st.DrawFn) -> OpenBuffers:
    n = draw(st.integers(0, 12))
    keys = [encode_part_key({"__name__": "m", "i": f'{i}\n"x"é'}) for i in range(n)]
    lengths = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    ts_parts, val_parts = [], []
    for length in lengths:
        start = draw(st.integers(-(2**62), 2**62))
        steps = draw(
            st.lists(
                st.integers(1, 2**20), min_size=max(0, length - 1), max_size=max(0, length - 1)
            )
        )
        ts_parts.append(start + np.concatenate(([0], np.cumsum(steps))).astype(np.int64)[:length])
        val_parts.append(
            np.array(
                draw(
                    st.lists(
                        st.one_of(st.floats(allow_nan=True), st.sampled_from(_SPECIAL)),
                        min_size=length,
                        max_size=length,
                    )
                ),
                np.float64,
            )
        )
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=bounds[1:])
    first = np.array(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n)))
    return OpenBuffers(
        keys,
        first.astype(np.int64),
        bounds,
        np.concatenate(ts_parts) if n else np.empty(0, np.int64),
        np.concatenate(val_parts) if n else np.empty(0, np.float64),
    )


@settings(max_examples=150)
@given(ob=open_buffers())
def test_open_buffers_round_trip_bit_exactly(ob: OpenBuffers) -> None:
    back = decode_open_buffers(encode_open_buffers(ob))
    assert back.part_keys == ob.part_keys
    assert np.array_equal(back.first_ts, ob.first_ts)
    assert np.array_equal(back.bounds, ob.bounds)
    assert np.array_equal(back.ts, ob.ts)
    assert np.array_equal(back.vals.view(np.uint64), ob.vals.view(np.uint64))
    assert back.samples == ob.samples


def test_scrape_like_open_buffers_are_compact() -> None:
    """Regular 15 s scrapes of decimal gauges: far below the 16 bytes a sample takes in memory."""
    rng = np.random.default_rng(1)
    n, per = 2_000, 60
    ts = (1_700_000_000_000 + np.arange(per) * 15_000 + rng.integers(-5, 6, (n, per))).ravel()
    vals = np.round(rng.normal(50, 5, (n, per)), 1).ravel()
    ob = OpenBuffers(
        [encode_part_key({"__name__": "g", "instance": f"host-{i}:9100"}) for i in range(n)],
        ts.reshape(n, per)[:, 0].copy(),
        np.arange(n + 1, dtype=np.int64) * per,
        ts.astype(np.int64),
        vals,
    )
    blob = encode_open_buffers(ob)
    assert len(blob) / ob.samples < 8
    back = decode_open_buffers(blob)
    assert np.array_equal(back.ts, ob.ts) and np.array_equal(back.vals, ob.vals)


@pytest.mark.parametrize("blob", [b"", b"XXXX", b"FOB1", b"FOB1not zstd"])
def test_garbage_is_refused(blob: bytes) -> None:
    with pytest.raises(Exception):  # noqa: B017 - any decoding error; never a wrong result
        decode_open_buffers(blob)

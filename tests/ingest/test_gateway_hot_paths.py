"""The HTTP gateway's steady-state paths give exactly what the plain paths give.

- Remote write 1.0's known-series path (`remote_write_v1._decode_known`: every series one
  sample of the usual shape, its labels cached) against the full upb parse, on generated
  requests, corrupt bytes and label values crafted to look like a sample.
"""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filopy.ingest_http import remote_write_v1
from filopy.ingest_http.prompb.remote_pb2 import WriteRequest
from ingest.bad_records import Decoded
from ingest.gateway import KeyedBatch

T0 = 1_700_000_000_000

_label_sets = [
    [("__name__", "up"), ("job", "node")],
    [("__name__", "up"), ("job", "node"), ("instance", "h:9100")],
    [("__name__", "cpu"), ("mode", "idle")],
    [("__name__", "x"), ("v", "\x12\x07\x10é\u0800\x01")],  # ends like a zero-value sample
    [("__name__", "y"), ("v", "\x12\x10\x09")],
    [("a", "")],
    [],
]
_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1.5])
# 6-byte varints (the usual milliseconds), and others the known path leaves to the walk
_stamps = st.integers(2**35, 2**42 - 1) | st.sampled_from(
    [T0, 0, 1, -1, 2**35 - 1, 2**42, 2**63 - 1, -(2**63)]
)


@st.composite
def steady_requests(draw: st.DrawFn) -> WriteRequest:
    """Requests of series from a small pool, mostly one sample each (as Prometheus sends)."""
    req = WriteRequest()
    for _ in range(draw(st.integers(1, 10))):
        ts = req.timeseries.add()
        for name, value in draw(st.sampled_from(_label_sets)):
            lb = ts.labels.add()
            lb.name, lb.value = name, value
        for _ in range(draw(st.sampled_from([1] * 8 + [0, 2]))):
            s = ts.samples.add()
            s.value, s.timestamp = draw(_floats), draw(_stamps)
    return req


def _same(a: Decoded, b: Decoded) -> None:
    x, y = a.batch, b.batch
    assert x.series == y.series
    assert x.series_idx.tolist() == y.series_idx.tolist()
    assert x.timestamps.tolist() == y.timestamps.tolist()
    assert x.timestamps.dtype == y.timestamps.dtype == np.int64
    assert x.values.view(np.int64).tolist() == y.values.view(np.int64).tolist()  # NaN, -0.0
    assert x.bad_records == y.bad_records
    assert a.first_bad == b.first_bad


def _full(raw: bytes, metric_column: str = "_metric_") -> Decoded:
    return remote_write_v1.to_batch(remote_write_v1.parse(raw), metric_column)


def _known(raw: bytes, metric_column: str = "_metric_") -> Decoded | None:
    bounds = remote_write_v1._series_bounds(raw)
    if bounds is None:
        return None
    buf = np.frombuffer(raw, np.uint8)
    return remote_write_v1._decode_known(raw, buf, *bounds, metric_column)


def _usual(req: WriteRequest) -> bool:
    """Every series labels and one sample with a 6-byte timestamp varint: the known path's
    shape."""
    return all(
        len(ts.labels) and len(ts.samples) == 1 and 2**35 <= ts.samples[0].timestamp < 2**42
        for ts in req.timeseries
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steady_requests(), st.sampled_from(["_metric_", "__name__"]))
def test_known_series_path_equals_the_full_parser(req: WriteRequest, metric_column: str) -> None:
    raw = req.SerializeToString()
    first = remote_write_v1.decode(raw, metric_column)  # learns the labels
    _same(first, _full(raw, metric_column))
    known = _known(raw, metric_column)
    if known is not None:
        _same(known, _full(raw, metric_column))
        assert isinstance(known.batch, KeyedBatch) and isinstance(first.batch, KeyedBatch)
        assert known.batch.keys == first.batch.keys
    elif _usual(req):
        raise AssertionError("a steady request with cached labels must take the known path")
    _same(remote_write_v1.decode(raw, metric_column), _full(raw, metric_column))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steady_requests(), st.data())
def test_known_series_path_on_corrupt_bodies(req: WriteRequest, data: st.DataObject) -> None:
    """Bytes changed after the labels are cached: the known path gives the full parser's batch
    or steps aside (and never takes a body the full parser refuses)."""
    clean = req.SerializeToString()
    remote_write_v1.decode(clean, "_metric_")
    raw = bytearray(clean)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(
            st.sampled_from([0x00, 0x07, 0x0A, 0x10, 0x12, 0x09, 0x80, 0xFF, raw[i] ^ 1])
        )
    body = bytes(raw[: data.draw(st.integers(0, len(raw)))]) if data.draw(st.booleans()) else raw
    body = bytes(body)
    known = _known(body)
    fast = remote_write_v1.decode_fast(body, "_metric_")
    try:
        full = _full(body)
    except Exception:
        assert known is None and fast is None
        return
    if known is not None:
        _same(known, full)
    if fast is not None:
        _same(fast, full)


def _series(labels: bytes, sample: bytes) -> bytes:
    body = labels + sample
    return b"\x0a" + bytes([len(body)]) + body


def _label(name: bytes, value: bytes) -> bytes:
    inner = b"\x0a" + bytes([len(name)]) + name + b"\x12" + bytes([len(value)]) + value
    return b"\x0a" + bytes([len(inner)]) + inner


def test_label_bytes_that_look_like_a_sample_are_labels() -> None:
    """A label value ending in the bytes of a sample, with the label section of another series
    before them, is still one label: the known path cannot take it for labels plus sample."""
    stamp = "é\u0800".encode() + b"\x01"  # a 6-byte varint, and UTF-8 inside a label value
    tail = b"\x12\x07\x10" + stamp  # a zero-value sample
    name = _label(b"__name__", b"m")
    one = _series(name, tail)
    assert _known(one) is None  # not cached yet
    _same(remote_write_v1.decode(one, "_metric_"), _full(one))
    assert _known(one) is not None
    # the bytes of `name` + `tail` as the value of one label: no sample, other labels
    tricky_value = name + tail
    tricky = _series(_label(b"v", tricky_value), b"")
    assert _full(tricky).batch.series == []  # no samples
    _same(remote_write_v1.decode(tricky, "_metric_"), _full(tricky))
    assert _known(tricky) is None
    value = struct.pack("<d", 2.5)
    with_value = b"\x12\x10\x09" + value + b"\x10" + stamp
    both = one + _series(name, with_value)
    known = _known(both)
    assert known is not None
    _same(known, _full(both))

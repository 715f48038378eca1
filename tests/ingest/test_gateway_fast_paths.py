"""The gateway's fast paths give exactly what the plain paths give.

- Remote write 1.0's vectorized decoder (`remote_write_v1.decode_fast`) against the full upb
  parse (`to_batch(parse(raw))`) on generated requests of every shape (histograms, exemplars,
  metadata, many samples, odd field order, corrupt bytes): it either steps aside (None) or gives
  the same batch, and it takes the requests Prometheus sends.
- A `KeyedBatch` (series found by their decoder's keys) puts the same messages on the same
  partitions of the real Kafka as the same samples in a plain `SampleBatch`.
- The line protocol decoder's memory across messages changes nothing it decodes.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from core.dataset import Dataset, LabelLimits
from ingest.bad_records import Decoded
from ingest.batch import KeyedBatch, SampleBatch
from ingest.gateway import Gateway
from ingest.wire import line_protocol, remote_write_v1
from ingest.wire.line_protocol import decode_influx
from ingest.wire.prompb.remote_pb2 import WriteRequest
from tests.ingest.line_loop import keyed_alike, line_loop_only
from tests.ingest.test_gateway import _consume_all, dataset  # noqa: F401 - the fixture
from tests.ingest.test_gateway_hot_paths import steady_requests

T0 = 1_700_000_000_000
_names = st.sampled_from(["__name__", "job", "instance", "le", "a", "", "ü", "x" * 200])
_values = st.sampled_from(["up", "node", "h:9100", "", "é", "0.5", "v" * 300])
_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1.5])
_stamps = st.integers(-(2**63), 2**63 - 1) | st.integers(T0 - 10**9, T0 + 10**9) | st.just(0)


@st.composite
def write_requests(draw: st.DrawFn) -> WriteRequest:
    req = WriteRequest()
    for _ in range(draw(st.integers(0, 12))):
        ts = req.timeseries.add()
        for name, value in draw(st.lists(st.tuples(_names, _values), max_size=10)):
            lb = ts.labels.add()
            lb.name, lb.value = name, value
        for _ in range(draw(st.integers(0, 11))):
            s = ts.samples.add()
            s.value, s.timestamp = draw(_floats), draw(_stamps)
        if draw(st.integers(0, 9)) == 0:
            ts.histograms.add().count_int = 3
        if draw(st.integers(0, 9)) == 0:
            ts.exemplars.add().value = 1.0
    if draw(st.integers(0, 9)) == 0:
        req.metadata.add().metric_family_name = "up"
    return req


def _same(a: Decoded, b: Decoded) -> None:
    x, y = a.batch, b.batch
    assert x.series == y.series
    assert x.series_idx.tolist() == y.series_idx.tolist()
    assert x.timestamps.tolist() == y.timestamps.tolist()
    assert x.values.view(np.int64).tolist() == y.values.view(np.int64).tolist()  # NaN, -0.0
    assert x.bad_records == y.bad_records
    assert a.first_bad == b.first_bad


def _full(raw: bytes, metric_column: str = "_metric_") -> Decoded:
    return remote_write_v1.to_batch(remote_write_v1.parse(raw), metric_column)


@given(write_requests(), st.sampled_from(["_metric_", "__name__"]))
def test_fast_decoding_equals_the_full_parser(req: WriteRequest, metric_column: str) -> None:
    raw = req.SerializeToString()
    fast = remote_write_v1.decode_fast(raw, metric_column)
    if fast is not None:
        _same(fast, _full(raw, metric_column))
        _same(remote_write_v1.decode_fast(raw, metric_column) or fast, fast)  # cached labels
    plain = all(
        not ts.histograms and not ts.exemplars and len(ts.samples) <= 8 for ts in req.timeseries
    )
    if plain and req.timeseries and not req.metadata:
        assert fast is not None, "a plain request must take the fast path"


@given(st.one_of(write_requests(), steady_requests()), st.booleans(), st.data())
def test_corrupt_bodies_are_left_to_the_full_parser(
    req: WriteRequest, learn: bool, data: st.DataObject
) -> None:
    """Bytes changed (and the body perhaps cut), with or without the clean body's labels
    learnt first: the fast path gives the full parser's batch or steps aside, and never takes
    a body the full parser refuses."""
    clean = req.SerializeToString()
    if not clean:
        return
    if learn:
        remote_write_v1.decode(clean, "_metric_")
    raw = bytearray(clean)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(
            st.sampled_from([0x00, 0x07, 0x0A, 0x12, 0x09, 0x10, 0x80, 0xFF, raw[i] ^ 1])
        )
    cut = data.draw(st.integers(0, len(raw)))
    body = bytes(raw[:cut]) if data.draw(st.booleans()) else bytes(raw)
    fast = remote_write_v1.decode_fast(body, "_metric_")
    try:
        full = _full(body)
    except Exception:
        assert fast is None
        return
    if fast is not None:
        _same(fast, full)


def test_unusual_encodings_are_read_as_the_full_parser_reads_them() -> None:
    labels = b"\x0a\x0c\x0a\x08__name__\x12\x00"  # an explicit empty value: valid, not canonical
    sample = b"\x12\x0b\x09" + struct.pack("<d", 1.5) + b"\x10\x01"
    series = labels + sample
    raw = b"\x0a" + bytes([len(series)]) + series
    assert _full(raw).batch.series == [{"_metric_": ""}]
    fast = remote_write_v1.decode_fast(raw, "_metric_")
    assert fast is not None  # label bytes are only a cache key: any valid encoding is fine
    _same(fast, _full(raw))
    swapped = b"\x12\x0b\x10\x01\x09" + struct.pack("<d", 1.5)  # timestamp before value
    series = labels + swapped
    raw = b"\x0a" + bytes([len(series)]) + series
    assert remote_write_v1.decode_fast(raw, "_metric_") is None
    _same(remote_write_v1.decode(raw, "_metric_"), _full(raw))
    series = labels + sample
    padded = b"\x0a" + bytes([0x80 | len(series), 0x00]) + series  # a two-byte length varint
    fast = remote_write_v1.decode_fast(padded, "_metric_")
    assert fast is not None  # read as upb reads it
    _same(fast, _full(raw.replace(swapped, sample)))
    _same(remote_write_v1.decode(padded, "_metric_"), _full(raw.replace(swapped, sample)))
    with pytest.raises(DecodeError):
        WriteRequest.FromString(b"\x0a\x05\x0a\x03\x0a\x01\xff")  # not UTF-8
    assert remote_write_v1.decode_fast(b"\x0a\x05\x0a\x03\x0a\x01\xff", "_metric_") is None


def _prometheus_like(scrape: int, n_series: int = 3000) -> bytes:
    req = WriteRequest()
    for i in range(n_series):
        ts = req.timeseries.add()
        for name, value in sorted(
            {
                "__name__": f"m{i % 40}",
                "instance": f"host-{i // 100}:9100",
                "job": "node",
                "cpu": str(i % 8),
            }.items()
        ):
            lb = ts.labels.add()
            lb.name, lb.value = name, value
        s = ts.samples.add()
        s.value, s.timestamp = (0.0 if i % 5 == 0 else i + scrape / 10), T0 + 15_000 * scrape
    return req.SerializeToString()


def test_prometheus_shaped_requests_take_the_fast_path_and_share_label_dicts() -> None:
    first = remote_write_v1.decode(_prometheus_like(0), "_metric_")
    second = remote_write_v1.decode(_prometheus_like(1), "_metric_")
    assert isinstance(first.batch, KeyedBatch) and isinstance(second.batch, KeyedBatch)
    _same(second, _full(_prometheus_like(1)))
    assert all(a is b for a, b in zip(first.batch.series, second.batch.series, strict=True))
    assert first.batch.keys == second.batch.keys


def test_a_keyed_batch_sends_what_a_plain_batch_sends(dataset: Dataset) -> None:  # noqa: F811
    plain = [_full(_prometheus_like(k)).batch for k in range(3)]
    keyed = [remote_write_v1.decode(_prometheus_like(k), "_metric_").batch for k in range(3)]
    assert all(isinstance(b, KeyedBatch) for b in keyed)
    odd = keyed[0]  # keys for a bad series and out-of-range samples count the same too
    series = [*odd.series, {"job": "no-metric"}]
    idx = np.append(odd.series_idx, np.int32(len(series) - 1))
    ts = np.append(odd.timestamps, np.int64(T0))
    ts[:3] = -1
    plain.append(SampleBatch(series, idx, ts, np.append(odd.values, 1.0)))
    keyed.append(KeyedBatch(series, idx, ts, np.append(odd.values, 1.0), keys=[*odd.keys, b"x"]))
    with Gateway(dataset) as a:
        accepted_plain = [a.send_batch(b) for b in plain]
    with Gateway(dataset) as b:
        accepted_keyed = [b.send_batch(k) for k in keyed]
    assert accepted_plain == accepted_keyed == [3000, 3000, 3000, 2997]
    assert a.skipped == b.skipped == {"no_metric": 1, "timestamp_range": 3}
    per_partition: dict[int, list[bytes]] = {}
    for partition, value in _consume_all(dataset):
        per_partition.setdefault(partition, []).append(value)
    assert len(per_partition) > 1
    for messages in per_partition.values():  # a's messages, then b's: the same bytes
        half = len(messages) // 2
        assert messages[:half] == messages[half:]


def _decoded_exactly(a: Decoded, b: Decoded) -> None:
    """`_same`, and each series' labels in the same order (the binary format keeps it)."""
    _same(a, b)
    assert [list(s.items()) for s in a.batch.series] == [list(s.items()) for s in b.batch.series]


_tag_sets = ["host=a,dc=x", "dc=x,host=a", "host=b", "", "host=a,dc=x,k=v"]
_fields = ["value=1.5", "v=2i,value=3", "x=t,y=4", 'q="s",value=5', "value=1e400", "v=1,v=2"]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["cpu", "mem", "m\\ x", "#c"]),
            st.sampled_from(_tag_sets),
            st.sampled_from(_fields),
            st.sampled_from(["", " 1700000000000", " -1", " 99999999999999999999"]),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(
        [("_metric_", LabelLimits()), ("__name__", LabelLimits(max_labels_per_series=2))]
    ),
)
def test_line_protocol_caches_change_nothing(
    lines: list[tuple[str, str, str, str]], column_limits: tuple[str, LabelLimits]
) -> None:
    """What the line protocol decoder keeps across messages (series key texts, per-field
    labels, contract checks, keys) gives exactly what a decoder without memory gives."""
    column, limits = column_limits
    text = "\n".join(f"{m}{',' + t if t else ''} {f}{ts}" for m, t, f, ts in lines)

    def decode() -> Decoded:
        return decode_influx(text, T0, column, "ms", limits=limits)

    warm = [decode(), decode()]  # the second finds everything cached
    line_protocol._templates.clear()
    cold = decode()
    for got in warm:
        _decoded_exactly(got, cold)
    if isinstance(warm[1].batch, KeyedBatch):
        assert warm[1].batch.keys == warm[0].batch.keys
    assert _same_as_the_parser(text, column, limits)


def _same_as_the_parser(text: str, column: str, limits: LabelLimits) -> bool:
    fast = decode_influx(text, T0, column, "ms", limits=limits)
    slow = decode_influx(text, T0, column, "ms", fast_path=False, limits=limits)
    rows = [
        sorted(
            zip(
                [json.dumps(d.batch.series[i], sort_keys=True) for i in d.batch.series_idx],
                d.batch.timestamps.tolist(),
                d.batch.values.tolist(),
                strict=True,
            )
        )
        for d in (fast, slow)
    ]
    return rows[0] == rows[1] and fast.batch.bad_records == slow.batch.bad_records


def _mostly(usual: list[str], odd: list[str]) -> st.SearchStrategy[str]:
    """Usual values most of the time, so whole messages often qualify; odd ones sometimes."""
    return st.sampled_from(usual * (10 * len(odd)) + odd)


_measurements = _mostly(["cpu", "mem", "disk_io"], ["#x", "a=b", "é"])
_tag_orders = _mostly(["host=a,dc=x", "dc=x,host=a", "host=b", ""], ["h=1,h=2", "k=", "a=b=c"])
_bulk_values = _mostly(
    ["1.5", "0", "-12", ".5", "3e5", "0.0"],
    ["-0.0", "1e-400", "1e400", "2.2e-308", "1-2", "7i", "t", "0e-999", "00"],
)
_bulk_stamps = _mostly(
    ["1700000000000", "1700000000001", "0"],
    ["9223372036854775807", "9223372036854775808", "-5", "+5", "1_0", "99999999999999999999"],
)
_field_names = _mostly(["value", "v"], ["x y", "", "a,b"])


@given(
    st.lists(
        st.tuples(
            _measurements,
            _tag_orders,
            _field_names,
            _bulk_values,
            _bulk_stamps,
        ),
        min_size=1,
        max_size=8,
    ),
    _mostly(["ms"], ["ns", "s"]),
    st.booleans(),
)
def test_line_protocol_column_path_equals_the_reference(
    lines: list[tuple[str, str, str, str, str]], precision: str, trailing_newline: bool
) -> None:
    """Uniform plain messages (one field per line) are decoded by the column path; every
    message, odd ones included, decodes exactly as the reference (the parser) decodes it."""
    text = "\n".join(f"{m}{',' + t if t else ''} {f}={v} {ts}" for m, t, f, v, ts in lines) + (
        "\n" if trailing_newline else ""
    )
    fast = decode_influx(text, T0, "_metric_", precision)
    with line_loop_only():
        reference = decode_influx(text, T0, "_metric_", precision)
    _decoded_exactly(fast, reference)
    keyed_alike(fast.batch, reference.batch)


def test_plain_messages_take_the_column_path() -> None:
    text = "\n".join(f"cpu,host=h{i % 7},dc=x value={i * 0.5} {T0 + i}" for i in range(50))
    b = line_protocol._InfluxBuilder("_metric_")
    assert line_protocol._decode_columns(b, text.encode(), 0, 2**62)
    assert len(b.series) == 7 and list(b.idx) == [i % 7 for i in range(50)]

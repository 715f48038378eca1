"""Record formats: binary round trips (property-tested), every bad-record reason, line protocol."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.dataset import Dataset, RecordFormat, SourceSettings
from ingest.bad_records import MAX_TIMESTAMP_MS
from ingest.batch import SampleBatch
from ingest.records import decoder_for
from ingest.wire.binary_format import (
    HEADER,
    RecordEncodeError,
    decode_binary,
    encode_binary,
    encode_binary_parts,
    encode_labels,
)
from ingest.wire.line_protocol import decode_influx

INT64 = (-(1 << 63), (1 << 63) - 1)
T0 = 1_700_000_000_000


def _batch(series, idx, ts, vals) -> SampleBatch:
    return SampleBatch(
        series,
        np.asarray(idx, dtype=np.int32),
        np.asarray(ts, dtype=np.int64),
        np.asarray(vals, dtype=np.float64),
    )


def _rows(batch: SampleBatch) -> list[tuple[tuple, int, int]]:
    """Per sample: (sorted labels, timestamp, value bits), so NaN payloads and -0.0 compare."""
    bits = batch.values.view(np.uint64).tolist()
    return [
        (tuple(sorted(batch.series[i].items())), t, b)
        for i, t, b in zip(batch.series_idx.tolist(), batch.timestamps.tolist(), bits, strict=True)
    ]


def _sample_batch() -> SampleBatch:
    series = [
        {"_metric_": "cpu", "_ws_": "w", "host": "a"},
        {"_metric_": "température", "lieu": "Zürich 🌡", "": ""},
        {"__name__": "up", "job": "node"},
    ]
    vals = [1.5, float("nan"), float("inf"), -float("inf"), -0.0, 0.0]
    return _batch(series, [0, 1, 2, 0, 1, 2], [T0, T0, T0, T0 + 15_000, T0 + 1, T0 - 7], vals)


# ------------------------------------------------------------------------------ binary


@pytest.mark.parametrize("level", [0, 1, 3])
def test_binary_round_trip_keeps_labels_and_value_bits(level: int) -> None:
    batch = _sample_batch()
    got = decode_binary(encode_binary(batch, level))
    assert got.first_bad is None and got.batch.bad_records == {}
    assert got.batch.series == batch.series
    assert _rows(got.batch) == _rows(batch)
    stale = np.array([0x7FF0000000000002], np.uint64).view(np.float64)  # Prometheus stale NaN
    got = decode_binary(encode_binary(_batch([{"_metric_": "m"}], [0], [T0], stale), level))
    assert got.batch.values.view(np.uint64).tolist() == [0x7FF0000000000002]


def test_binary_empty_batch_round_trips() -> None:
    got = decode_binary(encode_binary(SampleBatch.empty()))
    assert len(got.batch) == 0 and got.batch.series == [] and got.batch.bad_records == {}


@pytest.mark.parametrize(("n_series", "idx_width"), [(256, 1), (257, 2), (65_536, 2), (65_537, 4)])
def test_binary_series_index_width_grows_with_the_series_table(
    n_series: int, idx_width: int
) -> None:
    series = [{"_metric_": f"m{i}"} for i in range(n_series)]
    idx = np.arange(n_series)[::-1]
    message = encode_binary(_batch(series, idx, np.full(n_series, T0), idx), 0)
    assert message[5] == idx_width
    got = decode_binary(message).batch
    assert got.series == series
    assert got.values.tolist() == idx.tolist()
    assert [got.series[i]["_metric_"] for i in got.series_idx.tolist()] == [
        f"m{i}" for i in idx.tolist()
    ]


def test_binary_timestamps_use_4_bytes_unless_the_span_needs_8() -> None:
    narrow = encode_binary(_batch([{"_metric_": "m"}] * 1, [0, 0], [T0, T0 + 2**32 - 1], [1, 2]))
    wide = encode_binary(_batch([{"_metric_": "m"}], [0, 0], list(INT64), [1, 2]))
    assert narrow[6] == 4 and wide[6] == 8
    got = decode_binary(wide, ts_range=INT64).batch
    assert got.timestamps.tolist() == list(INT64)


def test_binary_compresses_typical_scrapes() -> None:
    series = [{"_metric_": f"http_requests_{i % 20}", "instance": f"h{i}"} for i in range(1000)]
    idx = np.tile(np.arange(1000), 10)
    ts = np.repeat(T0 + 15_000 * np.arange(10), 1000)
    vals = np.round(np.random.default_rng(0).normal(100, 5, 10_000), 1)
    batch = _batch(series, idx, ts, vals)
    raw, packed = encode_binary(batch, 0), encode_binary(batch, 1)
    assert len(raw) == HEADER.size + 10_000 * (8 + 4 + 2) + 2 * 1000 + len(
        b"\xff".join(encode_labels(s) for s in series)
    )
    assert len(packed) < len(raw) / 2
    assert _rows(decode_binary(packed).batch) == _rows(batch)


# Series within the dataset's contract: a metric name, no value under an empty label name.
labels_st = st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=12), max_size=4).map(
    lambda d: {**d, "_metric_": "m"}
)


@st.composite
def batches(draw: st.DrawFn) -> SampleBatch:
    series = draw(st.lists(labels_st, min_size=1, max_size=6))
    n = draw(st.integers(0, 40))
    idx = draw(st.lists(st.integers(0, len(series) - 1), min_size=n, max_size=n))
    ts = draw(st.lists(st.integers(*INT64), min_size=n, max_size=n))
    vals = draw(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=n, max_size=n))
    return _batch(series, idx, ts, vals)


@given(batch=batches(), level=st.sampled_from([0, 1]))
def test_binary_round_trip_property(batch: SampleBatch, level: int) -> None:
    got = decode_binary(encode_binary(batch, level), ts_range=INT64)
    assert got.batch.bad_records == {} and got.first_bad is None
    assert got.batch.series == batch.series
    assert _rows(got.batch) == _rows(batch)


@given(
    batch=batches(),
    level=st.sampled_from([0, 1]),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10_000),
)
def test_binary_corrupt_messages_never_raise(batch, level, edits, cut) -> None:
    data = bytearray(encode_binary(batch, level))
    for pos, byte in edits:
        data[pos % len(data)] = byte
    got = decode_binary(bytes(data[: max(cut, len(data) // 2)]))
    assert isinstance(got.batch, SampleBatch)
    if got.batch.bad_records.get("undecodable"):
        assert len(got.batch) == 0 and got.first_bad.startswith("undecodable")


@pytest.mark.parametrize("level", [0, 1])
def test_binary_every_truncation_is_undecodable(level: int) -> None:
    message = encode_binary(_sample_batch(), level)
    for n in range(len(message)):
        got = decode_binary(message[:n])
        assert got.batch.bad_records == {"undecodable": 1}, n
        assert len(got.batch) == 0
        assert got.first_bad is not None and "undecodable" in got.first_bad


def _patched(message: bytes, **fields: int) -> bytes:
    names = ["magic", "version", "flags", "idx_w", "ts_w", "n_series", "n", "base", "body_len"]
    values = dict(zip(names, HEADER.unpack_from(message), strict=True))
    values.update(fields)
    return HEADER.pack(*values.values()) + message[HEADER.size :]


@pytest.mark.parametrize(
    ("mangle", "why"),
    [
        (lambda m: b"XYZ" + m[3:], "bad magic"),
        (lambda m: _patched(m, version=2), "unsupported version 2"),
        (lambda m: _patched(m, flags=0x80), "unknown flags"),
        (lambda m: _patched(m, idx_w=3), "bad widths"),
        (lambda m: _patched(m, ts_w=2), "bad widths"),
        (lambda m: _patched(m, body_len=1 << 30), "exceeds"),
        (lambda m: _patched(m, n=10**6), "do not fit"),
        (lambda m: _patched(m, n_series=1), "series index beyond"),
        (lambda m: m + b"x", "header says"),
        (lambda m: b"", "shorter than"),
    ],
)
def test_binary_structural_errors_are_undecodable(mangle, why: str) -> None:
    got = decode_binary(mangle(encode_binary(_sample_batch(), 0)))
    assert got.batch.bad_records == {"undecodable": 1}
    assert why in got.first_bad


def test_binary_series_table_errors_are_undecodable() -> None:
    bad_utf8 = encode_binary_parts([b"_metric_\xff\xc3\x28"], [1], [0], [T0], [1.0], 0)
    got = decode_binary(bad_utf8)
    assert got.batch.bad_records == {"undecodable": 1} and "UTF-8" in got.first_bad
    miscounted = encode_binary_parts([b"_metric_\xffm"], [2], [0], [T0], [1.0], 0)
    got = decode_binary(miscounted)
    assert got.batch.bad_records == {"undecodable": 1} and "strings" in got.first_bad
    with pytest.raises(RecordEncodeError):
        encode_binary_parts([b"x"], [1], [1], [T0], [1.0])


def test_binary_mixed_good_and_bad_samples() -> None:
    series = [{"_metric_": "good", "i": "0"}, {"job": "no-name"}, {"_metric_": "good", "i": "2"}]
    idx = [0, 1, 2, 0, 1, 2, 2, 0]
    ts = [T0, T0, T0, -1, T0, MAX_TIMESTAMP_MS + 1, T0 + 1, MAX_TIMESTAMP_MS]
    got = decode_binary(encode_binary(_batch(series, idx, ts, range(8))))
    # samples 1 and 4: no metric; 3 and 5: out of range; the no-metric one wins for sample 4
    assert got.batch.bad_records == {"no_metric": 2, "timestamp_range": 2}
    assert got.first_bad.startswith("no_metric") and "no-name" in got.first_bad
    assert got.batch.series == [series[0], series[2]]  # the metric-less series is gone
    assert _rows(got.batch) == _rows(
        _batch(series, [0, 2, 2, 0], [T0, T0, T0 + 1, MAX_TIMESTAMP_MS], [0, 2, 6, 7])
    )


def test_binary_only_timestamp_errors_and_custom_range() -> None:
    batch = _batch([{"_metric_": "m"}], [0, 0, 0], [5, 10, 20], [1, 2, 3])
    got = decode_binary(encode_binary(batch), ts_range=(10, 19))
    assert got.batch.bad_records == {"timestamp_range": 2}
    assert got.batch.timestamps.tolist() == [10] and got.first_bad.startswith("timestamp_range")


def test_binary_metric_column_is_the_datasets() -> None:
    batch = _batch([{"name": "m"}, {"_metric_": "x"}], [0, 1], [T0, T0], [1, 2])
    got = decode_binary(encode_binary(batch), metric_column="name")
    assert got.batch.series == [{"name": "m"}] and got.batch.bad_records == {"no_metric": 1}


# ------------------------------------------------------------------------------ line protocol

NS = 1_000_000


def _influx_rows(text, **kw) -> list[tuple[tuple, int, float]]:
    got = decode_influx(text, T0, **kw).batch
    return sorted(
        (tuple(sorted(got.series[i].items())), t, v)
        for i, t, v in zip(
            got.series_idx.tolist(), got.timestamps.tolist(), got.values.tolist(), strict=True
        )
    )


def test_influx_mapping_fields_to_series() -> None:
    text = f"cpu,host=a,dc=eu usage_user=1.5,value=2i,count=3u,neg=-4i,e=1e3 {T0 * NS + 123}"
    assert _influx_rows(text) == sorted(
        (tuple(sorted({"host": "a", "dc": "eu", "_metric_": m}.items())), T0, v)
        for m, v in [
            ("cpu_usage_user", 1.5),
            ("cpu", 2.0),
            ("cpu_count", 3.0),
            ("cpu_neg", -4.0),
            ("cpu_e", 1000.0),
        ]
    )


@pytest.mark.parametrize("fast_path", [True, False])
def test_influx_escapes_and_quoted_strings(fast_path: bool) -> None:
    text = r"my\ meas,tag\,k=v\=1,host=a\ b " + 'f=1,s="a, b=c \\" d",b=true,g=2.5 ' + str(T0 * NS)
    got = decode_influx(text, 0, fast_path=fast_path)
    assert got.batch.bad_records == {"non_numeric": 2}
    labels = {"tag,k": "v=1", "host": "a b"}
    assert _influx_rows(text, fast_path=fast_path) == sorted(
        [
            (tuple(sorted({**labels, "_metric_": "my meas_f"}.items())), T0, 1.0),
            (tuple(sorted({**labels, "_metric_": "my meas_g"}.items())), T0, 2.5),
        ]
    )
    assert got.first_bad.startswith("non_numeric")


def test_influx_bad_lines_are_counted_and_skipped() -> None:
    lines = [
        f"ok v=1 {T0 * NS}",
        "no_fields_here",
        "m v=nan",
        f'm,t=a b=t,s="x",f=F {T0 * NS}',  # all non-numeric
        f"m v=1 {-1 * NS}",  # before 1970
        f"m v=1,w=2 {-5 * NS}",  # both fields counted
        "m v=1 99999999999999999999",  # not an int64: undecodable
        "# a comment",
        "",
        "   ",
        f"ok v=2 {T0 * NS + NS}\r",
        "ok v=3",  # no timestamp: the default
    ]
    got = decode_influx("\n".join(lines), T0 + 5)
    assert got.batch.bad_records == {"undecodable": 3, "non_numeric": 3, "timestamp_range": 3}
    assert got.first_bad.startswith("undecodable") and "no_fields_here" in got.first_bad
    assert got.batch.series == [{"_metric_": "ok_v"}]
    assert got.batch.timestamps.tolist() == [T0, T0 + 1, T0 + 5]
    assert got.batch.values.tolist() == [1.0, 2.0, 3.0]


def test_influx_timestamp_range_in_any_precision() -> None:
    text = f"m v=1 {MAX_TIMESTAMP_MS}\nm v=1 {MAX_TIMESTAMP_MS + 1}\nm v=1 -1"
    got = decode_influx(text, 0, precision="ms")
    assert got.batch.bad_records == {"timestamp_range": 2}
    assert got.batch.timestamps.tolist() == [MAX_TIMESTAMP_MS]
    got = decode_influx(f"m v=1 {T0 * NS}\nm v=2 {(T0 + 10) * NS}", 0, ts_range=(0, T0 + 9))
    assert got.batch.bad_records == {"timestamp_range": 1} and got.batch.values.tolist() == [1]


def test_influx_fast_path_undoes_a_line_it_gives_up_on() -> None:
    got = decode_influx(f"m a=1,b=2,c=nan {T0 * NS}\nm a=3,a=4,a=t {T0 * NS}", 0)
    assert got.batch.bad_records == {"undecodable": 1}
    assert got.batch.series == [{"_metric_": "m_a"}]  # no series left over from line 1
    assert got.batch.values.tolist() == [3.0]  # the parser keeps the first duplicate


def test_influx_invalid_utf8_line_is_undecodable_others_kept() -> None:
    data = b"m,t=\xff v=1 0\nm,t=\xc3\xa9 v=2 " + str(T0 * NS).encode()
    got = decode_influx(data, T0)
    assert got.batch.bad_records == {"undecodable": 1}
    assert got.batch.series == [{"t": "é", "_metric_": "m_v"}]


@pytest.mark.parametrize(
    ("precision", "ts", "ms"),
    [("ns", T0 * NS + 999_999, T0), ("us", T0 * 1000 + 999, T0), ("ms", T0, T0), ("s", 1, 1000)],
)
def test_influx_precision(precision: str, ts: int, ms: int) -> None:
    got = decode_influx(f"m v=1 {ts}", 0, precision=precision).batch
    assert got.timestamps.tolist() == [ms]
    assert decode_influx("m v=1", T0, precision=precision).batch.timestamps.tolist() == [
        T0 if precision != "s" else T0 // 1000 * 1000
    ]
    with pytest.raises(ValueError, match="precision"):
        decode_influx("m v=1", 0, precision="m")


def test_influx_many_lines_intern_series() -> None:
    text = "\n".join(f"cpu,host=h{i % 3} a=1,b=2 {(T0 + i) * NS}" for i in range(30))
    got = decode_influx(text, 0).batch
    assert len(got) == 60 and len(got.series) == 6
    assert got.series_idx.dtype == np.int32 and got.timestamps.dtype == np.int64


def test_influx_metric_column_and_existing_name_tag() -> None:
    got = decode_influx(f"m,_metric_=x,__name__=y v=1 {T0 * NS}", 0, metric_column="_metric_")
    assert got.batch.series == [{"_metric_": "m_v", "__name__": "y"}]


# The fast path must agree with the maintained parser on every line: generate lines from a
# tiny alphabet rich in the characters that matter (separators, escapes, quotes, type suffixes).
_atoms = st.sampled_from(
    [
        *("m", "cpu", "a", "b", "value", " ", ",", "=", "\\", '"', "1", "0", "-", ".", "e", "i"),
        *("u", "t", "true", "F", "nan", "inf", "+", "_", "\t", "\r", "#", "é", "5", "1e400", "00"),
    ]
)
_numbers = st.one_of(
    st.integers(-(2**65), 2**65).map(str),
    st.floats(allow_nan=False).map(repr),
    st.integers(-(2**65), 2**65).map(lambda i: f"{i}i"),
    st.integers(-5, 2**65).map(lambda i: f"{i}u"),
    st.sampled_from(["t", "false", "TRUE", '"s"', "1e-320", "-0.0", "0e-999"]),
)
_field = st.tuples(st.sampled_from(["v", "value", "x", "v"]), _numbers).map("=".join)


@st.composite
def lines(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return "".join(draw(st.lists(_atoms, max_size=25)))
    tags = draw(st.lists(st.sampled_from(["h=a", "h=b", "dc=x", "k=v"]), max_size=3))
    fields = draw(st.lists(_field, min_size=1, max_size=3))
    ts = draw(st.one_of(st.none(), st.integers(-(2**64), 2**64).map(str), _numbers))
    line = ",".join(["m", *tags]) + " " + ",".join(fields)
    return line if ts is None else f"{line} {ts}"


@given(st.lists(lines(), min_size=1, max_size=6))
def test_influx_fast_path_agrees_with_the_parser(batch_lines: list[str]) -> None:
    text = "\n".join(batch_lines)
    fast = decode_influx(text, T0)
    slow = decode_influx(text, T0, fast_path=False)
    assert fast.batch.bad_records == slow.batch.bad_records
    assert _influx_rows(text) == _influx_rows(text, fast_path=False)
    assert (fast.first_bad is None) == (slow.first_bad is None)


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_influx_arbitrary_bytes_never_raise(data: bytes) -> None:
    got = decode_influx(data, T0)
    assert isinstance(got.batch, SampleBatch)
    assert all(math.isfinite(v) for v in got.batch.values.tolist())


# ------------------------------------------------------------------------------ dispatch


def test_decoder_for_follows_the_datasets_record_format() -> None:
    binary = Dataset(name="b", num_shards=4)
    influx = Dataset(
        name="i", num_shards=4, source=SourceSettings(record_format=RecordFormat.INFLUX)
    )
    message = encode_binary(_batch([{"_metric_": "m"}], [0], [T0], [1.0]))
    assert decoder_for(binary)(message, 0).batch.values.tolist() == [1.0]
    got = decoder_for(influx)(b"m v=2", T0).batch
    assert got.values.tolist() == [2.0] and got.timestamps.tolist() == [T0]
    # each format's decoder treats the other's messages as bad records, without raising
    assert decoder_for(binary)(b"m v=2", T0).batch.bad_records == {"undecodable": 1}
    assert decoder_for(influx)(message, T0).batch.bad_records.get("undecodable", 0) >= 1


def test_header_layout_is_32_bytes_little_endian() -> None:
    message = encode_binary(_batch([{"_metric_": "m"}], [0, 0], [T0 + 9, T0], [1, 2]), 0)
    assert message[:4] == b"FPB\x01"
    table = len(b"_metric_\xffm")
    assert struct.unpack_from("<BBBxIIqI", message, 4) == (0, 1, 4, 1, 2, T0, 2 * 13 + 2 + table)

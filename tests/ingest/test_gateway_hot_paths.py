"""The HTTP gateway's steady-state paths give exactly what the plain paths give.

- Remote write 1.0's fast path (`remote_write_v1.decode_fast`: the protobuf walker, each
  series' label bytes found among those known) against the full upb parse, on generated
  requests, corrupt bytes, label values crafted to look like a sample, and alike label sets
  whose hashes collide on purpose (a hit is only ever the same bytes); the table's bound.
- Line protocol's column path (`line_protocol._decode_columns`: NumPy over the body's bytes)
  against the line loop alone, on plain messages and adversarial ones (escapes, quoted strings,
  booleans, integer fields, several fields, missing or odd timestamps, every precision, bad
  lines, control characters, invalid UTF-8): the same samples, series, label order, counts
  of refused samples and first offender.
- The gateway's messages, their columns computed for all shards at once
  (`binary_format.encode_checked`), are byte for byte what `encode_binary_parts` makes of the
  same samples, for batches of one sample per series and others, any timestamps; batches whose
  series are found by their int keys (`IntKeyedBatch`) give the same messages as plain ones.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.dataset import Dataset, LabelLimits, SourceSettings
from core.hashing import shard_for_series
from ingest import byte_table, gateway
from ingest.bad_records import Decoded
from ingest.batch import IntKeyedBatch, KeyedBatch, SampleBatch, new_series_key
from ingest.gateway import Gateway
from ingest.wire import line_protocol, remote_write_v1
from ingest.wire.binary_format import decode_binary, encode_binary_parts, encode_labels
from ingest.wire.line_protocol import decode_influx, decode_lines
from ingest.wire.prompb.remote_pb2 import WriteRequest
from tests.ingest.line_loop import keyed_alike, line_loop_only
from tests.ingest.test_byte_table import collisions  # noqa: F401 - the fixture
from tests.ingest.threads import in_threads

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
        _add_series(draw, req, draw(st.sampled_from(_label_sets)))
    return req


def _add_series(draw: st.DrawFn, req: WriteRequest, labels: list[tuple[str, str]]) -> None:
    """A series of `labels` with mostly one sample (sometimes none, or two)."""
    ts = req.timeseries.add()
    for name, value in labels:
        lb = ts.labels.add()
        lb.name, lb.value = name, value
    for _ in range(draw(st.sampled_from([1] * 8 + [0, 2]))):
        s = ts.samples.add()
        s.value, s.timestamp = draw(_floats), draw(_stamps)


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
    """The fast path, which finds known series' labels by their bytes (and learns new ones)."""
    return remote_write_v1.decode_fast(raw, metric_column)


def _usual(req: WriteRequest) -> bool:
    """Every series labels and one sample with a 6-byte timestamp varint: the known path's
    shape."""
    return all(
        len(ts.labels) and len(ts.samples) == 1 and 2**35 <= ts.samples[0].timestamp < 2**42
        for ts in req.timeseries
    )


@given(steady_requests(), st.sampled_from(["_metric_", "__name__"]))
def test_known_series_path_equals_the_full_parser(req: WriteRequest, metric_column: str) -> None:
    raw = req.SerializeToString()
    first = remote_write_v1.decode(raw, metric_column)  # learns the labels
    _same(first, _full(raw, metric_column))
    known = _known(raw, metric_column)
    if known is not None:
        _same(known, _full(raw, metric_column))
        if len(known.batch):
            assert isinstance(known.batch, KeyedBatch) and isinstance(first.batch, KeyedBatch)
            assert known.batch.keys == first.batch.keys
    elif _usual(req):
        raise AssertionError("a steady request with cached labels must take the known path")
    _same(remote_write_v1.decode(raw, metric_column), _full(raw, metric_column))


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
    _same(remote_write_v1.decode(one, "_metric_"), _full(one))
    assert _known(one) is not None
    # the bytes of `name` + `tail` as the value of one label: no sample, other labels
    tricky_value = name + tail
    tricky = _series(_label(b"v", tricky_value), b"")
    assert _full(tricky).batch.series == []  # no samples
    _same(remote_write_v1.decode(tricky, "_metric_"), _full(tricky))
    tricky_known = _known(tricky)
    assert tricky_known is not None and not tricky_known.batch.series
    value = struct.pack("<d", 2.5)
    with_value = b"\x12\x10\x09" + value + b"\x10" + stamp
    both = one + _series(name, with_value)
    known = _known(both)
    assert known is not None
    _same(known, _full(both))


# Label sets alike: the same names, values of one length differing in a byte (colliding when only
# the length is hashed), a series without labels, and long sections (the gathered words).
_alike_values = ["aa", "ab", "ba", "bb", "a\u00e9", "", "x" * 300, "x" * 299 + "y"]


@st.composite
def alike_requests(draw: st.DrawFn) -> WriteRequest:
    """Series of alike label sets, new and known, mostly one sample each, any value."""
    req = WriteRequest()
    for _ in range(draw(st.integers(1, 12))):
        labels = [("__name__", draw(st.sampled_from(["m", "n"])))]
        labels += [
            (k, draw(st.sampled_from(_alike_values))) for k in ["a", "b"][: draw(st.integers(0, 2))]
        ]
        if draw(st.integers(0, 19)) == 0:
            labels = []
        _add_series(draw, req, labels)
    return req


@pytest.fixture
def fresh_tables() -> Iterator[None]:
    """Remote write's label tables emptied before and after (entries hashed another way are
    not found again)."""
    remote_write_v1._tables.clear()
    yield
    remote_write_v1._tables.clear()


@settings(
    max_examples=150,  # per kind of collision: three runs
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(alike_requests(), min_size=1, max_size=4))
def test_known_series_path_with_colliding_hashes(
    collisions: str,  # noqa: F811 - the fixture
    fresh_tables: None,
    requests: list[WriteRequest],
) -> None:
    """Hashes as they are or colliding on purpose (`collisions`): a known series is only ever
    found as the same label bytes, and every known series is found."""
    remote_write_v1._tables.clear()
    for req in requests:
        raw = req.SerializeToString()
        known = _known(raw)
        if known is not None:
            _same(known, _full(raw))
        _same(remote_write_v1.decode(raw, "_metric_"), _full(raw))
        known = _known(raw)
        if known is not None:
            _same(known, _full(raw))
        elif _usual(req):
            raise AssertionError("a steady request of known series must take the known path")


def test_label_sections_of_one_hash_are_told_apart(
    fresh_tables: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every label section of a length hashing alike: each series still gets its own labels,
    the sections without a slot found by their bytes."""
    monkeypatch.setattr(byte_table, "_MIX", np.zeros_like(byte_table._MIX))
    sample = b"\x12\x10\x09" + struct.pack("<d", 1.5) + b"\x10" + b"\x80" * 5 + b"\x01"
    raw = b"".join(
        _series(_label(b"__name__", b"m") + _label(b"k", v), sample) for v in [b"ab", b"ba", b"aa"]
    )
    _same(remote_write_v1.decode(raw, "_metric_"), _full(raw))
    assert len(remote_write_v1._tables["_metric_"].overflow) == 2
    known = _known(raw)
    assert known is not None
    _same(known, _full(raw))
    assert [s["k"] for s in known.batch.series] == ["ab", "ba", "aa"]


def test_label_tables_are_bounded(fresh_tables: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `LABEL_CACHE_SIZE` series the table starts afresh; every request decodes as the
    full parser decodes it."""
    monkeypatch.setattr(remote_write_v1, "LABEL_CACHE_SIZE", 50)
    for scrape in range(3):
        for lo in range(0, 200, 40):
            req = WriteRequest()
            for i in range(lo, lo + 40):
                ts = req.timeseries.add()
                lb = ts.labels.add()
                lb.name, lb.value = "__name__", f"m{i}"
                s = ts.samples.add()
                s.value, s.timestamp = i + scrape, T0 + scrape
            raw = req.SerializeToString()
            _same(remote_write_v1.decode(raw, "_metric_"), _full(raw))
            assert len(remote_write_v1._tables["_metric_"]) <= 90


def _fleet_request(lo: int, hi: int, scrape: int) -> bytes:
    req = WriteRequest()
    for i in range(lo, hi):
        ts = req.timeseries.add()
        for name, value in [("__name__", f"m{i % 7}"), ("host", f"h{i // 7}"), ("job", "node")]:
            lb = ts.labels.add()
            lb.name, lb.value = name, value
        s = ts.samples.add()
        s.value, s.timestamp = (0.0 if i % 5 == 0 else i + scrape), T0 + 15_000 * scrape
    return req.SerializeToString()


@pytest.mark.parametrize("cache_size", [500_000, 500])
def test_decoders_on_several_threads(
    fresh_tables: None, monkeypatch: pytest.MonkeyPatch, cache_size: int
) -> None:
    """Requests decode on worker threads sharing the label table (new series learnt while
    others are found, the table growing, or emptied when over its bound): each result is the
    full parser's."""
    monkeypatch.setattr(remote_write_v1, "LABEL_CACHE_SIZE", cache_size)
    bodies = [_fleet_request(i, i + 400, s) for s in range(3) for i in range(0, 4000, 400)]
    want = [_full(raw) for raw in bodies]

    def each(k: int) -> None:
        _same(remote_write_v1.decode(bodies[k], "_metric_"), want[k])

    in_threads(each, len(bodies), seed=5)


# ----- line protocol ---------------------------------------------------------------------------


def _exactly(a: Decoded, b: Decoded) -> None:
    """The same batch, each series' labels in the same order (the binary format keeps it),
    keyed alike (the column path's keys also as an int64 array, equal to its list)."""
    _same(a, b)
    assert [list(s.items()) for s in a.batch.series] == [list(s.items()) for s in b.batch.series]
    keyed_alike(a.batch, b.batch)


def _mostly(usual: list[str], odd: list[str]) -> st.SearchStrategy[str]:
    """Usual values most of the time, so whole messages often qualify; odd ones sometimes."""
    return st.sampled_from(usual * (10 * len(odd)) + odd)


_lp_measurements = _mostly(["cpu", "mem", "disk_io", "é"], ["#x", "a=b", "m\\ x", "", "a,"])
_lp_tags = _mostly(
    ["host=a,dc=x", "dc=x,host=a", "host=b", "", "k=é"],
    ["h=1,h=2", "k=", "a=b=c", "=v", "k=v\\,w", 'q="x"', "k=v\r"],
)
_lp_names = _mostly(["value", "v"], ["x y", "", "a,b", "a=b", '"q"', "value\t"])
_lp_values = _mostly(
    ["1.5", "0", "-12", ".5", "3e5", "0.0", "1E-3", "991.315"],
    [
        "-0.0", "1e-400", "1e400", "2.2e-308", "1-2", "7i", "-7i", "7u", "t", "FALSE",
        '"str"', '"a b"', "0e-999", "00", "nan", "inf", "+1", "1_0", ".", "-", "e5",
        "9223372036854775808i", "18446744073709551615u", "1.5,v=2", "1=2", "",
    ],
)  # fmt: skip
_lp_stamps = _mostly(
    ["1700000000000", "1700000000001", "1700000000"],
    [
        "", "0", "7", "9223372036854775807", "9223372036854775808", "-5", "+5", "1_0",
        "99999999999999999999", "\uff11\uff17", "999999999999999999", "1700000000000 ",
        " 1700000000000", "17e2", "1700000000000\r",
    ],
)  # fmt: skip
_lp_joins = _mostly(["\n"], ["\r\n", "\n\n", "\n \n", "\n# comment here\n"])


@st.composite
def lp_messages(draw: st.DrawFn) -> bytes:
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        m, tags, name, value, stamp = (
            draw(_lp_measurements),
            draw(_lp_tags),
            draw(_lp_names),
            draw(_lp_values),
            draw(_lp_stamps),
        )
        line = f"{m}{',' + tags if tags else ''} {name}={value}{' ' + stamp if stamp else ''}"
        lines.append(line)
    text = lines[0]
    for line in lines[1:]:
        text += draw(_lp_joins) + line
    text += draw(st.sampled_from(["", "", "\n", "\n\n", " "]))
    raw = text.encode()
    if draw(st.integers(0, 19)) == 0:  # invalid UTF-8 somewhere
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + b"\xff" + raw[at:]
    return raw


_precisions = _mostly(["ms"], ["ns", "us", "s", "m", "h"])
_columns = st.sampled_from(
    [("_metric_", LabelLimits()), ("__name__", LabelLimits(max_labels_per_series=2))]
)


@given(lp_messages(), _precisions, _columns)
def test_line_protocol_column_path_equals_the_line_loop(
    raw: bytes, precision: str, column_limits: tuple[str, LabelLimits]
) -> None:
    column, limits = column_limits
    got = decode_lines(raw, T0, column, precision, limits)
    again = decode_lines(raw, T0, column, precision, limits)  # every key known now
    with line_loop_only():
        loop = decode_lines(raw, T0, column, precision, limits)
    _exactly(got, loop)
    _exactly(again, loop)
    if isinstance(got.batch, KeyedBatch) and isinstance(again.batch, KeyedBatch):
        assert got.batch.keys == again.batch.keys


@given(lp_messages(), st.booleans())
def test_line_protocol_str_and_bytes_decode_alike(raw: bytes, forget: bool) -> None:
    """decode_influx takes str too (the same path), and what it keeps across messages (series
    keys as text and as bytes) changes nothing."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return
    if forget:
        line_protocol._templates.clear()
        line_protocol._known_by_bytes.clear()
    _exactly(decode_influx(text, T0, "_metric_", "ms"), decode_influx(raw, T0, "_metric_", "ms"))


def _plain(n: int, stamp: str = "1700000000000", field: str = "value") -> bytes:
    lines = [f"cpu,host=h{i},dc=x {field}={i * 0.5} {stamp}" for i in range(n)]
    return "\n".join(lines).encode()


@pytest.mark.parametrize(
    "raw",
    [
        _plain(50),
        _plain(50) + b"\n",
        _plain(3, "1"),
        _plain(3, "170000000000000000"),  # 18 digits
        _plain(3, "1700000000000000000"),  # 19 digits (nanoseconds)
        b"cpu value=1 1700000000000\ncpu value=2 1700000000001",  # one series, two samples
        b"cpu,a=1,b=2 value=1 1700000000000\ncpu,b=2,a=1 value=2 1700000000001",  # tag order
        b"cpu,host=a value=1 17\ncpu,host=b value=2 1700000000000",  # stamps of two lengths
        "mém,hôte=é valeur=1 1700000000000".encode(),
    ],
)
def test_plain_messages_take_the_column_path(raw: bytes) -> None:
    b = line_protocol._InfluxBuilder("_metric_")
    assert line_protocol._decode_columns(b, raw, 0, 2**62)
    got = decode_influx(raw, T0, "_metric_", "ms")
    with line_loop_only():
        _exactly(got, decode_influx(raw, T0, "_metric_", "ms"))


@pytest.mark.parametrize(
    "raw",
    [
        _plain(3) + b"\n\n",
        b"cpu value=1 1700000000000\r\ncpu value=2 1700000000000",
        b"cpu value=1 1700000000000\ncpu v=2 1700000000000",  # two field names
        b"cpu value=1,v=2 1700000000000",
        b"cpu value=1i 1700000000000",
        b"cpu value=1 -1700000000000",
        b"cpu value=1",
        b" cpu value=1 1700000000000",
        b"cpu  value=1 1700000000000",
        b"cpu value=1 1700000000000 ",
        b"cpu value= 1700000000000",
        b"cpu =1 1700000000000",
        b"cpu value=nan 1700000000000",
        b"cpu value=1e-400 1700000000000",
        b"cpu value=1\x0b 1700000000000",
        b"cpu,h=a,h=b value=1 1700000000000",
        b"",
        b"\n",
    ],
)
def test_other_messages_leave_the_column_path(raw: bytes) -> None:
    b = line_protocol._InfluxBuilder("_metric_")
    assert not line_protocol._decode_columns(b, raw, 0, 2**62)
    assert not b.series and not b.idx and not b.ts and not b.vals
    got = decode_influx(raw, T0, "_metric_", "ms")
    with line_loop_only():
        _exactly(got, decode_influx(raw, T0, "_metric_", "ms"))


# ----- the gateway's messages ------------------------------------------------------------------


class _Capture:
    """A Producer that keeps what it is given (no Kafka)."""

    def __init__(self, _config: object) -> None:
        self.messages: list[tuple[int, bytes]] = []

    def produce(self, _topic: str, value: bytes, partition: int, on_delivery: object) -> None:
        self.messages.append((partition, value))

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float = 0) -> int:
        return 0


_hosts = [f"h{i}" for i in range(40)]
_batch_stamps = st.integers(-(2**63), 2**63 - 1) | st.integers(T0, T0 + 2**33)


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.sampled_from(_hosts), _batch_stamps, _floats), min_size=1, max_size=60),
    st.booleans(),
)
def test_gateway_messages_are_what_encode_binary_parts_makes(
    rows: list[tuple[str, int, float]], one_per_series: bool
) -> None:
    if one_per_series:  # each row its own series, as a scrape
        rows = list({h: (h, t, v) for h, t, v in rows}.values())
    hosts = list(dict.fromkeys(h for h, _, _ in rows))
    series = [{"_metric_": "up", "host": h} for h in hosts]
    idx = np.array([hosts.index(h) for h, _, _ in rows], np.int32)
    ts = np.array([t for _, t, _ in rows], np.int64)
    vals = np.array([v for _, _, v in rows], np.float64)
    ds = Dataset(name="capture", num_shards=4, source=SourceSettings(bootstrap_servers="x:1"))
    original = gateway.Producer
    gateway.Producer = _Capture  # type: ignore[assignment,misc]
    try:
        gw = Gateway(ds, verify_topic=False, ts_range=(-(2**63), 2**63 - 1))
        assert gw.send_batch(SampleBatch(series, idx, ts, vals)) == len(rows)
        messages = gw._producer.messages  # type: ignore[attr-defined]
    finally:
        gateway.Producer = original  # type: ignore[misc]
    got = []
    for partition, message in messages:
        batch = decode_binary(message, ts_range=(-(2**63), 2**63 - 1)).batch
        again = encode_binary_parts(
            [encode_labels(s) for s in batch.series],
            [len(s) for s in batch.series],
            batch.series_idx,
            batch.timestamps,
            batch.values,
        )
        assert again == message
        for i, t, v in zip(batch.series_idx, batch.timestamps, batch.values, strict=True):
            got.append((partition, batch.series[i]["host"], int(t), struct.pack("<d", v)))
    want = [
        (shard_for_series(ds, series[hosts.index(h)]), h, t, struct.pack("<d", v))
        for h, t, v in rows
    ]
    assert sorted(got) == sorted(want)
    for partition in range(ds.num_shards):  # in order within a partition
        assert [r[1:] for r in got if r[0] == partition] == [
            r[1:] for r in want if r[0] == partition
        ]


def _captured(ds: Dataset, batches: list[SampleBatch]) -> tuple[list[int], list[tuple[int, bytes]]]:
    """What a new Gateway of `ds` accepts of each batch, and the messages it produces."""
    original = gateway.Producer
    gateway.Producer = _Capture  # type: ignore[assignment,misc]
    try:
        gw = Gateway(ds, verify_topic=False)
        accepted = [gw.send_batch(b) for b in batches]
        return accepted, gw._producer.messages  # type: ignore[attr-defined]
    finally:
        gateway.Producer = original  # type: ignore[misc]


_series_pool = [{"_metric_": "up", "host": h} for h in _hosts] + [{"host": "no-metric"}]
_keys_of = {i: new_series_key() for i in range(len(_series_pool))}  # a key per label set


@settings(max_examples=150)
@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(0, len(_series_pool) - 1), _batch_stamps, _floats),
            min_size=1,
            max_size=30,
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([4, 512]),  # shards: a byte each, or not
)
def test_int_keyed_batches_send_what_plain_batches_send(
    batches: list[list[tuple[int, int, float]]], num_shards: int
) -> None:
    """Series found by their int keys in NumPy (`IntKeyedBatch`), repeated in a batch or not,
    new or known, refused ones and samples out of range among them: the same messages, byte
    for byte, on the same partitions, as the same samples in plain batches."""
    plain, keyed = [], []
    for rows in batches:
        series = [_series_pool[i] for i, _, _ in rows]  # a series per row (some repeated)
        idx = np.arange(len(rows), dtype=np.int32)
        ts = np.array([t for _, t, _ in rows], np.int64)
        vals = np.array([v for _, _, v in rows], np.float64)
        keys = [_keys_of[i] for i, _, _ in rows]
        plain.append(SampleBatch(series, idx, ts, vals))
        key_array = np.array(keys, np.int64)
        keyed.append(IntKeyedBatch(series, idx, ts, vals, keys=keys, key_array=key_array))
    src = SourceSettings(bootstrap_servers="x:1")
    a = _captured(Dataset(name="plain", num_shards=num_shards, source=src), plain)
    b = _captured(Dataset(name="keyed", num_shards=num_shards, source=src), keyed)
    assert a == b


def test_int_keys_of_a_growing_fleet() -> None:
    """Thousands of int keys (the key table grows), then the same again: every series found."""
    ds = Dataset(name="fleet", num_shards=8, source=SourceSettings(bootstrap_servers="x:1"))
    series = [{"_metric_": "up", "host": f"h{i}"} for i in range(6000)]
    keys = [new_series_key() for _ in series]
    batches: list[SampleBatch] = []
    for kind in ("plain", "keyed"):
        for lo in [*range(0, 6000, 1500), 0, 3000]:
            part = slice(lo, lo + 3000)
            n = len(series[part])
            args = (series[part], np.arange(n, dtype=np.int32), np.full(n, T0), np.ones(n))
            if kind == "plain":
                batches.append(SampleBatch(*args))
            else:
                key_array = np.array(keys[part], np.int64)
                batches.append(IntKeyedBatch(*args, keys=keys[part], key_array=key_array))
    half = len(batches) // 2
    plain = _captured(ds, batches[:half])
    keyed = _captured(ds.model_copy(update={"name": "fleet2"}), batches[half:])
    assert plain == keyed

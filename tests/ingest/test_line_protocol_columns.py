"""Line protocol's column path (`line_protocol._decode_columns`) decodes exactly as the line loop.

The column path reads plain decimal values with NumPy (Clinger's fast path), timestamps of up to
19 digits, and finds series key texts in a NumPy hash table (`_SeriesTable`: a `ByteTable`):
each is checked here against `float()`, `int()` and the line loop, on generated values (bit for
bit: NaN, -0.0, infinities, under- and overflows, long mantissas, exponents, integers `7i`/`7u`,
booleans, strings), timestamps (every length, int64's edge, leading zeros, every precision), series
(repeated, tags out of order, thousands of new ones growing the table, its bound, hash
collisions) and decoders on several threads sharing the table.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.dataset import LabelLimits
from ingest import byte_table
from ingest.bad_records import Decoded
from ingest.batch import KeyedBatch
from ingest.wire import line_protocol
from ingest.wire.line_protocol import decode_influx, decode_lines
from tests.ingest.line_loop import keyed_alike, line_loop_only
from tests.ingest.threads import in_threads

T0 = 1_700_000_000_000


def _exactly(a: Decoded, b: Decoded) -> None:
    """The same batch: series and their label order, samples (values bit for bit), counts."""
    x, y = a.batch, b.batch
    keyed_alike(x, y)
    assert [list(s.items()) for s in x.series] == [list(s.items()) for s in y.series]
    assert x.series_idx.tolist() == y.series_idx.tolist()
    assert x.timestamps.dtype == y.timestamps.dtype == np.int64
    assert x.timestamps.tolist() == y.timestamps.tolist()
    assert x.values.view(np.int64).tolist() == y.values.view(np.int64).tolist()
    assert x.bad_records == y.bad_records
    assert a.first_bad == b.first_bad


def _against_the_loop(raw: bytes, precision: str = "ms", **kw: object) -> Decoded:
    """Decode `raw` twice (cold, then with everything known) and check both against the line
    loop; the first result."""
    got = decode_influx(raw, T0, precision=precision, **kw)  # type: ignore[arg-type]
    again = decode_influx(raw, T0, precision=precision, **kw)  # type: ignore[arg-type]
    with line_loop_only():
        loop = decode_influx(raw, T0, precision=precision, **kw)  # type: ignore[arg-type]
    _exactly(got, loop)
    _exactly(again, loop)
    if isinstance(got.batch, KeyedBatch) and isinstance(again.batch, KeyedBatch):
        assert got.batch.keys == again.batch.keys
    return got


def _columns_take(raw: bytes, lo: int = 0, hi: int = 2**62) -> bool:
    return line_protocol._decode_columns(line_protocol._InfluxBuilder("_metric_"), raw, lo, hi)


# ----- values ----------------------------------------------------------------------------------

_digits = st.text("0123456789", min_size=0, max_size=22)


@st.composite
def decimals(draw: st.DrawFn) -> str:
    """Plain decimals of every length and point position (some too long for NumPy's reading,
    some not numbers at all: "", ".", "-")."""
    sign = draw(st.sampled_from(["", "", "-"]))
    left, right = draw(_digits), draw(_digits)
    return sign + left + (draw(st.sampled_from([".", ".", ""])) + right if right else "")


_odd_values = st.sampled_from(
    [
        "nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e-400", "0e-999",
        "5e-324", "2.2250738585072014e-308", "2.225073858507201e-308", "1.7976931348623157e308",
        "-0", "-0.0", "-.0", "0.", ".0", "00", "-00.000", "9007199254740993", "9007199254740992",
        "0.30000000000000004", "123456789012345678", "1234567890123456789", "1E5", "1e+5",
        "+1", "1_0", "1-2", "--1", "1.2.3", ".", "-", "e5", "7i", "-7i", "7u", "t", "FALSE",
        "9223372036854775808i", "18446744073709551615u", '"str"', "1,v=2", "1=2",
    ]
)  # fmt: skip
_values = (
    decimals()
    | _odd_values
    | st.floats(allow_nan=False).map(repr)
    | st.floats(allow_nan=False, width=32).map(repr)
    | st.integers(-(10**20), 10**20).map(str)
)


@given(st.lists(_values, min_size=1, max_size=6))
def test_values_read_as_float_reads_them(values: list[str]) -> None:
    """NumPy's reading of plain decimals is bit for bit float()'s; other values go through
    float() (or make the message step aside, as the line loop would refuse them)."""
    raw = "\n".join(f"v,i={i} value={v} {T0}" for i, v in enumerate(values)).encode()
    got = _against_the_loop(raw)
    if _columns_take(raw):
        want = [float(v) for v in values]
        assert got.batch.values.view(np.int64).tolist() == np.array(want).view(np.int64).tolist()


def test_plain_values_are_read_by_numpy() -> None:
    """The usual values need no float() (the reading is exact: Clinger's fast path)."""
    values = ["0", "-0", "1.5", "-12.25", ".5", "7.", "991.315", "123456789.012345", "000.1"]
    values += [repr(x) for x in np.random.default_rng(1).uniform(-1e6, 1e6, 200).round(4).tolist()]
    texts = [v.encode() for v in values]
    raw = b" ".join(texts)
    ends = np.cumsum([len(t) + 1 for t in texts]) - 1
    starts = ends - [len(t) for t in texts]
    called: list[object] = []
    original = line_protocol._floats_as_parsed
    line_protocol._floats_as_parsed = lambda t: called.append(t) or original(t)  # type: ignore[assignment,func-returns-value]
    try:
        got = line_protocol._values(raw, np.frombuffer(raw, np.uint8), starts, ends)
    finally:
        line_protocol._floats_as_parsed = original
    assert got is not None and not called
    assert got.view(np.int64).tolist() == np.array(list(map(float, values))).view(np.int64).tolist()


# ----- timestamps ------------------------------------------------------------------------------

_stamps = (
    st.integers(0, 2**63 - 1).map(str)
    | st.integers(0, 10**20).map(str)
    | st.tuples(st.text("0", max_size=4), st.integers(0, 10**15)).map(
        lambda z_n: z_n[0] + str(z_n[1])
    )
    | st.sampled_from(
        [
            "9223372036854775807",
            "9223372036854775808",
            "9999999999999999999",
            "10000000000000000000",
            "1700000000000000000",
            "0000000000000000001",
            "0",
            "-1",
        ]
    )
)


@given(st.lists(_stamps, min_size=1, max_size=6), st.sampled_from(["ns", "us", "ms", "s", "h"]))
def test_timestamps_of_every_length(stamps: list[str], precision: str) -> None:
    raw = "\n".join(f"cpu,host=h{i % 3} value=1.5 {s}" for i, s in enumerate(stamps)).encode()
    got = decode_lines(raw, T0, "_metric_", precision, LabelLimits())
    again = decode_lines(raw, T0, "_metric_", precision, LabelLimits())
    with line_loop_only():
        loop = decode_lines(raw, T0, "_metric_", precision, LabelLimits())
    _exactly(got, loop)
    _exactly(again, loop)


def test_nanosecond_stamps_take_the_column_path() -> None:
    raw = b"cpu,host=a value=1 1700000000000000000\ncpu,host=b value=2 9223372036854775807"
    assert _columns_take(raw, 0, 2**63 - 1)
    assert not _columns_take(raw.replace(b"807", b"808"), 0, 2**63 - 1)  # over int64
    # the parser (the reference) takes at most INT64_MAX - 1, as decode_influx's bound says
    got = decode_influx(raw.replace(b"807", b"806"), T0)
    assert got.batch.timestamps.tolist() == [1_700_000_000_000, 9_223_372_036_854]
    assert decode_influx(raw, T0).batch.bad_records == {"undecodable": 1}


# ----- series ----------------------------------------------------------------------------------

_keys = st.sampled_from(
    [
        "cpu", "cpu,host=a", "cpu,host=b", "cpu,dc=x,host=a", "cpu,host=a,dc=x", "mem,host=a",
        "é,k=é", "cpu,a=1,b=2,c=3", "cpu,c=3,b=2,a=1", "m,k=" + "x" * 40, "m,k=" + "x" * 41,
        "m,k=" + "y" * 9000, "#c", "a=b", "cpu,h=1,h=2", "cpu,k=",
    ]
)  # fmt: skip


@given(
    st.lists(st.tuples(_keys, st.sampled_from(["1.5", "-2", "3e3"])), min_size=1, max_size=10),
    st.sampled_from(
        [("_metric_", LabelLimits()), ("__name__", LabelLimits(max_labels_per_series=2))]
    ),
    st.booleans(),
)
def test_series_found_as_the_loop_finds_them(
    lines: list[tuple[str, str]], column_limits: tuple[str, LabelLimits], forget: bool
) -> None:
    """Repeated series, tags in another order, long texts, bad keys, the dataset's limits;
    with what the decoder keeps across messages or without."""
    column, limits = column_limits
    if forget:
        line_protocol._known_by_bytes.clear()
        line_protocol._templates.clear()
    raw = "\n".join(f"{k} value={v} {T0 + i}" for i, (k, v) in enumerate(lines)).encode()
    _against_the_loop(raw, metric_column=column, limits=limits)


def _fleet(lo: int, hi: int, scrape: int = 0) -> bytes:
    return "\n".join(
        f"node_{i % 7},host=h{i // 7},job=node value={i}.5 {T0 + scrape}" for i in range(lo, hi)
    ).encode()


def test_a_growing_fleet() -> None:
    """Thousands of new series, message after message (the table grows and its slots are
    rebuilt), then the same again: every message as the loop decodes it, the keys kept."""
    line_protocol._known_by_bytes.clear()
    first = [decode_influx(_fleet(i, i + 700), T0) for i in range(0, 7000, 700)]
    for k, i in enumerate(range(0, 7000, 700)):
        raw = _fleet(i, i + 700, scrape=15_000)
        assert _columns_take(raw)
        got = decode_influx(raw, T0)
        with line_loop_only():
            _exactly(got, decode_influx(raw, T0))
        assert got.batch.keys == first[k].batch.keys  # type: ignore[attr-defined]
    # one message of new and known series, some repeated
    raw = _fleet(6500, 7500) + b"\n" + _fleet(6900, 7100)
    _against_the_loop(raw)


def test_the_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(line_protocol, "CACHE_SIZE", 100)
    line_protocol._known_by_bytes.clear()
    for i in range(0, 1000, 150):
        _against_the_loop(_fleet(i, i + 150))
    for table in line_protocol._known_by_bytes.values():
        assert len(table.table) <= 300


def test_hash_collisions_cost_speed_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every word weighing nothing, every text of a length hashes alike: texts are told
    apart by their words, and those without a slot of their own are found in the dict."""
    monkeypatch.setattr(byte_table, "_MIX", np.zeros_like(byte_table._MIX))
    line_protocol._known_by_bytes.clear()
    raw = _fleet(0, 300)
    _against_the_loop(raw)
    table = line_protocol._known_by_bytes[("_metric_", LabelLimits(), "value")]
    assert table.table.overflow  # most texts share a hash
    _against_the_loop(_fleet(100, 400))


def test_decoders_on_several_threads() -> None:
    """Gateway requests decode on worker threads sharing the table: each result is the one
    decoded alone."""
    line_protocol._known_by_bytes.clear()
    bodies = [_fleet(i, i + 500, scrape=s) for s in range(3) for i in range(0, 6000, 500)]
    with line_loop_only():
        want = [decode_influx(raw, T0) for raw in bodies]
    in_threads(lambda k: _exactly(decode_influx(bodies[k], T0), want[k]), len(bodies), seed=3)

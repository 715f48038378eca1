"""The compiled kernels (`core.jit`) decide exactly as their references: remote write 1.0's
fast path (the protobuf walker, `ingest.wire.protobuf`) as the full upb parse, on generated
requests and adversarial bytes: truncated bodies, lengths as longer varints than needed, other
fields, bytes flipped or cut anywhere, tails that almost look like a sample. The gateway's
message bodies, laid out by a kernel for all of a batch's messages at once, are
`encode_checked`'s bytes.
(`ByteTable`'s kernels: tests/ingest/test_byte_table.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st
from numba.core.caching import CacheImpl

from core.errors import Invalid
from core.jit import kernel, warm
from ingest import gateway
from ingest.wire import line_protocol, remote_write_v1
from ingest.wire.binary_format import encode_bodies, encode_checked, finish
from ingest.wire.prompb.remote_pb2 import WriteRequest
from tests.ingest.test_gateway_hot_paths import T0, _same, steady_requests


def _split_message() -> type:
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="filopy_test_split.proto", package="filopy.testsplit", syntax="proto3"
    )
    msg = proto.message_type.add(name="Split")
    msg.field.add(name="timeseries", number=1, type=f.TYPE_BYTES, label=f.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("filopy.testsplit.Split"))


_Split = _split_message()


def _check(raw: bytes, column: str = "_metric_") -> None:
    """The fast path (the protobuf walker) gives the full parse's batch, or steps aside; it
    never takes a body the full parse refuses."""
    fast = remote_write_v1.decode_fast(raw, column)
    try:
        full = remote_write_v1.to_batch(remote_write_v1.parse(raw), column)
    except Invalid:
        assert fast is None
        return
    if fast is not None:
        _same(fast, full)


def _varint(n: int, extra: int = 0) -> bytes:
    """`n` as a varint, `extra` bytes longer than needed."""
    out = bytearray()
    while True:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
        if not n:
            break
    out += b"\x80" * extra
    out[-1] &= 0x7F
    return bytes(out)


_body_edits = st.sampled_from(["none", "truncate", "flip", "insert", "long_varint", "field"])


def test_kernels_warm() -> None:
    warm()


@given(steady_requests(), _body_edits, st.data())
def test_kernels_decide_as_the_references(
    req: WriteRequest, edit: str, data: st.DataObject
) -> None:
    raw = req.SerializeToString()
    at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
    if edit == "truncate":
        raw = raw[:at]
    elif edit == "flip":
        raw = raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1 :]
    elif edit == "insert":
        raw = raw[:at] + data.draw(st.binary(min_size=1, max_size=3)) + raw[at:]
    elif edit == "long_varint":  # a series' length with needless continuation bytes
        parts = [bytes(p) for p in _Split.FromString(raw).timeseries]
        k = data.draw(st.integers(0, len(parts) - 1))
        extra = data.draw(st.integers(1, 5))
        raw = b"".join(
            b"\x0a" + _varint(len(p), extra if i == k else 0) + p for i, p in enumerate(parts)
        )
    elif edit == "field":  # another field before, between or after the series
        field = data.draw(st.sampled_from([b"\x12\x00", b"\x08\x01", b"\x1a\x01x", b"\x0a"]))
        raw = raw[:at] + field + raw[at:]
    elif raw:  # unedited: the senders' shape, which the fast path takes
        assert remote_write_v1.decode_fast(raw, "_metric_") is not None
    _check(raw)


@given(st.binary(max_size=64))
def test_kernels_on_random_bytes(raw: bytes) -> None:
    _check(raw)
    _check(b"\x0a" + _varint(len(raw)) + raw)


def test_kernels_on_edge_cases() -> None:
    for raw in [
        b"",
        b"\x0a",
        b"\x0a\x00",  # one empty series
        b"\x0a\x80\x00",  # an empty series, its length in two bytes
        b"\x0a\x01",  # truncated
        b"\x0a\xff\xff\xff\xff\x0f",  # a length past the body
        b"\x0a\xff\xff\xff\xff\xff\x01",  # a 6-byte varint
        b"\x0a\x09" + b"\x12\x07\x10" + b"\x80" * 5 + b"\x01",  # a zero-value sample only
    ]:
        _check(raw)


def test_a_kernel_without_a_writable_cache_still_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no cache directory is writable (read-only site-packages, no home), numba refuses
    `cache=True` when the kernel is defined: the kernel is then compiled in each process."""
    monkeypatch.setattr(CacheImpl, "_locator_classes", [])

    @kernel
    def twice(x: int) -> int:
        return 2 * x

    assert twice(21) == 42


def _messages_both_ways(
    groups: list[tuple[list[bytes], list[int], list[int], list[float]]], level: int
) -> tuple[list[bytes], list[bytes]]:
    """Each group (its series' blobs, each sample's series, timestamps, values) encoded by
    `encode_checked` and by `encode_bodies` + `finish` (all groups at once, blobs in an arena
    in another order)."""
    expected, bounds, series_bounds, wide, bases = [], [0], [0], [], []
    values, offsets, local, counts, slots = [], [], [], [], []
    blobs: list[bytes] = []
    for group_blobs, idx, stamps, vals in groups:
        ts = np.array(stamps, np.int64)
        base = int(ts.min())
        off = ts.view(np.uint64) - np.uint64(base & 0xFFFFFFFFFFFFFFFF)
        is_wide = int(off.max()) > 0xFFFFFFFF
        n_labels = np.array([b.count(b"\xff") // 2 + 1 if b else 0 for b in group_blobs])
        v = np.array(vals, np.float64)
        expected.append(
            encode_checked(group_blobs, n_labels, np.array(idx), off, is_wide, base, v, level)
        )
        bounds.append(bounds[-1] + len(idx))
        series_bounds.append(series_bounds[-1] + len(group_blobs))
        wide.append(is_wide)
        bases.append(base)
        values.append(v)
        offsets.append(off)
        local += idx
        counts.append(n_labels)
        slots += list(range(len(blobs), len(blobs) + len(group_blobs)))
        blobs += group_blobs
    order = np.random.default_rng(len(blobs)).permutation(len(blobs))  # slots: arena order
    blob_start, blob_len, at = np.zeros(len(blobs), np.int64), np.zeros(len(blobs), np.int64), 0
    for k in order.tolist():
        blob_start[k], blob_len[k] = at, len(blobs[k])
        at += len(blobs[k])
    arena = np.frombuffer(b"".join(blobs[k] for k in order.tolist()), np.uint8).copy()
    bodies = encode_bodies(
        np.array(bounds, np.int64), np.array(series_bounds, np.int64), np.array(wide, bool),
        np.concatenate(values), np.concatenate(offsets), np.array(local, np.int64),
        np.concatenate(counts).astype(np.int64), np.array(slots, np.int64), arena, blob_start,
        blob_len,
    )  # fmt: skip
    got = [
        finish(
            body,
            series_bounds[g + 1] - series_bounds[g],
            bounds[g + 1] - bounds[g],
            wide[g],
            bases[g],
            level,
        )
        for g, body in enumerate(bodies)
    ]
    return expected, got


_blobs = st.lists(
    st.sampled_from([b"", b"k\xffv", b"__name__\xffup\xffjob\xffnode", b"a\xff" + b"x" * 300])
    | st.builds(lambda n: b"k\xff" + b"v" * n, st.integers(0, 22)),  # around the 8-byte words
    min_size=1,
    max_size=300,
)


@st.composite
def _groups(draw: st.DrawFn) -> tuple[list[bytes], list[int], list[int], list[float]]:
    blobs = draw(_blobs)
    n = draw(st.integers(1, 40))
    idx = draw(st.lists(st.integers(0, len(blobs) - 1), min_size=n, max_size=n))
    stamp = st.integers(-(2**63), 2**63 - 1) | st.integers(T0, T0 + 2**33)
    stamps = draw(st.lists(stamp, min_size=n, max_size=n))
    vals = draw(st.lists(st.floats(allow_nan=True) | st.just(-0.0), min_size=n, max_size=n))
    return blobs, idx, stamps, vals


@settings(max_examples=200)
@given(st.lists(_groups(), min_size=1, max_size=5), st.sampled_from([0, 1]))
def test_compiled_bodies_are_encode_checked(groups: list, level: int) -> None:
    """The gateway's messages laid out by the kernels (any blobs, empty ones too, of every
    length around the word size they are copied by, 1- and 2-byte series indexes, 4- and 8-byte
    timestamp offsets) are `encode_checked`'s bytes."""
    expected, got = _messages_both_ways(groups, level)
    assert got == expected


def test_compiled_bodies_with_4_byte_series_indexes() -> None:
    blobs = [f"k\xff{i}".encode() for i in range(70_000)]
    idx = list(range(0, 70_000, 7))
    group = (blobs, idx, [T0 + i for i in idx], [float(i) for i in idx])
    expected, got = _messages_both_ways([group, group], 1)
    assert got == expected


# ----- line protocol's column path -------------------------------------------------------------


def _reference_frame(raw: bytes) -> tuple[list[int], list[int], list[int]] | None:
    """The NumPy formulation: the bytes under 0x21, split into newlines and spaces."""
    buf = np.frombuffer(raw, np.uint8)
    cuts = np.flatnonzero(buf <= 0x20)
    is_nl = buf[cuts] == 0x0A
    nl, sp = cuts[is_nl], cuts[~is_nl]
    n = len(nl) + 1
    if (buf[sp] != 0x20).any() or len(sp) != 2 * n:
        return None
    line_end = np.append(nl, len(raw))
    key_end, field_end = sp[0::2], sp[1::2]
    if (field_end > line_end).any() or (key_end[1:] < nl).any():
        return None
    return line_end.tolist(), key_end.tolist(), field_end.tolist()


def _reference_stamp(text: bytes) -> int | None:
    if not 1 <= len(text) <= 19 or any(not 0x30 <= c <= 0x39 for c in text):
        return None
    t = int(text)
    return t if t < 2**63 else None


def _reference_plain(text: bytes) -> float | None:
    """A plain decimal of at most 18 bytes and 2**53 as its digits, as float() reads it."""
    body = text[1:] if text[:1] == b"-" else text
    digits = body.replace(b".", b"", 1)
    if len(text) > 18 or not digits or not digits.isdigit() or not digits.isascii():
        return None
    if int(digits) > 2**53:
        return None
    return float(text)


_lp_bytes = st.lists(
    st.sampled_from(
        [
            b"m,h=a",
            b" ",
            b"\n",
            b"v=",
            b"1.5",
            b"-",
            b".",
            b"0",
            b"/",
            b":",
            b"\t",
            b"\x1f",
            b"9" * 19,
            b"18446744073709551615",
            b"e",
            b"9223372036854775808",
            b"123456789012345678",
            b"9007199254740993",
            b"-0",
            b"\xc3\xa9",  # UTF-8, and bytes over 0x7f around the words `_frame` skips
            b"\xff\x80",
            b"abcdefghijklmnopq",
        ]
    ),
    max_size=30,
).map(b"".join)


@given(_lp_bytes)
def test_line_protocol_kernels_decide_as_the_references(raw: bytes) -> None:
    """Framing, field names, timestamps and plain values: the kernels take exactly what the NumPy
    formulation took (bytes under "0" or over "9", 19-digit stamps over int64, long values,
    several points or minus signs), and read the same numbers (float() for the values)."""
    if not raw:
        return
    buf = np.frombuffer(raw, np.uint8)
    line_end, key_end, field_end = line_protocol._frame(buf)
    framed = (line_end.tolist(), key_end.tolist(), field_end.tolist()) if len(line_end) else None
    assert framed == _reference_frame(raw)
    if framed is not None:  # every field `name=` and a value, for each name the lines have
        for name in {raw[k + 1 : f].partition(b"=")[0] for k, f in zip(*framed[1:], strict=True)}:
            prefix = name + b"="
            want_f = all(
                raw[k + 1 : f].startswith(prefix) and f - (k + 1) > len(prefix)
                for k, f in zip(*framed[1:], strict=True)
            )
            got_f = line_protocol._fields_start_with(
                buf, key_end, field_end, np.frombuffer(prefix, np.uint8)
            )
            assert got_f == want_f
    # stamps and values of any ranges, framed or not
    ends = np.array([len(raw)], np.int64)
    for a in range(len(raw)):
        t = line_protocol._stamps(buf, ends, np.array([a - 1], np.int64))
        want = _reference_stamp(raw[a:])
        assert (None if t is None else int(t[0])) == want
        vals, plain = line_protocol._plain_values(
            buf, np.array([a], np.int64), ends, line_protocol._POW10_FLOAT
        )
        want_v = _reference_plain(raw[a:])
        if want_v is None:
            assert not plain[0]
        else:
            assert plain[0] and vals.view(np.int64)[0] == np.float64(want_v).view(np.int64)


# ----- the gateway's grouping of a scrape --------------------------------------------------------


@given(
    st.integers(1, 60),
    st.integers(1, 9),
    st.data(),
)
def test_scrape_plan_groups_as_numpy_does(n: int, num_shards: int, data: st.DataObject) -> None:
    """`gateway._scrape_plan` (one pass) against the NumPy formulation `_send_grouped` uses:
    a stable sort of the rows by shard, each group's minimum timestamp, offsets modulo 2**64,
    8-byte offsets past 2**32 - 1, the series tables' sizes; nothing for a batch that is not
    one sendable, in-range sample per series."""
    n_slots = n + 3
    shard_of = np.array(
        data.draw(st.lists(st.integers(-1, num_shards - 1), min_size=n_slots, max_size=n_slots)),
        np.int32,
    )
    code_of = np.array(
        data.draw(st.lists(st.sampled_from([0, 0, 0, 2]), min_size=n_slots, max_size=n_slots)),
        np.int8,
    )
    cost_of = np.arange(10, 10 + n_slots, dtype=np.int64)
    slots = np.array(data.draw(st.permutations(range(n_slots)))[:n], np.int64)
    series_idx = np.arange(n, dtype=np.int32)
    if data.draw(st.booleans()):
        series_idx[data.draw(st.integers(0, n - 1))] = data.draw(st.integers(0, n - 1))
    stamp = st.integers(-(2**63), 2**63 - 1) | st.integers(T0, T0 + 2**33)
    ts = np.array(data.draw(st.lists(stamp, min_size=n, max_size=n)), np.int64)
    lo, hi = sorted(data.draw(st.lists(stamp, min_size=2, max_size=2)))
    if data.draw(st.booleans()):
        lo, hi = -(2**63), 2**63 - 1
    if data.draw(st.booleans()):  # half the batches sendable
        code_of[:], shard_of[shard_of < 0] = 0, 0
        series_idx, lo, hi = np.arange(n, dtype=np.int32), -(2**63), 2**63 - 1
    order, bounds, group_shards, local, bases, offsets, wide, cost = gateway._scrape_plan(
        slots, series_idx, ts, shard_of, code_of, cost_of, lo, hi, num_shards
    )
    shard = shard_of[slots]
    sendable = (
        (series_idx == np.arange(n)).all()
        and (code_of[slots] == 0).all()
        and (shard >= 0).all()
        and ((ts >= lo) & (ts <= hi)).all()
    )
    if not sendable:
        assert len(order) == 0
        return
    want_order = np.argsort(shard, kind="stable")
    assert order.tolist() == want_order.tolist()
    sorted_shards = shard[want_order]
    cuts = np.flatnonzero(sorted_shards[1:] != sorted_shards[:-1]) + 1
    want_bounds = [0, *cuts.tolist(), n]
    assert bounds.tolist() == want_bounds
    assert group_shards.tolist() == sorted_shards[want_bounds[:-1]].tolist()
    want_bases = np.minimum.reduceat(ts[want_order], want_bounds[:-1])
    assert bases.tolist() == want_bases.tolist()
    sizes = np.diff(want_bounds)
    want_offsets = ts[want_order].view(np.uint64) - np.repeat(want_bases.view(np.uint64), sizes)
    assert offsets.tolist() == want_offsets.tolist()
    assert (
        wide.tolist() == (np.maximum.reduceat(want_offsets, want_bounds[:-1]) > 2**32 - 1).tolist()
    )
    assert local.tolist() == (np.arange(n) - np.repeat(want_bounds[:-1], sizes)).tolist()
    assert cost.tolist() == np.add.reduceat(cost_of[slots][want_order], want_bounds[:-1]).tolist()

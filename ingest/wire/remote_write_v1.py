"""Remote write 1.0 bodies: a protobuf `prometheus.WriteRequest` into a columnar batch.

`__name__` becomes the dataset's metric column (`_metric_` by default; PromQL's `__name__` maps
back to it); every other label is kept as is. Exemplars and metadata are dropped; native
histogram samples are counted as refused ("unsupported"): FiloPy stores float samples only.

Speed: building a Python object per label (upb's message API) cost ~15 us per series, the
whole budget of a fast gateway. Requests of the shape Prometheus and vmagent send (each series
its labels, then float samples, canonically encoded) take a vectorized path instead: a compiled
kernel (`ingest.jit`, without the GIL) splits the request into series, NumPy walks every
series' fields at once, and each series' label bytes are found among those met before
(`ByteTable`: every series at once, each hit checked byte for byte), with their label dict and
key. The batch carries those keys (`IntKeyedBatch`) so the gateway's routing cache needs no
tuple of labels either. Anything else (histograms, exemplars, odd field order or encodings,
many samples per series) goes through the full upb parse, which has the last word. In the
steady state (every series one sample, its labels known) even the walk over the label fields
is skipped (`_decode_known`): a kernel reads each series' last bytes as the sample, the rest
are its label bytes; no Python runs per series.
"""

from __future__ import annotations

import sys

import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError

from filopy.errors import Invalid
from filopy.hashing import PROMETHEUS_METRIC_LABEL
from ingest.bad_records import Decoded, show_labels
from ingest.batch import IntKeyedBatch, Labels, SampleBatch, new_series_key
from ingest.byte_table import PAD, ByteTable, padded
from ingest.jit import kernel, warms
from ingest.wire.prompb.remote_pb2 import TimeSeries, WriteRequest

UNSUPPORTED = "unsupported"  # a refusal reason: samples of a kind FiloPy cannot store

LABEL_CACHE_SIZE = 500_000  # series whose label dicts are kept, per metric column
_MAX_LABELS = 256  # more labels on a series: the full parser decides
_MAX_SAMPLES = 8  # more samples on a series (a catch-up): the full parser decides
_LABELS_TAG, _SAMPLES_TAG = 0x0A, 0x12  # TimeSeries fields 1 and 2, length-delimited
_VALUE_TAG, _TIMESTAMP_TAG = 0x09, 0x10  # Sample: double value = 1, int64 timestamp = 2


# metric column -> the series' label bytes met, each entry's labels and key: label dicts are
# shared between batches (read only); a key (`new_series_key`) is an int: the gateway's lookup
# hashes no bytes. Keys as ints and in int64 (`IntKeyedBatch.key_array`).
_tables: dict[str, ByteTable] = {}
_LABELS, _KEYS, _KEY_ARRAY = 0, 1, 2  # the tables' columns


def _table(metric_column: str) -> ByteTable:
    table = _tables.get(metric_column)
    if table is None:
        table = _tables.setdefault(metric_column, ByteTable((object, object, np.int64)))
    return table


def parse(raw: bytes) -> WriteRequest:
    """The protobuf message, or `Invalid`."""
    request = WriteRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as e:
        raise Invalid(f"the body is not a protobuf prometheus.WriteRequest: {e}") from None
    return request


def to_batch(request: WriteRequest, metric_column: str) -> Decoded:
    """Float samples of every series, labels mapped (`__name__` -> the metric column)."""
    series: list[Labels] = []
    counts: list[int] = []
    ts_parts: list[np.ndarray] = []
    val_parts: list[np.ndarray] = []
    histograms = 0
    first_histogram = None
    for ts in request.timeseries:
        labels = {
            (metric_column if lb.name == PROMETHEUS_METRIC_LABEL else lb.name): lb.value
            for lb in ts.labels
        }
        if ts.histograms:
            histograms += len(ts.histograms)
            first_histogram = first_histogram or show_labels(labels)
        n = len(ts.samples)
        if not n:
            continue
        series.append(labels)
        counts.append(n)
        samples = ts.samples
        ts_parts.append(np.fromiter((s.timestamp for s in samples), np.int64, n))
        val_parts.append(np.fromiter((s.value for s in samples), np.float64, n))
    bad = {UNSUPPORTED: histograms} if histograms else {}
    first_bad = (
        f"native histogram samples (FiloPy stores float samples only); series {first_histogram}"
        if histograms
        else None
    )
    if not series:
        batch = SampleBatch.empty()
        batch.bad_records.update(bad)
        return Decoded(batch, first_bad)
    idx = np.repeat(np.arange(len(series), dtype=np.int32), counts)
    batch = SampleBatch(series, idx, np.concatenate(ts_parts), np.concatenate(val_parts), bad)
    return Decoded(batch, first_bad)


def decode(raw: bytes, metric_column: str) -> Decoded:
    """A decompressed remote write 1.0 body as a batch (the same batch either path gives)."""
    fast = decode_fast(raw, metric_column)
    return fast if fast is not None else to_batch(parse(raw), metric_column)


# ----- the vectorized path ----------------------------------------------------------------------


_VARINT_LIMITS = np.array([1 << 7, 1 << 14, 1 << 21, 1 << 28, 1 << 35], np.int64)


def _varint_size(n: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Bytes of the shortest varint of each (non-negative) length."""
    return np.searchsorted(_VARINT_LIMITS, n, side="right") + 1


_SHIFTS = {w: (7 * np.arange(w, dtype=np.uint64)) for w in (3, 6, 10)}
_SIX = np.arange(6)


def _varints(
    buf: npt.NDArray[np.uint8], at: npt.NDArray[np.int64], width: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]] | None:
    """The varints starting at `at` (at most `width` bytes each) and their sizes; None if one
    is longer (or a 10-byte varint overflows 64 bits)."""
    if width == 10:  # timestamps: milliseconds from 1971 to 2109 take 6 bytes
        b = buf.take(at[:, None] + _SIX, mode="clip")
        if (b[:, 5] < 0x80).all() and (b[:, :5] >= 0x80).all():
            value = ((b & 0x7F).astype(np.uint64) << _SHIFTS[6]).sum(axis=1, dtype=np.uint64)
            return value, np.full(len(at), 6, np.int64)
    b = buf.take(at[:, None] + np.arange(width), mode="clip")
    ends = b < 0x80
    if not ends.any(axis=1).all():
        return None
    size = ends.argmax(axis=1) + 1
    if width == 10 and (b[size == 10, 9] > 1).any():
        return None
    used = np.arange(width) < size[:, None]
    digits = np.where(used, b & 0x7F, 0).astype(np.uint64) << _SHIFTS[width]
    return np.bitwise_or.reduce(digits, axis=1), size


@kernel
def _series_fields(
    buf: npt.NDArray[np.uint8],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Where each field's bytes start and end, if `buf` is only fields 1 (tag 0A) with
    shortest length varints of at most 5 bytes, else none."""
    n = buf.shape[0]
    none = np.empty(0, np.int64)
    starts = ends = none
    for k in range(2):  # count the fields, then note where they are
        pos = count = 0
        while pos < n:
            if buf[pos] != _LABELS_TAG:
                return none, none
            pos += 1
            length = shift = 0
            while True:
                if pos >= n or shift > 28:
                    return none, none
                b = np.int64(buf[pos])
                pos += 1
                length |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    break
            if b == 0 and shift > 7:  # a varint longer than it needs to be
                return none, none
            if length > n - pos:
                return none, none
            if k:
                starts[count] = pos
                ends[count] = pos + length
            pos += length
            count += 1
        if not k:
            starts = np.empty(count, np.int64)
            ends = np.empty(count, np.int64)
    return starts, ends


def _series_bounds(raw: bytes) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """Where each series' bytes start and end in `raw`, if the body is series only (field 1,
    shortest length varints), as senders encode it. (What upb would split it into: any other
    field, or a longer varint, is not this shape; a truncated one not a protobuf.)"""
    starts, ends = _series_fields(np.frombuffer(raw, np.uint8))
    if not len(starts):
        return None
    return starts, ends


def decode_fast(raw: bytes, metric_column: str) -> Decoded | None:
    """The batch `to_batch(parse(raw))` gives, vectorized; None if the body is not of the
    common shape (every series: label fields, then at most `_MAX_SAMPLES` samples, each
    `value` then `timestamp`; nothing else) or anything about it is in doubt."""
    bounds = _series_bounds(raw)
    if bounds is None:
        return None
    starts, ends = bounds
    pad = padded(raw)
    known = _decode_known(raw, pad, starts, ends, metric_column)
    if known is not None:
        return known
    # Reads clip at the end: a read past it only ever feeds a bound check that then fails.
    return _decode_walk(raw, pad, starts, ends, metric_column)


# The steady state: every series ends with one sample of a millisecond timestamp (6-byte varint,
# 1971 to 2109), its value present (field 2, 16 bytes: 12 10 | 09 <8 bytes> 10 <6 bytes>) or
# zero and so left out by the sender (7 bytes: 12 07 | 10 <6 bytes>).
_TAIL_WITH_VALUE, _TAIL_ZERO = 18, 9


@kernel
def _known_tails(
    pad: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """Each series' label end, timestamp and value (its bits) if every series ends with one
    sample of the steady shape (`_TAIL_WITH_VALUE` or `_TAIL_ZERO` bytes), else none.
    `pad`: `padded(raw)`."""
    n = starts.shape[0]
    label_end = np.empty(n, np.int64)
    timestamps = np.empty(n, np.int64)
    values = np.zeros(n, np.uint64)
    at = pad[PAD:]
    none = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.uint64))
    for i in range(n):
        e = ends[i]
        size = e - starts[i]
        if size < _TAIL_ZERO:
            return none
        # the stamp: 10, then 5 bytes with their high bit set and a last one without
        if at[e - 7] != _TIMESTAMP_TAG or at[e - 1] >= 0x80:
            return none
        t = np.int64(at[e - 1])
        for k in range(2, 7):
            b = at[e - k]
            if b < 0x80:
                return none
            t = (t << 7) | np.int64(b & 0x7F)
        with_value = (
            size >= _TAIL_WITH_VALUE
            and at[e - 18] == _SAMPLES_TAG
            and at[e - 17] == 0x10
            and at[e - 16] == _VALUE_TAG
        )
        zero = at[e - 9] == _SAMPLES_TAG and at[e - 8] == 0x07
        if with_value == zero:
            return none
        timestamps[i] = t
        if with_value:
            v = np.uint64(0)
            for k in range(8):
                v |= np.uint64(at[e - 15 + k]) << np.uint64(8 * k)
            values[i] = v
            label_end[i] = e - _TAIL_WITH_VALUE
        else:
            label_end[i] = e - _TAIL_ZERO
    return label_end, timestamps, values


def _decode_known(
    raw: bytes,
    pad: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    metric_column: str,
) -> Decoded | None:
    """The steady state without walking the labels: when every series ends with one sample of
    the usual shape (`_TAIL_WITH_VALUE` or `_TAIL_ZERO` bytes) and the bytes before it are
    label bytes met before (`pad`: `padded(raw)`), that split is the parse. A table entry is
    only ever label fields that the walk delimited and upb parsed, and a protobuf parse is
    unique, so a series whose bytes are such an entry's (compared byte for byte) followed by
    one complete sample field holds exactly those. None (the walk decides) for any other
    series, or one not met yet."""
    table = _tables.get(metric_column)
    if table is None:
        return None
    n = len(starts)
    label_end, timestamps, value_bits = _known_tails(pad, starts, ends)
    if not len(label_end):
        return None
    values = value_bits.view(np.float64)
    found = table.find(pad, raw, starts, label_end - starts)
    ids = found.ids
    if (ids < 0).any():
        return None
    columns = found.view.columns
    series = columns[_LABELS][ids].tolist()
    keys = columns[_KEYS][ids].tolist()
    idx = np.arange(n, dtype=np.int32)
    batch = IntKeyedBatch(
        series, idx, timestamps, values, keys=keys, key_array=columns[_KEY_ARRAY][ids]
    )
    return Decoded(batch, None)


def _decode_walk(
    raw: bytes,
    pad: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    metric_column: str,
) -> Decoded | None:
    """`decode_fast` by walking every series' fields at once, a field per round."""
    n = len(starts)
    buf = pad[PAD : PAD + len(raw)]
    # Labels: hop over every series' label fields at once, a field per round (p: where the
    # series still in `act` are; a read past `ends` is caught by the bound check after).
    label_end = np.empty(n, np.int64)
    act, p, e = np.arange(n), starts.copy(), ends
    for _ in range(_MAX_LABELS + 1):
        more = (p < e) & (buf.take(p, mode="clip") == _LABELS_TAG)
        if not more.all():
            done = ~more
            label_end[act[done]] = p[done]
            act, p, e = act[more], p[more], e[more]
            if not len(act):
                break
        length = buf.take(p + 1, mode="clip")
        if not (length & 0x80).any():  # the rule: labels under 128 bytes
            p = p + 2 + length
            continue
        got = _varints(buf, p + 1, 3)
        if got is None:
            return None
        p = p + 1 + got[1] + got[0].astype(np.int64)
    else:
        return None
    if (label_end > ends).any():
        return None
    pos = label_end.copy()
    # Samples: a round per sample of the longest series.
    rounds_series: list[npt.NDArray[np.int64]] = []
    rounds_ts: list[npt.NDArray[np.int64]] = []
    rounds_val: list[npt.NDArray[np.float64]] = []
    act = np.arange(n)
    for _ in range(_MAX_SAMPLES + 1):
        p = pos[act]
        more = p < ends[act]
        if not more.all():
            act, p = act[more], p[more]
            if not len(act):
                break
        length = buf.take(p + 1, mode="clip")
        if (buf.take(p, mode="clip") != _SAMPLES_TAG).any() or (length & 0x80).any():
            return None  # exemplars, histograms, labels after samples, or a long sample
        q = p + 2
        inner_end = q + length
        if (inner_end > ends[act]).any():
            return None
        values = np.zeros(len(act), np.float64)
        has = np.flatnonzero((q < inner_end) & (buf.take(q, mode="clip") == _VALUE_TAG))
        if len(has):
            at = (q[has] + 1)[:, None] + np.arange(8)
            values[has] = buf.take(at, mode="clip").view("<f8").ravel()
            q[has] += 9
        stamps = np.zeros(len(act), np.int64)
        has = np.flatnonzero((q < inner_end) & (buf.take(q, mode="clip") == _TIMESTAMP_TAG))
        if len(has):
            got = _varints(buf, q[has] + 1, 10)
            if got is None:
                return None
            stamps[has] = got[0].view(np.int64)
            q[has] += 1 + got[1]
        if (q != inner_end).any():
            return None  # fields out of order, repeated or unknown: the full parser decides
        rounds_series.append(act)
        rounds_ts.append(stamps)
        rounds_val.append(values)
        pos[act] = inner_end
    else:
        return None
    # Every series' labels, those without samples too: the full parser would refuse bad ones.
    labelled = _labels_of(raw, pad, starts, label_end, metric_column)
    if labelled is None:
        return None
    series, keys = labelled
    if not rounds_series:
        return Decoded(SampleBatch.empty(), None)
    owner = np.concatenate(rounds_series)
    timestamps = np.concatenate(rounds_ts)
    values = np.concatenate(rounds_val)
    if len(rounds_series) > 1:  # samples of a series together, in their order
        order = np.argsort(owner, kind="stable")
        owner, timestamps, values = owner[order], timestamps[order], values[order]
    with_samples = np.zeros(n, bool)
    with_samples[owner] = True
    if with_samples.all():
        series_idx = owner.astype(np.int32)
    else:  # series without samples are left out, as `to_batch` does
        series_idx = (np.cumsum(with_samples) - 1)[owner].astype(np.int32)
        kept = np.flatnonzero(with_samples).tolist()
        series = [series[i] for i in kept]
        keys = [keys[i] for i in kept]
    key_array = np.fromiter(keys, np.int64, len(keys))
    batch = IntKeyedBatch(series, series_idx, timestamps, values, keys=keys, key_array=key_array)
    return Decoded(batch, None)


def _labels_of(
    raw: bytes,
    pad: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    metric_column: str,
) -> tuple[list[Labels], list[int]] | None:
    """Each series' labels and key, from its label bytes `raw[start:end]`: known, or parsed by
    upb when new and then learnt (None if they do not parse: the full parser then answers)."""
    table = _table(metric_column)
    found = table.find(pad, raw, starts, ends - starts)
    ids = found.ids
    columns = found.view.columns
    missed = np.flatnonzero(ids < 0)
    if not len(missed):
        return columns[_LABELS][ids].tolist(), columns[_KEYS][ids].tolist()
    known = np.where(ids < 0, 0, ids)
    series, keys = columns[_LABELS][known].tolist(), columns[_KEYS][known].tolist()
    new: dict[bytes, tuple[int, Labels, int]] = {}  # label bytes -> (first series, labels, key)
    intern = sys.intern
    for i, a, z in zip(
        missed.tolist(), starts[missed].tolist(), ends[missed].tolist(), strict=True
    ):
        b = raw[a:z]
        entry = new.get(b)  # a series repeated within the request
        if entry is None:
            try:
                parsed = TimeSeries.FromString(b)
            except DecodeError:
                return None
            labels = {
                intern(metric_column if lb.name == PROMETHEUS_METRIC_LABEL else lb.name): lb.value
                for lb in parsed.labels
            }
            entry = new[b] = (i, labels, new_series_key())
        series[i], keys[i] = entry[1], entry[2]
    if len(table) + len(new) > LABEL_CACHE_SIZE:
        table.clear()
    entries = list(new.values())
    which = np.array([e[0] for e in entries], np.intp)
    keys_added = [e[2] for e in entries]
    table.add(found, which, ([e[1] for e in entries], keys_added, keys_added))
    return series, keys


@warms
def _warm() -> None:
    """Both paths' kernels (a new series is walked, then known), on a column of its own."""
    request = WriteRequest()
    series = request.timeseries.add()
    series.labels.add(name=PROMETHEUS_METRIC_LABEL, value="warm")
    series.samples.add(value=1.0, timestamp=1_700_000_000_000)
    raw = request.SerializeToString()
    column = "\x00warm"
    try:
        decode(raw, column)
        decode(raw, column)
    finally:
        _tables.pop(column, None)

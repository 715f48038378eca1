"""Remote write 1.0 bodies: a protobuf `prometheus.WriteRequest` into a columnar batch.

`__name__` becomes the dataset's metric column (`_metric_` by default; PromQL's `__name__` maps
back to it); every other label is kept as is. Exemplars and metadata are dropped; native
histogram samples are counted as refused ("unsupported"): FiloPy stores float samples only.

The reference is upb's full parse (`to_batch(parse(raw))`), which has the last word. Building a
Python object per label costs a fast gateway's whole budget per series, so requests
of the shape Prometheus and vmagent send take one fast path (`decode_fast`): the shared
protobuf walker (`ingest.wire.protobuf`, compiled, without the GIL) finds each series' label
bytes and reads its samples, and each series' label bytes are found among those met before
(`ByteTable`: every series at once, each hit checked byte for byte), with their label dict and
key; new ones are parsed by upb and learnt. The batch carries those keys (`IntKeyedBatch`) so
the gateway's routing cache needs no tuple of labels either.
"""

from __future__ import annotations

import sys

import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError

from core.errors import Invalid
from core.hashing import PROMETHEUS_METRIC_LABEL
from core.jit import kernel, warms
from ingest.bad_records import Decoded, show_labels
from ingest.batch import IntKeyedBatch, Labels, SampleBatch, new_series_key
from ingest.byte_table import ByteTable, padded
from ingest.wire.prompb.remote_pb2 import TimeSeries, WriteRequest
from ingest.wire.protobuf import VARINT_2, field_bounds, series_index, walk_v1

UNSUPPORTED = "unsupported"  # a refusal reason: samples of a kind FiloPy cannot store

LABEL_CACHE_SIZE = 500_000  # series whose label dicts are kept, per metric column
_SERIES_TAG = 0x0A  # WriteRequest.timeseries: field 1, length-delimited


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


# ----- the fast path ---------------------------------------------------------------------------


# The steady state: every series ends with one sample of a millisecond timestamp (6-byte varint,
# 1971 to 2109), its value present (field 2, 16 bytes: 12 10 | 09 <8 bytes> 10 <6 bytes>) or
# zero and so left out by the sender (7 bytes: 12 07 | 10 <6 bytes>).
_TAIL_WITH_VALUE, _TAIL_ZERO = 18, 9


@kernel
def _steady_tails(
    buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> tuple[bool, npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """If every series ends with one sample of the steady shape: (True, where its labels would
    end, the sample's timestamp and value bits), read from the series' last bytes."""
    n = starts.shape[0]
    label_end = np.empty(n, np.int64)
    stamps = np.empty(n, np.uint64)
    bits = np.zeros(n, np.uint64)
    for i in range(n):
        e = ends[i]
        size = e - starts[i]
        # the stamp: 10, then 5 bytes with their high bit set and a last one without
        if size < _TAIL_ZERO or buf[e - 7] != VARINT_2 or buf[e - 1] >= 0x80:
            return False, label_end, stamps, bits
        t = np.uint64(buf[e - 1])
        for k in range(2, 7):
            b = buf[e - k]
            if b < 0x80:
                return False, label_end, stamps, bits
            t = (t << np.uint64(7)) | np.uint64(b & 0x7F)
        stamps[i] = t
        if size >= _TAIL_WITH_VALUE and (buf[e - 18], buf[e - 17], buf[e - 16]) == (0x12, 16, 9):
            for k in range(8):
                bits[i] |= np.uint64(buf[e - 15 + k]) << np.uint64(8 * k)
            label_end[i] = e - _TAIL_WITH_VALUE
        elif buf[e - 9] == 0x12 and buf[e - 8] == 0x07:
            label_end[i] = e - _TAIL_ZERO
        else:
            return False, label_end, stamps, bits
    return True, label_end, stamps, bits


def decode_fast(raw: bytes, metric_column: str) -> Decoded | None:
    """The batch `to_batch(parse(raw))` gives, without a Python object per sample; None if the
    body is not of the senders' shape (`ingest.wire.protobuf.walk_v1`) or its labels do not
    parse: the full parse then decides.

    Each series' label bytes end where its samples start. In the steady state (every series
    ends with one sample of the usual shape, `_steady_tails`, and the bytes before it are
    label bytes met before) that is read from the series' last bytes, without walking its
    labels: a table entry is only ever label fields that the walk delimited and upb parsed, and
    a protobuf parse is unique, so a series whose bytes are such an entry's (compared byte for
    byte) followed by one complete sample field holds exactly those. Otherwise the walker
    finds them."""
    buf = np.frombuffer(raw, np.uint8)
    ok, starts, ends = field_bounds(buf, _SERIES_TAG)
    if not ok or not len(starts):
        return None
    pad = padded(raw)
    n = len(starts)
    ok, label_end, stamps, bits = _steady_tails(buf, starts, ends)
    labelled = _labels_of(raw, pad, starts, label_end, metric_column, learn=False) if ok else None
    if labelled is not None:
        counts = np.ones(n, np.int64)
    else:
        ok, label_end, counts, stamps, bits = walk_v1(buf, starts, ends)
        if not ok:
            return None
        # Every series' labels, those without samples too: the full parser would refuse bad ones.
        labelled = _labels_of(raw, pad, starts, label_end, metric_column)
        if labelled is None:
            return None
    series, keys, key_array = labelled
    if not len(stamps):
        return Decoded(SampleBatch.empty(), None)
    series_idx, kept = series_index(counts)
    if kept is not None:
        series = [series[i] for i in kept.tolist()]
        keys = [keys[i] for i in kept.tolist()]
        key_array = key_array[kept]
    batch = IntKeyedBatch(
        series,
        series_idx,
        stamps.view(np.int64),
        bits.view(np.float64),
        keys=keys,
        key_array=key_array,
    )
    return Decoded(batch, None)


def _labels_of(
    raw: bytes,
    pad: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    metric_column: str,
    learn: bool = True,
) -> tuple[list[Labels], list[int], npt.NDArray[np.int64]] | None:
    """Each series' labels and key (also as int64), from its label bytes `raw[start:end]`:
    known, or parsed by upb when new and then learnt (None if they do not parse: the full
    parser then answers; or, with `learn=False`, if one is not known)."""
    table = _table(metric_column)
    found = table.find(pad, raw, starts, ends - starts)
    ids = found.ids
    columns = found.view.columns
    missed = np.flatnonzero(ids < 0)
    if len(missed) and not learn:
        return None
    if not len(missed):
        return (
            columns[_LABELS][ids].tolist(),
            columns[_KEYS][ids].tolist(),
            columns[_KEY_ARRAY][ids],
        )
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
    return series, keys, np.fromiter(keys, np.int64, len(keys))


@warms
def _warm() -> None:
    """The kernels (a new series is walked, then known), on a column of its own."""
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

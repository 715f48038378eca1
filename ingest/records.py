"""Record formats of a dataset's Kafka messages: FiloPy's binary batch and Influx line protocol.

Decoders never raise on bad input: ingestion must not stop for one bad record. They return the
good samples as a `SampleBatch` whose `bad_records` counts what was skipped, per reason, plus one
example of a bad record for the log. They also enforce the dataset's contract on each series (a
metric name, `Dataset.limits` on label sizes and counts), since anyone may write to the topic and
a series the stores cannot key (Cassandra: 64 KB) must never reach them. The binary format is
specified byte by byte in docs/ingestion-formats.md; decoding it is a handful of `np.frombuffer`
calls plus one pass over the series table, so its cost is per series, not per sample.
"""

from __future__ import annotations

import struct
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice

import numpy as np
import numpy.typing as npt
import zstandard
from line_protocol_parser import LineFormatError, parse_line

from filopy.dataset import METRIC_COLUMN, Dataset, LabelLimits, RecordFormat
from filopy.hashing import PROMETHEUS_METRIC_LABEL
from filopy.store.api import encode_part_key
from ingest.batch import Labels, SampleBatch

# ----------------------------------------------------------------------------- shared vocabulary


class BadRecord(StrEnum):
    """Why a record was skipped: short, stable strings, used as metric labels and in logs."""

    UNDECODABLE = "undecodable"  # a whole binary message or one text line could not be parsed
    NO_METRIC = "no_metric"  # the series has no metric name, or an empty one
    NON_NUMERIC = "non_numeric"  # a line protocol string or boolean field
    TIMESTAMP_RANGE = "timestamp_range"  # outside [MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS]
    # Over the dataset's `limits` (LabelLimits), or a label that no store can key:
    TOO_MANY_LABELS = "too_many_labels"
    EMPTY_LABEL_NAME = "empty_label_name"  # a non-empty value under the name ""
    LABEL_NAME_TOO_LONG = "label_name_too_long"
    LABEL_TOO_LONG = "label_too_long"  # a label value
    SERIES_KEY_TOO_LONG = "series_key_too_long"  # the stored series key, all labels together


# Series-level reasons in the order they are checked (the first that applies is counted);
# a series' reason code is its position here plus one, 0 meaning the series is fine.
SERIES_REASONS: tuple[BadRecord, ...] = (
    BadRecord.NO_METRIC,
    BadRecord.TOO_MANY_LABELS,
    BadRecord.EMPTY_LABEL_NAME,
    BadRecord.LABEL_NAME_TOO_LONG,
    BadRecord.LABEL_TOO_LONG,
    BadRecord.SERIES_KEY_TOO_LONG,
)
_CODE = {r: i + 1 for i, r in enumerate(SERIES_REASONS)}
DEFAULT_LIMITS = LabelLimits()
# json.dumps writes a character in at most 6 bytes (`\u001f`); each label adds `"":"",`.
_JSON_GROWTH, _JSON_PER_LABEL = 6, 6


MIN_TIMESTAMP_MS = 0  # 1970-01-01T00:00:00Z
MAX_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
DEFAULT_TS_RANGE: tuple[int, int] = (MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS)
_BAD_EXAMPLE_CHARS = 200


@dataclass(slots=True)
class Decoded:
    """A decoder's answer: the good samples, and one bad record's text (None if none) to log."""

    batch: SampleBatch
    first_bad: str | None = None


def _count(bad: dict[str, int], reason: BadRecord, n: int = 1) -> None:
    if n:
        bad[reason.value] = bad.get(reason.value, 0) + n


def _clip(text: str) -> str:
    return text if len(text) <= _BAD_EXAMPLE_CHARS else text[:_BAD_EXAMPLE_CHARS] + "..."


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _utf8_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def metric_missing(labels: Mapping[str, str], metric_column: str = METRIC_COLUMN) -> bool:
    """No metric name: neither `metric_column` nor `__name__`, or the one found is empty
    (Prometheus treats an empty label as absent)."""
    v = labels.get(metric_column)
    if v is None:
        v = labels.get(PROMETHEUS_METRIC_LABEL)
    return not v


def series_problem(
    labels: Mapping[str, str],
    metric_column: str = METRIC_COLUMN,
    limits: LabelLimits = DEFAULT_LIMITS,
) -> tuple[BadRecord, str] | None:
    """The first rule of the dataset's contract a series breaks, and why; None if it is fine.

    Per series: a few comparisons per label; the series key is JSON-encoded only when its size
    bound says it might be over the limit."""
    if metric_missing(labels, metric_column):
        return BadRecord.NO_METRIC, (
            f"no metric name: neither {metric_column!r} nor {PROMETHEUS_METRIC_LABEL!r}, or empty"
        )
    if len(labels) > limits.max_labels_per_series:
        return BadRecord.TOO_MANY_LABELS, (
            f"{len(labels)} labels, over limits.max_labels_per_series = "
            f"{limits.max_labels_per_series}"
        )
    sizes = [(k, v, _utf8_len(k), _utf8_len(v)) for k, v in labels.items()]
    # Reasons in `SERIES_REASONS` order, as the binary decoder's vectorised checks give them.
    for _, v, kb, vb in sizes:
        if kb == 0 and vb:
            return BadRecord.EMPTY_LABEL_NAME, f"the value {_short(v)!r} has an empty label name"
    for k, _, kb, _ in sizes:
        if kb > limits.max_label_name_bytes:
            return BadRecord.LABEL_NAME_TOO_LONG, (
                f"label name {_short(k)!r} is {kb} bytes, over limits.max_label_name_bytes = "
                f"{limits.max_label_name_bytes}"
            )
    for k, _, _, vb in sizes:
        if vb > limits.max_label_value_bytes:
            return BadRecord.LABEL_TOO_LONG, (
                f"label {_short(k)!r} has a value of {vb} bytes, over "
                f"limits.max_label_value_bytes = {limits.max_label_value_bytes}"
            )
    bound = 2 + sum(_JSON_GROWTH * (kb + vb) + _JSON_PER_LABEL for _, _, kb, vb in sizes if vb)
    if bound > limits.max_series_key_bytes:
        size = len(encode_part_key(labels).encode("utf-8", "surrogatepass"))
        if size > limits.max_series_key_bytes:
            return BadRecord.SERIES_KEY_TOO_LONG, (
                f"the series key is {size} bytes, over limits.max_series_key_bytes = "
                f"{limits.max_series_key_bytes}"
            )
    return None


def _problem_text(labels: Mapping[str, str], metric_column: str, limits: LabelLimits) -> str:
    problem = series_problem(labels, metric_column, limits)
    reason, why = problem if problem else (BadRecord.UNDECODABLE, "?")
    shown = {_short(k): _short(v) for k, v in islice(labels.items(), 6)}
    more = f" (+{len(labels) - 6} more labels)" if len(labels) > 6 else ""
    return f"{reason.value}: {why}; series " + _clip(f"{shown}{more}")


def _series_codes(
    series: Sequence[Mapping[str, str]], metric_column: str, limits: LabelLimits
) -> npt.NDArray[np.int8]:
    """Per series: 0 if fine, else its reason's code (`SERIES_REASONS`)."""
    codes = np.zeros(len(series), np.int8)
    for i, labels in enumerate(series):
        problem = series_problem(labels, metric_column, limits)
        if problem is not None:
            codes[i] = _CODE[problem[0]]
    return codes


# ----------------------------------------------------------------------------- binary format

MAGIC = b"FPB"
VERSION = 1
FLAG_ZSTD = 0x01
HEADER = struct.Struct("<3sBBBBxIIqI4x")  # 32 bytes, see docs/ingestion-formats.md
assert HEADER.size == 32
SEPARATOR = b"\xff"  # never occurs in UTF-8, so label strings need no escaping
MAX_BODY_BYTES = 256 << 20  # refuse to inflate a (corrupt) header's claim beyond this
DEFAULT_COMPRESSION_LEVEL = 1  # zstd level 1: ~4x smaller for ~0.05 us/sample to encode

_IDX_DTYPES = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}
_TS_DTYPES = {4: np.dtype("<u4"), 8: np.dtype("<u8")}
_F64 = np.dtype("<f8")
_U16 = np.dtype("<u2")

_zstd = threading.local()  # zstd contexts are not thread-safe; reuse one per thread


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] = _zstd.__dict__.setdefault("c", {})
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_zstd, "d", None)
    if d is None:
        d = _zstd.d = zstandard.ZstdDecompressor()
    return d


class RecordEncodeError(ValueError):
    """Samples that the binary format cannot carry (e.g. more than 65535 labels on a series)."""


def encode_labels(labels: Mapping[str, str]) -> bytes:
    """One series' entry in the string table: UTF-8 key, value, key, value... joined by 0xFF.

    The gateway caches this per series, since series repeat across scrapes.
    """
    if len(labels) > 0xFFFF:
        raise RecordEncodeError(f"a series has {len(labels)} labels; at most 65535 are allowed")
    return SEPARATOR.join(s.encode("utf-8") for kv in labels.items() for s in kv)


def encode_binary_parts(
    series_blobs: Sequence[bytes],
    label_counts: npt.ArrayLike,
    series_idx: npt.ArrayLike,
    timestamps: npt.ArrayLike,
    values: npt.ArrayLike,
    compression_level: int = DEFAULT_COMPRESSION_LEVEL,
) -> bytes:
    """Encode one message from pre-encoded series (`encode_labels`) and columnar samples.

    `series_idx` must index `series_blobs`; `compression_level` 0 leaves the body uncompressed.
    """
    idx = np.asarray(series_idx)
    ts = np.asarray(timestamps, dtype=np.int64)
    vals = np.asarray(values, dtype=np.float64)
    counts = np.asarray(label_counts, dtype=np.int64)
    n, n_series = len(ts), len(series_blobs)
    if len(idx) != n or len(vals) != n or len(counts) != n_series:
        raise RecordEncodeError("series_idx, timestamps and values (and label counts) differ")
    if n > 0xFFFFFFFF or n_series > 0xFFFFFFFF:
        raise RecordEncodeError("too many samples or series for one message")
    if n and (idx.min() < 0 or idx.max() >= n_series):
        raise RecordEncodeError("series_idx out of range of the series table")
    if n_series and counts.max() > 0xFFFF:
        raise RecordEncodeError("a series has more than 65535 labels")
    idx_width = 1 if n_series <= 1 << 8 else 2 if n_series <= 1 << 16 else 4
    base = int(ts.min()) if n else 0
    # Offsets from the minimum, modulo 2**64 so any int64 span round-trips exactly.
    offsets = ts.view(np.uint64) - np.uint64(base & 0xFFFFFFFFFFFFFFFF)
    ts_width = 4 if n == 0 or int(offsets.max()) <= 0xFFFFFFFF else 8
    body = b"".join(
        (
            vals.astype(_F64, copy=False).tobytes(),
            offsets.astype(_TS_DTYPES[ts_width]).tobytes(),
            idx.astype(_IDX_DTYPES[idx_width]).tobytes(),
            counts.astype(_U16).tobytes(),
            SEPARATOR.join(b for b in series_blobs if b),  # label-less series add no strings
        )
    )
    body_len = len(body)
    if body_len > MAX_BODY_BYTES:
        raise RecordEncodeError(f"a body of {body_len} bytes exceeds {MAX_BODY_BYTES}")
    flags = 0
    if compression_level > 0:
        body = _compressor(compression_level).compress(body)
        flags |= FLAG_ZSTD
    header = HEADER.pack(MAGIC, VERSION, flags, idx_width, ts_width, n_series, n, base, body_len)
    return header + body


def encode_binary(batch: SampleBatch, compression_level: int = DEFAULT_COMPRESSION_LEVEL) -> bytes:
    """Encode a whole batch as one message (the gateway splits by shard and size first)."""
    blobs = [encode_labels(s) for s in batch.series]
    counts = [len(s) for s in batch.series]
    return encode_binary_parts(
        blobs, counts, batch.series_idx, batch.timestamps, batch.values, compression_level
    )


class _Undecodable(Exception):
    pass


def _parse_binary(
    data: bytes,
) -> tuple[SampleBatch, npt.NDArray[np.uint16], npt.NDArray[np.int64]]:
    """Structural decode; raises `_Undecodable` saying what is wrong.

    Returns the batch, each series' label count and the UTF-8 length of every string of the
    series table (key, value, key, value...), for the limit checks."""
    if len(data) < HEADER.size:
        raise _Undecodable(f"{len(data)} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, flags, idx_width, ts_width, n_series, n, base, body_len = HEADER.unpack_from(
        data
    )
    if magic != MAGIC:
        raise _Undecodable(f"bad magic {magic!r}")
    if version != VERSION:
        raise _Undecodable(f"unsupported version {version}")
    if flags & ~FLAG_ZSTD:
        raise _Undecodable(f"unknown flags 0x{flags:02x}")
    if idx_width not in _IDX_DTYPES or ts_width not in _TS_DTYPES:
        raise _Undecodable(f"bad widths: index {idx_width}, timestamp {ts_width}")
    if body_len > MAX_BODY_BYTES:
        raise _Undecodable(f"body of {body_len} bytes exceeds {MAX_BODY_BYTES}")
    body = memoryview(data)[HEADER.size :]
    if flags & FLAG_ZSTD:
        try:
            if zstandard.frame_content_size(body) != body_len:
                raise _Undecodable("zstd frame size does not match the header")
            body = memoryview(_decompressor().decompress(body))
        except zstandard.ZstdError as e:
            raise _Undecodable(f"zstd: {e}") from None
    if len(body) != body_len:
        raise _Undecodable(f"body is {len(body)} bytes, header says {body_len}")
    fixed = n * (8 + ts_width + idx_width) + 2 * n_series
    if fixed > body_len:
        raise _Undecodable(f"{n} samples of {n_series} series do not fit in {body_len} bytes")
    pos = 0
    values = np.frombuffer(body, _F64, n, pos).astype(np.float64)
    pos += 8 * n
    offsets = np.frombuffer(body, _TS_DTYPES[ts_width], n, pos)
    timestamps = (offsets.astype(np.uint64) + np.uint64(base & 0xFFFFFFFFFFFFFFFF)).view(np.int64)
    pos += ts_width * n
    series_idx = np.frombuffer(body, _IDX_DTYPES[idx_width], n, pos).astype(np.int32)
    pos += idx_width * n
    counts = np.frombuffer(body, _U16, n_series, pos)
    pos += 2 * n_series
    # (u4 indexes above 2**31 wrap negative in int32: caught by the min check)
    if n and (int(series_idx.max()) >= n_series or int(series_idx.min()) < 0):
        raise _Undecodable("series index beyond the series table")
    n_strings = 2 * int(counts.sum())
    table = body[pos:].tobytes()
    if table:  # string lengths from the separators' positions: NumPy, not a loop over strings
        seps = np.flatnonzero(np.frombuffer(table, np.uint8) == SEPARATOR[0])
        ends = np.append(seps, len(table))
        lens = np.diff(ends, prepend=-1) - 1
    else:
        lens = np.empty(0, np.int64)
    if len(lens) != n_strings:
        raise _Undecodable(f"series table has {len(lens)} strings, expected {n_strings}")
    parts = table.split(SEPARATOR) if table else []
    try:
        strings = [p.decode("utf-8") for p in parts]
    except UnicodeDecodeError as e:
        raise _Undecodable(f"label is not UTF-8: {e}") from None
    it = iter(strings)
    pairs = zip(it, it, strict=False)
    series = [dict(islice(pairs, c)) for c in counts.tolist()]
    return SampleBatch(series, series_idx, timestamps, values), counts, lens


def _binary_codes(
    series: list[Labels],
    counts: npt.NDArray[np.uint16],
    lens: npt.NDArray[np.int64],
    metric_column: str,
    limits: LabelLimits,
) -> npt.NDArray[np.int8]:
    """`_series_codes` for a binary message, from its string lengths: NumPy per label, Python
    per series only for the metric lookup and for series whose key may be over the limit."""
    n_series = len(series)
    codes = np.zeros(n_series, np.int8)
    if not n_series:
        return codes
    missing = [i for i, s in enumerate(series) if metric_missing(s, metric_column)]
    codes[missing] = _CODE[BadRecord.NO_METRIC]
    counts = counts.astype(np.int64)
    codes[(counts > limits.max_labels_per_series) & (codes == 0)] = _CODE[BadRecord.TOO_MANY_LABELS]
    if not len(lens):
        return codes
    names, vals = lens[0::2], lens[1::2]
    owner = np.repeat(np.arange(n_series), counts)  # each label's series
    for reason, bad_label in (
        (BadRecord.EMPTY_LABEL_NAME, (names == 0) & (vals > 0)),
        (BadRecord.LABEL_NAME_TOO_LONG, names > limits.max_label_name_bytes),
        (BadRecord.LABEL_TOO_LONG, vals > limits.max_label_value_bytes),
    ):
        if bad_label.any():
            hit = np.zeros(n_series, np.bool_)
            hit[owner[bad_label]] = True
            codes[hit & (codes == 0)] = _CODE[reason]
    per_label = np.where(vals > 0, _JSON_GROWTH * (names + vals) + _JSON_PER_LABEL, 0)
    bound = np.bincount(owner, per_label, n_series) + 2
    for i in np.flatnonzero((bound > limits.max_series_key_bytes) & (codes == 0)).tolist():
        if len(encode_part_key(series[i]).encode("utf-8")) > limits.max_series_key_bytes:
            codes[i] = _CODE[BadRecord.SERIES_KEY_TOO_LONG]
    return codes


def decode_binary(
    data: bytes,
    metric_column: str = METRIC_COLUMN,
    ts_range: tuple[int, int] = DEFAULT_TS_RANGE,
    limits: LabelLimits = DEFAULT_LIMITS,
) -> Decoded:
    """Decode one FiloPy binary message; never raises.

    A message that cannot be parsed counts once as "undecodable". Samples of series that break
    the dataset's contract (no metric name, `limits`: see `SERIES_REASONS`) or with timestamps
    outside `ts_range` ("timestamp_range") are dropped one by one, counted by reason; the rest
    are returned.
    """
    try:
        batch, counts, lens = _parse_binary(data)
        codes = _binary_codes(batch.series, counts, lens, metric_column, limits)
        return _drop_bad(batch, codes, ts_range, metric_column, limits)
    except _Undecodable as e:
        head = bytes(data[:16]).hex()
        return Decoded(
            SampleBatch([], *_empty_cols(), {BadRecord.UNDECODABLE.value: 1}),
            f"undecodable binary message ({len(data)} bytes, starts {head}): {e}",
        )
    except Exception as e:  # a decoder bug must not stop ingestion either
        return Decoded(
            SampleBatch([], *_empty_cols(), {BadRecord.UNDECODABLE.value: 1}),
            f"undecodable binary message ({len(data)} bytes): {type(e).__name__}: {e}",
        )


def _empty_cols() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.float64)


def _drop_bad(
    batch: SampleBatch,
    codes: npt.NDArray[np.int8],
    ts_range: tuple[int, int] | None,
    metric_column: str,
    limits: LabelLimits,
) -> Decoded:
    """Drop the samples of bad series (`codes`) and out-of-range timestamps, counting them by
    reason into the batch's `bad_records` (added to what is there already)."""
    bad = batch.bad_records
    first_bad: str | None = None
    keep: npt.NDArray[np.bool_] | None = None
    if codes.any():
        sample_codes = codes[batch.series_idx]
        keep = sample_codes == 0
        per_reason = np.bincount(sample_codes, minlength=len(SERIES_REASONS) + 1)
        for reason, n in zip(SERIES_REASONS, per_reason[1:].tolist(), strict=True):
            _count(bad, reason, n)
        if not keep.all():
            i = int(batch.series_idx[int(np.argmin(keep))])
            first_bad = _problem_text(batch.series[i], metric_column, limits)
    if ts_range is not None:
        lo, hi = ts_range
        ts = batch.timestamps
        in_range = (ts >= lo) & (ts <= hi)
        if not in_range.all():
            out = ~in_range if keep is None else keep & ~in_range
            n_out = int(out.sum())
            if n_out:
                _count(bad, BadRecord.TIMESTAMP_RANGE, n_out)
                if first_bad is None:
                    i = int(np.flatnonzero(out)[0])
                    first_bad = _clip(
                        f"timestamp_range: {int(ts[i])} ms for {batch.series[batch.series_idx[i]]}"
                    )
            keep = in_range if keep is None else keep & in_range
    if keep is None:
        return Decoded(batch)
    idx = batch.series_idx[keep]
    # Keep only referenced series, so a consumer never sees a series without samples.
    used, new_idx = np.unique(idx, return_inverse=True)
    series = [batch.series[i] for i in used.tolist()]
    out_batch = SampleBatch(
        series,
        new_idx.astype(np.int32).reshape(-1),
        batch.timestamps[keep],
        batch.values[keep],
        bad,
    )
    return Decoded(out_batch, first_bad)


# ----------------------------------------------------------------------------- line protocol

_TS_UNITS_PER_MS: dict[str, tuple[int, int]] = {
    # precision -> (divide by, multiply by) to get milliseconds
    "ns": (1_000_000, 1),
    "us": (1_000, 1),
    "ms": (1, 1),
    "s": (1, 1_000),
}
_BOOLEANS = frozenset({"t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE"})
_FLOAT_CHARS = "0123456789.eE-"
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_FLOAT_MIN, _FLOAT_MAX = sys.float_info.min, sys.float_info.max  # normal float64 range
VALUE_FIELD = "value"  # a field of this name maps to the bare measurement name


def _nonzero_mantissa(v: str) -> bool:
    return bool(v.lower().partition("e")[0].strip("0.-"))


class _Fallback(Exception):
    """The fast path met something it does not handle; the full parser decides the line."""


_Entry = tuple[str, dict[str, str], dict[str, int]]  # measurement, tags, field -> series index


class _InfluxBuilder:
    """Accumulates samples of one message, with each (series, field) interned once."""

    __slots__ = ("bad", "cache", "first_bad", "idx", "metric_column", "series", "ts", "vals")

    def __init__(self, metric_column: str) -> None:
        self.metric_column = metric_column
        # raw series key text, and (measurement, sorted tags), -> the series' entry
        self.cache: dict[object, _Entry] = {}
        self.series: list[Labels] = []
        self.idx: list[int] = []
        self.ts: list[int] = []
        self.vals: list[float] = []
        self.bad: dict[str, int] = {}
        self.first_bad: str | None = None

    def bad_line(self, reason: BadRecord, line: str, n: int = 1, why: str = "") -> None:
        _count(self.bad, reason, n)
        if self.first_bad is None:
            self.first_bad = _clip(f"{reason.value}: {why + ': ' if why else ''}{line}")

    def entry(self, measurement: str, tags: dict[str, str]) -> _Entry:
        """The series entry shared by every line of this measurement and tag set."""
        canonical = (measurement, tuple(sorted(tags.items())))
        entry = self.cache.get(canonical)
        if entry is None:
            entry = self.cache[canonical] = (measurement, tags, {})
        return entry

    def new_series(self, entry: _Entry, field: str) -> int:
        measurement, tags, field_idx = entry
        labels = dict(tags)
        labels[self.metric_column] = (
            measurement if field == VALUE_FIELD else f"{measurement}_{field}"
        )
        i = field_idx[field] = len(self.series)
        self.series.append(labels)
        return i

    def add(self, entry: _Entry, fields: list[tuple[str, float | None]], t: int, line: str) -> None:
        """Add one parsed line's fields: a sample each, or a bad record if not numeric."""
        field_idx = entry[2]
        for f, x in fields:
            if x is None:
                self.bad_line(BadRecord.NON_NUMERIC, line, why=f"field {f!r}")
                continue
            i = field_idx.get(f)
            if i is None:
                i = self.new_series(entry, f)
            self.idx.append(i)
            self.ts.append(t)
            self.vals.append(x)


_FAST_KEY_CHARS = 65535 // 4  # the parser refuses keys over 65535 bytes: it decides long ones


def _fast_entry(b: _InfluxBuilder, key: str) -> _Entry:
    """Parse `measurement,k=v,...` without escapes, validated like the parser."""
    if len(key) > _FAST_KEY_CHARS:
        raise _Fallback
    measurement, *tag_items = key.split(",")
    if not measurement or "=" in measurement or measurement[0] == "#":
        raise _Fallback
    tags: dict[str, str] = {}
    for item in tag_items:
        k, _, v = item.partition("=")
        if not k or not v or "=" in v or k in tags:
            raise _Fallback
        tags[k] = v
    return b.entry(measurement, tags)


def _decode_lines(
    b: _InfluxBuilder,
    lines: Sequence[str | bytes],
    default_ts: int,
    lo: int,
    hi: int,
    fast_path: bool,
) -> None:
    """Decode lines in order; plain lines inline, the rest through `_full_line`.

    The fast path handles lines without escapes, quotes or tabs by splitting on separators,
    validating like the parser; anything unusual raises `_Fallback`, undoes the line's samples
    and leaves the line to the parser. It is one loop with local names because per-line Python
    overhead is the whole cost here.
    """
    cache, series, idx, ts, vals = b.cache, b.series, b.idx, b.ts, b.vals
    line_of: list[int] = []  # per series: the last line that gave it a sample (duplicates)
    for n_line, line in enumerate(lines):
        mark, series_mark, non_numeric = len(idx), len(series), 0
        try:
            if isinstance(line, bytes):
                line = line.decode("utf-8")
            if not fast_path or "\\" in line or '"' in line or "\t" in line:
                raise _Fallback
            parts = line.split(" ")
            if len(parts) == 3:
                key, fields, ts_text = parts
                if not (
                    ts_text.isascii()
                    and (ts_text.isdigit() or (ts_text[:1] == "-" and ts_text[1:].isdigit()))
                ):
                    raise _Fallback
                t = int(ts_text)
                if not lo <= t <= hi:
                    raise _Fallback  # rare: the parser tells non-int64 (undecodable) from range
            elif len(parts) == 2:
                key, fields = parts
                t = default_ts
            else:
                raise _Fallback
            entry = cache.get(key)
            if entry is None:
                entry = cache[key] = _fast_entry(b, key)
            field_idx = entry[2]
            for item in fields.split(","):
                f, _, v = item.partition("=")
                if not f:
                    raise _Fallback
                last = v[-1:]
                if last == "i" or last == "u":
                    digits = v[:-1]
                    body = digits[1:] if last == "i" and digits[:1] == "-" else digits
                    if not (body.isascii() and body.isdigit()):
                        raise _Fallback
                    n = int(digits)
                    if not (_INT64_MIN <= n <= _INT64_MAX if last == "i" else n <= _UINT64_MAX):
                        raise _Fallback
                    x = float(n)
                else:
                    try:
                        x = float(v)
                    except ValueError:
                        # (a repeated field name, maybe: the parser keeps the first)
                        if v not in _BOOLEANS or fields.count(f + "=") > 1:
                            raise _Fallback from None
                        non_numeric += 1
                        continue
                    # float() also takes "nan", "+1", "1_0", " 1" and under/overflows that the
                    # parser (strtod, strict grammar) rejects: only plain finite normals pass.
                    if (v.strip(_FLOAT_CHARS) or not _FLOAT_MIN <= abs(x) <= _FLOAT_MAX) and (
                        x != 0 or v.strip(_FLOAT_CHARS) or _nonzero_mantissa(v)
                    ):
                        raise _Fallback
                i = field_idx.get(f)
                if i is None:
                    i = b.new_series(entry, f)
                    line_of.append(n_line)
                elif line_of[i] == n_line:
                    raise _Fallback  # a duplicate field: the parser keeps the first
                else:
                    line_of[i] = n_line
                idx.append(i)
                ts.append(t)
                vals.append(x)
            if non_numeric:
                b.bad_line(BadRecord.NON_NUMERIC, line, non_numeric)
        except (_Fallback, UnicodeDecodeError):
            if len(idx) > mark:  # undo the fast path's partial line
                del idx[mark:], ts[mark:], vals[mark:]
            if len(series) > series_mark:  # new series of this line: all in `field_idx`
                for f in [f for f, i in field_idx.items() if i >= series_mark]:
                    del field_idx[f]
                del series[series_mark:]
            if not line or line.isspace():
                continue
            try:
                _full_line(b, line, default_ts, lo, hi)
            except Exception as e:  # a parser bug must not stop ingestion
                text = line if isinstance(line, str) else line.decode("utf-8", "replace")
                b.bad_line(BadRecord.UNDECODABLE, text, why=f"{type(e).__name__}: {e}")
            del line_of[len(series) :]
            line_of.extend([n_line] * (len(series) - len(line_of)))


def _full_line(b: _InfluxBuilder, line: str | bytes, default_ts: int, lo: int, hi: int) -> None:
    """Any line, through the maintained C parser (escapes, quoted strings, odd whitespace)."""
    text = line if isinstance(line, str) else line.decode("utf-8", "replace")
    try:
        point = parse_line(line)
    except (LineFormatError, UnicodeDecodeError, ValueError, OverflowError) as e:
        b.bad_line(BadRecord.UNDECODABLE, text, why=str(e))
        return
    if point is None:  # a comment
        return
    fields: list[tuple[str, float | None]] = [
        (f, None if isinstance(v, bool | str) else float(v)) for f, v in point["fields"].items()
    ]
    t = point["time"]
    t = default_ts if t is None else t
    if not lo <= t <= hi:
        b.bad_line(BadRecord.TIMESTAMP_RANGE, text, len(fields))
        return
    b.add(b.entry(point["measurement"], point["tags"]), fields, t, text)


def decode_influx(
    data: bytes | str,
    default_ts_ms: int,
    metric_column: str = METRIC_COLUMN,
    precision: str = "ns",
    ts_range: tuple[int, int] = DEFAULT_TS_RANGE,
    fast_path: bool = True,
    limits: LabelLimits = DEFAULT_LIMITS,
) -> Decoded:
    """Decode Influx line protocol (one or many lines); never raises.

    Each numeric field is a sample of series `tags + {metric_column: measurement_field}` (just
    `measurement` for a field named "value"); integers become floats; strings and booleans are
    "non_numeric"; a line outside `ts_range` counts each of its fields as "timestamp_range";
    a series over the dataset's `limits` counts each of its samples by reason (`SERIES_REASONS`).
    Lines without a timestamp get `default_ts_ms` (e.g. the Kafka message time).
    Plain lines take a split-based fast path; lines with escapes or quoted strings (and any
    line the fast path doubts) go to `line_protocol_parser`, which has the last word.
    `fast_path=False` sends every line to the parser (for tests and benchmarks).
    """
    try:
        div, mul = _TS_UNITS_PER_MS[precision]
    except KeyError:
        raise ValueError(
            f"unknown precision {precision!r}; use one of {sorted(_TS_UNITS_PER_MS)}"
        ) from None
    lo_ms, hi_ms = ts_range
    # Bounds and default in the input unit: t is in range iff its (floored) millisecond value is.
    if mul == 1:
        lo, hi = lo_ms * div, hi_ms * div + div - 1
        default_ts = default_ts_ms * div
    else:
        lo, hi = -(-lo_ms // mul), hi_ms // mul
        default_ts = default_ts_ms // mul
    lo, hi = max(lo, _INT64_MIN), min(hi, _INT64_MAX)  # the parser's limits
    b = _InfluxBuilder(metric_column)
    lines: Sequence[str | bytes]
    if isinstance(data, str):
        lines = data.split("\n")
    else:
        try:
            lines = bytes(data).decode("utf-8").split("\n")
        except UnicodeDecodeError:
            lines = bytes(data).split(b"\n")  # the parser reports the bad lines
    _decode_lines(b, lines, default_ts, lo, hi, fast_path)
    ts = np.array(b.ts, dtype=np.int64)
    ts = ts // div if mul == 1 else ts * mul
    batch = SampleBatch(
        b.series,
        np.array(b.idx, dtype=np.int32),
        ts,
        np.array(b.vals, dtype=np.float64),
        b.bad,
    )
    codes = _series_codes(b.series, metric_column, limits)
    if not codes.any():
        return Decoded(batch, b.first_bad)
    decoded = _drop_bad(batch, codes, None, metric_column, limits)
    return Decoded(decoded.batch, b.first_bad or decoded.first_bad)


# ----------------------------------------------------------------------------- by dataset

Decoder = Callable[[bytes, int], Decoded]


def decoder_for(dataset: Dataset, ts_range: tuple[int, int] = DEFAULT_TS_RANGE) -> Decoder:
    """The dataset's decoder: `decode(message_value, message_timestamp_ms) -> Decoded`."""
    column, limits = dataset.metric_column, dataset.limits
    if dataset.source.record_format == RecordFormat.BINARY:

        def binary(data: bytes, _ts_ms: int) -> Decoded:
            return decode_binary(data, column, ts_range, limits)

        return binary

    def influx(data: bytes, ts_ms: int) -> Decoded:
        try:
            return decode_influx(data, ts_ms, column, ts_range=ts_range, limits=limits)
        except Exception as e:  # a decoder bug must not stop ingestion (binary: in decode_binary)
            return Decoded(
                SampleBatch([], *_empty_cols(), {BadRecord.UNDECODABLE.value: 1}),
                f"undecodable line protocol message ({len(data)} bytes): {type(e).__name__}: {e}",
            )

    return influx

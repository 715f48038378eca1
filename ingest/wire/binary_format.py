"""FiloPy's binary record format: encoding (for the gateway) and decoding (for the ingesters).

The format is specified byte by byte in docs/ingestion-formats.md: a 32-byte header, then a
column of values, timestamp offsets, series indexes and a series string table, optionally
zstd-compressed. Decoding it is a handful of `np.frombuffer` calls plus one pass over the series
table, so its cost is per series, not per sample; the dataset's contract on series is checked
from the table's string lengths (`ingest.bad_records`). A table seen again (the same series in
the same order, as a scraper's batches are) is found in the decoder's `SeriesTables` and not
parsed again.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import zstandard

from core.dataset import METRIC_COLUMN, LabelLimits
from core.errors import Invalid
from core.jit import kernel, warms
from ingest.bad_records import (
    DEFAULT_LIMITS,
    DEFAULT_TS_RANGE,
    Decoded,
    drop_bad,
    series_codes_from_lengths,
    undecodable,
)
from ingest.batch import KeyedBatch, SampleBatch
from ingest.byte_table import words_at

MAGIC = b"FPB"
VERSION = 1
FLAG_ZSTD = 0x01
HEADER = struct.Struct("<3sBBBBxIIqI4x")  # 32 bytes, see docs/ingestion-formats.md
assert HEADER.size == 32
SEPARATOR = b"\xff"  # never occurs in UTF-8, so label strings need no escaping
MAX_BODY_BYTES = 256 << 20  # refuse to inflate a (corrupt) header's claim beyond this
DEFAULT_COMPRESSION_LEVEL = 1  # the cheapest: most of zstd's gain (docs/ingestion-formats.md)

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


class RecordEncodeError(Invalid):
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
    base = int(ts.min()) if n else 0
    # Offsets from the minimum, modulo 2**64 so any int64 span round-trips exactly.
    offsets = ts.view(np.uint64) - np.uint64(base & 0xFFFFFFFFFFFFFFFF)
    wide = n > 0 and int(offsets.max()) > 0xFFFFFFFF
    return encode_checked(series_blobs, counts, idx, offsets, wide, base, vals, compression_level)


def idx_width_for(n_series: int) -> int:
    """Bytes per series index in a message of `n_series` series."""
    return 1 if n_series <= 1 << 8 else 2 if n_series <= 1 << 16 else 4


def encode_checked(
    series_blobs: Sequence[bytes],
    label_counts: npt.NDArray[np.integer],
    series_idx: npt.NDArray[np.integer],
    offsets: npt.NDArray[np.uint64],
    wide: bool,
    base: int,
    values: npt.NDArray[np.float64],
    compression_level: int = DEFAULT_COMPRESSION_LEVEL,
) -> bytes:
    """Encode one message from columns the caller has checked (what `encode_binary_parts`
    checks: lengths agree, indexes within the table, label counts under 65536), the
    timestamps as offsets from `base` (their minimum) modulo 2**64, `wide` if one is over
    2**32 - 1. The gateway computes these for all its messages at once; the bytes are
    `encode_binary_parts`' for the same samples."""
    n, n_series = len(values), len(series_blobs)
    idx_width = idx_width_for(n_series)
    ts_width = 8 if wide else 4
    body = b"".join(
        (
            values.astype(_F64, copy=False).tobytes(),
            offsets.astype(_TS_DTYPES[ts_width], copy=False).tobytes(),
            series_idx.astype(_IDX_DTYPES[idx_width], copy=False).tobytes(),
            label_counts.astype(_U16, copy=False).tobytes(),
            _string_table(series_blobs),
        )
    )
    return finish(body, n_series, n, wide, base, compression_level)


def _string_table(series_blobs: Sequence[bytes]) -> bytes:
    """The series' strings joined; label-less series (empty blobs) add none."""
    if b"" in series_blobs:  # rare: the general join (a C scan decides, no generator)
        return SEPARATOR.join(b for b in series_blobs if b)
    return SEPARATOR.join(series_blobs)


@kernel
def _body_starts(
    bounds: npt.NDArray[np.int64],
    series_bounds: npt.NDArray[np.int64],
    wide: npt.NDArray[np.bool_],
    series_slots: npt.NDArray[np.int64],
    blob_len: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Where each message's body starts among the bodies laid out one after the other (and,
    last, where the last one ends): see `_fill_bodies`."""
    groups = bounds.shape[0] - 1
    starts = np.empty(groups + 1, np.int64)
    size = 0
    for g in range(groups):
        n = bounds[g + 1] - bounds[g]
        sa, sb = series_bounds[g], series_bounds[g + 1]
        m = sb - sa
        idx_width = 1 if m <= 256 else 2 if m <= 65536 else 4
        table = 0
        blobs = 0
        for j in range(sa, sb):
            length = blob_len[series_slots[j]]
            if length:
                table += length
                blobs += 1
        starts[g] = size
        size += n * (8 + (8 if wide[g] else 4) + idx_width) + 2 * m + table + max(blobs - 1, 0)
    starts[groups] = size
    return starts


@kernel
def _fill_bodies(
    out: npt.NDArray[np.uint8],
    out_words: npt.NDArray[np.uint64],
    starts: npt.NDArray[np.int64],
    bounds: npt.NDArray[np.int64],
    series_bounds: npt.NDArray[np.int64],
    wide: npt.NDArray[np.bool_],
    value_bits: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.uint64],
    local_idx: npt.NDArray[np.int64],
    label_counts: npt.NDArray[np.int64],
    series_slots: npt.NDArray[np.int64],
    arena: npt.NDArray[np.uint8],
    arena_words: npt.NDArray[np.uint64],
    blob_start: npt.NDArray[np.int64],
    blob_len: npt.NDArray[np.int64],
) -> None:
    """The bodies of several messages, one after the other from `starts`: message g is the
    samples `bounds[g]:bounds[g + 1]` (values as bits, timestamp offsets, each one's index
    among the message's series) and the series `series_bounds[g]:series_bounds[g + 1]` (label
    counts, and their blobs: `arena` bytes of each one's slot), laid out as `encode_checked`
    does. `out_words` and `arena_words` are the 8-byte words at every byte offset of `out` and
    `arena` (`words_at`): each field is one unaligned store whose bytes past the field are
    overwritten by the next one (bytes are written in increasing order; `out` has 8 bytes to
    spare at its end), a blob of 8 bytes or more is copied a word at a time, its last word
    ending at its last byte (never reading past it)."""
    for g in range(bounds.shape[0] - 1):
        a, b = bounds[g], bounds[g + 1]
        sa, sb = series_bounds[g], series_bounds[g + 1]
        m = sb - sa
        idx_width = 1 if m <= 256 else 2 if m <= 65536 else 4
        ts_width = 8 if wide[g] else 4
        at = starts[g]
        for i in range(a, b):
            out_words[at] = value_bits[i]
            at += 8
        for i in range(a, b):
            out_words[at] = offsets[i]  # < 2**32 unless wide: the upper bytes are zero
            at += ts_width
        for i in range(a, b):
            out_words[at] = np.uint64(local_idx[i])
            at += idx_width
        for j in range(sa, sb):
            out_words[at] = np.uint64(label_counts[j])
            at += 2
        first = True
        for j in range(sa, sb):
            slot = series_slots[j]
            length = blob_len[slot]
            if not length:
                continue
            if not first:
                out[at] = 0xFF  # SEPARATOR
                at += 1
            first = False
            src = blob_start[slot]
            if length >= 8:
                last = length - 8
                for k in range(0, last, 8):
                    out_words[at + k] = arena_words[src + k]
                out_words[at + last] = arena_words[src + last]
            else:
                for k in range(length):
                    out[at + k] = arena[src + k]
            at += length


def finish(
    body: bytes | memoryview, n_series: int, n: int, wide: bool, base: int, compression_level: int
) -> bytes:
    """A message from its uncompressed body: compressed, after its header."""
    body_len = len(body)
    if body_len > MAX_BODY_BYTES:
        raise RecordEncodeError(f"a body of {body_len} bytes exceeds {MAX_BODY_BYTES}")
    flags = 0
    if compression_level > 0:
        body = _compressor(compression_level).compress(body)
        flags |= FLAG_ZSTD
    header = HEADER.pack(
        MAGIC,
        VERSION,
        flags,
        idx_width_for(n_series),
        8 if wide else 4,
        n_series,
        n,
        base,
        body_len,
    )
    return header + body


def encode_bodies(
    bounds: npt.NDArray[np.int64],
    series_bounds: npt.NDArray[np.int64],
    wide: npt.NDArray[np.bool_],
    values: npt.NDArray[np.float64],
    offsets: npt.NDArray[np.uint64],
    local_idx: npt.NDArray[np.int64],
    label_counts: npt.NDArray[np.int64],
    series_slots: npt.NDArray[np.int64],
    arena: npt.NDArray[np.uint8],
    blob_start: npt.NDArray[np.int64],
    blob_len: npt.NDArray[np.int64],
) -> list[memoryview]:
    """The uncompressed bodies `encode_checked` makes of several messages (message g: samples
    `bounds[g]:bounds[g + 1]`, series `series_bounds[g]:series_bounds[g + 1]`, their blobs
    in `arena`), laid out by compiled kernels without the GIL; `finish` makes each a
    message."""
    i64, c = np.int64, np.ascontiguousarray  # (the types the kernels are compiled for)
    bounds, series_bounds = c(bounds, i64), c(series_bounds, i64)
    wide, series_slots, blob_len = c(wide, np.bool_), c(series_slots, i64), c(blob_len, i64)
    starts = _body_starts(bounds, series_bounds, wide, series_slots, blob_len)
    out = np.empty(int(starts[-1]) + 8, np.uint8)  # (8 bytes for the last store's spill)
    arena = c(arena, np.uint8)
    _fill_bodies(
        out, words_at(out), starts, bounds, series_bounds, wide,
        c(values, np.float64).view(np.uint64), c(offsets, np.uint64), c(local_idx, i64),
        c(label_counts, i64), series_slots, arena, words_at(arena), c(blob_start, i64),
        blob_len,
    )  # fmt: skip
    view = memoryview(out)
    at = starts.tolist()
    return [view[at[g] : at[g + 1]] for g in range(len(at) - 1)]


def encode_binary(batch: SampleBatch, compression_level: int = DEFAULT_COMPRESSION_LEVEL) -> bytes:
    """Encode a whole batch as one message (the gateway splits by shard and size first)."""
    blobs = [encode_labels(s) for s in batch.series]
    counts = [len(s) for s in batch.series]
    return encode_binary_parts(
        blobs, counts, batch.series_idx, batch.timestamps, batch.values, compression_level
    )


class _Undecodable(Exception):
    pass


@dataclass(slots=True, eq=False)
class _Table:
    """A message's series table, parsed: what `_parse_binary` derives from it alone."""

    n_series: int
    raw: bytes  # the label counts and the string table, as in the message
    keys: list[bytes]
    series: list[dict[str, str]]
    counts: npt.NDArray[np.uint16]
    lens: npt.NDArray[np.int64]
    codes: dict[tuple[str, LabelLimits], npt.NDArray[np.int8]] = field(default_factory=dict)


class SeriesTables:
    """The series tables of the last messages a decoder read, parsed once.

    A producer that sends the same series in the same order (one scrape of a fleet, a gateway
    batch of it) repeats its series table byte for byte in every message. Finding it here
    costs one length check and one memcmp, instead of a Python pass over the table's series
    (slicing each series' key, looking up its labels, checking the dataset's contract), which
    was most of a binary message's decoding cost. The batches of a found table share its
    `keys` list, so the memstore can also remember their series ids (`ShardMemstore`).
    One per decoder, used by one thread (an ingester's); not thread-safe."""

    def __init__(self, max_tables: int = 4, max_bytes: int = 8 << 20) -> None:
        self.max_tables, self.max_bytes = max_tables, max_bytes
        self._recent: list[_Table] = []  # most recently used first
        self.hits = self.misses = 0

    def find(self, n_series: int, raw: bytes) -> _Table | None:
        for i, t in enumerate(self._recent):
            if t.n_series == n_series and len(t.raw) == len(raw) and t.raw == raw:
                if i:
                    self._recent.insert(0, self._recent.pop(i))
                self.hits += 1
                return t
        self.misses += 1
        return None

    def add(self, table: _Table) -> None:
        if len(table.raw) > self.max_bytes:
            return
        self._recent.insert(0, table)
        total = 0
        for i, t in enumerate(self._recent):
            total += len(t.raw)
            if i >= self.max_tables or total > self.max_bytes:
                del self._recent[i:]
                break


def _parse_binary(data: bytes, tables: SeriesTables | None = None) -> tuple[SampleBatch, _Table]:
    """Structural decode; raises `_Undecodable` saying what is wrong.

    Returns the batch and its parsed series table (each series' label count and the UTF-8
    length of every string, key, value, key, value..., for the limit checks)."""
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
    # (u4 indexes above 2**31 wrap negative in int32: caught by the min check)
    if n and (int(series_idx.max()) >= n_series or int(series_idx.min()) < 0):
        raise _Undecodable("series index beyond the series table")
    raw = body[pos:].tobytes()
    table = tables.find(n_series, raw) if tables is not None else None
    if table is None:
        table = _parse_table(n_series, raw)
        if tables is not None:
            tables.add(table)
    batch = KeyedBatch(table.series, series_idx, timestamps, values, keys=table.keys)  # type: ignore[arg-type]
    return batch, table


def _parse_table(n_series: int, raw: bytes) -> _Table:
    """Parse a series table: label counts (u16 each), then the strings."""
    counts = np.frombuffer(raw, _U16, n_series, 0)
    table = raw[2 * n_series :]
    n_strings = 2 * int(counts.sum())
    if table:  # string lengths from the separators' positions: NumPy, not a loop over strings
        seps = np.flatnonzero(np.frombuffer(table, np.uint8) == SEPARATOR[0])
        ends = np.append(seps, len(table))
        lens = np.diff(ends, prepend=-1) - 1
    else:
        lens = np.empty(0, np.int64)
    if len(lens) != n_strings:
        raise _Undecodable(f"series table has {len(lens)} strings, expected {n_strings}")
    # Each series' slice of the table is its key: equal bytes, equal labels (in the same
    # order). Known series are found by it with one dict lookup, not decoded again.
    first = 2 * np.cumsum(counts, dtype=np.int64) - 2 * counts.astype(np.int64)
    last = first + 2 * counts.astype(np.int64) - 1
    empty = counts == 0
    if len(lens):
        ends = np.cumsum(lens + 1) - 1  # each string's end (its separator's position)
        starts = np.where(first > 0, ends[np.maximum(first - 1, 0)] + 1, 0)
        stops = np.where(empty, starts, ends[np.maximum(last, 0)])
    else:
        starts = stops = np.zeros(n_series, np.int64)
    keys = [table[a:b] for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
    cache = _labels_cache
    series = [cache.get(k) or _labels_of(k) for k in keys]
    return _Table(n_series, raw, keys, series, counts, lens)


_labels_cache: dict[bytes, dict[str, str]] = {}  # a series' table bytes -> its labels (shared)
_LABELS_CACHE_MAX = 1 << 20


def _labels_of(key: bytes) -> dict[str, str]:
    """Decode one series' labels (key, value, ... joined by the separator) and cache them.
    The cache starts afresh past `_LABELS_CACHE_MAX` series (a churn of series names)."""
    try:
        strings = [p.decode("utf-8") for p in key.split(SEPARATOR)] if key else []
    except UnicodeDecodeError as e:
        raise _Undecodable(f"label is not UTF-8: {e}") from None
    it = iter(strings)
    labels = dict(zip(it, it, strict=False))
    if len(_labels_cache) >= _LABELS_CACHE_MAX:
        _labels_cache.clear()
    _labels_cache[key] = labels
    return labels


def decode_binary(
    data: bytes,
    metric_column: str = METRIC_COLUMN,
    ts_range: tuple[int, int] = DEFAULT_TS_RANGE,
    limits: LabelLimits = DEFAULT_LIMITS,
    tables: SeriesTables | None = None,
) -> Decoded:
    """Decode one FiloPy binary message; never raises. `tables`: the decoder's recently seen
    series tables (a message repeating one skips parsing it).

    A message that cannot be parsed counts once as "undecodable". Samples of series that break
    the dataset's contract (no metric name, `limits`: see `SERIES_REASONS`) or with timestamps
    outside `ts_range` ("timestamp_range") are dropped one by one, counted by reason; the rest
    are returned.
    """
    try:
        batch, table = _parse_binary(data, tables)
        contract = (metric_column, limits)
        codes = table.codes.get(contract)
        if codes is None:
            codes = series_codes_from_lengths(
                table.series, table.counts, table.lens, metric_column, limits
            )
            table.codes = {contract: codes}  # one contract per decoder: keep only the last
        return drop_bad(batch, codes, ts_range, metric_column, limits)
    except _Undecodable as e:
        head = bytes(data[:16]).hex()
        return undecodable(f"undecodable binary message ({len(data)} bytes, starts {head}): {e}")
    except Exception as e:  # a decoder bug must not stop ingestion either
        return undecodable(
            f"undecodable binary message ({len(data)} bytes): {type(e).__name__}: {e}"
        )


@warms
def _warm() -> None:
    """`encode_bodies` with the argument types the gateway gives it."""
    one = np.array([0, 1], np.int64)
    arena = np.frombuffer(b"k\xffv", np.uint8).copy()
    encode_bodies(
        one, one, np.zeros(1, bool), np.zeros(1), np.zeros(1, np.uint64), np.zeros(1, np.int64),
        np.ones(1, np.int64), np.zeros(1, np.int64), arena, np.zeros(1, np.int64),
        np.full(1, 3, np.int64),
    )  # fmt: skip

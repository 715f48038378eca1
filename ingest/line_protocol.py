"""Influx line protocol records: decoding a message of lines into samples.

Plain lines take a split-based fast path written as one loop, since per-line Python overhead is
the whole cost; lines with escapes or quoted strings (and any line the fast path doubts) go to
the maintained C parser `line_protocol_parser`, which has the last word. The dataset's contract
on series is checked as for every format (`ingest.bad_records`).

Series repeat from one message to the next (each a scrape), so what the fast path learns about a
series key text (its measurement and tags) and about each of its fields (the labels, the contract
check, a `KeyedBatch` key for the gateway) is kept across messages, bounded by `CACHE_SIZE`:
a known series costs the line's split and a few dict lookups.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Sequence

import numpy as np
from line_protocol_parser import LineFormatError, parse_line

from filopy.dataset import METRIC_COLUMN, LabelLimits
from ingest.bad_records import (
    DEFAULT_LIMITS,
    DEFAULT_TS_RANGE,
    SERIES_REASONS,
    BadRecord,
    Decoded,
    clip,
    count_bad,
    drop_bad,
    series_problem,
)
from ingest.batch import Labels, SampleBatch
from ingest.gateway import KeyedBatch, new_series_key

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


# measurement, tags, field -> series index, and the series key text it was made from (None if
# the parser made it): what identifies its labels across messages
_Entry = tuple[str, dict[str, str], dict[str, int], str | None]
_Canonical = tuple[str, tuple[tuple[str, str], ...]]  # measurement, sorted tags
# A series key's labels for one field, its contract code (0 or SERIES_REASONS index + 1), and
# its `KeyedBatch` key. Label dicts are shared by every batch that has the series: read only.
_Series = tuple[Labels, int, int]

CACHE_SIZE = 500_000  # series key texts, and (text, field)s per metric column and limits
# series key text -> (measurement, tags, canonical), as the fast path parses it
_keys: dict[str, tuple[str, dict[str, str], _Canonical]] = {}
# (metric column, limits) -> (series key text, field) -> the series
_series: dict[tuple[str, LabelLimits], dict[tuple[str, str], _Series]] = {}


def _known_series(metric_column: str, limits: LabelLimits) -> dict[tuple[str, str], _Series]:
    known = _series.get((metric_column, limits))
    if known is None:
        known = _series.setdefault((metric_column, limits), {})
    return known


def _code(labels: Labels, metric_column: str, limits: LabelLimits) -> int:
    """The dataset's contract on one series, as `series_codes` gives it."""
    problem = series_problem(labels, metric_column, limits)
    return 0 if problem is None else SERIES_REASONS.index(problem[0]) + 1


class _InfluxBuilder:
    """Accumulates samples of one message, with each (series, field) interned once."""

    __slots__ = (
        "bad",
        "cache",
        "codes",
        "first_bad",
        "idx",
        "keys",
        "known",
        "limits",
        "metric_column",
        "series",
        "ts",
        "vals",
    )

    def __init__(self, metric_column: str, limits: LabelLimits = DEFAULT_LIMITS) -> None:
        self.metric_column = metric_column
        self.limits = limits
        self.known = _known_series(metric_column, limits)
        # raw series key text, and (measurement, sorted tags), -> the series' entry
        self.cache: dict[object, _Entry] = {}
        self.series: list[Labels] = []
        self.codes: list[int] = []  # per series, aligned with `series`
        self.keys: list[Hashable | None] = []  # per series: its key, None if not cached
        self.idx: list[int] = []
        self.ts: list[int] = []
        self.vals: list[float] = []
        self.bad: dict[str, int] = {}
        self.first_bad: str | None = None

    def truncate(self, n_series: int) -> None:
        """Forget the series from index `n_series` on (a line the fast path gave up)."""
        del self.series[n_series:], self.codes[n_series:], self.keys[n_series:]

    def bad_line(self, reason: BadRecord, line: str, n: int = 1, why: str = "") -> None:
        count_bad(self.bad, reason, n)
        if self.first_bad is None:
            self.first_bad = clip(f"{reason.value}: {why + ': ' if why else ''}{line}")

    def entry(
        self,
        measurement: str,
        tags: dict[str, str],
        canonical: _Canonical | None = None,
        text: str | None = None,
    ) -> _Entry:
        """The series entry shared by every line of this measurement and tag set (`text`: the
        series key text the fast path parsed them from)."""
        if canonical is None:
            canonical = (measurement, tuple(sorted(tags.items())))
        entry = self.cache.get(canonical)
        if entry is None:
            entry = self.cache[canonical] = (measurement, tags, {}, text)
        return entry

    def new_series(self, entry: _Entry, field: str) -> int:
        measurement, tags, field_idx, text = entry
        known = self.known.get((text, field)) if text is not None else None
        if known is None:
            labels = dict(tags)
            labels[self.metric_column] = (
                measurement if field == VALUE_FIELD else f"{measurement}_{field}"
            )
            code = _code(labels, self.metric_column, self.limits)
            key: Hashable | None = None
            if text is not None:
                if len(self.known) >= CACHE_SIZE:
                    self.known.clear()
                key = new_series_key()
                self.known[(text, field)] = (labels, code, key)
        else:
            labels, code, key = known
        i = field_idx[field] = len(self.series)
        self.series.append(labels)
        self.codes.append(code)
        self.keys.append(key)
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
    """Parse `measurement,k=v,...` without escapes, validated like the parser (once per key
    text: kept across messages)."""
    parsed = _keys.get(key)
    if parsed is None:
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
        if len(_keys) >= CACHE_SIZE:
            _keys.clear()
        parsed = _keys[key] = (measurement, tags, (measurement, tuple(sorted(tags.items()))))
    measurement, tags, canonical = parsed
    return b.entry(measurement, tags, canonical, key)


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
                b.truncate(series_mark)
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
    b = _InfluxBuilder(metric_column, limits)
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
    idx = np.array(b.idx, dtype=np.int32)
    vals = np.array(b.vals, dtype=np.float64)
    codes = np.array(b.codes, np.int8)
    if not codes.any():
        if None in b.keys:
            return Decoded(SampleBatch(b.series, idx, ts, vals, b.bad), b.first_bad)
        keys: list[Hashable] = b.keys  # type: ignore[assignment]
        return Decoded(KeyedBatch(b.series, idx, ts, vals, b.bad, keys=keys), b.first_bad)
    batch = SampleBatch(b.series, idx, ts, vals, b.bad)
    decoded = drop_bad(batch, codes, None, metric_column, limits)
    return Decoded(decoded.batch, b.first_bad or decoded.first_bad)

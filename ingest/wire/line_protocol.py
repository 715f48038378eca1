"""Influx line protocol records: decoding a message of lines into samples.

The reference is the maintained C parser `line_protocol_parser`, one line at a time
(`_decode_lines`), which has the last word. The dataset's contract on series is checked as for
every format (`ingest.bad_records`). Series repeat from one message to the next (each a
scrape), so what is learnt about a series key text (its measurement and tags, as the parser
reads them) and about each of its fields (the labels, the contract check, a `KeyedBatch` key
for the gateway) is kept across messages, bounded by `CACHE_SIZE`.

One fast path: whole messages of one-field lines (`key name=float timestamp`, as scrapes are
sent) skip the per-line parse. `_decode_columns` works on the message's bytes in compiled
kernels without the GIL (`core.jit`: lines framed, timestamps and plain decimal values read
from the bytes, series key texts found in a hash table, `_SeriesTable`) and NumPy. It steps
aside at the first doubt, and the reference decides; every message decodes as the reference
decodes it (tests/ingest/test_line_protocol_columns.py).
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
from line_protocol_parser import LineFormatError, parse_line

from core.dataset import METRIC_COLUMN, LabelLimits
from core.jit import kernel, warms
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
from ingest.batch import IntKeyedBatch, KeyedBatch, Labels, SampleBatch, new_series_key
from ingest.byte_table import ByteTable, TableView, padded

_TS_UNITS_PER_MS: dict[str, tuple[int, int]] = {
    # precision -> (divide by, multiply by) to get milliseconds
    "ns": (1_000_000, 1),
    "us": (1_000, 1),
    "ms": (1, 1),
    "s": (1, 1_000),
}
_FLOAT_CHARS = "0123456789.eE-"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_FLOAT_MIN, _FLOAT_MAX = sys.float_info.min, sys.float_info.max  # normal float64 range
VALUE_FIELD = "value"  # a field of this name maps to the bare measurement name


def _nonzero_mantissa(v: str) -> bool:
    return bool(v.lower().partition("e")[0].strip("0.-"))


def _floats_as_parsed(texts: Sequence[str] | Sequence[bytes]) -> list[float] | None:
    """`float()` of each field value, or None unless that is surely what the parser reads: a
    value that is no number, or a non-zero one outside float64's normal range (an underflow to
    zero such as "1e-400", or a subnormal), which the parser may read otherwise."""
    try:
        vals = list(map(float, texts))
    except ValueError:
        return None
    x = np.abs(np.array(vals, np.float64))
    normal = (x >= _FLOAT_MIN) & (x <= _FLOAT_MAX)
    if not normal.all():  # zeros pass unless they are underflows ("1e-400")
        zeros = np.flatnonzero(x == 0).tolist()
        if len(zeros) != int((~normal).sum()) or any(
            _nonzero_mantissa(t.decode() if isinstance(t, bytes) else t)
            for t in (texts[i] for i in zeros)
        ):
            return None
    return vals


class _Fallback(Exception):
    """The fast path met something it does not handle; the reference decides the message."""


# A series' labels for one field, its contract code (0 or SERIES_REASONS index + 1) and its
# `KeyedBatch` key. Label dicts are shared by every batch that has the series: read only.
_Series = tuple[Labels, int, int]
# In one message: measurement, tags, field -> series index, and what is known across messages of
# the series' fields (None for an entry the parser made)
_Entry = tuple[str, dict[str, str], dict[str, int], dict[str, _Series] | None]
# A series key text as the parser reads it: measurement, tags, canonical form (lines whose
# tags come in another order are the same series) and its fields seen so far
_Template = tuple[str, dict[str, str], str, dict[str, _Series]]

CACHE_SIZE = 500_000  # series key texts kept per metric column and limits
# (metric column, limits) -> series key text -> its template
_templates: dict[tuple[str, LabelLimits], dict[str, _Template]] = {}


def _canonical(measurement: str, tags: dict[str, str]) -> str:
    """Measurement and sorted tags as one string, its hash cached by the string: lines are
    split at "\n", so no name or value holds one, and a series key text never does either."""
    return "\n" + "\n".join([measurement, *(f"{k}\n{v}" for k, v in sorted(tags.items()))])


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
        "key_array",
        "keys",
        "limits",
        "metric_column",
        "series",
        "templates",
        "ts",
        "vals",
    )

    def __init__(self, metric_column: str, limits: LabelLimits = DEFAULT_LIMITS) -> None:
        self.metric_column = metric_column
        self.limits = limits
        templates = _templates.get((metric_column, limits))
        if templates is None:
            templates = _templates.setdefault((metric_column, limits), {})
        self.templates = templates
        # a line's series key text, and the canonical form (`_canonical`), -> the series' entry
        self.cache: dict[str, _Entry] = {}
        self.series: list[Labels] = []
        self.codes: list[int] = []  # per series, aligned with `series`
        self.keys: list[Hashable | None] = []  # per series: its key, None if not cached
        self.key_array: np.ndarray | None = None  # `keys` as int64, where the column path set it
        self.idx: list[int] = []
        self.ts: list[int] = []
        self.vals: list[float] = []
        self.bad: dict[str, int] = {}
        self.first_bad: str | None = None

    def bad_line(self, reason: BadRecord, line: str, n: int = 1, why: str = "") -> None:
        count_bad(self.bad, reason, n)
        if self.first_bad is None:
            self.first_bad = clip(f"{reason.value}: {why + ': ' if why else ''}{line}")

    def entry(
        self,
        measurement: str,
        tags: dict[str, str],
        canonical: str | None = None,
        fields: dict[str, _Series] | None = None,
    ) -> _Entry:
        """The series entry shared by every line of this measurement and tag set (`fields`:
        what is known of their fields across messages)."""
        if canonical is None:
            canonical = _canonical(measurement, tags)
        entry = self.cache.get(canonical)
        if entry is None:
            entry = self.cache[canonical] = (measurement, tags, {}, fields)
        return entry

    def new_series(self, entry: _Entry, field: str) -> int:
        fields = entry[3]
        known = fields.get(field) if fields is not None else None
        labels, code, key = known if known is not None else self.make_series(entry, field)
        i = entry[2][field] = len(self.series)
        self.series.append(labels)
        self.codes.append(code)
        self.keys.append(key)
        return i

    def make_series(
        self, entry: _Entry | _Template, field: str
    ) -> tuple[Labels, int, Hashable | None]:
        """A new series' labels, contract code and key (kept in the entry's known fields)."""
        measurement, tags, _, fields = entry
        labels = dict(tags)
        labels[self.metric_column] = (
            measurement if field == VALUE_FIELD else f"{measurement}_{field}"
        )
        code = _code(labels, self.metric_column, self.limits)
        if not isinstance(fields, dict):
            return labels, code, None
        key = new_series_key()
        fields[field] = (labels, code, key)
        return labels, code, key

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


def _template(b: _InfluxBuilder, key: str, point: dict[str, Any] | None = None) -> _Template:
    """The template of a series key text (`measurement,tag=value,...`, without escapes, quotes
    or whitespace): its measurement and tags as the parser reads them (from `point`, a line's
    parse, or a parse of the key alone), kept across messages; `_Fallback` if the parser does
    not read it as a series key."""
    templates = b.templates
    template = templates.get(key)
    if template is None:
        if point is None:
            try:
                point = parse_line(key + " f=0")
            except (LineFormatError, ValueError, OverflowError):
                raise _Fallback from None
            if point is None:  # a comment
                raise _Fallback
        measurement, tags = point["measurement"], point["tags"]
        if len(templates) >= CACHE_SIZE:
            templates.clear()
        template = templates[key] = (measurement, tags, _canonical(measurement, tags), {})
    return template


_canonical_of = itemgetter(2)  # of a template
_labels_of, _code_of, _key_of = itemgetter(0), itemgetter(1), itemgetter(2)  # of a series


CACHE_BYTES = 64 << 20  # key bytes kept per metric column, limits and field (`_SeriesTable`)
_SP, _NL, _EQ, _ZERO, _DOT, _MINUS = 0x20, 0x0A, 0x3D, 0x30, 0x2E, 0x2D
_MAX_DIGITS = 19  # < 10**19 < 2**64: a timestamp of at most 19 digits is exact in uint64
_FLOAT_BYTES = _FLOAT_CHARS.encode()
# Values read by the kernel: at most 18 characters (so at most 18 digits: < 10**18 < 2**63, and
# at most 17 after the point: 10**17 is an exact float64), their digits M <= 2**53 (an exact
# float64): M / 10**p is then the correctly rounded value of the text, as float() gives it
# (Clinger's fast path: one IEEE division of exact operands). Other values go through float().
_VALUE_WIDTH = 18
_POW10_FLOAT = 10.0 ** np.arange(_VALUE_WIDTH)
_MANTISSA_MAX = 1 << 53


# A word of 8 bytes holds a byte under 0x21 iff (w - 0x2121..21) & ~w & 0x8080..80 is not zero
# ("hasless", exact for bounds up to 0x80): `_frame` skips the words of a line's texts whole.
_WORD_BELOW = np.uint64(0x21 * 0x0101010101010101)
_WORD_HIGHS = np.uint64(0x8080808080808080)


@kernel
def _frame(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each line's end, first and second space, if every line has exactly two spaces and no
    other byte under 0x21 but the newlines (tabs are not here: the caller); else none."""
    size = buf.shape[0]
    n = 1
    for i in range(size):
        n += buf[i] == _NL
    line_end = np.empty(n, np.int64)
    key_end = np.empty(n, np.int64)
    field_end = np.empty(n, np.int64)
    none = np.empty(0, np.int64)
    n_words = size // 8
    words = buf[: n_words * 8].view(np.uint64)
    k = spaces = i = 0
    while i < size:
        if i % 8 == 0:  # whole words without a byte under 0x21 skipped
            w = i // 8
            while w < n_words:
                x = words[w]
                if (x - _WORD_BELOW) & ~x & _WORD_HIGHS:
                    break
                w += 1
            i = w * 8
            if i >= size:
                break
        c = buf[i]
        i += 1
        if c > _SP:
            continue
        if c == _NL:
            if spaces != 2:
                return none, none, none
            line_end[k] = i - 1
            k += 1
            spaces = 0
        elif c == _SP:
            if spaces == 0:
                key_end[k] = i - 1
            elif spaces == 1:
                field_end[k] = i - 1
            else:
                return none, none, none
            spaces += 1
        else:  # another control character
            return none, none, none
    if spaces != 2:
        return none, none, none
    line_end[k] = size
    return line_end, key_end, field_end


@kernel
def _stamps_of(buf: np.ndarray, line_end: np.ndarray, field_end: np.ndarray) -> np.ndarray:
    """Each line's timestamp (the bytes after its second space): 1 to 19 ASCII digits, within
    int64; none if any is anything else."""
    n = line_end.shape[0]
    t = np.empty(n, np.int64)
    none = np.empty(0, np.int64)
    for k in range(n):
        a, z = field_end[k] + 1, line_end[k]
        if z - a < 1 or z - a > _MAX_DIGITS:
            return none
        x = np.uint64(0)
        for i in range(a, z):
            d = np.int64(buf[i]) - _ZERO
            if d < 0 or d > 9:
                return none
            x = x * np.uint64(10) + np.uint64(d)
        if x > np.uint64(_INT64_MAX):
            return none  # (the parser refuses these)
        t[k] = np.int64(x)
    return t


@kernel
def _fields_start_with(
    buf: np.ndarray, key_end: np.ndarray, field_end: np.ndarray, prefix: np.ndarray
) -> bool:
    """Whether every line's field (after its first space, to its second) is `prefix` (a field
    name and "=") followed by at least one byte: a value."""
    p = prefix.shape[0]
    for k in range(key_end.shape[0]):
        a = key_end[k] + 1
        if a + p >= field_end[k]:  # an empty value, or no room for the prefix
            return False
        for j in range(p):
            if buf[a + j] != prefix[j]:
                return False
    return True


def _stamps(buf: np.ndarray, line_end: np.ndarray, field_end: np.ndarray) -> np.ndarray | None:
    """Each line's timestamp (the bytes after its second space): 1 to 19 ASCII digits read
    right-aligned from the line's last bytes, within int64; None for anything else."""
    t = _stamps_of(buf, line_end, field_end)
    return t if len(t) else None


@kernel
def _plain_values(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray, pow10: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each value text `buf[start:end]` as a float64 and whether it is a plain decimal read
    exactly (digits, at most one point, a leading minus, at most `_VALUE_WIDTH` bytes, its
    digits at most 2**53); the others' values are left for float()."""
    n = start.shape[0]
    vals = np.zeros(n, np.float64)
    plain = np.zeros(n, np.bool_)
    for k in range(n):
        a, z = start[k], end[k]
        if z - a > _VALUE_WIDTH:
            continue
        negative = buf[a] == _MINUS
        mantissa = np.int64(0)
        digits = dots = fraction = 0
        for i in range(a + 1 if negative else a, z):
            c = buf[i]
            if c == _DOT:
                dots += 1
                fraction = z - 1 - i
            elif _ZERO <= c <= _ZERO + 9:
                digits += 1
                mantissa = mantissa * 10 + (np.int64(c) - _ZERO)
            else:
                dots = 2  # not plain
                break
        if digits < 1 or dots > 1 or mantissa > _MANTISSA_MAX:
            continue
        v = np.float64(mantissa) / pow10[fraction]
        vals[k] = -v if negative else v
        plain[k] = True
    return vals, plain


def _values(raw: bytes, buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """The field values `raw[start:end]` (non-empty) as the parser reads them, or None if
    it would not take them all (`_floats_as_parsed`). Plain decimals (`-12.5`: digits,
    at most one point, a leading minus) are read by a compiled kernel, exactly (see
    `_VALUE_WIDTH`); the others (exponents, long mantissas) by float(), one at a time."""
    vals, plain = _plain_values(buf, start, end, _POW10_FLOAT)
    if plain.all():
        return vals
    others = np.flatnonzero(~plain).tolist()
    starts, ends = start.tolist(), end.tolist()
    texts = [raw[starts[i] : ends[i]] for i in others]
    if b"".join(texts).translate(None, _FLOAT_BYTES):
        return None  # (so no "=" or "," either: one field per line)
    read = _floats_as_parsed(texts)
    if read is None:
        return None
    vals[others] = read
    return vals


def _decode_columns(b: _InfluxBuilder, raw: bytes, lo: int, hi: int) -> bool:
    """The common message with no Python per line: lines of `key name=value timestamp` with the
    same field name, no escapes, quotes or tabs (the caller checked), timestamps of 1 to 19
    digits. Kernels find the spaces and newlines, read the timestamps and the plain decimal
    values (others go through float(): `_floats_as_parsed`) and find each line's series key
    text in a table of known ones (`_SeriesTable.find`). False, with `b` untouched, for any
    other message or anything in doubt: the reference then decides, and every message decodes
    as the reference decodes it (hypothesis tests)."""
    if raw[-1:] == b"\n":
        raw = raw[:-1]  # one trailing newline, as the line split drops one empty last line
    if not raw:
        return False
    buf = np.frombuffer(raw, np.uint8)
    line_end, key_end, field_end = _frame(buf)  # each line exactly two spaces
    if not len(line_end):
        return False
    n = len(line_end)
    nl = line_end[:-1]
    t = _stamps(buf, line_end, field_end)
    if t is None or int(t.min()) < lo or int(t.max()) > hi:
        return False
    # fields: every line's field starts with the first line's `name=`, then the value
    first_field = raw[int(key_end[0]) + 1 : int(field_end[0])]
    name, eq, _ = first_field.partition(b"=")
    if not name or not eq or b"," in name:
        return False
    prefix = np.frombuffer(name + b"=", np.uint8)
    if not _fields_start_with(buf, key_end, field_end, prefix):
        return False
    value_start = key_end + 1 + len(prefix)
    vals = _values(raw, buf, value_start, field_end)
    if vals is None:
        return False
    # series: every line's key text found in the field's table at once
    key_start = np.empty(n, np.int64)
    key_start[0] = 0
    key_start[1:] = nl + 1
    try:
        field = name.decode()
        found = _series_table(b, field).find(b, field, raw, key_start, key_end)
    except (_Fallback, UnicodeDecodeError):
        return False
    ids = found.ids
    if found.canonical():
        # distinct key texts that are each their series' only spelling (tags in order) are
        # distinct series: the ids number the series
        in_order = np.sort(ids)
        if (in_order[1:] != in_order[:-1]).all():  # every line its own series (a scrape)
            rows = np.arange(n)
            b.idx = rows.astype(np.int32)  # type: ignore[assignment]
        else:  # series in order of first appearance
            first, inverse = np.unique(ids, return_index=True, return_inverse=True)[1:]
            order = np.argsort(first)
            rank = np.empty(len(first), np.int32)
            rank[order] = np.arange(len(first), dtype=np.int32)
            rows = first[order]
            b.idx = rank[inverse.ravel()]  # type: ignore[assignment]
        b.series, b.codes, b.key_array = found.series(rows)  # type: ignore[assignment]
        b.keys = b.key_array.tolist()
    else:  # series in order of first appearance, each with its first line's template
        templates = found.templates()
        canon = list(map(_canonical_of, templates))
        order = list(dict.fromkeys(canon))
        number = dict(zip(order, range(len(order)), strict=True))
        first_of = dict(zip(canon[::-1], templates[::-1], strict=True))
        by_series = list(map(first_of.__getitem__, order))
        series = [tp[3].get(field) or b.make_series(tp, field) for tp in by_series]
        b.series.extend(map(_labels_of, series))
        b.codes.extend(map(_code_of, series))
        b.keys.extend(map(_key_of, series))
        b.idx = list(map(number.__getitem__, canon))
    b.ts = t  # type: ignore[assignment]
    b.vals = vals  # type: ignore[assignment]
    return True


# What the column path knows of a series key text and field: its `_Series` (labels, contract
# code, key), whether the text is its series' only spelling, and the text's template; a
# `ByteTable` column each.
_Known = tuple[Labels, int, int, bool, _Template]
_LABELS, _CODE, _KEY, _CANONICAL, _TEMPLATE = range(5)
_KNOWN_DTYPES = (object, np.int8, np.int64, bool, object)


class _Found(NamedTuple):
    """Each line's key text as the table found it: `ids` equal for equal texts (entries of
    `view` below its count; texts met in this message from `view.count` on, in `new`)."""

    ids: np.ndarray
    view: TableView
    new: list[_Known]

    def canonical(self) -> bool:
        return bool(self._per_line(_CANONICAL, slice(None)).all())

    def templates(self) -> list[_Template]:
        return self._per_line(_TEMPLATE, slice(None)).tolist()

    def series(self, rows: np.ndarray) -> tuple[list[Labels], np.ndarray, np.ndarray]:
        """Labels, contract codes and keys (int64) of the lines `rows`."""
        return (
            self._per_line(_LABELS, rows).tolist(),
            self._per_line(_CODE, rows),
            self._per_line(_KEY, rows),
        )

    def _per_line(self, k: int, rows: np.ndarray | slice) -> np.ndarray:
        """The view's column `k` (`_Known`'s item k) for the lines `rows`, the new texts'
        included."""
        column = self.view.columns[k]
        ids = self.ids[rows]
        if not self.new:
            return column[ids]
        count = self.view.count
        is_new = ids >= count
        out = column[np.where(is_new, 0, ids)]
        new = np.fromiter(map(itemgetter(k), self.new), column.dtype, len(self.new))
        out[is_new] = new[ids[is_new] - count]
        return out


class _SeriesTable:
    """The series key texts of one metric column, limits and field that the column path has
    met, to find every line's text at once (`ByteTable`), and per entry what the reference
    gives the series (`_Known`). Bounded: emptied when its texts' bytes reach CACHE_BYTES, or
    their count CACHE_SIZE."""

    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table = ByteTable(_KNOWN_DTYPES)

    def find(
        self, b: _InfluxBuilder, field: str, raw: bytes, start: np.ndarray, end: np.ndarray
    ) -> _Found:
        """Each key text `raw[start:end]`; texts not known yet are learnt from their template
        (`_learn_series`, which raises `_Fallback` where the parser must decide) and added."""
        table = self.table
        if len(table) >= CACHE_SIZE or table.n_bytes >= CACHE_BYTES:
            table.clear()
        length = end - start
        if int(length.min()) < 1:
            raise _Fallback  # an empty key text: the reference decides
        found = table.find(padded(raw), raw, start, length)
        ids, view = found.ids, found.view
        new: list[_Known] = []  # entries of the texts not found, numbered from view.count
        missed = np.flatnonzero(ids < 0)
        if len(missed):
            number_of: dict[bytes, int] = {}
            added: list[int] = []  # lines whose texts to add to the table
            numbers: list[int] = []
            for i, a, z in zip(
                missed.tolist(), start[missed].tolist(), end[missed].tolist(), strict=True
            ):
                text = raw[a:z]
                number = number_of.get(text)
                if number is None:
                    added.append(i)
                    number = number_of[text] = view.count + len(new)
                    new.append(_learn_series(b, field, text))
                numbers.append(number)
            ids[missed] = numbers
            table.add(found, np.array(added, np.intp), list(zip(*new, strict=True)))
        return _Found(ids, view, new)


# (metric column, limits, field) -> the key texts met, with what the reference gives them
_known_by_bytes: dict[tuple[str, LabelLimits, str], _SeriesTable] = {}


def _series_table(b: _InfluxBuilder, field: str) -> _SeriesTable:
    """The series key texts known for `field`, `b`'s metric column and limits."""
    cache_key = (b.metric_column, b.limits, field)
    table = _known_by_bytes.get(cache_key)
    if table is None:
        table = _known_by_bytes.setdefault(cache_key, _SeriesTable())
    return table


def _learn_series(b: _InfluxBuilder, field: str, key: bytes) -> _Known:
    """A series key text's entry for `field`, from its template (`_template`, which raises
    `_Fallback` where the parser must decide) as the reference finds it."""
    text = key.decode("utf-8")
    template = _template(b, text)
    labels, code, series_key = template[3].get(field) or b.make_series(template, field)
    measurement, tags = template[0], template[1]
    # the text is the series' only spelling (tags in order, no duplicate): distinct such
    # texts are distinct series
    canonical = measurement + "".join(f",{k}={v}" for k, v in sorted(tags.items()))
    return (labels, code, series_key, text == canonical, template)  # type: ignore[return-value]


def _decode_lines(
    b: _InfluxBuilder, lines: Sequence[str | bytes], default_ts: int, lo: int, hi: int
) -> None:
    """The reference: every line in order through the maintained C parser (`_line`); blank
    lines skipped."""
    for line in lines:
        if not line or line.isspace():
            continue
        try:
            _line(b, line, default_ts, lo, hi)
        except Exception as e:  # a parser bug must not stop ingestion
            text = line if isinstance(line, str) else line.decode("utf-8", "replace")
            b.bad_line(BadRecord.UNDECODABLE, text, why=f"{type(e).__name__}: {e}")


def _line(b: _InfluxBuilder, line: str | bytes, default_ts: int, lo: int, hi: int) -> None:
    """One line, through `line_protocol_parser` (escapes, quoted strings, odd whitespace). A
    series key text without escapes, quotes or whitespace has its template kept across
    messages (`_template`): its series' labels, contract check and key are made once."""
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
    if isinstance(line, str):
        key = line.partition(" ")[0]
        entry = b.cache.get(key)  # (key texts have no newline; canonical forms start with one)
        if entry is None:
            if key.isprintable() and "\\" not in key and '"' not in key:
                entry = b.cache[key] = b.entry(*_template(b, key, point))
            else:
                entry = b.entry(point["measurement"], point["tags"])
    else:
        entry = b.entry(point["measurement"], point["tags"])
    b.add(entry, fields, t, text)


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
    Every line goes through `line_protocol_parser` (the reference, `_decode_lines`), unless the
    whole message is of the shape the column path takes (`_decode_columns`), which decodes it
    as the reference does. `fast_path=False`: the reference only (for tests and benchmarks).
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
    lo, hi = max(lo, _INT64_MIN), min(hi, _INT64_MAX - 1)  # the parser refuses INT64_MAX
    b = _InfluxBuilder(metric_column, limits)
    lines: Sequence[str | bytes]
    raw = data.encode() if isinstance(data, str) else bytes(data)
    special = b"\\" in raw or b'"' in raw or b"\t" in raw
    # (the column path never takes invalid UTF-8: it decodes the key texts it learns and the
    # field name, and reads nothing else but digits, signs and points)
    if fast_path and not special and _decode_columns(b, raw, lo, hi):
        return _decoded(b, div, mul, metric_column, limits)
    try:
        lines = (data if isinstance(data, str) else raw.decode("utf-8")).split("\n")
    except UnicodeDecodeError:
        lines = raw.split(b"\n")  # the parser reports the bad lines
    _decode_lines(b, lines, default_ts, lo, hi)
    return _decoded(b, div, mul, metric_column, limits)


_SECONDS_PER = {"m": 60, "h": 3600}  # precisions coarser than a second


def decode_lines(
    body: bytes,
    received_ms: int,
    metric_column: str,
    precision: str,
    limits: LabelLimits,
) -> Decoded:
    """Line protocol with timestamps in `precision` (ns, us, ms, s, m or h) as a batch in
    milliseconds; lines without one get `received_ms` truncated to the precision (InfluxDB's
    `SetPrecision`). Minutes and hours are decoded as seconds and scaled, with the timestamp
    range and the default scaled to match, so `decode_influx` needs no unit of its own."""
    per = _SECONDS_PER.get(precision)
    if per is None:
        return decode_influx(body, received_ms, metric_column, precision, limits=limits)
    lo, hi = DEFAULT_TS_RANGE
    decoded = decode_influx(
        body,
        received_ms // per,  # -> received_ms // (per * 1000) as a default in seconds
        metric_column,
        "s",
        ts_range=(-(-lo // per), hi // per),
        limits=limits,
    )
    decoded.batch.timestamps *= per
    return decoded


def _decoded(
    b: _InfluxBuilder, div: int, mul: int, metric_column: str, limits: LabelLimits
) -> Decoded:
    """The builder's samples as a batch, timestamps in milliseconds, bad series dropped."""
    ts = np.array(b.ts, dtype=np.int64)
    ts = ts // div if mul == 1 else ts * mul
    idx = np.array(b.idx, dtype=np.int32)
    vals = np.array(b.vals, dtype=np.float64)
    codes = np.array(b.codes, np.int8)
    if not codes.any():
        keys: list[Hashable] = b.keys  # type: ignore[assignment]
        if b.key_array is not None:  # the column path (every key known): found in NumPy
            batch = IntKeyedBatch(b.series, idx, ts, vals, b.bad, keys=keys, key_array=b.key_array)
            return Decoded(batch, b.first_bad)
        if None in keys:
            return Decoded(SampleBatch(b.series, idx, ts, vals, b.bad), b.first_bad)
        return Decoded(KeyedBatch(b.series, idx, ts, vals, b.bad, keys=keys), b.first_bad)
    batch = SampleBatch(b.series, idx, ts, vals, b.bad)
    decoded = drop_bad(batch, codes, None, metric_column, limits)
    return Decoded(decoded.batch, b.first_bad or decoded.first_bad)


@warms
def _warm() -> None:
    """The column path's kernels (`_frame`, `_stamps_of`, `_fields_start_with`,
    `_plain_values`)."""
    raw = b"m,host=a value=1.5 1700000000000\nm,host=b value=-2 1700000000000"
    buf = np.frombuffer(raw, np.uint8)
    line_end, key_end, field_end = _frame(buf)
    _stamps(buf, line_end, field_end)
    _fields_start_with(buf, key_end, field_end, np.frombuffer(b"value=", np.uint8))
    _values(raw, buf, np.array([15, 48], np.int64), np.array([18, 50], np.int64))

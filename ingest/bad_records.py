"""What every record decoder enforces, and how it accounts for what it skips.

Decoders never raise on bad input: ingestion must not stop for one bad record. They return the
good samples as a `SampleBatch` whose `bad_records` counts what was skipped, per reason
(`BadRecord`), plus one example of a bad record for the log (`Decoded`). They also enforce the
dataset's contract on each series (a metric name, `Dataset.limits` on label sizes and counts,
timestamps in range), since anyone may write to the topic and a series the stores cannot key
(Cassandra: 64 KB) must never reach them. That contract is the same whatever the wire format, so
it lives here, once, apart from the formats (`ingest.wire`): `series_problem` checks one series,
`series_codes` / `series_codes_from_lengths` many, and `drop_bad` removes and counts the samples
of the series and timestamps that break it; `clip` and `show_labels` shape the messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice

import numpy as np
import numpy.typing as npt

from core.dataset import METRIC_COLUMN, LabelLimits
from core.hashing import PROMETHEUS_METRIC_LABEL
from ingest.batch import Labels, SampleBatch
from store.api import encode_part_key


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


def undecodable(first_bad: str) -> Decoded:
    """A whole message that could not be decoded: no samples, one "undecodable" bad record."""
    empty = np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.float64)
    return Decoded(SampleBatch([], *empty, {BadRecord.UNDECODABLE.value: 1}), first_bad)


def count_bad(bad: dict[str, int], reason: BadRecord, n: int = 1) -> None:
    if n:
        bad[reason.value] = bad.get(reason.value, 0) + n


def clip(text: str) -> str:
    return text if len(text) <= _BAD_EXAMPLE_CHARS else text[:_BAD_EXAMPLE_CHARS] + "..."


def show_labels(labels: Mapping[str, str]) -> str:
    """A series for a message: at most six labels, each clipped."""
    shown = ", ".join(f"{k}={v!r}"[:80] for k, v in list(labels.items())[:6])
    return "{" + shown + (", ..." if len(labels) > 6 else "") + "}"


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
    # Reasons in `SERIES_REASONS` order, as `series_codes_from_lengths` gives them.
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
    return f"{reason.value}: {why}; series " + clip(f"{shown}{more}")


def series_codes(
    series: Sequence[Mapping[str, str]], metric_column: str, limits: LabelLimits
) -> npt.NDArray[np.int8]:
    """Per series: 0 if fine, else its reason's code (`SERIES_REASONS`)."""
    codes = np.zeros(len(series), np.int8)
    for i, labels in enumerate(series):
        problem = series_problem(labels, metric_column, limits)
        if problem is not None:
            codes[i] = _CODE[problem[0]]
    return codes


def series_codes_from_lengths(
    series: list[Labels],
    counts: npt.NDArray[np.uint16],
    lens: npt.NDArray[np.int64],
    metric_column: str,
    limits: LabelLimits,
) -> npt.NDArray[np.int8]:
    """`series_codes` from each series' label count (`counts`) and the UTF-8 length of every
    string (`lens`: key, value, key, value... of all series in order), as a binary message's
    series table gives them: NumPy per label, Python per series only for the metric lookup and
    for series whose key may be over the limit."""
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


def drop_bad(
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
            count_bad(bad, reason, n)
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
                count_bad(bad, BadRecord.TIMESTAMP_RANGE, n_out)
                if first_bad is None:
                    i = int(np.flatnonzero(out)[0])
                    first_bad = clip(
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

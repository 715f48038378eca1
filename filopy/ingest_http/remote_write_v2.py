"""Remote write 2.0 bodies: a protobuf `io.prometheus.write.v2.Request` into a columnar batch.

Labels are references into the request's symbol table; they map as 1.0's do (`__name__` becomes
the dataset's metric column, every other label is kept as is). Float samples are stored. Native
histogram samples are counted as refused ("unsupported": FiloPy stores float samples only).
Exemplars are validated and counted as written when their series is valid (the spec's
"written" means accepted by the receiver) but not stored; metadata (type, help, unit) and start
timestamps are read and dropped. A reference outside the symbol table, an odd number of label
refs or a symbol table not starting with "" make the whole request invalid (400, nothing written).

Per-series Python work is done once per series (its labels, through the symbol table); samples
are gathered across all series and turned into NumPy arrays in one pass each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
from google.protobuf.message import DecodeError

from filopy.dataset import LabelLimits
from filopy.hashing import PROMETHEUS_METRIC_LABEL
from filopy.ingest_http.core import Refused, show_labels
from filopy.ingest_http.prompb.write_v2_pb2 import Request
from filopy.ingest_http.remote_write_v1 import UNSUPPORTED
from ingest.bad_records import Decoded, series_problem
from ingest.batch import Labels, SampleBatch

_timestamp = attrgetter("timestamp")
_value = attrgetter("value")


@dataclass(slots=True)
class DecodedV2:
    """The float samples as a batch (histograms counted in its `bad_records`), and the exemplars:
    how many were accepted (their series is valid) and how many refused with their series."""

    decoded: Decoded
    exemplars: int = 0
    exemplars_refused: int = 0
    first_exemplar_refused: str | None = None


def _bad(message: str) -> Refused:
    return Refused(400, "bad_data", message)


def parse(raw: bytes) -> Request:
    """The protobuf message, or `Refused` (400). A non-empty body that holds none of the 2.0
    fields is most likely a 1.0 `prometheus.WriteRequest` (whose fields 2.0 reserves) sent with
    the 2.0 Content-Type: refused rather than answered "0 written" with a 2xx."""
    request = Request()
    try:
        request.ParseFromString(raw)
    except DecodeError as e:
        raise _bad(f"the body is not a protobuf io.prometheus.write.v2.Request: {e}") from None
    if raw and not request.symbols and not request.timeseries:
        raise _bad(
            "the body holds no io.prometheus.write.v2.Request field (a prometheus.WriteRequest "
            "of remote write 1.0? then send Content-Type: application/x-protobuf)"
        )
    return request


def _check_refs(refs: Sequence[int], n_symbols: int, what: str) -> None:
    """Label refs come in name-value pairs, each pointing into the symbol table."""
    n = len(refs)
    if n % 2:
        raise _bad(f"{what}: {n} label refs, not name-value pairs")
    if n and max(refs) >= n_symbols:
        raise _bad(
            f"{what}: label ref {max(refs)} is outside the symbol table ({n_symbols} symbols)"
        )


def to_batch(request: Request, metric_column: str, limits: LabelLimits) -> DecodedV2:
    """Float samples of every series, labels mapped (`__name__` -> the metric column); the
    exemplars counted against `limits` (a series the gateway would refuse loses them too)."""
    symbols = list(request.symbols)
    n_symbols = len(symbols)
    if symbols and symbols[0]:
        raise _bad(f"the symbol table must start with the empty string, not {symbols[0][:40]!r}")
    # Label names through `names` (`__name__` renamed in place), values through `symbols`.
    names = [metric_column if s == PROMETHEUS_METRIC_LABEL else s for s in symbols]
    name_of, value_of = names.__getitem__, symbols.__getitem__

    series: list[Labels] = []
    counts: list[int] = []
    samples: list[object] = []  # every float sample, in series order
    histograms = 0
    first_histogram: str | None = None
    exemplars = refused = 0
    first_refused: str | None = None
    i = 0
    try:
        for i, ts in enumerate(request.timeseries):
            refs = ts.labels_refs
            if len(refs) % 2:
                raise _bad(f"timeseries {i}: {len(refs)} label refs, not name-value pairs")
            # An IndexError for a ref outside the table; an even count, checked.
            labels = dict(zip(map(name_of, refs[0::2]), map(value_of, refs[1::2]), strict=False))
            if ts.HasField("metadata"):
                md = ts.metadata
                value_of(md.help_ref), value_of(md.unit_ref)
            ts_samples = ts.samples
            n = len(ts_samples)
            if n:
                series.append(labels)
                counts.append(n)
                samples.extend(ts_samples)
            if ts.histograms:
                histograms += len(ts.histograms)
                first_histogram = first_histogram or show_labels(_shown(labels, metric_column))
            if ts.exemplars:
                for e in ts.exemplars:
                    _check_refs(e.labels_refs, n_symbols, f"timeseries {i}, exemplar")
                problem = series_problem(labels, metric_column, limits)
                if problem is None:
                    exemplars += len(ts.exemplars)
                else:
                    refused += len(ts.exemplars)
                    first_refused = first_refused or (
                        f"{problem[1]}; series {show_labels(_shown(labels, metric_column))}"
                    )
    except IndexError:
        raise _bad(
            f"timeseries {i}: a label or metadata ref is outside the symbol table "
            f"({n_symbols} symbols)"
        ) from None

    bad = {UNSUPPORTED: histograms} if histograms else {}
    first_bad = (
        f"native histogram samples (FiloPy stores float samples only); series {first_histogram}"
        if histograms
        else None
    )
    total = len(samples)
    if not total:
        batch = SampleBatch.empty()
        batch.bad_records.update(bad)
    else:
        batch = SampleBatch(
            series,
            np.repeat(np.arange(len(series), dtype=np.int32), counts),
            np.fromiter(map(_timestamp, samples), np.int64, total),
            np.fromiter(map(_value, samples), np.float64, total),
            bad,
        )
    return DecodedV2(Decoded(batch, first_bad), exemplars, refused, first_refused)


def _shown(labels: Labels, metric_column: str) -> Labels:
    """Labels as the sender wrote them, for messages."""
    if metric_column == PROMETHEUS_METRIC_LABEL or metric_column not in labels:
        return labels
    return {(PROMETHEUS_METRIC_LABEL if k == metric_column else k): v for k, v in labels.items()}


def decode(raw: bytes, metric_column: str, limits: LabelLimits) -> DecodedV2:
    """A decompressed remote write 2.0 body as a batch."""
    return to_batch(parse(raw), metric_column, limits)

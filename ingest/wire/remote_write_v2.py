"""Remote write 2.0 bodies: a protobuf `io.prometheus.write.v2.Request` into a columnar batch.

Labels are references into the request's symbol table; they map as 1.0's do (`__name__` becomes
the dataset's metric column, every other label is kept as is). Float samples are stored. Native
histogram samples are counted as refused ("unsupported": FiloPy stores float samples only).
Exemplars are validated and counted as written when their series is valid (the spec's
"written" means accepted by the receiver) but not stored; metadata (type, help, unit) and start
timestamps are read and dropped. A reference outside the symbol table, an odd number of label
refs or a symbol table not starting with "" make the whole request invalid (400, nothing written).

Requests of the shape Prometheus sends take one fast path (`decode_fast`, below: no Python
object per series or sample, labels cached across requests); any other goes through the full upb
parse (`to_batch`: per-series Python work once per series, samples gathered into NumPy arrays in
one pass each), which has the last word on errors.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import numpy.typing as npt
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from core.dataset import LabelLimits
from core.errors import Invalid
from core.hashing import PROMETHEUS_METRIC_LABEL
from ingest.bad_records import Decoded, series_problem, show_labels
from ingest.batch import KeyedBatch, Labels, SampleBatch, new_series_key
from ingest.wire.prompb.write_v2_pb2 import Request
from ingest.wire.protobuf import series_index, walk_v2
from ingest.wire.remote_write_v1 import UNSUPPORTED

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


def parse(raw: bytes) -> Request:
    """The protobuf message, or `Invalid`. A non-empty body that holds none of the 2.0
    fields is most likely a 1.0 `prometheus.WriteRequest` (whose fields 2.0 reserves) sent with
    the 2.0 Content-Type: refused rather than answered "0 written" with a 2xx."""
    request = Request()
    try:
        request.ParseFromString(raw)
    except DecodeError as e:
        raise Invalid(f"the body is not a protobuf io.prometheus.write.v2.Request: {e}") from None
    if raw and not request.symbols and not request.timeseries:
        raise Invalid(
            "the body holds no io.prometheus.write.v2.Request field (a prometheus.WriteRequest "
            "of remote write 1.0? then send Content-Type: application/x-protobuf)"
        )
    return request


def _check_refs(refs: Sequence[int], n_symbols: int, what: str) -> None:
    """Label refs come in name-value pairs, each pointing into the symbol table."""
    n = len(refs)
    if n % 2:
        raise Invalid(f"{what}: {n} label refs, not name-value pairs")
    if n and max(refs) >= n_symbols:
        raise Invalid(
            f"{what}: label ref {max(refs)} is outside the symbol table ({n_symbols} symbols)"
        )


def to_batch(request: Request, metric_column: str, limits: LabelLimits) -> DecodedV2:
    """Float samples of every series, labels mapped (`__name__` -> the metric column); the
    exemplars counted against `limits` (a series the gateway would refuse loses them too)."""
    symbols = list(request.symbols)
    n_symbols = len(symbols)
    if symbols and symbols[0]:
        raise Invalid(f"the symbol table must start with the empty string, not {symbols[0][:40]!r}")
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
                raise Invalid(f"timeseries {i}: {len(refs)} label refs, not name-value pairs")
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
        raise Invalid(
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
    """A decompressed remote write 2.0 body as a batch (the same batch either path gives)."""
    fast = decode_fast(raw, metric_column)
    return fast if fast is not None else to_batch(parse(raw), metric_column, limits)


# ----- the fast path ---------------------------------------------------------------------------
#
# What Prometheus sends (each series: packed label refs, float samples `value, timestamp
# [, start_timestamp]`, its metadata, nothing else) is decoded without a Python object per series
# or per sample: upb splits the body into the symbol table and each series' bytes, the shared
# protobuf walker (`ingest.wire.protobuf`, compiled) reads every series' refs and samples, and
# each series' labels are looked up in a cache by the series' label refs translated to
# process-wide symbol ids, so a series seen before costs a bytes slice and a dict lookup.
# Anything else (histograms, exemplars, unpacked refs, fields out of order, anything in doubt)
# returns None and the full upb parse decides, with its messages.

LABEL_CACHE_SIZE = 1_000_000  # series whose label dicts are kept, per metric column


def _split_message() -> type:
    """`Request` with each series as raw bytes: upb splits a body without building series."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="filopy_remote_write_v2_split.proto", package="filopy.rw2split", syntax="proto3"
    )
    msg = proto.message_type.add(name="RequestSplit")
    msg.field.add(name="symbols", number=4, type=f.TYPE_STRING, label=f.LABEL_REPEATED)
    msg.field.add(name="timeseries", number=5, type=f.TYPE_BYTES, label=f.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("filopy.rw2split.RequestSplit")
    )


_RequestSplit = _split_message()
# Symbol -> a process-wide id (never reused: the counter does not restart when the table is
# cleared), so a series' refs translated to ids are a key that holds across requests.
_symbol_ids: dict[str, int] = {}
_next_symbol_id = itertools.count(1)
# metric column -> (series' symbol ids as bytes -> (labels, KeyedBatch key)); dicts are shared
# between batches: read only
_label_cache: dict[str, dict[bytes, tuple[Labels, int]]] = {}


def decode_fast(raw: bytes, metric_column: str) -> DecodedV2 | None:
    """The batch `to_batch(parse(raw))` gives (as a `KeyedBatch`), without a Python object per
    sample; None if the body is not of the common shape or anything about it is in doubt."""
    try:
        split = _RequestSplit.FromString(raw)
    except DecodeError:
        return None
    symbols = list(split.symbols)
    parts = list(split.timeseries)  # (each access to upb's container makes new bytes)
    n = len(parts)
    if not n or not symbols or symbols[0]:
        return None
    lens = np.fromiter(map(len, parts), np.int64, n)
    ends = np.cumsum(lens)
    starts = ends - lens
    buf = np.frombuffer(b"".join(parts), np.uint8)
    ok, counts, stamps, bits, refs, n_refs = walk_v2(buf, starts, ends, len(symbols))
    if not ok:
        return None
    if not len(stamps):
        return DecodedV2(Decoded(SampleBatch.empty()))
    entries = _labels_of(symbols, refs, n_refs, metric_column)
    series_idx, kept = series_index(counts)
    if kept is not None:
        entries = [entries[i] for i in kept.tolist()]
    series, keys = zip(*entries, strict=True)
    batch = KeyedBatch(
        list(series), series_idx, stamps.view(np.int64), bits.view(np.float64), keys=list(keys)
    )
    return DecodedV2(Decoded(batch))


def _labels_of(
    symbols: list[str],
    refs: npt.NDArray[np.int64],
    n_refs: npt.NDArray[np.int64],
    metric_column: str,
) -> list[tuple[Labels, int]]:
    """Each series' labels and `KeyedBatch` key, cached by its refs as process-wide symbol ids
    (built when new)."""
    if len(_symbol_ids) > LABEL_CACHE_SIZE:
        _symbol_ids.clear()
        _label_cache.clear()
    ids = np.fromiter(
        map(_symbol_ids.setdefault, symbols, _next_symbol_id), np.uint64, len(symbols)
    )
    key_bytes = ids[refs].tobytes()
    bounds = np.cumsum(n_refs) * 8
    label_keys = list(
        map(key_bytes.__getitem__, map(slice, (bounds - n_refs * 8).tolist(), bounds.tolist()))
    )
    cache = _label_cache.get(metric_column)
    if cache is None:
        cache = _label_cache.setdefault(metric_column, {})
    entries: list[tuple[Labels, int] | None] = list(map(cache.get, label_keys))
    if None not in entries:
        return entries  # type: ignore[return-value]
    if len(cache) + len(label_keys) > LABEL_CACHE_SIZE:
        cache.clear()
    names = [metric_column if s == PROMETHEUS_METRIC_LABEL else s for s in symbols]
    ref_list = refs.tolist()
    starts = (np.cumsum(n_refs) - n_refs).tolist()
    intern = sys.intern
    for i, entry in enumerate(entries):
        if entry is not None:
            continue
        k = label_keys[i]
        entry = cache.get(k)  # a series repeated within the request
        if entry is None:
            own = ref_list[starts[i] : starts[i] + int(n_refs[i])]
            labels = {
                intern(names[a]): symbols[b] for a, b in zip(own[0::2], own[1::2], strict=True)
            }
            entry = cache[k] = (labels, new_series_key())
        entries[i] = entry
    return entries  # type: ignore[return-value]

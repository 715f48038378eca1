"""Remote write 1.0 bodies: a protobuf `prometheus.WriteRequest` into a columnar batch.

`__name__` becomes the dataset's metric column (`_metric_` by default; PromQL's `__name__` maps
back to it); every other label is kept as is. Exemplars and metadata are dropped; native
histogram samples are counted as refused ("unsupported"): FiloPy stores float samples only.
"""

from __future__ import annotations

import numpy as np
from google.protobuf.message import DecodeError

from filopy.hashing import PROMETHEUS_METRIC_LABEL
from filopy.ingest_http.core import Refused, show_labels
from filopy.ingest_http.prompb.remote_pb2 import WriteRequest
from ingest.bad_records import Decoded
from ingest.batch import Labels, SampleBatch

UNSUPPORTED = "unsupported"  # a refusal reason: samples of a kind FiloPy cannot store


def parse(raw: bytes) -> WriteRequest:
    """The protobuf message, or `Refused` (400)."""
    request = WriteRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as e:
        raise Refused(
            400, "bad_data", f"the body is not a protobuf prometheus.WriteRequest: {e}"
        ) from None
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
    """A decompressed remote write 1.0 body as a batch."""
    return to_batch(parse(raw), metric_column)

"""OTLP points flagged "no recorded value" become Prometheus staleness markers, as Prometheus's
own OTLP receiver writes them: one per series the point would have written, bit-exact."""

from __future__ import annotations

import numpy as np
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from core.dataset import LabelLimits
from core.staleness import STALE_NAN_BITS, is_stale
from ingest.wire.otlp import NO_RECORDED_VALUE, decode

T_NS = 1_700_000_000_000_000_000


def request() -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    attr = rm.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", "svc"
    metrics = rm.scope_metrics.add().metrics
    gauge = metrics.add()
    gauge.name = "temperature"
    for i, flags in enumerate((0, NO_RECORDED_VALUE)):
        pt = gauge.gauge.data_points.add()
        pt.time_unix_nano = T_NS + i * 15_000_000_000
        pt.flags = flags
        if not flags:
            pt.as_double = 21.5
    hist = metrics.add()
    hist.name = "latency"
    hist.histogram.aggregation_temporality = 2  # cumulative
    pt = hist.histogram.data_points.add()
    pt.time_unix_nano = T_NS
    pt.flags = NO_RECORDED_VALUE
    pt.explicit_bounds.extend([0.1, 1.0])
    pt.bucket_counts.extend([0, 0, 0])
    return req


def test_no_recorded_value_points_are_staleness_markers() -> None:
    decoded = decode(request().SerializeToString(), "protobuf", "__name__", LabelLimits())
    batch = decoded.batch
    names = [batch.series[i]["__name__"] for i in batch.series_idx]
    by_name: dict[str, list[float]] = {}
    for name, v in zip(names, batch.values.tolist(), strict=True):
        by_name.setdefault(name, []).append(v)
    assert by_name["temperature"][0] == 21.5
    assert is_stale(by_name["temperature"][1:]).all() and len(by_name["temperature"]) == 2
    # count, three buckets (0.1, 1, +Inf); no sum on this point: every one a marker
    hist = [n for n in names if n.startswith("latency")]
    assert sorted(set(hist)) == ["latency_bucket", "latency_count"] and len(hist) == 4
    stale = batch.values[np.array([n.startswith("latency") for n in names])]
    assert (stale.view(np.uint64) == STALE_NAN_BITS).all()
    assert not decoded.batch.bad_records

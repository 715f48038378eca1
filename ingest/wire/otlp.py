"""OTLP metrics as Prometheus samples: an `ExportMetricsServiceRequest` (binary protobuf or its
JSON mapping) into a batch.

Metrics become Prometheus series as Prometheus' own OTLP receiver makes them (v3.14.0, its
defaults; the rules of storage/remote/otlptranslator/prometheusremotewrite, the names those of
github.com/prometheus/otlptranslator v1.0.0, in `ingest.wire.otlp_names`): unit and `_total`
suffixes, `service.namespace`/`service.name` -> `job`, `service.instance.id` -> `instance`, the
other resource attributes on `target_info`. Gauges and non-monotonic sums are gauges, cumulative
monotonic sums counters, explicit-bucket histograms `_bucket{le}` (cumulative) / `_sum` /
`_count`, summaries `{quantile}` / `_sum` / `_count`. Refused, per data point: delta (or
unspecified) temporality, which cannot become cumulative without state across requests;
exponential histograms, which FiloPy (float samples only) cannot store. A data point is written
whole or not at all: if any of its series breaks the dataset's limits, or its timestamp is out
of range, all of it is refused. Data points flagged "no recorded value" become staleness
markers, as Prometheus writes them. A body that cannot be read at all raises `Invalid`.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import operator
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric

from core.dataset import LabelLimits
from core.errors import Invalid
from core.staleness import STALE_NAN
from ingest.bad_records import (
    DEFAULT_TS_RANGE,
    BadRecord,
    Decoded,
    clip,
    series_problem,
    show_labels,
)
from ingest.batch import Labels, SampleBatch
from ingest.wire.otlp_names import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    OTHER,
    SUMMARY,
    UPDOWN,
    label_name,
    metric_name,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# Refusal reasons of data points (besides `BadRecord`'s): short, stable metric labels.
DELTA = "delta_temporality"
BAD_TEMPORALITY = "invalid_temporality"  # AGGREGATION_TEMPORALITY_UNSPECIFIED
UNSUPPORTED = "unsupported"  # exponential histograms
BAD_NAME = "invalid_metric_name"  # a name that normalises to nothing, or underscores only
BAD_LABEL_NAME = "invalid_label_name"  # an attribute key that is empty or underscores only
NO_VALUE = "no_value"  # a number data point with neither as_double nor as_int

NO_RECORDED_VALUE = 1  # DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA_TEMPORALITY = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
TARGET_INFO = "target_info"
SERVICE_NAME, SERVICE_NAMESPACE, SERVICE_INSTANCE = (
    "service.name",
    "service.namespace",
    "service.instance.id",
)
IDENTIFYING = frozenset({SERVICE_NAME, SERVICE_NAMESPACE, SERVICE_INSTANCE})
# target_info gets a sample every half lookback delta (Prometheus' default 5 m) from the
# resource's earliest to its latest data point, so it is found over the whole range.
TARGET_INFO_INTERVAL_NS = 150 * 10**9
MAX_TARGET_INFO_STEPS = 100  # past that (points over 4 h apart), samples at both ends only


_first = operator.itemgetter(0)


@functools.lru_cache(maxsize=4096)
def format_float(v: float) -> str:
    """A float as Go's strconv.FormatFloat(v, 'f', -1, 64) writes it (`le`, `quantile`)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, trim="-")


def _json_float(v: float) -> str:
    """A double attribute as pcommon's Value.AsString writes it (ES6 number formatting)."""
    if not math.isfinite(v):
        return "json: unsupported value: " + format_float(v)
    a = abs(v)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        text = repr(v)  # shortest round-trip digits, as Go's 'e' with precision -1
        return re.sub(r"e-0(\d)$", r"e-\1", text)
    return format_float(v)


def _raw(v: AnyValue) -> Any:
    """An AnyValue as plain data (pcommon's AsRaw), for arrays and maps written as JSON."""
    kind = v.WhichOneof("value")
    if kind == "kvlist_value":
        return {kv.key: _raw(kv.value) for kv in v.kvlist_value.values}
    if kind == "array_value":
        return [_raw(x) for x in v.array_value.values]
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    if kind == "double_value":
        d = v.double_value
        return int(d) if d.is_integer() and abs(d) < 1e21 else d
    return getattr(v, kind) if kind else None


def attribute_value(v: AnyValue) -> str:
    """An attribute value as a label value (pcommon's Value.AsString)."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return str(v.int_value)
    if kind == "bool_value":
        return "true" if v.bool_value else "false"
    if kind == "double_value":
        return _json_float(v.double_value)
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    if kind is None:
        return ""
    return json.dumps(_raw(v), ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def attribute_labels(
    attributes: Iterable[KeyValue], ignore: frozenset[str] = frozenset()
) -> tuple[Labels, str | None]:
    """Attributes as labels, sorted by key; keys that sanitise to one name have their values
    joined by ";" (Prometheus does so); empty values are dropped. The second item names the
    first key that cannot be a label name (None if all can)."""
    labels: Labels = {}
    items = [(kv.key, kv.value) for kv in attributes]
    items.sort(key=_first)
    for key, v in items:
        if key in ignore or key == "__name__":
            continue
        name = label_name(key)
        if not name:
            return labels, key
        value = v.string_value if v.WhichOneof("value") == "string_value" else attribute_value(v)
        old = labels.get(name)
        if old:
            labels[name] = f"{old};{value}"
        elif value:  # Prometheus drops empty labels
            labels[name] = value
    return labels, None


# ----- the conversion --------------------------------------------------------------------------


class _Points:
    """Accepted samples, one data point at a time (all of its samples, or none), and what was
    refused: per reason, in data points."""

    def __init__(self, metric_column: str, limits: LabelLimits) -> None:
        self.metric_column = metric_column
        self.limits = limits
        # Series surely within `limits` (UTF-8 takes at most 4 bytes a character; JSON at most
        # 6 bytes a byte, 6 a label): label count, longest name and value, total characters.
        self.max_labels = limits.max_labels_per_series
        self.max_name_chars = limits.max_label_name_bytes // 4
        self.max_value_chars = limits.max_label_value_bytes // 4
        self.max_key_chars = (limits.max_series_key_bytes - 2) // 24
        self.series: list[Labels] = []
        # Data points (first series' name, base labels) seen; the series index, built once a
        # point repeats (several points of one series in a request, rare).
        self.points: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        self.index: dict[tuple[tuple[str, str], ...], int] | None = None
        self.idx: list[int] = []
        self.ts: list[int] = []
        self.vals: list[float] = []
        self.bad: dict[str, int] = {}
        self.first_bad: str | None = None
        self.lo, self.hi = DEFAULT_TS_RANGE

    def refuse(self, reason: str, n: int, why: str) -> None:
        if n:
            self.bad[reason] = self.bad.get(reason, 0) + n
            if self.first_bad is None:
                self.first_bad = clip(why)

    def problem(self, labels: Labels) -> tuple[BadRecord, str] | None:
        """`series_problem`, skipped (a few C-level passes) for series surely within limits.
        Names are never empty here (metric_name, label_name), so only sizes can be wrong."""
        n = len(labels)
        if (
            n <= self.max_labels
            and max(map(len, labels)) <= self.max_name_chars
            and max(map(len, labels.values())) <= self.max_value_chars
            and sum(map(len, labels)) + sum(map(len, labels.values())) + n <= self.max_key_chars
        ):
            return None
        return series_problem(labels, self.metric_column, self.limits)

    def add(
        self,
        ts_ms: int,
        base: Labels,
        series: list[Labels],
        values: list[float],
        what: str,
        widest: int | None = -1,
    ) -> bool:
        """One data point's samples (all at `ts_ms`), unless its timestamp or one of its
        series breaks the dataset's contract; then the whole point is refused. `series` are
        `base` plus a name and at most one more label; `series[widest]` has the most labels,
        the longest names and values and the most characters (so if it fits, all do; None:
        no series is widest in every way)."""
        if not self.lo <= ts_ms <= self.hi:
            self.refuse(
                BadRecord.TIMESTAMP_RANGE.value,
                1,
                f"{what}: timestamp {ts_ms} ms is outside [{self.lo}, {self.hi}]; "
                f"series {show_labels(series[0])}",
            )
            return False
        if widest is None or self.problem(series[widest]) is not None:
            for labels in series:
                problem = self.problem(labels)
                if problem is not None:
                    reason, why = problem
                    self.refuse(reason.value, 1, f"{what}: {why}; series {show_labels(labels)}")
                    return False
        n = len(series)
        point = (series[0][self.metric_column], tuple(base.items()))
        if self.index is None and point not in self.points:
            self.points.add(point)  # series never seen in this request: no lookups
            first = len(self.series)
            self.series.extend(series)
            self.idx.extend(range(first, first + n))
        else:  # several points of one series in a request: each series found by its labels
            if self.index is None:
                self.index = {tuple(labels.items()): i for i, labels in enumerate(self.series)}
            self.points.add(point)
            index, idx = self.index, self.idx
            for labels in series:
                key = tuple(labels.items())
                i = index.get(key)
                if i is None:
                    i = index[key] = len(self.series)
                    self.series.append(labels)
                idx.append(i)
        self.ts.extend([ts_ms] * n)
        self.vals.extend(values)
        return True

    def batch(self) -> SampleBatch:
        n = len(self.idx)
        return SampleBatch(
            self.series,
            np.fromiter(self.idx, np.int32, n),
            np.fromiter(self.ts, np.int64, n),
            np.fromiter(self.vals, np.float64, n),
            self.bad,
        )


def _kind(metric: Metric, data: str) -> int:
    if data == "gauge":
        return GAUGE
    if data == "sum":
        return COUNTER if metric.sum.is_monotonic else UPDOWN
    if data == "histogram":
        return HISTOGRAM
    if data == "summary":
        return SUMMARY
    return OTHER


class _Resource:
    """What every data point of one ResourceMetrics shares: job, instance, target_info's labels,
    the range of its accepted points' timestamps."""

    def __init__(self, attributes: Iterable[KeyValue]) -> None:
        attrs = {kv.key: kv.value for kv in attributes}
        self.attributes = attributes
        self.identity: Labels = {}
        if SERVICE_NAME in attrs:
            job = attribute_value(attrs[SERVICE_NAME])
            if SERVICE_NAMESPACE in attrs:
                job = attribute_value(attrs[SERVICE_NAMESPACE]) + "/" + job
            if job:
                self.identity["job"] = job
        if SERVICE_INSTANCE in attrs:
            instance = attribute_value(attrs[SERVICE_INSTANCE])
            if instance:
                self.identity["instance"] = instance
        self.other_attributes = any(k not in IDENTIFYING for k in attrs)
        self.earliest_ns: int | None = None
        self.latest_ns = 0

    def saw(self, t_ns: int) -> None:
        if self.earliest_ns is None or t_ns < self.earliest_ns:
            self.earliest_ns = t_ns
        self.latest_ns = max(self.latest_ns, t_ns)


class Converter:
    """An ExportMetricsServiceRequest as samples, the way Prometheus' OTLP receiver makes them."""

    def __init__(self, metric_column: str, limits: LabelLimits) -> None:
        self.mc = metric_column
        self.points = _Points(metric_column, limits)
        self.target_info_seen: set[tuple[tuple[tuple[str, str], ...], int]] = set()

    def convert(self, request: ExportMetricsServiceRequest) -> Decoded:
        for rm in request.resource_metrics:
            resource = _Resource(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    self.metric(metric, resource)
            self.target_info(resource)
        return Decoded(self.points.batch(), self.points.first_bad)

    def base_labels(self, attributes: Iterable[KeyValue], resource: _Resource) -> Labels | str:
        """A data point's labels (without the name), or the attribute key that cannot be one."""
        labels, bad_key = attribute_labels(attributes)
        if bad_key is not None:
            return bad_key
        labels.update(resource.identity)
        return labels

    def metric(self, metric: Metric, resource: _Resource) -> None:
        data = metric.WhichOneof("data")
        if data is None:
            return
        points = getattr(metric, data).data_points
        if not points:
            return
        kind = _kind(metric, data)
        if data in ("sum", "histogram", "exponential_histogram"):
            temporality = getattr(metric, data).aggregation_temporality
            if temporality != CUMULATIVE:
                what = "delta" if temporality == DELTA_TEMPORALITY else "unspecified"
                reason = DELTA if temporality == DELTA_TEMPORALITY else BAD_TEMPORALITY
                self.points.refuse(
                    reason,
                    len(points),
                    f"metric {metric.name!r}: {what} aggregation temporality "
                    "(only cumulative can be stored; set the exporter's temporality preference "
                    "to cumulative)",
                )
                return
        if kind == OTHER:
            self.points.refuse(
                UNSUPPORTED,
                len(points),
                f"metric {metric.name!r}: exponential histograms are not supported "
                "(FiloPy stores float samples; configure an explicit-bucket histogram)",
            )
            return
        name = metric_name(metric.name, metric.unit, kind)
        if not name:
            self.points.refuse(
                BAD_NAME,
                len(points),
                f"metric {metric.name!r}: no valid Prometheus metric name can be made of it",
            )
            return
        if kind in (GAUGE, COUNTER, UPDOWN):
            self.numbers(points, name, metric.name, resource)
        elif kind == HISTOGRAM:
            self.histograms(points, name, metric.name, resource)
        else:
            self.summaries(points, name, metric.name, resource)

    def _start(self, pt: Any, metric: str, resource: _Resource) -> Labels | None:
        """A point's base labels, or None if it is refused."""
        base = self.base_labels(pt.attributes, resource)
        if isinstance(base, str):
            self.points.refuse(
                BAD_LABEL_NAME,
                1,
                f"metric {metric!r}: attribute key {base!r} cannot be a label name",
            )
            return None
        return base

    def _accept(
        self,
        pt: Any,
        base: Labels,
        series: list[Labels],
        vals: list[float],
        metric: str,
        resource: _Resource,
        widest: int | None = -1,
    ) -> None:
        t_ns = pt.time_unix_nano
        if self.points.add(t_ns // 1_000_000, base, series, vals, f"metric {metric!r}", widest):
            resource.saw(t_ns)

    def numbers(self, points: Any, name: str, metric: str, resource: _Resource) -> None:
        mc = self.mc
        for pt in points:
            base = self._start(pt, metric, resource)
            if base is None:
                continue
            which = pt.WhichOneof("value")
            if pt.flags & NO_RECORDED_VALUE:
                value = STALE_NAN  # the series ended, as Prometheus's receiver writes it
            elif which is None:
                self.points.refuse(NO_VALUE, 1, f"metric {metric!r}: a data point with no value")
                continue
            else:
                value = float(pt.as_double if which == "as_double" else pt.as_int)
            base[mc] = name
            self._accept(pt, base, [base], [value], metric, resource)

    def histograms(self, points: Any, name: str, metric: str, resource: _Resource) -> None:
        mc = self.mc
        bucket, count_name, sum_name = name + "_bucket", name + "_count", name + "_sum"
        for pt in points:
            base = self._start(pt, metric, resource)
            if base is None:
                continue
            count = float(pt.count)
            series = [{**base, mc: count_name}]
            vals = [count]
            if pt.HasField("sum"):
                series.append({**base, mc: sum_name})
                vals.append(pt.sum)
            cumulative = 0
            widest, longest = len(series), 4  # the bucket with the longest `le`: +Inf or one
            for bound, n in zip(pt.explicit_bounds, pt.bucket_counts, strict=False):
                cumulative += n
                le = format_float(bound)
                if len(le) > longest:
                    widest, longest = len(series), len(le)
                series.append({**base, "le": le, mc: bucket})
                vals.append(float(cumulative))
            if widest == len(series):
                widest = -1
            series.append({**base, "le": "+Inf", mc: bucket})
            vals.append(count)
            if pt.flags & NO_RECORDED_VALUE:  # every series of the histogram ended
                vals = [STALE_NAN] * len(vals)
            self._accept(pt, base, series, vals, metric, resource, widest)

    def summaries(self, points: Any, name: str, metric: str, resource: _Resource) -> None:
        mc = self.mc
        count_name, sum_name = name + "_count", name + "_sum"
        for pt in points:
            base = self._start(pt, metric, resource)
            if base is None:
                continue
            series = [{**base, mc: sum_name}, {**base, mc: count_name}]
            vals = [pt.sum, float(pt.count)]
            for q in pt.quantile_values:
                series.append({**base, "quantile": format_float(q.quantile), mc: name})
                vals.append(q.value)
            if pt.flags & NO_RECORDED_VALUE:
                vals = [STALE_NAN] * len(vals)
            self._accept(pt, base, series, vals, metric, resource, None)

    def target_info(self, resource: _Resource) -> None:
        """`target_info{job, instance, <other resource attributes>} 1` over the range of the
        resource's accepted points, if it has attributes besides the identifying ones."""
        if resource.earliest_ns is None or not resource.other_attributes:
            return
        labels, bad_key = attribute_labels(resource.attributes, IDENTIFYING)
        if bad_key is not None:
            self.points.refuse(
                BAD_LABEL_NAME,
                1,
                f"target_info: resource attribute key {bad_key!r} cannot be a label name",
            )
            return
        labels.update(resource.identity)
        if "job" not in labels and "instance" not in labels:
            return
        labels[self.mc] = TARGET_INFO
        key = tuple(labels.items())
        first, last = resource.earliest_ns, resource.latest_ns
        if (last - first) // TARGET_INFO_INTERVAL_NS <= MAX_TARGET_INFO_STEPS:
            times = [t // 1_000_000 for t in range(first, last, TARGET_INFO_INTERVAL_NS)]
        else:  # points hours apart in one request: bounded work, the two ends only
            times = [first // 1_000_000]
        times.append(last // 1_000_000)
        for ms in times:
            if (key, ms) not in self.target_info_seen:
                self.target_info_seen.add((key, ms))
                self.points.add(ms, labels, [dict(labels)], [1.0], "target_info")


def parse(body: bytes, media: str) -> ExportMetricsServiceRequest:
    """The request message, or `Invalid`."""
    request = ExportMetricsServiceRequest()
    if media == JSON:
        try:
            obj = json.loads(body)
            if not isinstance(obj, dict):
                raise ValueError(f"a JSON {type(obj).__name__}, not an object")
            json_format.ParseDict(obj, request, ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError, RecursionError) as e:
            raise Invalid(
                f"the body is not a JSON ExportMetricsServiceRequest (OTLP/JSON): {e}"
            ) from None
        return request
    try:  # no bytes at all are an empty request (success, as the spec says)
        request.ParseFromString(body)
    except (DecodeError, RecursionError) as e:
        raise Invalid(f"the body is not a protobuf ExportMetricsServiceRequest: {e}") from None
    return request


def decode(body: bytes, media: str, metric_column: str, limits: LabelLimits) -> Decoded:
    """A decompressed OTLP body as a batch; refusals counted per data point."""
    return Converter(metric_column, limits).convert(parse(body, media))

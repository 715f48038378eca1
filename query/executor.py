"""Query execution on a node: its shards' memstores and the ColumnStore as one `SeriesSource`.

A node evaluates the series-local parts of a query (and partial aggregations) where the samples
are, so only step results, never raw samples, cross the network. Each series is read from the
ColumnStore for the times before its oldest in-memory sample and from memory after that, with one
ColumnStore read per shard for all the series that need one.

Retention: `run_node_query` sets the source's `min_time` to the dataset's `now - retention` once
per query part, and every read starts there, so samples past retention answer from neither the
store nor memory (the memstore may still hold them until it evicts) and the boundary is the same
for every series of the part.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from core.dataset import Dataset
from core.errors import Unavailable
from ingest.memstore import ShardMemstore
from ingest.shard_reader import read_merged_batch
from query.evaluator import eval_partial, eval_series_local
from query.expr_wire import expr_bytes, expr_of
from query.functions import SampleBatch
from query.limits import QueryLimits
from query.promql import Aggregate, Expr
from query.routing import PROMETHEUS_METRIC
from query.values import SeriesData
from store import ColumnStore
from store.api import INT64_MAX, INT64_MIN, LabelMatcher, StoreError
from store.downsample import (
    Periods,
    concat_series,
    decoded_periods,
    series_periods,
    summarise,
    within,
)

log = logging.getLogger(__name__)


@dataclass
class ScanStats:
    """What a source read, for metrics and the routing tests' node-side counters."""

    shards: set[int] = field(default_factory=set)
    series: int = 0
    samples: int = 0
    periods: int = 0  # downsampled periods read (`select_periods`)
    warnings: list[str] = field(default_factory=list)  # for the query's answer


# Under limits, a shard's matching series are read this many at a time, so a query over a
# limit stops within a slice of one shard rather than after the whole shard.
LIMITED_SLICE_SERIES = 1024


def _slices(sids: list[int], limits: QueryLimits | None) -> list[list[int]]:
    if limits is None or len(sids) <= LIMITED_SLICE_SERIES:
        return [sids]
    return [sids[i : i + LIMITED_SLICE_SERIES] for i in range(0, len(sids), LIMITED_SLICE_SERIES)]


class ShardSource:
    """The series of some of this node's shards of one dataset, with PromQL's `__name__`."""

    def __init__(
        self,
        dataset: Dataset,
        memstores: Mapping[int, ShardMemstore],
        column_store: ColumnStore,
    ) -> None:
        self.dataset = dataset
        self._ref = dataset.ref  # a new model per access: made once per part, not per shard
        self._memstores = memstores
        self._columns = column_store
        self.stats = ScanStats()
        self.limits: QueryLimits | None = None  # the query's, checked as samples are read
        self.min_time = INT64_MIN  # nothing older answers (`limit_to_retention`)

    def limit_to_retention(self) -> None:
        """Answer nothing older than the dataset's retention allows. If the store cannot say
        (it is out), memory answers as it would without retention: the store's own reads fail
        meanwhile, and queries serve what memory holds, as during any outage."""
        if self._columns is None:
            return
        try:
            self.min_time = self._columns.cutoff(self._ref)
        except StoreError:
            log.warning("retention of %s unknown (the store is out)", self.dataset.name)

    def restricted(self, shards: Sequence[int]) -> ShardSource:
        """The same source over some of its shards, counting into the same stats."""
        part = ShardSource(
            self.dataset, {s: m for s, m in self._memstores.items() if s in shards}, self._columns
        )
        part.stats, part.limits = self.stats, self.limits
        part.min_time = self.min_time
        return part

    def _translate(self, matchers: Sequence[LabelMatcher]) -> list[LabelMatcher]:
        metric = self.dataset.metric_column
        return [
            LabelMatcher(metric, m.op, m.value) if m.label == PROMETHEUS_METRIC else m
            for m in matchers
        ]

    def _labels(self, mem: ShardMemstore, series_ids: Iterable[int]) -> list[dict[str, str]]:
        """The series' label sets as PromQL names them (the metric column as `__name__`)."""
        out = mem.labels_many(series_ids)
        metric = self.dataset.metric_column
        for labels in out:
            if metric in labels:
                labels[PROMETHEUS_METRIC] = labels.pop(metric)
        return out

    def _matching(
        self, matchers: Sequence[LabelMatcher], start_ms: int, end_ms: int
    ) -> Iterable[tuple[int, ShardMemstore, list[int]]]:
        """Per shard: (shard, memstore, ids of the series matching with samples in the range)."""
        if start_ms > end_ms:  # wholly before the retention boundary
            return
        translated = self._translate(matchers)
        for shard, mem in sorted(self._memstores.items()):
            self.stats.shards.add(shard)
            sids = mem.in_range(mem.find_series(translated), start_ms, end_ms)
            if sids:
                yield shard, mem, sids

    def select(
        self, matchers: Sequence[LabelMatcher], start_ms: int, end_ms: int
    ) -> list[SeriesData]:
        batch = self.select_batch(matchers, start_ms, end_ms)
        b = batch.bounds.tolist()
        return [
            SeriesData(labels, batch.ts[b[i] : b[i + 1]], batch.vals[b[i] : b[i + 1]])
            for i, labels in enumerate(batch.labels)
        ]

    def select_batch(
        self, matchers: Sequence[LabelMatcher], start_ms: int, end_ms: int
    ) -> SampleBatch:
        """`select` as one columnar batch (what the evaluator reads): no per-series arrays."""
        start_ms, end_ms = max(start_ms, INT64_MIN, self.min_time), min(end_ms, INT64_MAX)
        labels: list[dict[str, str]] = []
        ts_parts, val_parts, size_parts = [], [], []
        limits, samples = self.limits, 0
        for shard, mem, matched in self._matching(matchers, start_ms, end_ms):
            for sids in _slices(matched, limits):
                ts, vals, bounds = read_merged_batch(
                    mem, self._columns, self._ref, shard, sids, start_ms, end_ms
                )
                sizes = np.diff(bounds)
                held = np.flatnonzero(sizes)
                labels.extend(self._labels(mem, map(sids.__getitem__, held.tolist())))
                ts_parts.append(ts)
                val_parts.append(vals)
                size_parts.append(sizes[held])
                samples += len(ts)
                if limits is not None:
                    limits.check(self.stats.samples + samples, self.stats.series + len(labels))
        if not labels:
            return SampleBatch([], np.empty(0, np.int64), np.empty(0), np.zeros(1, np.int64))
        sizes = np.concatenate(size_parts)
        bounds = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=bounds[1:])
        self.stats.series += len(labels)
        self.stats.samples += int(bounds[-1])
        return SampleBatch(labels, np.concatenate(ts_parts), np.concatenate(val_parts), bounds)

    def warn(self, warning: str) -> None:
        """A warning for the query's answer (Prometheus' `warnings`), once."""
        if warning not in self.stats.warnings:
            self.stats.warnings.append(warning)

    @property
    def resolutions_ms(self) -> list[int]:
        """The resolutions downsampled on any of these shards, coarsest first."""
        found = {r for m in self._memstores.values() for r in m.downsampled_until}
        return sorted(found, reverse=True)

    def select_periods(
        self, matchers: Sequence[LabelMatcher], resolution_ms: int, start_ms: int, end_ms: int
    ) -> tuple[list[dict[str, str]], Periods] | None:
        """The matching series' periods of `resolution_ms` ending in [start_ms, end_ms]: those
        downsampled and stored up to each shard's mark, the rest summarised from raw samples
        here (the newest, not downsampled yet), so every period is whole. None when no shard
        has stored periods in the range: reading raw samples is then as cheap."""
        res = resolution_ms
        if all(
            m.downsampled_until.get(res, INT64_MIN) < start_ms for m in self._memstores.values()
        ):
            return None
        labels: list[dict[str, str]] = []
        per_series: list[list[Periods]] = []
        for shard, mem, matched in self._matching(matchers, start_ms, end_ms):
            stored_end = min(end_ms, mem.downsampled_until.get(res, start_ms - 1))
            keys = [mem.part_key(s) for s in matched]
            stored = {}
            if stored_end >= start_ms:
                stored = self._columns.read_downsampled(
                    self._ref, shard, res, keys, start_ms, stored_end
                )
            tail = None
            tail_start = max(start_ms, stored_end + 1, self.min_time)  # raw: within retention
            if tail_start <= end_ms:
                ts, vals, bounds = read_merged_batch(
                    mem, self._columns, self._ref, shard, matched, tail_start, end_ms
                )
                tail = summarise(ts, vals, bounds, res)
                self.stats.samples += len(ts)
            held: list[int] = []
            for i, key in enumerate(keys):
                parts = [
                    within(decoded_periods(r.data), start_ms, stored_end)
                    for r in stored.get(key, ())
                ]
                if tail is not None:
                    parts.append(series_periods(tail, i))
                parts = [p for p in parts if len(p)]
                if parts:
                    held.append(matched[i])
                    per_series.append(parts)
            labels.extend(self._labels(mem, held))
        periods = concat_series(per_series, res)
        self.stats.series += len(labels)
        self.stats.periods += len(periods)
        return labels, periods

    def series(
        self, matchers: Sequence[LabelMatcher], start_ms: int, end_ms: int
    ) -> list[dict[str, str]]:
        """Label sets of the matching series with samples in the range (`/api/v1/series`)."""
        found = self._matching(matchers, max(start_ms, self.min_time), end_ms)
        return [labels for _, mem, sids in found for labels in self._labels(mem, sids)]


@dataclass(frozen=True)
class NodeQuery:
    """One node's part of a query, as sent over Ray (everything in it pickles) or the query
    channel (`query.wire`)."""

    kind: Literal["series_local", "partial", "series", "batch", "raw"]
    expr: Expr | None = None  # series_local: a series-local Expr; partial: a pushable Aggregate
    times: npt.NDArray[np.int64] | None = None
    lookback_ms: int = 300_000
    # series: any of these selectors; raw: the samples in [start_ms, end_ms] of the first
    matchers: tuple[tuple[LabelMatcher, ...], ...] = ()
    start_ms: int = INT64_MIN
    end_ms: int = INT64_MAX
    # batch: every part of one query this node evaluates, as (index, "series_local" or
    # "partial", expression, its shards here); the answer maps each index to its result.
    parts: tuple[tuple[int, str, Expr, tuple[int, ...]], ...] = ()
    # The query's per-tenant limits and what it spent before this call (None: no limits).
    limits: QueryLimits | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (for Ray) with each expression as its bytes from `query.expr_wire`, made once
        per tree and read once per node: data, not a pickle of the tree, so a node reads no
        code from a query part; and a dashboard's queries send the same trees again and again,
        which pickling node by node made a good part of a small query's time on both sides."""
        parts = tuple((i, kind, expr_bytes(e), shards) for i, kind, e, shards in self.parts)
        return _node_query, (
            self.kind,
            None if self.expr is None else expr_bytes(self.expr),
            self.times,
            self.lookback_ms,
            self.matchers,
            self.start_ms,
            self.end_ms,
            parts,
            self.limits,
        )


def _node_query(
    kind: Any,
    expr: bytes | None,
    times: Any,
    lookback_ms: int,
    matchers: Any,
    start_ms: int,
    end_ms: int,
    parts: tuple[tuple[int, str, bytes, tuple[int, ...]], ...],
    limits: QueryLimits | None = None,
) -> NodeQuery:
    return NodeQuery(
        kind,
        None if expr is None else expr_of(expr),
        times,
        lookback_ms,
        matchers,
        start_ms,
        end_ms,
        tuple((i, k, expr_of(e), shards) for i, k, e, shards in parts),
        limits,
    )


@dataclass(frozen=True)
class NodeAnswer:
    result: Any  # StepMatrix, Partial, or a list of label sets
    shards: tuple[int, ...]
    series: int
    samples: int
    warnings: tuple[str, ...] = ()  # for the query's answer (approximations)


def run_node_query(query: NodeQuery, source: ShardSource) -> NodeAnswer:
    """Evaluate a node's part of a query over its shards (called on the node, off its loop);
    `QueryLimitExceeded` as soon as it reads more than the query's limits allow."""
    source.limit_to_retention()
    result: Any
    if query.limits is not None and query.limits.enabled:
        source.limits = query.limits
    if query.kind == "batch":
        assert query.times is not None
        result = {}
        for index, kind, expr, shards in query.parts:
            part = source.restricted(shards)
            if kind == "partial":
                assert isinstance(expr, Aggregate)
                result[index] = eval_partial(expr, part, query.times, query.lookback_ms)
            else:
                result[index] = eval_series_local(expr, part, query.times, query.lookback_ms)
    elif query.kind == "series_local":
        assert query.expr is not None and query.times is not None
        result = eval_series_local(query.expr, source, query.times, query.lookback_ms)
    elif query.kind == "partial":
        assert isinstance(query.expr, Aggregate) and query.times is not None
        result = eval_partial(query.expr, source, query.times, query.lookback_ms)
    elif query.kind == "raw":
        result = source.select(query.matchers[0], query.start_ms, query.end_ms)
    else:
        seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        for matchers in query.matchers:
            for labels in source.series(matchers, query.start_ms, query.end_ms):
                seen.setdefault(tuple(sorted(labels.items())), labels)
        result = list(seen.values())
    st = source.stats
    return NodeAnswer(result, tuple(sorted(st.shards)), st.series, st.samples, tuple(st.warnings))


class ShardsNotHere(Unavailable):
    """The node does not run these shards (the caller's shard map is out of date): not there
    now, so the caller retries with a fresher map or counts them unavailable."""

    def __init__(self, dataset: str, node: str, shards: list[int]) -> None:
        super().__init__(
            f"node {node} does not run shards {shards} of {dataset!r} (they moved); retry"
        )
        self.dataset, self.node, self.shards = dataset, node, shards

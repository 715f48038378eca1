"""PromQL evaluation on step matrices, at the caller and on the nodes that hold the data.

The one module that walks the expression tree. `evaluate` runs at the caller and never reads
raw samples: it hands series-local subtrees and pushable aggregations to a `Backend` (see
`query.pushdown`) and evaluates the rest itself. A node calls `eval_series_local` /
`eval_partial` on its own `SeriesSource`. `LocalBackend` is the single-process backend.

Semantics follow Prometheus 3:

* windows are left-open: an instant selector takes the latest sample in
  (t - offset - lookback, t - offset], a range selector sees (t - offset - range, t - offset];
* rate/increase/delta extrapolate like Prometheus's extrapolatedRate, irate uses the last two
  samples; all functions, arithmetic, `bool` comparisons, unary minus and `without` drop
  `__name__`, except last_over_time and filtering comparisons, which keep it;
* label sets made equal by dropping `__name__` are merged into one series, and are an
  "execution" error if they have values at the same step (Prometheus's per-step check);
* NaN is a value: a stored NaN sample is read like any other, and NaN results (0/0, asin(2),
  histogram_quantile of an empty histogram) are returned; a step matrix's `present` mask, not
  NaN, says where a series has a value. Prometheus's staleness marker ends a series (an instant
  selector that finds it as the latest sample has no value; range functions skip it). Scalars
  are always present and may be NaN (e.g. `scalar()` of no series);
* topk/bottomk keep what Prometheus' heap keeps (equal values at the cut: replayed over the
  series in label order); instant topk/bottomk results come group by group (in order of first
  appearance), each by value, as Prometheus answers them; instant sort/sort_desc results are
  ordered by value (ties by label set), every other vector result by label set.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from query import aggregate as agg_mod
from query import downsampled, histogram
from query import functions as fn
from query import label_functions as labels_fn
from query.aggregate import Partial, label_key
from query.binary import scalar_binop, set_op, vector_scalar, vector_vector
from query.promql import (
    DATE_FUNCTIONS,
    DEFAULT_SUBQUERY_STEP_MS,
    MATH_FUNCTIONS,
    MAX_SUBQUERY_POINTS,
    RANGE_FUNCTIONS,
    SET_OPS,
    Aggregate,
    Binary,
    Call,
    Expr,
    MatrixSelector,
    NumberLiteral,
    QueryError,
    StringLiteral,
    Subquery,
    Unary,
    VectorSelector,
    parse,
    range_args,
    resolve_at,
    value_type,
)
from query.pushdown import (
    Backend,
    absent_count,
    finish,
    is_pushable,
    is_series_local,
    partial_from_matrix,
)
from query.values import (
    I64,
    RangeVector,
    Scalar,
    SeriesData,
    SeriesSource,
    StepMatrix,
    String,
    Value,
    dedupe,
    drop_name,
    execution_error,
    finalize,
)

__all__ = [
    "DEFAULT_LOOKBACK_MS",
    "LocalBackend",
    "eval_partial",
    "eval_series_local",
    "evaluate",
    "range_times",
]

DEFAULT_LOOKBACK_MS = 300_000


class LocalBackend:
    """Evaluates series-local subtrees and partial aggregations in-process over one source."""

    def __init__(self, source: SeriesSource) -> None:
        self.source = source

    def series_local(self, expr: Expr, times: I64, lookback_ms: int) -> StepMatrix:
        return eval_series_local(expr, self.source, times, lookback_ms)

    def partial_aggregate(self, agg: Aggregate, times: I64, lookback_ms: int) -> Partial:
        return eval_partial(agg, self.source, times, lookback_ms)

    def raw(self, sel: VectorSelector, start_ms: int, end_ms: int) -> list[SeriesData]:
        return self.source.select(sel.matchers, start_ms, end_ms)


def _as_times(times: npt.ArrayLike) -> I64:
    arr = np.asarray(times)
    if arr.ndim != 1 or len(arr) == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError("times must be a non-empty 1-D array of int64 milliseconds")
    return arr.astype(np.int64)


def range_times(start_ms: int, end_ms: int, step_ms: int) -> I64:
    """Evaluation steps of a range query: start, start + step, ... up to end inclusive."""
    if step_ms <= 0 or end_ms < start_ms:
        raise ValueError("need step_ms > 0 and start_ms <= end_ms")
    return np.arange(start_ms, end_ms + 1, step_ms, dtype=np.int64)


class _Evaluator:
    """Recursive evaluation. With a backend it delegates series-local and pushable subtrees;
    with a source (on the node that holds the data) it reads samples itself."""

    def __init__(
        self,
        times: I64,
        lookback_ms: int,
        backend: Backend | None = None,
        source: SeriesSource | None = None,
    ) -> None:
        self.times = times
        self.lookback_ms = lookback_ms
        self.backend = backend
        self.source = source

    def vector(self, expr: Expr) -> StepMatrix:
        v = self.eval(expr)
        assert isinstance(v, StepMatrix), f"expected an instant vector from {expr}"
        return v

    def scalar(self, expr: Expr) -> Scalar:
        v = self.eval(expr)
        assert isinstance(v, Scalar), f"expected a scalar from {expr}"
        return v

    def eval(self, expr: Expr) -> Value:
        if self.backend is not None and value_type(expr) == "vector":
            if is_series_local(expr):
                return self.backend.series_local(expr, self.times, self.lookback_ms)
            if is_pushable(expr):
                assert isinstance(expr, Aggregate)
                return finish(self.backend.partial_aggregate(expr, self.times, self.lookback_ms))
        match expr:
            case NumberLiteral(value=v):
                return Scalar(self.times, np.full(len(self.times), v))
            case StringLiteral(value=s):
                return String(self.times, s)
            case VectorSelector():
                times = self._at(expr.at)
                batch = self._load(expr, self.lookback_ms, times)
                values, present = fn.instant_values(batch, times, expr.offset_ms, self.lookback_ms)
                return StepMatrix(self.times, batch.labels, values, present)
            case MatrixSelector():
                raise QueryError("unsupported", "unsupported: range vector (matrix) query results")
            case Call():
                return self._call(expr)
            case Aggregate():
                return self._aggregate(expr)
            case Binary():
                return self._binary(expr)
            case Unary(expr=inner):
                v = self.eval(inner)
                if isinstance(v, Scalar):
                    return Scalar(self.times, -v.values)
                assert isinstance(v, StepMatrix)
                return drop_name(v.with_values(-v.values))
        raise QueryError("unsupported", f"unsupported: expression {expr!r}")

    def _at(self, at: int | str | None) -> I64:
        """The times a selector is evaluated at: every step's, or its `@` time at every step."""
        if at is None:
            return self.times
        assert isinstance(at, int), "resolve_at() fixes @ start() / end() before evaluation"
        return np.full(len(self.times), at, dtype=np.int64)

    def _load(self, sel: VectorSelector, width_ms: int, times: I64) -> fn.SampleBatch:
        """One `select` covering every window of `sel` over all of `times`."""
        if self.source is None:
            raise RuntimeError("raw samples are only read by a node's evaluator (no source)")
        lower = int(times.min()) - sel.offset_ms - width_ms
        upper = int(times.max()) - sel.offset_ms
        select_batch = getattr(self.source, "select_batch", None)
        if select_batch is not None:  # a columnar source (a node's shards)
            return select_batch(sel.matchers, lower + 1, upper)  # windows are left-open
        series = self.source.select(sel.matchers, lower + 1, upper)
        return fn.SampleBatch.from_series(series, lower + 1, upper)

    def _downsampled(
        self, func: str, ms: MatrixSelector, times: I64
    ) -> tuple[list[dict[str, str]], npt.NDArray[np.float64], npt.NDArray[np.bool_]] | None:
        """`func` over `ms` from downsampled periods, where that gives the raw answer: a
        function `downsampled.EXACT` answers, windows that are whole periods of a resolution the
        source keeps (the coarsest such), and periods stored for them (docs/lifecycle.md).
        None: read raw samples."""
        source = self.source
        select_periods = getattr(source, "select_periods", None)
        if select_periods is None or func not in downsampled.EXACT:
            return None
        sel, range_ms = ms.selector, ms.range_ms
        lower = int(times.min()) - sel.offset_ms - range_ms
        upper = int(times.max()) - sel.offset_ms
        resolutions = source.resolutions_ms  # type: ignore[union-attr]
        for res in resolutions:
            if downsampled.aligned(res, times, range_ms, sel.offset_ms):
                got = select_periods(sel.matchers, res, lower + 1, upper)
                if got is not None:
                    labels, periods = got
                    values, present = downsampled.answer(
                        func, periods, times, range_ms, sel.offset_ms
                    )
                    return labels, values, present
        # Not whole periods: raw samples answer, unless raw retention dropped some of them
        # (the source answers nothing older than its `min_time`): then the finest periods
        # answer every window, approximately, and say so.
        raw_from = getattr(source, "min_time", lower + 1)
        if not resolutions or lower + 1 >= raw_from:
            return None
        res = resolutions[-1]
        got = select_periods(sel.matchers, res, lower + 1, upper)
        if got is None:
            return None
        labels, periods = got
        values, present = downsampled.answer(
            func, periods, times, range_ms, sel.offset_ms, approximate=True
        )
        source.warn(  # type: ignore[union-attr]
            f"{func} over windows older than the raw data's retention answered from "
            f"{res // 1000} s downsampled periods: approximate, as the windows are not whole "
            "periods (docs/lifecycle.md)"
        )
        return labels, values, present

    def _subquery(self, sq: Subquery) -> fn.SampleBatch:
        """The subquery's expression evaluated once at every time any step's window needs:
        multiples of its step after the earliest window's (left-open) start (as Prometheus
        aligns them) to the latest window's end; its values become the samples."""
        step = sq.step_ms or DEFAULT_SUBQUERY_STEP_MS
        times = self._at(sq.at)
        lower = int(times.min()) - sq.offset_ms - sq.range_ms
        start = (lower // step) * step
        if start <= lower:  # windows are left-open: the earliest window excludes its start
            start += step
        end = int(times.max()) - sq.offset_ms
        if (end - start) // step + 1 > MAX_SUBQUERY_POINTS:
            raise QueryError(
                "bad_data",
                f"subquery too fine: more than {MAX_SUBQUERY_POINTS} evaluation times; use a "
                "larger step or a shorter range",
            )
        grid = np.arange(start, end + 1, step, dtype=np.int64)
        if len(grid) == 0:  # a range shorter than the step may hold no multiple of it
            return fn.SampleBatch([], np.empty(0, np.int64), np.empty(0), np.zeros(1, np.int64))
        inner = _Evaluator(grid, self.lookback_ms, self.backend, self.source).eval(sq.expr)
        if isinstance(inner, Scalar):
            inner = StepMatrix(grid, [{}], inner.values.reshape(1, -1))
        assert isinstance(inner, StepMatrix), f"a subquery of {sq.expr}"
        present = inner.present  # row-major: each series' times in order
        ts = np.broadcast_to(grid, inner.values.shape)[present]
        bounds = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int64)
        return fn.SampleBatch(inner.labels, ts.astype(np.int64), inner.values[present], bounds)

    def _call(self, call: Call) -> Value:
        func, args = call.func, call.args
        if func in RANGE_FUNCTIONS:
            ms, param_expr = range_args(call)
            param = None if param_expr is None else self.scalar(param_expr).values
            if isinstance(ms, Subquery):
                times = self._at(ms.at)
                batch, offset_ms = self._subquery(ms), ms.offset_ms
            else:
                times = self._at(ms.selector.at)
                offset_ms = ms.selector.offset_ms
                answered = None if param is not None else self._downsampled(func, ms, times)
                if answered is not None:
                    out = StepMatrix(self.times, *answered)
                    return out if func == "last_over_time" else drop_name(out)
                batch = self._load(ms.selector, ms.range_ms, times)
            values, present = fn.range_function(func, batch, times, ms.range_ms, offset_ms, param)
            out = StepMatrix(self.times, batch.labels, values, present)
            return out if func == "last_over_time" else drop_name(out)
        if func in MATH_FUNCTIONS:
            v = self.vector(args[0])
            params = [self.scalar(a).values for a in args[1:]]
            values, present = fn.math_function(func, v.values, v.present, params)
            return drop_name(StepMatrix(self.times, v.labels, values, present))
        if func in DATE_FUNCTIONS:
            if not args:  # of the evaluation time, as `func(vector(time()))`
                secs = fn.unix_seconds(self.times).reshape(1, -1)
                return StepMatrix(self.times, [{}], fn.date_function(func, secs))
            v = self.vector(args[0])  # nothing for a non-finite value (a deliberate difference)
            return drop_name(StepMatrix(self.times, v.labels, fn.date_function(func, v.values)))
        match func:
            case "time":
                return Scalar(self.times, self.times / 1000.0)
            case "pi":
                return Scalar(self.times, np.full(len(self.times), np.pi))
            case "vector":
                s = self.scalar(args[0])
                values = s.values.reshape(1, -1).copy()
                return StepMatrix(self.times, [{}], values, np.ones(values.shape, bool))
            case "scalar":
                v = self.vector(args[0])
                single = v.present.sum(axis=0) == 1
                if len(v) == 0:
                    return Scalar(self.times, np.full(len(self.times), np.nan))
                picked = np.fmax.reduce(v.values, axis=0)  # absent cells are NaN
                return Scalar(self.times, np.where(single, picked, np.nan))
            case "timestamp":
                return self._timestamp(args[0])
            case "sort" | "sort_desc":  # only an instant query's order changes (`evaluate`)
                return self.vector(args[0])
            case "absent" | "absent_over_time":
                return self._absent(call)
            case "label_replace" | "label_join":
                return self._label_function(call)
            case "histogram_quantile":
                q = self.scalar(args[0]).values
                v = self.vector(args[1])
                out_labels, values, present = histogram.histogram_quantile(
                    v.labels, v.values, v.present, q
                )
                return dedupe(StepMatrix(self.times, out_labels, values, present))
        raise QueryError("unsupported", f"unsupported: function '{func}'")

    def _timestamp(self, arg: Expr) -> StepMatrix:
        """timestamp(): of the sample a selector picked, else of the evaluation step."""
        if isinstance(arg, VectorSelector):
            times = self._at(arg.at)
            batch = self._load(arg, self.lookback_ms, times)
            ts, present = fn.instant_timestamps(batch, times, arg.offset_ms, self.lookback_ms)
            return drop_name(StepMatrix(self.times, batch.labels, ts, present))
        v = self.vector(arg)
        stamps = np.broadcast_to((self.times / 1000.0)[None, :], v.values.shape)
        return drop_name(v.with_values(stamps))

    def _absent(self, call: Call) -> StepMatrix:
        """1 at the steps where the argument has no series, labelled from its equality
        matchers (a selector's) as Prometheus does."""
        counted = self.vector(absent_count(call))
        present = counted.present.any(axis=0)
        arg = call.args[0]
        sel = arg.selector if isinstance(arg, MatrixSelector) else arg
        lab = labels_fn.absent_labels(sel.matchers) if isinstance(sel, VectorSelector) else {}
        return StepMatrix(self.times, [lab], np.where(present, np.nan, 1.0).reshape(1, -1))

    def _label_function(self, call: Call) -> StepMatrix:
        v = self.vector(call.args[0])
        strings = [a.value for a in call.args[1:] if isinstance(a, StringLiteral)]
        if call.func == "label_replace":
            dst, replacement, src, regex = strings
            new = labels_fn.label_replace(v.labels, dst, replacement, src, regex)
        else:
            new = labels_fn.label_join(v.labels, strings[0], strings[1], strings[2:])
        return dedupe(v.with_values(v.values, new))

    def _aggregate(self, agg: Aggregate) -> StepMatrix:
        inner = self.vector(agg.expr)
        if agg.op in ("topk", "bottomk"):
            assert agg.param is not None
            k_raw = self.scalar(agg.param).values
            bad = ~np.isfinite(k_raw) | (np.abs(k_raw) >= 2.0**63)
            if bad.any():
                raise execution_error(f"Scalar value {k_raw[bad][0]} overflows int64")
            k = np.trunc(k_raw).astype(np.int64)
            bottom = agg.op == "bottomk"
            if len(self.times) == 1:  # rows in the order Prometheus answers an instant query
                first = agg_mod.instant_k_order(
                    inner.labels,
                    inner.values[:, 0],
                    inner.present[:, 0],
                    int(k[0]),
                    agg.grouping,
                    agg.without,
                    bottom,
                )
                rows = np.array(first, dtype=np.int64)
                return StepMatrix(
                    self.times,
                    [inner.labels[i] for i in first],
                    inner.values[rows].reshape(-1, 1),
                    np.ones((len(first), 1), bool),
                )
            keep = agg_mod.select_k(
                inner.labels, inner.values, inner.present, k, agg.grouping, agg.without, bottom
            )
            return StepMatrix(self.times, inner.labels, inner.values, keep)
        if agg.op == "quantile":
            assert agg.param is not None
            q = self.scalar(agg.param).values
            groups, values, present = agg_mod.quantile(
                inner.labels, inner.values, inner.present, q, agg.grouping, agg.without
            )
            return StepMatrix(self.times, groups, values, present)
        if agg.op == "count_values":
            assert isinstance(agg.param, StringLiteral)
            groups, values = agg_mod.count_values(
                inner.labels,
                inner.values,
                inner.present,
                agg.param.value,
                agg.grouping,
                agg.without,
            )
            return StepMatrix(self.times, groups, values)
        if agg.op not in agg_mod.PUSHABLE_OPS or agg.param is not None:
            raise QueryError("unsupported", f"unsupported: aggregation '{agg.op}'")
        return finish(partial_from_matrix(agg, inner))

    def _binary(self, b: Binary) -> Value:
        lhs, rhs = self.eval(b.lhs), self.eval(b.rhs)
        if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
            return Scalar(self.times, scalar_binop(b.op, lhs.values, rhs.values))
        if isinstance(lhs, StepMatrix) and isinstance(rhs, Scalar):
            return vector_scalar(b.op, lhs, rhs.values, False, b.return_bool)
        if isinstance(lhs, Scalar) and isinstance(rhs, StepMatrix):
            return vector_scalar(b.op, rhs, lhs.values, True, b.return_bool)
        assert isinstance(lhs, StepMatrix) and isinstance(rhs, StepMatrix)
        if b.op in SET_OPS:
            return set_op(b.op, lhs, rhs, b.matching)
        return vector_vector(b.op, lhs, rhs, b.matching, b.return_bool)


def eval_series_local(
    expr: Expr, source: SeriesSource, times: npt.ArrayLike, lookback_ms: int = DEFAULT_LOOKBACK_MS
) -> StepMatrix:
    """Evaluate a series-local expression over `source` (on the node that holds the series)."""
    if not is_series_local(expr):
        raise ValueError(f"not a series-local expression: {expr!r}")
    result = _Evaluator(_as_times(times), lookback_ms, source=source).vector(expr)
    return finalize(result)


def eval_partial(
    agg: Aggregate,
    source: SeriesSource,
    times: npt.ArrayLike,
    lookback_ms: int = DEFAULT_LOOKBACK_MS,
) -> Partial:
    """The partial state of a pushable aggregation over the series of `source`."""
    if not is_pushable(agg):
        raise ValueError(f"not a pushable aggregation: {agg!r}")
    inner = _Evaluator(_as_times(times), lookback_ms, source=source).vector(agg.expr)
    return partial_from_matrix(agg, inner)


def evaluate(
    expr: Expr | str,
    backend: Backend,
    times: npt.ArrayLike,
    lookback_ms: int = DEFAULT_LOOKBACK_MS,
) -> Value:
    """Evaluate `expr` at each of `times` (one element for an instant query)."""
    if isinstance(expr, str):
        expr = parse(expr)
    ts = _as_times(times)
    expr = resolve_at(expr, int(ts[0]), int(ts[-1]))
    result = _Evaluator(ts, lookback_ms, backend=backend).eval(expr)
    if not isinstance(result, StepMatrix):
        return result
    order = None
    if len(ts) == 1:
        if isinstance(expr, Aggregate) and expr.op in ("topk", "bottomk"):
            order = "rows"  # as instant_k_order gave them
        elif isinstance(expr, Call) and expr.func in ("sort", "sort_desc"):
            order = "desc" if expr.func == "sort_desc" else "asc"
    return finalize(result, order)


def eval_range_vector(
    expr: MatrixSelector | Subquery, backend: Backend, time_ms: int, lookback_ms: int
) -> RangeVector:
    """An instant query of a range vector: each series' raw samples in the window (left-open),
    as Prometheus answers `x[5m]`; a subquery's evaluated points likewise. `@` and `offset` as
    for any selector (`resolve_at` fixed start()/end() already)."""
    if isinstance(expr, Subquery):
        batch = _Evaluator(np.array([time_ms], np.int64), lookback_ms, backend=backend)._subquery(
            expr
        )
        b = batch.bounds
        return RangeVector(
            time_ms,
            list(batch.labels),
            [batch.ts[b[i] : b[i + 1]] for i in range(batch.n_series)],
            [batch.vals[b[i] : b[i + 1]] for i in range(batch.n_series)],
        )
    sel = expr.selector
    at = time_ms if sel.at is None else int(sel.at)
    end = at - sel.offset_ms
    found = []
    for s in backend.raw(sel, end - expr.range_ms + 1, end):
        live = ~fn.is_stale(s.vals)  # staleness markers are not samples of a range vector
        if live.any():
            found.append(SeriesData(s.labels, s.ts[live], s.vals[live]))
    found.sort(key=lambda s: label_key(s.labels))
    return RangeVector(
        time_ms, [s.labels for s in found], [s.ts for s in found], [s.vals for s in found]
    )

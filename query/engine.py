"""PromQL evaluation on step matrices, split so the data-heavy parts run where the data lives.

An expression is evaluated at the caller by `evaluate`, which never reads raw samples. It hands
two kinds of subtrees to a `Backend`, which may run them on the nodes that hold the series:

* series-local expressions (`is_series_local`): a series' result depends on that series alone
  (selectors, range functions, math functions, arithmetic/comparison with number literals), so
  each node evaluates its own series and the results are concatenated (`concat_matrices`);
* pushable aggregations (`is_pushable`): sum/min/max/count/avg of a series-local expression, which
  each node folds into a mergeable `Partial` per output group (`merge_partials`, `finish`).

Everything else (vector matching, topk/bottomk, scalars, aggregations of non-local expressions)
runs at the caller on the step matrices the backend returns. `LocalBackend` is the single-process
backend; a node of a distributed backend calls `eval_series_local` / `eval_partial` on its own
`SeriesSource`.

Semantics follow Prometheus 3:

* windows are left-open: an instant selector takes the latest sample in
  (t - offset - lookback, t - offset], a range selector sees (t - offset - range, t - offset];
* rate/increase/delta extrapolate like Prometheus's extrapolatedRate, irate uses the last two
  samples; all functions, arithmetic, `bool` comparisons, unary minus and `without` drop
  `__name__`, except last_over_time and filtering comparisons, which keep it;
* label sets made equal by dropping `__name__` are merged into one series, and are an
  "execution" error if they have values at the same step (Prometheus's per-step check);
* NaN means "no value" in every step matrix, so NaN-valued results (0/0, Inf-Inf, NaN scalars
  applied to vectors) are absent rather than NaN samples, and NaN raw samples are ignored.
  Scalars are always present and may be NaN (e.g. `scalar()` of no series);
* topk/bottomk ties are broken by label set; instant topk/bottomk results are ordered by value,
  every other vector result by label set.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from filopy.store.api import LabelMatcher
from query import aggregate as agg_mod
from query import functions as fn
from query.aggregate import LabelKey, Partial, label_key
from query.promql import (
    ARITHMETIC_OPS,
    COMPARISON_OPS,
    MATH_FUNCTIONS,
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
    Unary,
    VectorMatching,
    VectorSelector,
    parse,
    value_type,
)

__all__ = [
    "DEFAULT_LOOKBACK_MS",
    "Backend",
    "LocalBackend",
    "MemorySource",
    "Partial",
    "Scalar",
    "SeriesData",
    "SeriesSource",
    "StepMatrix",
    "String",
    "Value",
    "concat_matrices",
    "eval_partial",
    "eval_series_local",
    "evaluate",
    "finish",
    "is_pushable",
    "is_series_local",
    "merge_partials",
    "partial_from_matrix",
    "range_times",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
DEFAULT_LOOKBACK_MS = 300_000

# ---------------------------------------------------------------------------------- data types


@dataclass(frozen=True, eq=False)
class SeriesData:
    """Raw samples of one series (labels include `__name__`); `ts` ascending, in ms."""

    labels: dict[str, str]
    ts: I64
    vals: F64

    def __post_init__(self) -> None:
        object.__setattr__(self, "ts", np.asarray(self.ts, dtype=np.int64))
        object.__setattr__(self, "vals", np.asarray(self.vals, dtype=np.float64))
        if self.ts.shape != self.vals.shape or self.ts.ndim != 1:
            raise ValueError("ts and vals must be 1-D arrays of equal length")


@dataclass(frozen=True, eq=False)
class StepMatrix:
    """An instant vector at each evaluation step: `values[i, j]` is series i at `times[j]`,
    NaN where the series has no value at that step."""

    times: I64
    labels: list[dict[str, str]]
    values: F64

    def __post_init__(self) -> None:
        if self.values.shape != (len(self.labels), len(self.times)):
            raise ValueError(
                f"values shape {self.values.shape} != ({len(self.labels)}, {len(self.times)})"
            )

    @classmethod
    def empty(cls, times: I64) -> StepMatrix:
        return cls(times, [], np.empty((0, len(times))))

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True, eq=False)
class Scalar:
    """A scalar per step; always present (a NaN value is a value)."""

    times: I64
    values: F64


@dataclass(frozen=True, eq=False)
class String:
    times: I64
    value: str


Value = StepMatrix | Scalar | String


class SeriesSource(Protocol):
    def select(
        self, matchers: Sequence[LabelMatcher], start_ms: int, end_ms: int
    ) -> Iterable[SeriesData]:
        """Every series matching all `matchers`, with its samples in [start_ms, end_ms]."""
        ...


class Backend(Protocol):
    def series_local(self, expr: Expr, times: I64, lookback_ms: int) -> StepMatrix:
        """Evaluate a series-local expression (see `is_series_local`)."""
        ...

    def partial_aggregate(self, agg: Aggregate, times: I64, lookback_ms: int) -> Partial:
        """The partial state of a pushable aggregation (see `is_pushable`)."""
        ...


class MemorySource:
    """A `SeriesSource` over series held in memory."""

    def __init__(self, series: Iterable[SeriesData]) -> None:
        self._series = list(series)

    def select(
        self, matchers: Sequence[LabelMatcher], start_ms: int, end_ms: int
    ) -> list[SeriesData]:
        out = []
        for s in self._series:
            if all(m.matches(s.labels) for m in matchers):
                a = int(np.searchsorted(s.ts, start_ms, side="left"))
                b = int(np.searchsorted(s.ts, end_ms, side="right"))
                out.append(SeriesData(s.labels, s.ts[a:b], s.vals[a:b]))
        return out


class LocalBackend:
    """Evaluates series-local subtrees and partial aggregations in-process over one source."""

    def __init__(self, source: SeriesSource) -> None:
        self.source = source

    def series_local(self, expr: Expr, times: I64, lookback_ms: int) -> StepMatrix:
        return eval_series_local(expr, self.source, times, lookback_ms)

    def partial_aggregate(self, agg: Aggregate, times: I64, lookback_ms: int) -> Partial:
        return eval_partial(agg, self.source, times, lookback_ms)


# ---------------------------------------------------------------------------- classification


def _const_value(expr: Expr) -> float | None:
    """The value of an expression made of number literals only, else None."""
    match expr:
        case NumberLiteral(value=v):
            return v
        case Unary(expr=inner):
            v = _const_value(inner)
            return None if v is None else -v
        case Binary(op=op, lhs=lhs, rhs=rhs) if op not in SET_OPS:
            a, b = _const_value(lhs), _const_value(rhs)
            if a is None or b is None:
                return None
            return float(_scalar_binop(op, np.array([a]), np.array([b]))[0])
    return None


def is_series_local(expr: Expr) -> bool:
    """Whether each series' result depends on that series alone (so nodes can evaluate their
    own series and the caller concatenates the results)."""
    match expr:
        case VectorSelector():
            return True
        case Call(func=func, args=args) if func in RANGE_FUNCTIONS:
            return isinstance(args[0], MatrixSelector)
        case Call(func=func, args=args) if func in MATH_FUNCTIONS:
            bound_ok = len(args) == 1 or _const_value(args[1]) is not None
            return bound_ok and is_series_local(args[0])
        case Unary(expr=inner):
            return is_series_local(inner)
        case Binary(op=op, lhs=lhs, rhs=rhs) if op in ARITHMETIC_OPS | COMPARISON_OPS:
            if _const_value(rhs) is not None:
                return is_series_local(lhs)
            return _const_value(lhs) is not None and is_series_local(rhs)
    return False


def is_pushable(expr: Expr) -> bool:
    """Whether `expr` is an aggregation that nodes can pre-aggregate into a `Partial`."""
    return (
        isinstance(expr, Aggregate)
        and expr.op in agg_mod.PUSHABLE_OPS
        and expr.param is None
        and is_series_local(expr.expr)
    )


# ----------------------------------------------------------------------------- matrix helpers


def _fmt_labels(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


def _execution(message: str) -> QueryError:
    return QueryError("execution", message)


def _dedupe(m: StepMatrix) -> StepMatrix:
    """Merge rows with equal label sets; an error if two have a value at the same step."""
    groups, ids = agg_mod.distinct(m.labels)
    if len(groups) == len(m.labels):
        return m
    present = np.zeros((len(groups), len(m.times)), np.int64)
    np.add.at(present, ids, ~np.isnan(m.values))
    clash = np.argwhere(present > 1)
    if len(clash):
        raise _execution(
            "vector cannot contain metrics with the same labelset: "
            + _fmt_labels(groups[int(clash[0][0])])
        )
    merged = np.full((len(groups), len(m.times)), np.nan)
    np.fmax.at(merged, ids, m.values)  # at most one non-NaN per cell
    return StepMatrix(m.times, groups, merged)


def _drop_name(m: StepMatrix) -> StepMatrix:
    if not any("__name__" in lab for lab in m.labels):
        return m
    labels = [{k: v for k, v in lab.items() if k != "__name__"} for lab in m.labels]
    return _dedupe(StepMatrix(m.times, labels, m.values))


def _finalize(m: StepMatrix, order_by_value: str | None = None) -> StepMatrix:
    """Drop series without any value; order by label set (or by value, for instant topk)."""
    keep = [i for i in range(len(m.labels)) if not np.isnan(m.values[i]).all()]
    if order_by_value is None:
        keep.sort(key=lambda i: label_key(m.labels[i]))
    else:
        sign = -1.0 if order_by_value == "desc" else 1.0
        keep.sort(key=lambda i: (sign * float(np.nanmax(m.values[i])), label_key(m.labels[i])))
    rows = np.array(keep, dtype=np.int64)
    return StepMatrix(
        m.times, [m.labels[i] for i in keep], m.values[rows].reshape(-1, len(m.times))
    )


def concat_matrices(parts: Sequence[StepMatrix]) -> StepMatrix:
    """Combine series-local results of disjoint sets of series (e.g. from several nodes)."""
    if not parts:
        raise ValueError("concat_matrices needs at least one matrix")
    times = parts[0].times
    if any(not np.array_equal(p.times, times) for p in parts):
        raise ValueError("can only concatenate matrices of the same steps")
    labels = [lab for p in parts for lab in p.labels]
    values = np.concatenate([p.values for p in parts]).reshape(-1, len(times))
    return _finalize(_dedupe(StepMatrix(times, labels, values)))


def partial_from_matrix(agg: Aggregate, m: StepMatrix) -> Partial:
    """The partial state of `agg` over an already evaluated inner vector (groups with no value
    at any step are left out)."""
    p = agg_mod.partial_of(agg.op, m.times, m.labels, m.values, agg.grouping, agg.without)
    live = np.flatnonzero(p.counts.any(axis=1))
    if len(live) == len(p.labels):
        return p
    return Partial(p.op, p.times, [p.labels[i] for i in live], p.values[live], p.counts[live])


def merge_partials(parts: Sequence[Partial]) -> Partial:
    """Merge partial states of one aggregation (any order, any grouping of the inputs)."""
    return agg_mod.merge(parts)


def finish(partial: Partial) -> StepMatrix:
    """The aggregation result of a (merged) partial state."""
    values = agg_mod.finish_values(partial)
    return _finalize(StepMatrix(partial.times, list(partial.labels), values))


# ------------------------------------------------------------------------------ binary operators


def _arith(op: str, a: F64, b: F64) -> F64:
    with np.errstate(all="ignore"):
        match op:
            case "+":
                return a + b
            case "-":
                return a - b
            case "*":
                return a * b
            case "/":
                return a / b
            case "%":
                return np.fmod(a, b)  # Go's math.Mod: the sign of the dividend
            case "^":
                return np.power(a, b)
    raise ValueError(f"not an arithmetic operator: {op}")


def _compare(op: str, a: F64, b: F64) -> npt.NDArray[np.bool_]:
    with np.errstate(invalid="ignore"):
        match op:
            case "==":
                return a == b
            case "!=":
                return a != b
            case ">":
                return a > b
            case "<":
                return a < b
            case ">=":
                return a >= b
            case "<=":
                return a <= b
    raise ValueError(f"not a comparison operator: {op}")


def _scalar_binop(op: str, a: F64, b: F64) -> F64:
    if op in ARITHMETIC_OPS:
        return _arith(op, a, b)
    return _compare(op, a, b).astype(np.float64)  # the parser requires `bool` here


def _vector_scalar(op: str, vec: StepMatrix, s: F64, swap: bool, return_bool: bool) -> StepMatrix:
    lv = vec.values
    present = ~np.isnan(lv)
    a, b = (s[None, :], lv) if swap else (lv, s[None, :])
    if op in ARITHMETIC_OPS:
        values = np.where(present, _arith(op, a, b), np.nan)
        return _drop_name(StepMatrix(vec.times, vec.labels, values))
    hit = _compare(op, a, b)
    if return_bool:
        values = np.where(present, hit.astype(np.float64), np.nan)
        return _drop_name(StepMatrix(vec.times, vec.labels, values))
    return StepMatrix(vec.times, vec.labels, np.where(hit & present, lv, np.nan))


def _signature(labels: Mapping[str, str], matching: VectorMatching) -> tuple[tuple[str, str], ...]:
    """The labels two series must agree on to match (ignoring always ignores the name)."""
    if matching.on:
        wanted = set(matching.labels)
        return tuple(sorted((k, v) for k, v in labels.items() if k in wanted))
    ignored = {*matching.labels, "__name__"}
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ignored))


def _result_labels(
    many: Mapping[str, str], one: Mapping[str, str], op: str, m: VectorMatching, return_bool: bool
) -> dict[str, str]:
    """Prometheus's resultMetric: the labels of a matched pair's output series."""
    out = dict(many)
    if op in ARITHMETIC_OPS:
        out.pop("__name__", None)
    if m.card == "one-to-one":
        if m.on:
            out = {k: v for k, v in out.items() if k in m.labels}
        else:
            for k in m.labels:
                out.pop(k, None)
    for k in m.include:
        if one.get(k, ""):
            out[k] = one[k]
        else:
            out.pop(k, None)
    if return_bool:
        out.pop("__name__", None)
    return out


def _set_op(op: str, lhs: StepMatrix, rhs: StepMatrix, m: VectorMatching) -> StepMatrix:
    """and/or/unless: per step, keep series by whether the other side has their signature."""
    sigs, ids = agg_mod.distinct([dict(_signature(lab, m)) for lab in lhs.labels + rhs.labels])
    lid, rid = ids[: len(lhs)], ids[len(lhs) :]
    n = len(lhs.times)
    r_has = np.zeros((len(sigs), n), bool)
    np.logical_or.at(r_has, rid, ~np.isnan(rhs.values))
    if op == "and":
        return StepMatrix(lhs.times, lhs.labels, np.where(r_has[lid], lhs.values, np.nan))
    if op == "unless":
        return StepMatrix(lhs.times, lhs.labels, np.where(r_has[lid], np.nan, lhs.values))
    l_has = np.zeros((len(sigs), n), bool)
    np.logical_or.at(l_has, lid, ~np.isnan(lhs.values))
    extra = np.where(l_has[rid], np.nan, rhs.values)
    values = np.concatenate([lhs.values, extra]).reshape(-1, n)
    return _dedupe(StepMatrix(lhs.times, lhs.labels + rhs.labels, values))


def _vector_vector(
    op: str, lhs: StepMatrix, rhs: StepMatrix, m: VectorMatching, return_bool: bool
) -> StepMatrix:
    """One-to-one and many-to-one/one-to-many matching, step by step as Prometheus does it,
    but vectorised over steps: pairs of series with equal signatures are formed once."""
    times = lhs.times
    swapped = m.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    if len(many) == 0 or len(one) == 0:
        return StepMatrix.empty(times)
    many_has, one_has = ~np.isnan(many.values), ~np.isnan(one.values)
    # Prometheus skips a step entirely when either side is empty there.
    active = many_has.any(axis=0) & one_has.any(axis=0)

    sigs, ids = agg_mod.distinct([dict(_signature(lab, m)) for lab in many.labels + one.labels])
    many_sig, one_sig = ids[: len(many)], ids[len(many) :]
    one_count = np.zeros((len(sigs), len(times)), np.int64)
    np.add.at(one_count, one_sig, one_has)
    dup = np.argwhere((one_count > 1) & active[None, :])
    if len(dup):
        s, j = int(dup[0][0]), int(dup[0][1])
        rows = [r for r in range(len(one)) if one_sig[r] == s and one_has[r, j]][:2]
        side = "left" if swapped else "right"
        raise _execution(
            f"found duplicate series for the match group {_fmt_labels(sigs[s])} on the {side} "
            f"hand-side of the operation: [{_fmt_labels(one.labels[rows[0]])}, "
            f"{_fmt_labels(one.labels[rows[1]])}];many-to-many matching not allowed: matching "
            "labels must be unique on one side"
        )

    one_rows: dict[int, list[int]] = {}
    for r, s in enumerate(one_sig.tolist()):
        one_rows.setdefault(s, []).append(r)
    pairs = [(i, r) for i, s in enumerate(many_sig.tolist()) for r in one_rows.get(s, ())]
    if not pairs:
        return StepMatrix.empty(times)
    pi = np.array([p[0] for p in pairs], dtype=np.int64)
    pr = np.array([p[1] for p in pairs], dtype=np.int64)
    mv, ov = many.values[pi], one.values[pr]
    valid = ~np.isnan(mv) & ~np.isnan(ov)  # the one side is unique wherever both are present
    left, right = (ov, mv) if swapped else (mv, ov)
    if op in ARITHMETIC_OPS:
        keep = valid
        values = np.where(valid, _arith(op, left, right), np.nan)
    elif return_bool:
        keep = valid
        values = np.where(valid, _compare(op, left, right).astype(np.float64), np.nan)
    else:  # a filter keeps the left operand's value (the "one" side's, for group_right)
        keep = _compare(op, left, right) & valid
        values = np.where(keep, left, np.nan)
    labels = [_result_labels(many.labels[i], one.labels[r], op, m, return_bool) for i, r in pairs]

    if m.card == "one-to-one":
        matched = np.zeros((len(sigs), len(times)), np.int64)
        np.add.at(matched, many_sig[pi], keep)
        if (matched > 1).any():
            raise _execution(
                "multiple matches for labels: many-to-one matching must be explicit "
                "(group_left/group_right)"
            )
    else:
        index: dict[tuple[int, LabelKey], int] = {}
        out_ids = np.array(
            [
                index.setdefault((int(many_sig[i]), label_key(lab)), len(index))
                for (i, _), lab in zip(pairs, labels, strict=True)
            ],
            dtype=np.int64,
        )
        matched = np.zeros((len(index), len(times)), np.int64)
        np.add.at(matched, out_ids, keep)
        if (matched > 1).any():
            raise _execution(
                "multiple matches for labels: grouping labels must ensure unique results"
            )
    return _dedupe(StepMatrix(times, labels, values))


# ---------------------------------------------------------------------------------- evaluation


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
                batch = self._load(expr, self.lookback_ms)
                values = fn.instant_values(batch, self.times, expr.offset_ms, self.lookback_ms)
                return StepMatrix(self.times, batch.labels, values)
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
                return _drop_name(StepMatrix(self.times, v.labels, -v.values))
        raise QueryError("unsupported", f"unsupported: expression {expr!r}")

    def _load(self, sel: VectorSelector, width_ms: int) -> fn.SampleBatch:
        """One `select` covering every window of `sel` over all steps."""
        if self.source is None:
            raise RuntimeError("raw samples are only read by a node's evaluator (no source)")
        lower = int(self.times.min()) - sel.offset_ms - width_ms
        upper = int(self.times.max()) - sel.offset_ms
        series = self.source.select(sel.matchers, lower + 1, upper)  # windows are left-open
        return fn.SampleBatch.from_series(series, lower + 1, upper)

    def _call(self, call: Call) -> Value:
        func, args = call.func, call.args
        if func in RANGE_FUNCTIONS:
            ms = args[0]
            assert isinstance(ms, MatrixSelector)
            batch = self._load(ms.selector, ms.range_ms)
            values = fn.range_function(func, batch, self.times, ms.range_ms, ms.selector.offset_ms)
            out = StepMatrix(self.times, batch.labels, values)
            return out if func == "last_over_time" else _drop_name(out)
        if func in MATH_FUNCTIONS:
            v = self.vector(args[0])
            bound = self.scalar(args[1]).values if len(args) > 1 else None
            return _drop_name(
                StepMatrix(self.times, v.labels, fn.math_function(func, v.values, bound))
            )
        if func == "time":
            return Scalar(self.times, self.times / 1000.0)
        if func == "vector":
            s = self.scalar(args[0])
            return StepMatrix(self.times, [{}], s.values.reshape(1, -1).copy())
        if func == "scalar":
            v = self.vector(args[0])
            has = ~np.isnan(v.values)
            single = has.sum(axis=0) == 1
            if len(v) == 0:
                return Scalar(self.times, np.full(len(self.times), np.nan))
            picked = np.fmax.reduce(v.values, axis=0)
            return Scalar(self.times, np.where(single, picked, np.nan))
        raise QueryError("unsupported", f"unsupported: function '{func}'")

    def _aggregate(self, agg: Aggregate) -> StepMatrix:
        inner = self.vector(agg.expr)
        if agg.op in ("topk", "bottomk"):
            assert agg.param is not None
            k_raw = self.scalar(agg.param).values
            bad = ~np.isfinite(k_raw) | (np.abs(k_raw) >= 2.0**63)
            if bad.any():
                raise _execution(f"Scalar value {k_raw[bad][0]} overflows int64")
            k = np.trunc(k_raw).astype(np.int64)
            values = agg_mod.select_k(
                inner.labels, inner.values, k, agg.grouping, agg.without, agg.op == "bottomk"
            )
            return StepMatrix(self.times, inner.labels, values)
        if agg.op not in agg_mod.PUSHABLE_OPS or agg.param is not None:
            raise QueryError("unsupported", f"unsupported: aggregation '{agg.op}'")
        return finish(partial_from_matrix(agg, inner))

    def _binary(self, b: Binary) -> Value:
        lhs, rhs = self.eval(b.lhs), self.eval(b.rhs)
        if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
            return Scalar(self.times, _scalar_binop(b.op, lhs.values, rhs.values))
        if isinstance(lhs, StepMatrix) and isinstance(rhs, Scalar):
            return _vector_scalar(b.op, lhs, rhs.values, False, b.return_bool)
        if isinstance(lhs, Scalar) and isinstance(rhs, StepMatrix):
            return _vector_scalar(b.op, rhs, lhs.values, True, b.return_bool)
        assert isinstance(lhs, StepMatrix) and isinstance(rhs, StepMatrix)
        if b.op in SET_OPS:
            return _set_op(b.op, lhs, rhs, b.matching)
        return _vector_vector(b.op, lhs, rhs, b.matching, b.return_bool)


def eval_series_local(
    expr: Expr, source: SeriesSource, times: npt.ArrayLike, lookback_ms: int = DEFAULT_LOOKBACK_MS
) -> StepMatrix:
    """Evaluate a series-local expression over `source` (on the node that holds the series)."""
    if not is_series_local(expr):
        raise ValueError(f"not a series-local expression: {expr!r}")
    result = _Evaluator(_as_times(times), lookback_ms, source=source).vector(expr)
    return _finalize(result)


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
    result = _Evaluator(ts, lookback_ms, backend=backend).eval(expr)
    if not isinstance(result, StepMatrix):
        return result
    order = None
    if isinstance(expr, Aggregate) and expr.op in ("topk", "bottomk") and len(ts) == 1:
        order = "desc" if expr.op == "topk" else "asc"
    return _finalize(result, order)

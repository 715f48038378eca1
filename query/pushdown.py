"""Pushdown: which subtrees of a query the nodes holding the data evaluate, and how the caller
combines what they return.

Its own module because it is the contract between the caller's evaluator and the nodes: the
evaluator never reads raw samples and hands two kinds of subtrees to a `Backend`, which may run
them on the nodes that hold the series:

* series-local expressions (`is_series_local`): a series' result depends on that series alone
  (selectors, range functions, math and date functions, `timestamp`, label_replace/label_join,
  sort, arithmetic/comparison with number literals), so each node evaluates its own series and
  the results are concatenated (`concat_matrices`, which also merges or rejects label sets that
  became equal on different nodes);
* pushable aggregations (`is_pushable`): sum/min/max/count/avg/group/stddev/stdvar of a
  series-local expression, which each node folds into a mergeable `Partial` per output group
  (`partial_from_matrix`), merged by the caller (`merge_partials`) and turned into the result
  (`finish`).

absent(v) and absent_over_time(m) only need to know whether anything is there: they are
evaluated from `absent_count` (count(v), count(present_over_time(m))), usually pushable.
Everything else (vector matching, topk/bottomk, quantile, count_values, histogram_quantile,
scalars, aggregations of non-local expressions) runs at the caller on the step matrices the
backend returns.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from query import aggregate as agg_mod
from query.aggregate import Partial
from query.binary import scalar_binop
from query.promql import (
    ARITHMETIC_OPS,
    COMPARISON_OPS,
    DATE_FUNCTIONS,
    LABEL_FUNCTIONS,
    MATH_FUNCTIONS,
    RANGE_FUNCTIONS,
    SET_OPS,
    Aggregate,
    Binary,
    Call,
    Expr,
    MatrixSelector,
    NumberLiteral,
    Unary,
    VectorSelector,
)
from query.values import I64, SeriesData, StepMatrix, dedupe_keyed, finalize

__all__ = [
    "Backend",
    "absent_count",
    "concat_matrices",
    "finish",
    "is_pushable",
    "is_series_local",
    "merge_partials",
    "partial_from_matrix",
]


class Backend(Protocol):
    def series_local(self, expr: Expr, times: I64, lookback_ms: int) -> StepMatrix:
        """Evaluate a series-local expression (see `is_series_local`)."""
        ...

    def partial_aggregate(self, agg: Aggregate, times: I64, lookback_ms: int) -> Partial:
        """The partial state of a pushable aggregation (see `is_pushable`)."""
        ...

    def raw(self, sel: VectorSelector, start_ms: int, end_ms: int) -> list[SeriesData]:
        """The samples in [start_ms, end_ms] of every series `sel` selects."""
        ...


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
            return float(scalar_binop(op, np.array([a]), np.array([b]))[0])
    return None


def is_series_local(expr: Expr) -> bool:
    """Whether each series' result depends on that series alone (so nodes can evaluate their
    own series and the caller concatenates the results)."""
    match expr:
        case VectorSelector():
            return True
        case Call(func=func, args=args) if func in RANGE_FUNCTIONS:
            # The parser admits only a range selector and a constant parameter.
            return all(isinstance(a, MatrixSelector) or _const_value(a) is not None for a in args)
        case Call(func=func, args=args) if func in MATH_FUNCTIONS:
            params_ok = all(_const_value(a) is not None for a in args[1:])
            return params_ok and is_series_local(args[0])
        case Call(func=func, args=(inner, *_)) if func in LABEL_FUNCTIONS:
            return is_series_local(inner)
        case Call(func=func, args=(inner,)) if func in DATE_FUNCTIONS:
            return is_series_local(inner)
        case Call(func="timestamp" | "sort" | "sort_desc", args=(inner,)):
            return is_series_local(inner)
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


@functools.lru_cache(maxsize=1024)
def absent_count(call: Call) -> Aggregate:
    """What absent(v) / absent_over_time(m) evaluate: count(v) / count(present_over_time(m)),
    present at the steps where something is. One object per call (cached), so the caller can
    prefetch it with the query's other node parts and find it again by identity."""
    inner = call.args[0]
    if call.func == "absent_over_time":
        inner = Call("present_over_time", (inner,))
    return Aggregate("count", inner)


# ------------------------------------------------------------------------ combining the parts


def concat_matrices(parts: Sequence[StepMatrix]) -> StepMatrix:
    """Combine series-local results of disjoint sets of series (e.g. from several nodes)."""
    if not parts:
        raise ValueError("concat_matrices needs at least one matrix")
    times = parts[0].times
    if any(not np.array_equal(p.times, times) for p in parts):
        raise ValueError("can only concatenate matrices of the same steps")
    labels = [lab for p in parts for lab in p.labels]
    values = np.concatenate([p.values for p in parts]).reshape(-1, len(times))
    present = np.concatenate([p.present for p in parts]).reshape(-1, len(times))
    merged, keys = dedupe_keyed(StepMatrix(times, labels, values, present))
    return finalize(merged, keys=keys)


def partial_from_matrix(agg: Aggregate, m: StepMatrix) -> Partial:
    """The partial state of `agg` over an already evaluated inner vector (groups with no value
    at any step are left out)."""
    p = agg_mod.partial_of(
        agg.op, m.times, m.labels, m.values, m.present, agg.grouping, agg.without
    )
    live = np.flatnonzero(p.counts.any(axis=1))
    return p if len(live) == len(p.labels) else p.rows(live)


def merge_partials(parts: Sequence[Partial]) -> Partial:
    """Merge partial states of one aggregation (any order, any grouping of the inputs)."""
    return agg_mod.merge(parts)


def finish(partial: Partial) -> StepMatrix:
    """The aggregation result of a (merged) partial state."""
    values = agg_mod.finish_values(partial)
    present = partial.counts > 0
    m = StepMatrix(partial.times, list(partial.labels), values, present)
    return finalize(m, keys=partial.keys)

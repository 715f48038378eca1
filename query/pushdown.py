"""Pushdown: which subtrees of a query the nodes holding the data evaluate, and how the caller
combines what they return.

Its own module because it is the contract between the caller's evaluator and the nodes: the
evaluator never reads raw samples and hands two kinds of subtrees to a `Backend`, which may run
them on the nodes that hold the series:

* series-local expressions (`is_series_local`): a series' result depends on that series alone
  (selectors, range functions, math functions, arithmetic/comparison with number literals), so
  each node evaluates its own series and the results are concatenated (`concat_matrices`);
* pushable aggregations (`is_pushable`): sum/min/max/count/avg of a series-local expression, which
  each node folds into a mergeable `Partial` per output group (`partial_from_matrix`), merged by
  the caller (`merge_partials`) and turned into the result (`finish`).

Everything else (vector matching, topk/bottomk, scalars, aggregations of non-local expressions)
runs at the caller on the step matrices the backend returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from query import aggregate as agg_mod
from query.aggregate import Partial
from query.binary import scalar_binop
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
    Unary,
    VectorSelector,
)
from query.values import I64, StepMatrix, dedupe, finalize

__all__ = [
    "Backend",
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
    return finalize(dedupe(StepMatrix(times, labels, values)))


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
    return finalize(StepMatrix(partial.times, list(partial.labels), values))

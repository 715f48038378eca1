"""PromQL binary operators on step matrices: arithmetic, comparisons, vector matching, set ops.

Its own module because vector matching is the one part of evaluation with rules of its own
(signatures, cardinalities, group_left/group_right, Prometheus's resultMetric and its
duplicate-match errors), and because the pushdown analysis folds constant subexpressions with
the same arithmetic (`scalar_binop`). Semantics follow Prometheus 3, vectorised over steps:

* arithmetic and `bool` comparisons drop `__name__`; filtering comparisons keep it;
* NaN is a value: 0/0, Inf-Inf and NaN scalars applied to vectors give NaN samples; a
  comparison with NaN is false, so a filter drops it and `bool` gives 0;
* a step where either side of a vector/vector operation is empty is skipped, as Prometheus does;
  a match group with several series on the "one" side is an "execution" error.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from query import aggregate as agg_mod
from query.aggregate import LabelKey, label_key
from query.promql import ARITHMETIC_OPS, VectorMatching
from query.values import F64, StepMatrix, dedupe, drop_name, execution_error, fmt_labels

__all__ = ["scalar_binop", "set_op", "vector_scalar", "vector_vector"]


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
            case "atan2":
                return np.arctan2(a, b)
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


def scalar_binop(op: str, a: F64, b: F64) -> F64:
    if op in ARITHMETIC_OPS:
        return _arith(op, a, b)
    return _compare(op, a, b).astype(np.float64)  # the parser requires `bool` here


def vector_scalar(op: str, vec: StepMatrix, s: F64, swap: bool, return_bool: bool) -> StepMatrix:
    lv = vec.values
    a, b = (s[None, :], lv) if swap else (lv, s[None, :])
    if op in ARITHMETIC_OPS:
        return drop_name(vec.with_values(_arith(op, a, b)))
    hit = _compare(op, a, b)
    if return_bool:
        return drop_name(vec.with_values(hit.astype(np.float64)))
    return StepMatrix(vec.times, vec.labels, lv, hit & vec.present)


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


def set_op(op: str, lhs: StepMatrix, rhs: StepMatrix, m: VectorMatching) -> StepMatrix:
    """and/or/unless: per step, keep series by whether the other side has their signature."""
    sigs, ids = agg_mod.distinct([dict(_signature(lab, m)) for lab in lhs.labels + rhs.labels])
    lid, rid = ids[: len(lhs)], ids[len(lhs) :]
    n = len(lhs.times)
    r_has = np.zeros((len(sigs), n), bool)
    np.logical_or.at(r_has, rid, rhs.present)
    if op == "and":
        return StepMatrix(lhs.times, lhs.labels, lhs.values, lhs.present & r_has[lid])
    if op == "unless":
        return StepMatrix(lhs.times, lhs.labels, lhs.values, lhs.present & ~r_has[lid])
    l_has = np.zeros((len(sigs), n), bool)
    np.logical_or.at(l_has, lid, lhs.present)
    values = np.concatenate([lhs.values, rhs.values]).reshape(-1, n)
    present = np.concatenate([lhs.present, rhs.present & ~l_has[rid]]).reshape(-1, n)
    return dedupe(StepMatrix(lhs.times, lhs.labels + rhs.labels, values, present))


def vector_vector(
    op: str, lhs: StepMatrix, rhs: StepMatrix, m: VectorMatching, return_bool: bool
) -> StepMatrix:
    """One-to-one and many-to-one/one-to-many matching, step by step as Prometheus does it,
    but vectorised over steps: pairs of series with equal signatures are formed once."""
    times = lhs.times
    swapped = m.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    if len(many) == 0 or len(one) == 0:
        return StepMatrix.empty(times)
    many_has, one_has = many.present, one.present
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
        raise execution_error(
            f"found duplicate series for the match group {fmt_labels(sigs[s])} on the {side} "
            f"hand-side of the operation: [{fmt_labels(one.labels[rows[0]])}, "
            f"{fmt_labels(one.labels[rows[1]])}];many-to-many matching not allowed: matching "
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
    valid = many_has[pi] & one_has[pr]  # the one side is unique wherever both are present
    left, right = (ov, mv) if swapped else (mv, ov)
    if op in ARITHMETIC_OPS:
        keep = valid
        values = _arith(op, left, right)
    elif return_bool:
        keep = valid
        values = _compare(op, left, right).astype(np.float64)
    else:  # a filter keeps the left operand's value (the "one" side's, for group_right)
        keep = _compare(op, left, right) & valid
        values = left
    labels = [_result_labels(many.labels[i], one.labels[r], op, m, return_bool) for i, r in pairs]

    if m.card == "one-to-one":
        matched = np.zeros((len(sigs), len(times)), np.int64)
        np.add.at(matched, many_sig[pi], keep)
        if (matched > 1).any():
            raise execution_error(
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
            raise execution_error(
                "multiple matches for labels: grouping labels must ensure unique results"
            )
    return dedupe(StepMatrix(times, labels, values, keep))

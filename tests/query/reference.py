"""A deliberately naive PromQL evaluator, used as the oracle for the engine's tests.

It shares nothing with the engine (query/evaluator.py and the modules it uses) but the AST:
every step is evaluated on its own, straight from the Prometheus definitions (engine.go /
functions.go), with Python loops over all samples.
An instant vector is a list of (labels, value). It follows the same documented conventions as
the engine: left-open windows, NaN a value like any other (stored, returned, propagated; ordered
before every number by sorts, after every number by topk/bottomk; skipped by min/max unless all
are NaN), the staleness marker ending a series, duplicate label sets an error only when they meet
at one step, topk/bottomk replaying Prometheus' heap over series in label order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from query.promql import (
    Aggregate,
    Binary,
    Call,
    Expr,
    MatrixSelector,
    NumberLiteral,
    StringLiteral,
    Unary,
    VectorMatching,
    VectorSelector,
)

Labels = dict[str, str]
Key = tuple[tuple[str, str], ...]
Vector = list[tuple[Labels, float]]

ARITH = {"+", "-", "*", "/", "%", "^"}
COMPARE = {"==", "!=", ">", "<", ">=", "<="}


def variance(vals: Sequence[float]) -> float:
    """The population variance, from its definition."""
    mean = sum(vals) / len(vals)
    return sum((v - mean) ** 2 for v in vals) / len(vals)


STALE_BITS = 0x7FF0000000000002


def is_stale(v: float) -> bool:
    """Prometheus' staleness marker, by its bit pattern (other NaNs are values)."""
    return int(np.array([v], np.float64).view(np.uint64)[0]) == STALE_BITS


def nan_skipping(pick: object, vals: Sequence[float]) -> float:
    """min or max as Prometheus folds them: a NaN is replaced by any number that follows."""
    numbers = [v for v in vals if not math.isnan(v)]
    return pick(numbers) if numbers else math.nan  # type: ignore[operator]


def quantile(q: float, vals: Sequence[float]) -> float:
    """Prometheus' quantile: linear interpolation between the closest ranks of the sorted
    values (NaN sorts first, as Go's sort); -Inf below 0, +Inf above 1."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(vals, key=lambda v: (not math.isnan(v), v))
    rank = q * (len(ordered) - 1)
    lower = math.floor(rank)
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - lower
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def _sgn(v: float) -> float:
    return 1.0 if v > 0 else -1.0 if v < 0 else v


# Elementwise functions, from their definitions (NaN where undefined, as Go's math).
MATH = {
    "exp": lambda v: math.inf if v >= 709 else math.exp(v),
    "sqrt": lambda v: math.sqrt(v) if v >= 0 else math.nan,
    "ln": lambda v: math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan),
    "log2": lambda v: math.log2(v) if v > 0 else (-math.inf if v == 0 else math.nan),
    "log10": lambda v: math.log10(v) if v > 0 else (-math.inf if v == 0 else math.nan),
    "sgn": _sgn,
    "deg": lambda v: v * 180 / math.pi,
    "rad": lambda v: v * math.pi / 180,
    "sin": math.sin,
    "cos": math.cos,
    "atan": math.atan,
    "sinh": math.sinh,
    "tanh": math.tanh,
}


class RefError(Exception):
    """The query fails at evaluation (the engine must raise QueryError(kind="execution"))."""


def key(labels: Labels) -> Key:
    return tuple(sorted(labels.items()))


def without_name(labels: Labels) -> Labels:
    return {k: v for k, v in labels.items() if k != "__name__"}


def check_unique(vec: Vector) -> Vector:
    seen = set()
    for labels, _ in vec:
        if key(labels) in seen:
            raise RefError("vector cannot contain metrics with the same labelset")
        seen.add(key(labels))
    return vec


def present(vec: Vector) -> Vector:
    """Every element: a NaN result is a value (kept as a named step for readability)."""
    return vec


def arith(op: str, a: float, b: float) -> float:
    # NumPy float64 scalars give IEEE results (x/0 = ±Inf, 0/0 = NaN) like Go, instead of raising.
    x, y = np.float64(a), np.float64(b)
    with np.errstate(all="ignore"):
        if op == "+":
            return float(x + y)
        if op == "-":
            return float(x - y)
        if op == "*":
            return float(x * y)
        if op == "/":
            return float(x / y)
        if op == "%":
            return float(np.fmod(x, y))
        return float(np.power(x, y))


def compare(op: str, a: float, b: float) -> bool:
    return {
        "==": a == b,
        "!=": a != b,
        ">": a > b,
        "<": a < b,
        ">=": a >= b,
        "<=": a <= b,
    }[op]


class Reference:
    def __init__(
        self, series: Sequence[tuple[Labels, Sequence[tuple[int, float]]]], lookback_ms: int
    ):
        self.series = [
            (dict(labels), [(int(t), float(v)) for t, v in samples]) for labels, samples in series
        ]
        self.lookback_ms = lookback_ms

    # ------------------------------------------------------------------------------- entry

    def evaluate(self, expr: Expr, times: Sequence[int]) -> object:
        """A dict {label key: {t: value}} for vectors, a list of values for scalars, or str."""
        if isinstance(expr, StringLiteral):
            return expr.value
        rows: dict[Key, dict[int, float]] = {}
        scalars: list[float] = []
        for t in times:
            out = self.eval(expr, t)
            if isinstance(out, float):
                scalars.append(out)
                continue
            for labels, v in out:
                rows.setdefault(key(labels), {})
                if t in rows[key(labels)]:
                    raise RefError("vector cannot contain metrics with the same labelset")
                rows[key(labels)][t] = v
        return scalars if scalars else rows

    def instant_order(self, expr: Expr, t: int) -> list[Key]:
        """The order of an instant query's series."""
        vec = self.eval(expr, t)
        assert isinstance(vec, list)
        if isinstance(expr, Aggregate) and expr.op in ("topk", "bottomk"):
            return [key(lb) for lb, _ in vec]  # aggregate() gives Prometheus' order
        return sorted(key(lb) for lb, _ in vec)

    # ------------------------------------------------------------------------------ nodes

    def eval(self, expr: Expr, t: int) -> float | Vector:
        if isinstance(expr, NumberLiteral):
            return expr.value
        if isinstance(expr, VectorSelector):
            return self.select_instant(expr, t)
        if isinstance(expr, Unary):
            inner = self.eval(expr.expr, t)
            if isinstance(inner, float):
                return -inner
            return check_unique([(without_name(lb), -v) for lb, v in inner])
        if isinstance(expr, Call):
            return self.call(expr, t)
        if isinstance(expr, Aggregate):
            return self.aggregate(expr, t)
        if isinstance(expr, Binary):
            return self.binary(expr, t)
        raise AssertionError(f"reference cannot evaluate {expr!r}")

    def matching_series(self, sel: VectorSelector) -> list[tuple[Labels, list[tuple[int, float]]]]:
        return [(lb, s) for lb, s in self.series if all(m.matches(lb) for m in sel.matchers)]

    def select_instant(self, sel: VectorSelector, t: int) -> Vector:
        out = []
        end = t - sel.offset_ms
        for labels, samples in self.matching_series(sel):
            latest = None
            for ts, v in samples:
                if end - self.lookback_ms < ts <= end:
                    latest = v
            if latest is not None and not is_stale(latest):
                out.append((labels, latest))
        return out

    def select_range(self, ms: MatrixSelector, t: int) -> list[tuple[Labels, list]]:
        end = t - ms.selector.offset_ms
        out = []
        for labels, samples in self.matching_series(ms.selector):
            window = [
                (ts, v) for ts, v in samples if end - ms.range_ms < ts <= end and not is_stale(v)
            ]
            if window:
                out.append((labels, window))
        return out

    def call(self, call: Call, t: int) -> float | Vector:
        f = call.func
        if f == "time":
            return t / 1000.0
        if f == "vector":
            s = self.eval(call.args[0], t)
            assert isinstance(s, float)
            return present([({}, s)])
        if f == "scalar":
            vec = self.eval(call.args[0], t)
            assert isinstance(vec, list)
            return vec[0][1] if len(vec) == 1 else math.nan
        matrix = [a for a in call.args if isinstance(a, MatrixSelector)]
        if matrix:
            ms = matrix[0]
            params = [a for a in call.args if a is not ms]
            q = self.eval(params[0], t) if params else math.nan
            assert isinstance(q, float)
            out = []
            for labels, window in self.select_range(ms, t):
                v = self.range_function(f, window, t - ms.selector.offset_ms, ms.range_ms, q)
                if v is not None:
                    out.append((labels if f == "last_over_time" else without_name(labels), v))
            return check_unique(present(out))
        vec = self.eval(call.args[0], t)
        assert isinstance(vec, list)
        bound = self.eval(call.args[1], t) if len(call.args) > 1 else math.nan
        out = []
        for labels, v in vec:
            if f == "abs":
                r = abs(v)
            elif f in ("ceil", "floor", "round"):
                if math.isinf(v) or math.isnan(v):
                    r = v
                elif f == "ceil":
                    r = float(math.ceil(v))
                elif f == "floor":
                    r = float(math.floor(v))
                else:
                    r = float(math.floor(v + 0.5))
            elif f == "clamp_min":
                r = math.nan if math.isnan(bound) else max(v, bound)
            elif f == "clamp_max":
                r = math.nan if math.isnan(bound) else min(v, bound)
            elif f in MATH:
                r = MATH[f](v)
            else:
                raise AssertionError(f)
            out.append((without_name(labels), r))
        return check_unique(present(out))

    @staticmethod
    def range_function(
        f: str, window: list[tuple[int, float]], end: int, range_ms: int, q: float = math.nan
    ) -> float | None:
        vals = [v for _, v in window]
        if f == "present_over_time":
            return 1.0
        if f in ("stddev_over_time", "stdvar_over_time"):
            var = variance(vals)
            return math.sqrt(var) if f == "stddev_over_time" else var
        if f == "quantile_over_time":
            return quantile(q, vals)
        if f == "changes":  # two NaNs in a row are no change
            return float(
                sum(
                    1
                    for a, b in itertools.pairwise(vals)
                    if a != b and not (math.isnan(a) and math.isnan(b))
                )
            )
        if f == "resets":
            return float(sum(1 for a, b in itertools.pairwise(vals) if b < a))
        if f == "count_over_time":
            return float(len(vals))
        if f == "sum_over_time":
            return float(sum(vals))
        if f == "avg_over_time":
            return float(sum(vals)) / len(vals)
        if f == "min_over_time":
            return nan_skipping(min, vals)
        if f == "max_over_time":
            return nan_skipping(max, vals)
        if f == "last_over_time":
            return vals[-1]
        if len(window) < 2:
            return None
        if f == "idelta":
            return window[-1][1] - window[-2][1]
        if f == "deriv":  # least-squares slope, per second
            xs = [ts / 1000.0 for ts, _ in window]
            mx, my = sum(xs) / len(xs), sum(vals) / len(vals)
            sxx = sum((x - mx) ** 2 for x in xs)
            return sum((x - mx) * (y - my) for x, y in zip(xs, vals, strict=True)) / sxx
        if f == "irate":
            (t0, v0), (t1, v1) = window[-2], window[-1]
            if t1 == t0:
                return None
            diff = v1 if v1 < v0 else v1 - v0
            return diff / ((t1 - t0) / 1000.0)
        # extrapolatedRate (Prometheus functions.go)
        is_counter = f in ("rate", "increase")
        is_rate = f == "rate"
        range_start, range_end = end - range_ms, end
        result = vals[-1] - vals[0]
        if is_counter:
            prev = vals[0]
            for v in vals[1:]:
                if v < prev:
                    result += prev
                prev = v
        first_t, last_t = window[0][0], window[-1][0]
        duration_to_start = (first_t - range_start) / 1000.0
        duration_to_end = (range_end - last_t) / 1000.0
        sampled = (last_t - first_t) / 1000.0
        average = sampled / (len(window) - 1)
        threshold = average * 1.1
        if duration_to_start >= threshold:
            duration_to_start = average / 2
        if is_counter and result > 0 and vals[0] >= 0:
            duration_to_zero = sampled * (vals[0] / result)
            if duration_to_zero < duration_to_start:
                duration_to_start = duration_to_zero
        if duration_to_end >= threshold:
            duration_to_end = average / 2
        factor = (sampled + duration_to_start + duration_to_end) / sampled
        if is_rate:
            factor /= range_ms / 1000.0
        return result * factor

    def aggregate(self, agg: Aggregate, t: int) -> Vector:
        vec = self.eval(agg.expr, t)
        assert isinstance(vec, list)

        def group_of(labels: Labels) -> Labels:
            if agg.without:
                return {
                    k: v for k, v in labels.items() if k not in agg.grouping and k != "__name__"
                }
            return {k: v for k, v in labels.items() if k in agg.grouping}

        groups: dict[Key, tuple[Labels, Vector]] = {}
        for labels, v in vec:
            g = group_of(labels)
            groups.setdefault(key(g), (g, []))[1].append((labels, v))
        out: Vector = []
        if agg.op in ("topk", "bottomk"):
            assert agg.param is not None
            k_value = self.eval(agg.param, t)
            assert isinstance(k_value, float)
            if math.isnan(k_value) or math.isinf(k_value):
                raise RefError(f"Scalar value {k_value} overflows int64")
            k = int(k_value)
            # Prometheus sees a selector's series in label order; groups come in the order of
            # their first series, each group's heap sorted (engine.go's aggregationK).
            in_order: dict[Key, Vector] = {}
            for labels, v in sorted(vec, key=lambda e: key(e[0])):
                in_order.setdefault(key(group_of(labels)), []).append((labels, v))
            for members in in_order.values():
                heap = _go_heap_k(members, k, agg.op == "bottomk")
                out.extend(_go_sort_reverse(heap, agg.op == "bottomk"))
            return out
        for g, members in groups.values():
            vals = [v for _, v in members]
            if agg.op == "sum":
                r = float(sum(vals))
            elif agg.op == "avg":
                r = float(sum(vals)) / len(vals)
            elif agg.op == "count":
                r = float(len(vals))
            elif agg.op == "min":
                r = nan_skipping(min, vals)
            elif agg.op == "max":
                r = nan_skipping(max, vals)
            elif agg.op == "group":
                r = 1.0
            elif agg.op in ("stddev", "stdvar"):
                r = variance(vals)
                r = math.sqrt(r) if agg.op == "stddev" else r
            elif agg.op == "quantile":
                assert agg.param is not None
                q = self.eval(agg.param, t)
                assert isinstance(q, float)
                r = quantile(q, vals)
            else:
                raise AssertionError(agg.op)
            out.append((g, r))
        return present(out)

    # -------------------------------------------------------------------------- binary ops

    def binary(self, b: Binary, t: int) -> float | Vector:
        lhs, rhs = self.eval(b.lhs, t), self.eval(b.rhs, t)
        if isinstance(lhs, float) and isinstance(rhs, float):
            if b.op in ARITH:
                return arith(b.op, lhs, rhs)
            return 1.0 if compare(b.op, lhs, rhs) else 0.0
        if isinstance(lhs, float) or isinstance(rhs, float):
            return self.vector_scalar(b, lhs, rhs)
        assert isinstance(lhs, list) and isinstance(rhs, list)
        if b.op in ("and", "or", "unless"):
            return self.set_op(b, lhs, rhs)
        return self.vector_vector(b, lhs, rhs)

    @staticmethod
    def vector_scalar(b: Binary, lhs: float | Vector, rhs: float | Vector) -> Vector:
        swap = isinstance(lhs, float)
        vec = rhs if swap else lhs
        s = lhs if swap else rhs
        assert isinstance(vec, list) and isinstance(s, float)
        out = []
        drop = b.op in ARITH or b.return_bool
        for labels, v in vec:
            x, y = (s, v) if swap else (v, s)
            if b.op in ARITH:
                r, keep = arith(b.op, x, y), True
            else:
                keep = compare(b.op, x, y)
                r = v
                if b.return_bool:
                    r, keep = (1.0 if keep else 0.0), True
            if keep:
                out.append((without_name(labels) if drop else labels, r))
        out = present(out)
        return check_unique(out) if drop else out

    @staticmethod
    def signature(labels: Labels, m: VectorMatching) -> Key:
        if m.on:
            return key({k: v for k, v in labels.items() if k in m.labels})
        return key({k: v for k, v in labels.items() if k not in m.labels and k != "__name__"})

    def set_op(self, b: Binary, lhs: Vector, rhs: Vector) -> Vector:
        m = b.matching
        rsigs = {self.signature(lb, m) for lb, _ in rhs}
        lsigs = {self.signature(lb, m) for lb, _ in lhs}
        if b.op == "and":
            return [(lb, v) for lb, v in lhs if self.signature(lb, m) in rsigs]
        if b.op == "unless":
            return [(lb, v) for lb, v in lhs if self.signature(lb, m) not in rsigs]
        out = list(lhs) + [(lb, v) for lb, v in rhs if self.signature(lb, m) not in lsigs]
        return check_unique(out)

    def vector_vector(self, b: Binary, lhs: Vector, rhs: Vector) -> Vector:
        """Prometheus's VectorBinop, line by line."""
        m = b.matching
        if not lhs or not rhs:
            return []
        if m.card == "one-to-many":
            lhs, rhs = rhs, lhs
        right: dict[Key, tuple[Labels, float]] = {}
        for labels, v in rhs:
            sig = self.signature(labels, m)
            if sig in right:
                raise RefError("found duplicate series for the match group")
            right[sig] = (labels, v)
        matched: dict[Key, set[Key]] = {}
        out: Vector = []
        for labels, lv in lhs:
            sig = self.signature(labels, m)
            if sig not in right:
                continue
            rlabels, rv = right[sig]
            fl, fr = (rv, lv) if m.card == "one-to-many" else (lv, rv)
            if b.op in ARITH:
                value, keep = arith(b.op, fl, fr), True
            else:
                keep = compare(b.op, fl, fr)
                value = fl
            if b.return_bool:
                value, keep = (1.0 if keep else 0.0), True
            elif not keep:
                continue
            metric = dict(labels)
            if b.op in ARITH:
                metric.pop("__name__", None)
            if m.card == "one-to-one":
                if m.on:
                    metric = {k: v for k, v in metric.items() if k in m.labels}
                else:
                    metric = {k: v for k, v in metric.items() if k not in m.labels}
            for name in m.include:
                if rlabels.get(name, ""):
                    metric[name] = rlabels[name]
                else:
                    metric.pop(name, None)
            if b.return_bool:
                metric.pop("__name__", None)
            if m.card == "one-to-one":
                if sig in matched:
                    raise RefError("multiple matches for labels: many-to-one must be explicit")
                matched[sig] = set()
            else:
                if key(metric) in matched.setdefault(sig, set()):
                    raise RefError("multiple matches for labels: grouping labels must be unique")
                matched[sig].add(key(metric))
            out.append((metric, value))
        return check_unique(present(out))


def _go_heap_k(members: Vector, k: int, bottom: bool) -> Vector:
    """topk/bottomk of one group at one step, as engine.go's aggregationK builds it with Go's
    container/heap (Push = append + up, Fix(0) = down, else up)."""
    h: Vector = []

    def less(i: int, j: int) -> bool:
        a, b = h[i][1], h[j][1]
        if math.isnan(a):
            return True
        return a > b if bottom else a < b

    def swap(i: int, j: int) -> None:
        h[i], h[j] = h[j], h[i]

    def up(j: int) -> None:
        while True:
            i = (j - 1) // 2
            if i == j or j == 0 or not less(j, i):
                return
            swap(i, j)
            j = i

    def down(i0: int) -> bool:
        i = i0
        while True:
            left = 2 * i + 1
            if left >= len(h):
                break
            j = left
            if left + 1 < len(h) and less(left + 1, left):
                j = left + 1
            if not less(j, i):
                break
            swap(i, j)
            i = j
        return i > i0

    if k < 1:
        return []
    for labels, v in members:
        if len(h) < k:
            h.append((labels, v))
            up(len(h) - 1)
            continue
        top = h[0][1]
        if (top > v if bottom else top < v) or (math.isnan(top) and not math.isnan(v)):
            h[0] = (labels, v)
            if k > 1 and not down(0):
                up(0)
    return h


def _go_sort_reverse(heap: Vector, bottom: bool) -> Vector:
    """sort.Sort(sort.Reverse(heap)) for a topk (bottomk) heap of up to 12 elements, where Go
    sorts by insertion: Reverse's Less(i, j) is the heap's Less(j, i)."""
    out = list(heap)

    def heap_less(a: float, b: float) -> bool:
        if math.isnan(a):
            return True
        return a > b if bottom else a < b

    for i in range(1, len(out)):
        j = i
        while j > 0 and heap_less(out[j - 1][1], out[j][1]):
            out[j], out[j - 1] = out[j - 1], out[j]
            j -= 1
    return out

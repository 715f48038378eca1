"""PromQL text to FiloPy's own AST, restricted to the subset FiloPy evaluates.

`promql_parser` (a Rust parser) does the parsing and type checking; its objects are converted here
into frozen dataclasses that own no foreign objects, so queries pickle cleanly across Ray
processes. Anything the parser accepts but the engine cannot evaluate is rejected at parse time
with `QueryError(kind="unsupported")` naming the construct, so callers never get half an answer.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import promql_parser as pp

from core.errors import (
    ExecutionFailed,
    FiloPyError,
    Invalid,
    Unavailable,
    Unsupported,
    category_of,
)
from store.api import LabelMatcher, MatchOp

__all__ = [
    "ARITHMETIC_OPS",
    "COMPARISON_OPS",
    "DATE_FUNCTIONS",
    "DEFAULT_SUBQUERY_STEP_MS",
    "LABEL_FUNCTIONS",
    "MATH_FUNCTIONS",
    "MAX_QUERY_DEPTH",
    "MAX_SUBQUERY_POINTS",
    "QUERY_ERROR_CATEGORIES",
    "RANGE_FUNCTIONS",
    "SET_OPS",
    "Aggregate",
    "At",
    "Binary",
    "Call",
    "Expr",
    "MatrixSelector",
    "NumberLiteral",
    "QueryError",
    "StringLiteral",
    "Subquery",
    "Unary",
    "ValueType",
    "VectorMatching",
    "VectorSelector",
    "children",
    "depth_bound",
    "format_expr",
    "is_constant",
    "parse",
    "range_args",
    "resolve_at",
    "selectors",
    "value_type",
    "walk",
]

ErrorKind = Literal["bad_data", "unsupported", "execution", "unavailable"]
ValueType = Literal["scalar", "vector", "matrix", "string"]

# Functions of one range vector, computed per series where the samples are. predict_linear and
# quantile_over_time also take a scalar, which must be constant (see `is_constant`).
RANGE_FUNCTIONS = frozenset(
    {
        "rate",
        "increase",
        "irate",
        "delta",
        "idelta",
        "sum_over_time",
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "count_over_time",
        "last_over_time",
        "present_over_time",
        "stddev_over_time",
        "stdvar_over_time",
        "quantile_over_time",
        "changes",
        "resets",
        "deriv",
        "predict_linear",
    }
)
# Elementwise functions of one instant vector (clamp_*, clamp and round take scalars as well).
MATH_FUNCTIONS = frozenset(
    {
        "abs",
        "ceil",
        "floor",
        "round",
        "clamp",
        "clamp_min",
        "clamp_max",
        "sqrt",
        "exp",
        "ln",
        "log2",
        "log10",
        "sgn",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "deg",
        "rad",
    }
)
# Calendar fields (UTC) of each value as unix seconds, or of the evaluation time without one.
DATE_FUNCTIONS = frozenset(
    {
        "minute",
        "hour",
        "day_of_week",
        "day_of_month",
        "day_of_year",
        "days_in_month",
        "month",
        "year",
    }
)
# Functions that rewrite labels, leaving values alone.
LABEL_FUNCTIONS = frozenset({"label_replace", "label_join"})
OTHER_FUNCTIONS = frozenset(
    {
        "time",
        "vector",
        "scalar",
        "pi",
        "timestamp",
        "absent",
        "absent_over_time",
        "sort",
        "sort_desc",
        "histogram_quantile",
    }
)
FUNCTIONS = RANGE_FUNCTIONS | MATH_FUNCTIONS | DATE_FUNCTIONS | LABEL_FUNCTIONS | OTHER_FUNCTIONS
SCALAR_FUNCTIONS = frozenset({"time", "scalar", "pi"})
AGGREGATIONS = frozenset(
    {
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "group",
        "stddev",
        "stdvar",
        "quantile",
        "count_values",
        "topk",
        "bottomk",
    }
)
ARITHMETIC_OPS = frozenset({"+", "-", "*", "/", "%", "^", "atan2"})
COMPARISON_OPS = frozenset({"==", "!=", ">", "<", ">=", "<="})
SET_OPS = frozenset({"and", "or", "unless"})

# The step of a subquery written without one (`x[5m:]`): Prometheus takes its global
# evaluation interval, 1m unless configured.
DEFAULT_SUBQUERY_STEP_MS = 60_000
# At most this many evaluation times per subquery (its range over its step, across every step
# of the query): past it the query is refused rather than run out of memory.
MAX_SUBQUERY_POINTS = 1_000_000

# How deep a query's expression tree may be: parenthesised groups, function calls, aggregations,
# range selectors and binary or unary operators each count one level (see `depth_bound`).
# Prometheus has no limit; here a deeper query is a 400 before anything recurses over it: the
# Rust parser crashes the whole process (SIGSEGV, stack overflow) from a few thousand levels,
# and conversion, evaluation and pickling recurse in Python. 200 leaves room below Python's
# recursion limit for all of them (tests/query/test_query_limits.py evaluates 200 levels).
MAX_QUERY_DEPTH = 200

# promql_parser's enums are unhashable; key them by member name.
_MATCH_OPS = {"Equal": MatchOp.EQ, "NotEqual": MatchOp.NE, "Re": MatchOp.RE, "NotRe": MatchOp.NRE}
_CARDS = {
    "OneToOne": "one-to-one",
    "ManyToOne": "many-to-one",
    "OneToMany": "one-to-many",
    "ManyToMany": "many-to-many",
}


class QueryError(FiloPyError):
    """A query that cannot be answered; `kind` maps to the Prometheus API error type and to the
    error's category (`core.errors`), so one class serves every construction site.

    "bad_data": not valid PromQL (`Invalid`). "unsupported": valid PromQL that FiloPy does not
    evaluate (`Unsupported`). "execution": evaluation failed on the data, e.g. many-to-many
    matching (`ExecutionFailed`). "unavailable": shards or nodes the query needs cannot answer
    (`Unavailable`).
    """

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message

    @property
    def category(self) -> type[FiloPyError] | None:
        return category_of(type(self)) or QUERY_ERROR_CATEGORIES.get(self.kind)


QUERY_ERROR_CATEGORIES: dict[str, type[FiloPyError]] = {
    "bad_data": Invalid,
    "unsupported": Unsupported,
    "execution": ExecutionFailed,
    "unavailable": Unavailable,
}


def _unsupported(construct: str) -> QueryError:
    return QueryError("unsupported", f"unsupported: {construct}")


# ------------------------------------------------------------------------------------------ AST


@dataclass(frozen=True, slots=True)
class NumberLiteral:
    value: float


@dataclass(frozen=True, slots=True)
class StringLiteral:
    value: str


# The `@` modifier: evaluate at this time (ms) whatever the step; "start" / "end" stand for the
# query's start and end until `resolve_at` fixes them (the evaluator sees only ms).
At = int | Literal["start", "end"] | None


@dataclass(frozen=True, slots=True)
class VectorSelector:
    """`metric` is informational; `matchers` alone (incl. any `__name__` matcher) select series."""

    metric: str | None
    matchers: tuple[LabelMatcher, ...]
    offset_ms: int = 0
    at: At = None


@dataclass(frozen=True, slots=True)
class MatrixSelector:
    selector: VectorSelector
    range_ms: int


@dataclass(frozen=True, slots=True)
class Subquery:
    """`expr[range:step] offset`: `expr` evaluated every `step_ms` (0: the default
    evaluation interval) at times aligned to multiples of the step, as a range vector."""

    expr: Expr
    range_ms: int
    step_ms: int = 0
    offset_ms: int = 0
    at: At = None


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Aggregate:
    """`grouping` lists the `by` labels, or the `without` labels when `without` is set."""

    op: str
    expr: Expr
    param: Expr | None = None
    grouping: tuple[str, ...] = ()
    without: bool = False


@dataclass(frozen=True, slots=True)
class VectorMatching:
    """How two instant vectors' series are paired.

    `on` selects `on(labels)` versus `ignoring(labels)`; `card` is one of "one-to-one",
    "many-to-one" (group_left), "one-to-many" (group_right), "many-to-many" (and/or/unless);
    `include` are the extra labels of group_left/group_right, copied from the "one" side.
    """

    card: str = "one-to-one"
    on: bool = False
    labels: tuple[str, ...] = ()
    include: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    lhs: Expr
    rhs: Expr
    return_bool: bool = False
    matching: VectorMatching = VectorMatching()


@dataclass(frozen=True, slots=True)
class Unary:
    """Unary minus (unary plus is dropped by the parser)."""

    op: str
    expr: Expr


Expr = (
    NumberLiteral
    | StringLiteral
    | VectorSelector
    | MatrixSelector
    | Subquery
    | Call
    | Aggregate
    | Binary
    | Unary
)


# ------------------------------------------------------------------------------------- helpers


def format_duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def format_expr(expr: Expr) -> str:
    """PromQL text for an expression (for plans and messages; parses back to the same AST)."""
    match expr:
        case NumberLiteral(value=v):
            if v != v or v in (math.inf, -math.inf):
                return "NaN" if v != v else "Inf" if v > 0 else "-Inf"
            return repr(v) if v != int(v) or abs(v) >= 1e15 else str(int(v))
        case StringLiteral(value=v):
            return _quote(v)
        case VectorSelector(offset_ms=off):
            return (
                _format_selector(expr)
                + _format_at(expr.at)
                + (f" offset {format_duration(off)}" if off else "")
            )
        case MatrixSelector(selector=sel, range_ms=rng):
            inner = format_expr(VectorSelector(sel.metric, sel.matchers))
            off = f" offset {format_duration(sel.offset_ms)}" if sel.offset_ms else ""
            return f"{inner}[{format_duration(rng)}]{_format_at(sel.at)}{off}"
        case Subquery(expr=inner, range_ms=rng, step_ms=step, offset_ms=off, at=at):
            offset = f" offset {format_duration(off)}" if off else ""
            step_text = format_duration(step) if step else ""
            return f"{_operand(inner)}[{format_duration(rng)}:{step_text}]{_format_at(at)}{offset}"
        case Call(func=func, args=args):
            return f"{func}({', '.join(format_expr(a) for a in args)})"
        case Aggregate(op=op, expr=inner, param=param, grouping=grouping, without=without):
            mod = (
                f" {'without' if without else 'by'} ({', '.join(grouping)})"
                if grouping or without
                else ""
            )
            args = ([format_expr(param)] if param is not None else []) + [format_expr(inner)]
            return f"{op}{mod} ({', '.join(args)})"
        case Binary(op=op, lhs=lhs, rhs=rhs, return_bool=rb, matching=m):
            mod = " bool" if rb else ""
            if m.on or m.labels:
                mod += f" {'on' if m.on else 'ignoring'}({', '.join(m.labels)})"
            if m.card == "many-to-one":
                mod += f" group_left({', '.join(m.include)})"
            elif m.card == "one-to-many":
                mod += f" group_right({', '.join(m.include)})"
            return f"{_operand(lhs)} {op}{mod} {_operand(rhs)}"
        case Unary(op=op, expr=NumberLiteral() as inner):
            return f"{op}({format_expr(inner)})"  # "-3" would parse as the literal -3
        case Unary(op=op, expr=inner):
            return f"{op}{_operand(inner)}"
    raise TypeError(f"not an expression: {expr!r}")


# A metric name written before the braces must lex as one: an identifier that is no keyword
# the parser reads otherwise (a number, a modifier). Any other name goes inside the braces.
_BARE_METRIC = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NOT_BARE = frozenset(
    {"inf", "nan", "bool", "on", "ignoring", "group_left", "group_right", "atan2"}
)


def _format_selector(sel: VectorSelector) -> str:
    """A selector's name and matchers, in the order the parser gives them back: the name before
    the braces stands for a leading `__name__` matcher (as `_selector` puts it first)."""
    matchers = sel.matchers
    metric = sel.metric
    first = matchers[0] if matchers else None
    bare = (
        metric is not None
        and first is not None
        and first.label == "__name__"
        and first.op is MatchOp.EQ
        and first.value == metric
        and _BARE_METRIC.fullmatch(metric) is not None
        and metric.lower() not in _NOT_BARE
    )
    rest = matchers[1:] if bare else matchers
    inner = ", ".join(f"{m.label}{m.op}{_quote(m.value)}" for m in rest)
    return f"{metric}{{{inner}}}" if bare and rest else str(metric) if bare else f"{{{inner}}}"


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _quote(value: str) -> str:
    """A PromQL string literal: characters as they are (UTF-8), but for the quote, the
    backslash and control characters (JSON's escapes would write characters past U+FFFF as
    surrogate pairs, which the parser refuses)."""
    out = []
    for ch in value:
        esc = _ESCAPES.get(ch)
        if esc is None and (ch < " " or ch == "\x7f"):
            esc = f"\\x{ord(ch):02x}"
        out.append(ch if esc is None else esc)
    return '"' + "".join(out) + '"'


def _format_at(at: At) -> str:
    if at is None:
        return ""
    return f" @ {at}()" if isinstance(at, str) else f" @ {at / 1000:.3f}"


def resolve_at(expr: Expr, start_ms: int, end_ms: int) -> Expr:
    """`expr` with every `@ start()` / `@ end()` replaced by the query's start / end (ms), as
    Prometheus resolves them once per query (also inside subqueries)."""
    if not any(isinstance(getattr(n, "at", None), str) for n in walk(expr)):
        return expr

    def fix(at: At) -> At:
        return start_ms if at == "start" else end_ms if at == "end" else at

    def go(e: Expr) -> Expr:
        match e:
            case VectorSelector(at=at):
                return replace(e, at=fix(at))
            case MatrixSelector(selector=sel):
                return replace(e, selector=go(sel))
            case Subquery(expr=inner, at=at):
                return replace(e, expr=go(inner), at=fix(at))
            case Call(args=args):
                return replace(e, args=tuple(go(a) for a in args))
            case Aggregate(expr=inner, param=param):
                return replace(e, expr=go(inner), param=None if param is None else go(param))
            case Binary(lhs=lhs, rhs=rhs):
                return replace(e, lhs=go(lhs), rhs=go(rhs))
            case Unary(expr=inner):
                return replace(e, expr=go(inner))
        return e

    return go(expr)


def _operand(expr: Expr) -> str:
    text = format_expr(expr)
    return f"({text})" if isinstance(expr, Binary | Unary) else text


def children(expr: Expr) -> list[Expr]:
    """The direct subexpressions of `expr`, left to right."""
    match expr:
        case MatrixSelector(selector=sel):
            return [sel]
        case Subquery(expr=inner):
            return [inner]
        case Call(args=args):
            return list(args)
        case Aggregate(expr=inner, param=param):
            return [inner] if param is None else [param, inner]
        case Binary(lhs=lhs, rhs=rhs):
            return [lhs, rhs]
        case Unary(expr=inner):
            return [inner]
    return []


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of `expr`, parents before children, left to right."""
    yield expr
    for child in children(expr):
        yield from walk(child)


def selectors(expr: Expr) -> list[VectorSelector]:
    """Every vector selector in `expr`, including those inside range selectors."""
    return [node for node in walk(expr) if isinstance(node, VectorSelector)]


def value_type(expr: Expr) -> ValueType:
    """The PromQL type `expr` evaluates to."""
    match expr:
        case NumberLiteral():
            return "scalar"
        case StringLiteral():
            return "string"
        case MatrixSelector() | Subquery():
            return "matrix"
        case Call(func=func):
            return "scalar" if func in SCALAR_FUNCTIONS else "vector"
        case Binary(lhs=lhs, rhs=rhs):
            both_scalar = value_type(lhs) == "scalar" and value_type(rhs) == "scalar"
            return "scalar" if both_scalar else "vector"
        case Unary(expr=inner):
            return value_type(inner)
        case _:
            return "vector"


def is_constant(expr: Expr) -> bool:
    """Whether `expr` is made of number literals only (the same value at every step, known
    before evaluation, so it can travel to the nodes inside the expression)."""
    match expr:
        case NumberLiteral():
            return True
        case Unary(expr=inner):
            return is_constant(inner)
        case Binary(op=op, lhs=lhs, rhs=rhs) if op not in SET_OPS:
            return is_constant(lhs) and is_constant(rhs)
    return False


def range_args(call: Call) -> tuple[MatrixSelector | Subquery, Expr | None]:
    """The range vector of a range function and its scalar argument, if any
    (`quantile_over_time(q, m)`, `predict_linear(m, t)`)."""
    ms = next(a for a in call.args if isinstance(a, MatrixSelector | Subquery))
    rest = [a for a in call.args if a is not ms]
    return ms, (rest[0] if rest else None)


# ------------------------------------------------------------------------------------- parsing


# Tokens that matter for nesting depth; string literals and comments are matched whole so that
# brackets and operators inside them do not count (an unterminated one runs to the end).
_DEPTH_TOKENS = re.compile(
    r""""(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|`[^`]*`?|#[^\n]*"""
    r"|[{}()\[\]]|==|!=|>=|<=|[-+*/%^<>]|\b(?:and|or|unless|atan2)\b",
    re.DOTALL,
)


# An `@` with a negative time (before 1970): the parser accepts it, then panics (a Rust panic,
# not an exception) when its time is read; so the text is refused first. Strings and comments
# are skipped, as for the depth.
_NEGATIVE_AT = re.compile(
    r""""(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|`[^`]*`?|#[^\n]*|@\s*-""", re.DOTALL
)


def check_at(text: str) -> None:
    """Raise QueryError (bad_data) for an `@` modifier with a negative time."""
    for m in _NEGATIVE_AT.finditer(text):
        if m.group()[0] == "@":
            raise QueryError(
                "bad_data",
                "parse error: the @ modifier's time must not be negative (before 1970-01-01)",
            )


def _too_deep(limit: int) -> QueryError:
    return QueryError(
        "bad_data",
        f"query too deep: its expression nests more than {limit} levels (parentheses, function "
        "calls, aggregations and operators each count one); simplify it or split it",
    )


def depth_bound(text: str, limit: int = MAX_QUERY_DEPTH) -> int:
    """An upper bound of the depth of the expression tree `text` parses to, read from the text
    alone (the parser must not see a query too deep for it); raise QueryError past `limit`.

    A bracketed group is one level plus one per operator in it (a chain `a + b + c` is a tree
    as deep as it has operators) plus its deepest inner group; the whole query counts its
    operators, its deepest group and one for the leaves. Operators inside label matchers,
    string literals and comments do not count; a unary minus counts like an operator.
    """
    stack = [[0, 0]]  # per open group: operators in it, deepest closed inner group
    braces = 0
    for m in _DEPTH_TOKENS.finditer(text):
        tok = m.group()
        c = tok[0]
        if c in "\"'`#":
            continue
        if c == "{":
            braces += 1
        elif c == "}":
            braces = max(0, braces - 1)
        elif braces:
            continue  # label matchers: `!=` there is not an operator
        elif c in "([":
            stack.append([0, 0])
            if len(stack) > limit:
                raise _too_deep(limit)
        elif c in ")]":
            if len(stack) > 1:  # else unbalanced: the parser reports it
                ops, inner = stack.pop()
                stack[-1][1] = max(stack[-1][1], 1 + ops + inner)
        else:
            stack[-1][0] += 1
            if stack[-1][0] + len(stack) > limit:
                raise _too_deep(limit)
    while len(stack) > 1:  # unclosed groups (a parse error, but bound them all the same)
        ops, inner = stack.pop()
        stack[-1][1] = max(stack[-1][1], 1 + ops + inner)
    ops, inner = stack[0]
    depth = ops + inner + 1
    if depth > limit:
        raise _too_deep(limit)
    return depth


def parse(text: str, max_depth: int = MAX_QUERY_DEPTH, *, matrix_ok: bool = False) -> Expr:
    """Parse PromQL into FiloPy's AST; raise QueryError (bad_data / unsupported) otherwise.

    A query nesting deeper than `max_depth` levels is refused (bad_data) before parsing. A range
    vector as the whole query is refused as unsupported unless `matrix_ok` (a range query's
    caller refuses it as Prometheus does, as bad_data).

    Parsed trees are immutable and kept for the last `PARSED_CACHED` texts: a dashboard sends
    the same queries again and again, and parsing is a good part of a small query's time."""
    return _parse(text, max_depth, matrix_ok)


PARSED_CACHED = 1024


@functools.lru_cache(maxsize=PARSED_CACHED)
def _parse(text: str, max_depth: int, matrix_ok: bool) -> Expr:
    depth_bound(text, max_depth)
    check_at(text)
    try:
        raw = pp.parse(text)
    except Exception as e:  # the Rust parser raises ValueError; be robust to others
        raise QueryError("bad_data", f"parse error: {e}") from None
    try:
        expr = _convert(raw)
    except BaseException as e:  # a panic in the parser's objects is a BaseException
        if type(e).__name__ != "PanicException":
            raise
        raise QueryError("bad_data", f"parse error: the parser failed on it: {e}") from None
    if isinstance(expr, MatrixSelector | Subquery) and not matrix_ok:
        raise _unsupported("range vector (matrix) query results")
    return expr


def _member(enum_value: Any) -> str:
    return str(enum_value).rsplit(".", 1)[-1]


def _duration_ms(d: timedelta | None) -> int:
    return 0 if d is None else d // timedelta(milliseconds=1)


def _convert(node: Any) -> Expr:
    match node:
        case pp.ParenExpr():
            return _convert(node.expr)
        case pp.NumberLiteral():
            return NumberLiteral(float(node.val))
        case pp.StringLiteral():
            return StringLiteral(str(node.val))
        case pp.VectorSelector():
            return _selector(node)
        case pp.MatrixSelector():
            return MatrixSelector(_selector(node.vector_selector), _duration_ms(node.range))
        case pp.SubqueryExpr():
            return Subquery(
                _convert(node.expr),
                _duration_ms(node.range),
                _duration_ms(node.step),
                _duration_ms(node.offset),
                _at(node.at),
            )
        case pp.UnaryExpr():
            return Unary("-", _convert(node.expr))
        case pp.Call():
            return _call(node)
        case pp.AggregateExpr():
            return _aggregate(node)
        case pp.BinaryExpr():
            return _binary(node)
    raise _unsupported(f"expression type {type(node).__name__}")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _at(at: Any) -> At:
    if at is None:
        return None
    kind = _member(at.type)
    if kind == "Start":
        return "start"
    if kind == "End":
        return "end"
    return (at.at - _EPOCH) // timedelta(milliseconds=1)


def _selector(vs: Any) -> VectorSelector:
    if vs.matchers.or_matchers:
        raise _unsupported("'or' between label matchers")
    try:
        matchers = [
            LabelMatcher(m.name, _MATCH_OPS[_member(m.op)], m.value) for m in vs.matchers.matchers
        ]
    except ValueError as e:  # an RE2 regex that Python's `re` rejects
        raise QueryError("bad_data", f"parse error: {e}") from None
    metric: str | None = vs.name
    if metric is not None:
        matchers.insert(0, LabelMatcher("__name__", MatchOp.EQ, metric))
    else:
        names = [m.value for m in matchers if m.label == "__name__" and m.op is MatchOp.EQ]
        metric = names[0] if len(names) == 1 else None
    return VectorSelector(metric, tuple(matchers), _duration_ms(vs.offset), _at(vs.at))


def _call(node: Any) -> Call:
    name = node.func.name
    if name not in FUNCTIONS:
        raise _unsupported(f"function '{name}'")
    call = Call(name, tuple(_convert(a) for a in node.args))
    if name in RANGE_FUNCTIONS and not any(
        isinstance(a, MatrixSelector | Subquery) for a in call.args
    ):
        raise _unsupported(f"function '{name}' of anything but a range selector or subquery")
    if name in ("quantile_over_time", "predict_linear"):
        _, param = range_args(call)
        if param is None or not is_constant(param):
            # The nodes compute range functions where the samples are, from the expression
            # alone: a parameter that varies per step (e.g. scalar(x)) cannot travel with it.
            raise _unsupported(f"a {name} parameter that is not a number")
    if name in LABEL_FUNCTIONS:
        _check_label_function(call)
    return call


def _string_args(call: Call) -> list[str]:
    out = []
    for a in call.args[1:]:
        if not isinstance(a, StringLiteral):  # the parser types them; be safe
            raise QueryError("bad_data", f"parse error: {call.func} expects string arguments")
        out.append(a.value)
    return out


def _check_label_function(call: Call) -> None:
    """Prometheus's checks of label_replace/label_join arguments (its errors are evaluation
    errors: "execution", as Prometheus answers them)."""
    from query.label_functions import compile_anchored  # the regex engine, imported when used

    args = _string_args(call)
    if call.func == "label_replace":
        dst, _, _, regex = args
        try:
            compile_anchored(regex)
        except ValueError:
            raise QueryError(
                "execution", f"invalid regular expression in label_replace(): {regex}"
            ) from None
    else:
        dst = args[0]
        for src in args[2:]:
            if not src:
                raise QueryError("execution", "invalid source label name in label_join(): ")
    if not dst:
        raise QueryError("execution", f"invalid destination label name in {call.func}(): ")


def _aggregate(node: Any) -> Aggregate:
    op = str(node.op)
    if op not in AGGREGATIONS:
        raise _unsupported(f"aggregation '{op}'")
    grouping: tuple[str, ...] = ()
    without = False
    if node.modifier is not None:
        grouping = tuple(node.modifier.labels)
        without = node.modifier.type == pp.AggModifierType.Without
    param = None if node.param is None else _convert(node.param)
    if op == "count_values" and (not isinstance(param, StringLiteral) or not param.value):
        label = param.value if isinstance(param, StringLiteral) else ""
        raise QueryError("execution", f"invalid label name {json.dumps(label)}")
    return Aggregate(op, _convert(node.expr), param, grouping, without)


def _binary(node: Any) -> Binary:
    op = str(node.op)
    if op not in ARITHMETIC_OPS | COMPARISON_OPS | SET_OPS:
        raise _unsupported(f"binary operator '{op}'")
    mod = node.modifier
    matching = VectorMatching(card="many-to-many" if op in SET_OPS else "one-to-one")
    return_bool = False
    if mod is not None:
        if mod.fill_values.lhs is not None or mod.fill_values.rhs is not None:
            raise _unsupported("fill modifiers of binary operators")
        return_bool = bool(mod.return_bool)
        on, labels = False, ()
        if mod.matching is not None:
            on = mod.matching.type == pp.LabelModifierType.Include
            labels = tuple(mod.matching.labels)
        matching = VectorMatching(
            _CARDS[_member(mod.card)], on, labels, tuple(mod.group_labels or ())
        )
    return Binary(op, _convert(node.lhs), _convert(node.rhs), return_bool, matching)

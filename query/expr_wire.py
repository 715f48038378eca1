"""PromQL expressions as bytes that carry data, never code: how a node part's expression
crosses to the node, on the query channel (`query.wire`) and in a Ray call
(`NodeQuery.__reduce__`).

Why not a pickle: whoever could make a node read a pickle could make it run code. An expression
travels as its PromQL text (`format_expr`), parsed again on the node by the same parser as any
query; a tree whose text does not parse back to the very same tree (bit for bit: a `-0` literal,
an `@` the parser cannot take back, anything `format_expr` gets wrong) travels as the tree
itself, node by node from an allow-list of node types, functions and operators (msgpack).

The caller checks once per tree which of the two it is (trees of a cached plan are the same
objects query after query), and a node keeps the trees of the last `PARSED_CACHED` expressions
by their bytes: a dashboard's repeated queries are neither formatted nor parsed again.

Kept apart from `query.wire` (the channel's messages) because `query.executor` needs it for
`NodeQuery`'s pickling, and `query.wire` needs `query.executor`.
"""

from __future__ import annotations

import functools
from typing import Any

import msgpack

from core.errors import Invalid
from query.promql import (
    AGGREGATIONS,
    ARITHMETIC_OPS,
    COMPARISON_OPS,
    FUNCTIONS,
    MAX_QUERY_DEPTH,
    PARSED_CACHED,
    SET_OPS,
    Aggregate,
    At,
    Binary,
    Call,
    Expr,
    MatrixSelector,
    NumberLiteral,
    QueryError,
    StringLiteral,
    Subquery,
    Unary,
    VectorMatching,
    VectorSelector,
    format_expr,
    parse,
)
from store.api import INT64_MAX, INT64_MIN, LabelMatcher, MatchOp

__all__ = ["WireError", "expr_bytes", "expr_of", "pack", "tree_data", "tree_of", "unpack"]

TEXT, TREE = b"T", b"D"  # the first byte of an expression's bytes: which form follows
# A tree deeper than a parsed query can be is refused before it is walked further.
MAX_TREE_DEPTH = 2 * MAX_QUERY_DEPTH
BINARY_OPS = ARITHMETIC_OPS | COMPARISON_OPS | SET_OPS
CARDS = frozenset({"one-to-one", "many-to-one", "one-to-many", "many-to-many"})
_MATCH_OPS = {op.value: op for op in MatchOp}


class WireError(Invalid):
    """Bytes that are not a message of the protocol: a type, a tag, a dtype or a shape outside
    the allow-list, or not msgpack at all. The peer is broken or hostile."""


def _no_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code}: none is allowed")


def pack(obj: Any) -> bytes:
    """msgpack of plain data: str kept exactly (lone surrogates too), bytes as bin."""
    return msgpack.packb(obj, use_bin_type=True, unicode_errors="surrogatepass")


def unpack(data: bytes | bytearray | memoryview) -> Any:
    """Plain data from msgpack: str-keyed maps only, no extension type; `WireError` else."""
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=_no_ext,
            unicode_errors="surrogatepass",
        )
    except WireError:
        raise
    except Exception as e:  # malformed, truncated, extra data, too deep
        raise WireError(f"not a msgpack message: {type(e).__name__}: {e}") from None


# --------------------------------------------------------------------------------- the caller


_MAX_KNOWN = PARSED_CACHED
_known: dict[int, tuple[Expr, bytes]] = {}  # id -> (the tree, held so the id stays its; bytes)


def expr_bytes(expr: Expr) -> bytes:
    """The bytes `expr` travels as: its text where that parses back to the same tree, else the
    tree as data. Made once per tree object."""
    hit = _known.get(id(expr))
    if hit is not None and hit[0] is expr:
        return hit[1]
    text = _exact_text(expr)
    data = TEXT + text.encode() if text is not None else TREE + pack(tree_data(expr))
    if len(_known) >= _MAX_KNOWN:
        _known.clear()
    _known[id(expr)] = (expr, data)
    return data


def _exact_text(expr: Expr) -> str | None:
    """`format_expr(expr)` if the node's `parse` gives back the same tree, bit for bit."""
    try:
        text = format_expr(expr)
        back = parse(text)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # the Rust parser panics as a BaseException
        return None
    return text if pack(tree_data(back)) == pack(tree_data(expr)) else None


def tree_data(expr: Expr) -> list[Any]:
    """The tree as plain data: per node a list, its type's tag first, then its fields."""
    match expr:
        case NumberLiteral(value=v):
            return ["n", float(v)]
        case StringLiteral(value=v):
            return ["s", v]
        case VectorSelector(metric=metric, matchers=ms, offset_ms=off, at=at):
            return ["v", metric, [[m.label, m.op.value, m.value] for m in ms], off, at]
        case MatrixSelector(selector=sel, range_ms=rng):
            return ["M", tree_data(sel), rng]
        case Subquery(expr=inner, range_ms=rng, step_ms=step, offset_ms=off, at=at):
            return ["S", tree_data(inner), rng, step, off, at]
        case Call(func=func, args=args):
            return ["c", func, [tree_data(a) for a in args]]
        case Aggregate(op=op, expr=inner, param=param, grouping=grouping, without=without):
            p = None if param is None else tree_data(param)
            return ["a", op, tree_data(inner), p, list(grouping), without]
        case Binary(op=op, lhs=lhs, rhs=rhs, return_bool=rb, matching=m):
            return [
                "b",
                op,
                tree_data(lhs),
                tree_data(rhs),
                rb,
                [m.card, m.on, list(m.labels), list(m.include)],
            ]
        case Unary(op=op, expr=inner):
            return ["u", op, tree_data(inner)]
    raise TypeError(f"not an expression: {type(expr).__name__}")


# ----------------------------------------------------------------------------------- the node


@functools.lru_cache(maxsize=PARSED_CACHED)
def expr_of(data: bytes) -> Expr:
    """The expression of `expr_bytes`' bytes: text parsed (a `QueryError` if it does not parse
    here), a tree rebuilt from the allow-list (`WireError` for anything outside it)."""
    form, body = data[:1], data[1:]
    if form == TEXT:
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise WireError("an expression's text is not UTF-8") from None
        return parse(text)
    if form == TREE:
        try:
            return tree_of(unpack(body))
        except (WireError, QueryError):
            raise
        except Exception as e:  # a field of the wrong type or value
            raise WireError(f"a malformed expression tree: {type(e).__name__}: {e}") from None
    raise WireError(f"an expression of unknown form {form!r}")


def tree_of(data: Any, depth: int = 0) -> Expr:
    """A tree from `tree_data`'s plain data, every field checked."""
    if depth > MAX_TREE_DEPTH:
        raise WireError(f"an expression tree deeper than {MAX_TREE_DEPTH} levels")
    if type(data) is not list or not data:
        raise WireError("an expression node is not a tagged list")
    tag, fields, down = data[0], data[1:], depth + 1
    match tag, fields:
        case "n", [float() as v]:
            return NumberLiteral(v)
        case "s", [str() as v]:
            return StringLiteral(v)
        case "v", [metric, list() as ms, off, at] if metric is None or type(metric) is str:
            return VectorSelector(metric, tuple(_matcher(m) for m in ms), _int(off), _at(at))
        case "M", [sel, rng]:
            selector = tree_of(sel, down)
            if not isinstance(selector, VectorSelector):
                raise WireError("a range selector of anything but a vector selector")
            return MatrixSelector(selector, _int(rng))
        case "S", [inner, rng, step, off, at]:
            return Subquery(tree_of(inner, down), _int(rng), _int(step), _int(off), _at(at))
        case "c", [str() as func, list() as args] if func in FUNCTIONS:
            return Call(func, tuple(tree_of(a, down) for a in args))
        case "a", [str() as op, inner, param, list() as grouping, bool() as without] if (
            op in AGGREGATIONS
        ):
            p = None if param is None else tree_of(param, down)
            return Aggregate(op, tree_of(inner, down), p, _strs(grouping), without)
        case "b", [str() as op, lhs, rhs, bool() as rb, [str() as card, bool() as on, ls, inc]] if (
            op in BINARY_OPS and card in CARDS
        ):
            matching = VectorMatching(card, on, _strs(ls), _strs(inc))
            return Binary(op, tree_of(lhs, down), tree_of(rhs, down), rb, matching)
        case "u", ["-", inner]:
            return Unary("-", tree_of(inner, down))
    raise WireError(f"an expression node outside the allow-list (tag {tag!r})")


def _int(v: Any) -> int:
    if type(v) is not int or not INT64_MIN <= v <= INT64_MAX:
        raise WireError(f"not an int64: {type(v).__name__}")
    return v


def _at(v: Any) -> At:
    if v is None or v in ("start", "end"):
        return v  # type: ignore[no-any-return]
    return _int(v)


def _strs(v: Any) -> tuple[str, ...]:
    if type(v) is not list or not all(type(s) is str for s in v):
        raise WireError("not a list of strings")
    return tuple(v)


def _matcher(v: Any) -> LabelMatcher:
    """A label matcher from [label, op, value]; its regex compiled as any query's."""
    match v:
        case [str() as label, str() as op, str() as value] if op in _MATCH_OPS:
            return LabelMatcher(label, _MATCH_OPS[op], value)
    raise WireError("a label matcher is not [label, op, value]")

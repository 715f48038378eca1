"""The query channel's messages as data (msgpack), never code: a node part's request, and its
answer or error.

Why: the channel's frames were pickles, so whoever held a node's key (or got past its MAC check)
could run code on the node, or on every caller from a node. Here each message is plain msgpack
read by an explicit schema: every type that crosses is written field by field as a list whose
first item names its type, read back only where the schema expects it, each field's type
checked; NumPy arrays are (dtype from an allow-list, shape, raw bytes), rebuilt with
`np.frombuffer` (never an object dtype, never a pickle); msgpack extension types are refused.
Anything else raises `WireError`, and the channel closes the connection.

What crosses (`query.executor`): a request is the dataset's name, the shards and a `NodeQuery`
(its expressions as `query.expr_wire` bytes, its step times, label matchers); an answer is a
`NodeAnswer` whose result is a `StepMatrix`, a `Partial`, label sets, `SeriesData` or, for a
batch, a map from part index to a `StepMatrix` or `Partial`. An error is its class's name, its
args and its fields, for the FiloPy errors a node raises on a query (`ERRORS`); another FiloPy
error crosses as its category (every category is in `ERRORS`) with its message, so the caller
answers it with the same status; any other error arrives as `RemoteQueryError` with its type
and message. A request carries the query's limits (`query.limits`) last, if it has any: a
request without them is the same bytes as before the limits, so nodes of either version read it.

In the query layer, beside the types it encodes, so it is tested without sockets; the channel
itself (`coordinator.query_channel`) only frames and signs these bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from core.dataset import DatasetInvalid, DatasetRef
from core.errors import (
    Conflict,
    DatasetUnknownError,
    ExecutionFailed,
    FiloPyError,
    Forbidden,
    Internal,
    Invalid,
    Limited,
    NotFound,
    Unauthenticated,
    Unavailable,
    Unsupported,
)
from query.aggregate import PUSHABLE_OPS, LabelKey, Partial
from query.executor import NodeAnswer, NodeQuery, ShardsNotHere
from query.expr_wire import WireError, expr_bytes, expr_of, pack, unpack
from query.limits import QueryLimitExceeded, QueryLimits
from query.promql import QueryError
from query.service import NodeUnavailable
from query.values import SeriesData, StepMatrix
from store.api import (
    INT64_MAX,
    INT64_MIN,
    LabelMatcher,
    MatchOp,
    StaleEpochError,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
)

__all__ = [
    "DTYPES",
    "ERRORS",
    "RemoteQueryError",
    "WireError",
    "decode_reply",
    "decode_request",
    "encode_answer",
    "encode_error",
    "encode_request",
]


class RemoteQueryError(Internal):
    """A node failed on a query part with an error that does not cross as itself (not one of
    `ERRORS`, or with fields that are not plain data): its type and message."""


# The dtypes arrays cross in (little-endian, as every machine FiloPy runs on): step times and
# counts, values, presence masks. An object array ("O") or any other is refused both ways.
DTYPES: dict[str, np.dtype[Any]] = {
    "<i8": np.dtype("<i8"),
    "<f8": np.dtype("<f8"),
    "|b1": np.dtype("|b1"),
}
MAX_NDIM = 2
REQUEST_KINDS = frozenset({"series_local", "partial", "series", "batch", "raw"})
PART_KINDS = frozenset({"series_local", "partial"})

# The errors that cross as themselves: those a node raises on a query part (stale maps, query
# errors, the store's), and their categories. Rebuilt like their pickles (`core.errors`): the
# class, its args and its fields, without calling `__init__`.
ERRORS: dict[str, type[FiloPyError]] = {
    f"{cls.__module__}.{cls.__qualname__}": cls
    for cls in (
        FiloPyError,
        NotFound,
        Conflict,
        Invalid,
        Unauthenticated,
        Forbidden,
        Limited,
        Unsupported,
        Unavailable,
        ExecutionFailed,
        Internal,
        DatasetUnknownError,
        DatasetInvalid,
        QueryError,
        ShardsNotHere,
        NodeUnavailable,
        StoreError,
        StoreUnavailable,
        StoreTimeout,
        StaleEpochError,
        RemoteQueryError,
        QueryLimitExceeded,
    )
}
_REMOTE = f"{RemoteQueryError.__module__}.{RemoteQueryError.__qualname__}"


# --------------------------------------------------------------------------------- requests


def encode_request(ref: DatasetRef, shards: Sequence[int], request: NodeQuery) -> bytes:
    """`(ref, shards, request)` as the channel sends it."""
    q = request
    limits = [] if q.limits is None else [_limits(q.limits)]  # none: as callers before them
    return pack(
        [
            ref.name,
            [int(s) for s in shards],
            q.kind,
            None if q.expr is None else expr_bytes(q.expr),
            None if q.times is None else _array(q.times, "<i8"),
            int(q.lookback_ms),
            [[[m.label, m.op.value, m.value] for m in sel] for sel in q.matchers],
            int(q.start_ms),
            int(q.end_ms),
            [
                [int(i), kind, expr_bytes(expr), [int(s) for s in part_shards]]
                for i, kind, expr, part_shards in q.parts
            ],
            *limits,
        ]
    )


def decode_request(payload: bytes | bytearray) -> tuple[DatasetRef, list[int], NodeQuery]:
    """A request from `encode_request`'s bytes: `WireError` if it is not one, `QueryError` if
    an expression's text does not parse here (the caller is told, as for any query)."""
    try:
        match unpack(payload):
            case [
                str() as name,
                list() as shards,
                str() as kind,
                expr,
                times,
                lookback_ms,
                list() as matchers,
                start_ms,
                end_ms,
                list() as parts,
                *rest,
            ] if kind in REQUEST_KINDS and len(rest) <= 1:
                pass  # without the limits: a caller older than them
            case _:
                raise WireError("not a query part request")
        ref = DatasetRef.of(name)
        query = NodeQuery(
            kind,  # type: ignore[arg-type]  # checked: one of REQUEST_KINDS
            None if expr is None else _expr(expr),
            None if times is None else _from_array(times, "<i8", 1),
            _int(lookback_ms),
            tuple(tuple(_matcher(m) for m in _list(sel)) for sel in matchers),
            _int(start_ms),
            _int(end_ms),
            tuple(_part(p) for p in parts),
            _limits_of(rest[0]) if rest else None,
        )
        return ref, _ints(shards), query
    except (WireError, QueryError):
        raise
    except Exception as e:  # a field of the wrong type or value
        raise WireError(f"a malformed request: {type(e).__name__}: {e}") from None


def _limits(limits: QueryLimits) -> list[Any]:
    return [
        limits.tenant,
        int(limits.max_samples),
        int(limits.max_series),
        int(limits.spent_samples),
        int(limits.spent_series),
    ]


def _limits_of(v: Any) -> QueryLimits | None:
    match v:
        case None:
            return None
        case [str() as tenant, *counts] if len(counts) == 4:
            return QueryLimits(tenant, *(_int(c) for c in counts))
    raise WireError("query limits are not [tenant, max samples, max series, spent, spent]")


def _part(v: Any) -> tuple[int, str, Any, tuple[int, ...]]:
    match v:
        case [index, str() as kind, expr, list() as shards] if kind in PART_KINDS:
            return _int(index), kind, _expr(expr), tuple(_ints(shards))
    raise WireError("a batch part is not [index, kind, expression, shards]")


def _expr(v: Any) -> Any:
    if type(v) is not bytes:
        raise WireError("an expression is not bytes")
    return expr_of(v)


def _matcher(v: Any) -> LabelMatcher:
    match v:
        case [str() as label, str() as op, str() as value]:
            return LabelMatcher(label, MatchOp(op), value)
    raise WireError("a label matcher is not [label, op, value]")


# ---------------------------------------------------------------------------------- answers


def encode_answer(answer: NodeAnswer) -> bytes:
    """("ok", answer) as the channel sends it; `TypeError` for a result of no known type."""
    fields = [
        _result(answer.result),
        [int(s) for s in answer.shards],
        int(answer.series),
        int(answer.samples),
    ]
    if answer.warnings:  # only then: an answer without them is what older callers read
        fields.append([str(w) for w in answer.warnings])
    return pack(["ok", fields])


def encode_error(err: BaseException) -> bytes:
    """("error", err) as the channel sends it: as itself if it is one of `ERRORS` with plain
    args and fields; else a FiloPy error as its category (so the caller answers the same
    status) with its message and errorType; anything else a `RemoteQueryError` with its type
    and message."""
    cls = type(err)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if ERRORS.get(name) is cls:
        fields = {k: v for k, v in vars(err).items() if not k.startswith("__")}
        args = list(err.args)
        if _plain(args) and _plain(fields):
            return pack(["error", [name, args, fields]])
    if isinstance(err, FiloPyError) and err.category not in (None, Internal):
        category = err.category
        assert category is not None
        message = f"{err.context}: {err}" if err.context else str(err)
        fields = {"error_type": err.error_type} if isinstance(err.error_type, str) else {}
        name = f"{category.__module__}.{category.__qualname__}"
        return pack(["error", [name, [message], fields]])
    return pack(["error", [_REMOTE, [f"{cls.__name__}: {err}"], {}]])


def decode_reply(payload: bytes | bytearray) -> tuple[str, Any]:
    """("ok", NodeAnswer) or ("error", exception) from the node's bytes; `WireError` if they
    are not an answer."""
    try:
        match unpack(payload):
            case ["ok", [result, list() as shards, series, samples, *rest]] if len(rest) <= 1:
                warnings = tuple(_strs(rest[0])) if rest else ()
                answer = NodeAnswer(
                    _result_of(result), tuple(_ints(shards)), _int(series), _int(samples),
                    warnings,
                )  # fmt: skip
                return "ok", answer
            case ["error", [str() as name, list() as args, dict() as fields]]:
                return "error", _error_of(name, args, fields)
        raise WireError("not an answer")
    except WireError:
        raise
    except Exception as e:  # a field of the wrong type or value
        raise WireError(f"a malformed answer: {type(e).__name__}: {e}") from None


def _error_of(name: str, args: list[Any], fields: dict[str, Any]) -> BaseException:
    cls = ERRORS.get(name)
    if cls is None:  # a newer node's error: its type and message
        message = " ".join(map(str, args))
        return RemoteQueryError(f"{name.rsplit('.', 1)[-1]}: {message}")
    if not all(k.isidentifier() and not k.startswith("__") for k in fields):
        raise WireError("an error field that is not a plain name")
    err = cls.__new__(cls, *args)
    err.args = tuple(args)
    err.__dict__.update(fields)
    return err


def _plain(v: Any) -> bool:
    """Data that msgpack carries and gives back (tuples as lists): no objects."""
    if v is None or type(v) in (bool, int, str, float, bytes):
        return type(v) is not int or INT64_MIN <= v <= INT64_MAX
    if type(v) in (list, tuple):
        return all(_plain(x) for x in v)
    if type(v) is dict:
        return all(type(k) is str and _plain(x) for k, x in v.items())
    return False


# Results: a tagged list per type, "b" (a batch) mapping part indexes to "m" or "p".


def _result(r: Any) -> list[Any]:
    if isinstance(r, StepMatrix):
        return [
            "m",
            _array(r.times, "<i8"),
            r.labels,
            _array(r.values, "<f8"),
            _array(r.present, "|b1"),
            r.finalized,
        ]
    if isinstance(r, Partial):
        keys = None if r.keys is None else [[list(kv) for kv in key] for key in r.keys]
        m2 = None if r.m2 is None else _array(r.m2, "<f8")
        return [
            "p",
            r.op,
            _array(r.times, "<i8"),
            r.labels,
            _array(r.values, "<f8"),
            _array(r.counts, "<i8"),
            m2,
            keys,
        ]
    if isinstance(r, dict):
        parts = []
        for i, v in r.items():
            if not isinstance(v, StepMatrix | Partial):
                raise TypeError(f"a batch part's result is a {type(v).__name__}")
            parts.append([int(i), _result(v)])
        return ["b", parts]
    if isinstance(r, list) and r and all(isinstance(s, SeriesData) for s in r):
        return ["s", [[s.labels, _array(s.ts, "<i8"), _array(s.vals, "<f8")] for s in r]]
    if isinstance(r, list) and all(type(d) is dict for d in r):
        return ["l", r]
    raise TypeError(f"a node answer of type {type(r).__name__}")


def _result_of(v: Any, nested: bool = False) -> Any:
    match v:
        case ["m", times, labels, values, present, bool() as finalized]:
            return StepMatrix(
                _from_array(times, "<i8", 1),
                _labels(labels),
                _from_array(values, "<f8", 2),
                _from_array(present, "|b1", 2),
                finalized,
            )
        case ["p", str() as op, times, labels, values, counts, m2, keys] if op in PUSHABLE_OPS:
            return Partial(
                op,
                _from_array(times, "<i8", 1),
                _labels(labels),
                _from_array(values, "<f8", 2),
                _from_array(counts, "<i8", 2),
                None if m2 is None else _from_array(m2, "<f8", 2),
                None if keys is None else [_label_key(k) for k in _list(keys)],
            )
        case ["b", list() as parts] if not nested:
            out = {}
            for part in parts:
                match part:
                    case [index, ["m" | "p", *_] as value]:
                        out[_int(index)] = _result_of(value, nested=True)
                    case _:
                        raise WireError("a batch part is not [index, matrix or partial]")
            return out
        case ["s", list() as series] if not nested:
            out_series = []
            for s in series:
                match s:
                    case [labels, ts, vals]:
                        out_series.append(
                            SeriesData(
                                _label_set(labels),
                                _from_array(ts, "<i8", 1),
                                _from_array(vals, "<f8", 1),
                            )
                        )
                    case _:
                        raise WireError("a series is not [labels, ts, vals]")
            return out_series
        case ["l", labels] if not nested:
            return _labels(labels)
    raise WireError("a result outside the allow-list")


def _labels(v: Any) -> list[dict[str, str]]:
    if type(v) is not list:
        raise WireError("label sets are not a list")
    for labels in v:
        _label_set(labels)
    return v


def _label_set(v: Any) -> dict[str, str]:
    # Keys are str already (strict_map_key, raw=False); only values need a look.
    if type(v) is not dict or not all(type(x) is str for x in v.values()):
        raise WireError("a label set is not a map of strings")
    return v


def _label_key(v: Any) -> LabelKey:
    out = []
    for kv in _list(v):
        match kv:
            case [str() as k, str() as x]:
                out.append((k, x))
            case _:
                raise WireError("a label key is not a list of [name, value]")
    return tuple(out)


# ------------------------------------------------------------------------------------ arrays


def _array(a: npt.NDArray[Any], dtype: str) -> list[Any]:
    """[dtype, shape, raw bytes] of an array, as the field's dtype (a safe cast, e.g. int32 to
    int64, is made; anything else, an object array, is a `TypeError`)."""
    want = DTYPES[dtype]
    if a.dtype != want and not np.can_cast(a.dtype, want, casting="safe"):
        raise TypeError(f"an array of dtype {a.dtype.str} does not cross as {dtype}")
    a = np.ascontiguousarray(a, want)
    if a.ndim > MAX_NDIM:
        raise TypeError(f"an array of {a.ndim} dimensions does not cross")
    return [dtype, list(a.shape), a.tobytes()]


def _from_array(v: Any, dtype: str, ndim: int) -> npt.NDArray[Any]:
    """The array of `_array`'s data, of the dtype and dimensions the field has: a writable
    copy of the bytes, as an unpickled array was."""
    match v:
        case [str() as got, list() as shape, bytes() as raw] if got in DTYPES:
            pass
        case _:
            raise WireError("an array is not [dtype, shape, bytes] of an allowed dtype")
    if got != dtype or len(shape) != ndim or not all(type(n) is int and n >= 0 for n in shape):
        raise WireError(f"an array of dtype {got}, shape {shape}: expected {dtype}, {ndim}-D")
    count = math.prod(shape)
    if len(raw) != count * DTYPES[got].itemsize:
        raise WireError(f"an array of shape {shape} with {len(raw)} bytes")
    if not count:
        return np.empty(shape, DTYPES[got])
    return np.frombuffer(bytearray(raw), DTYPES[got]).reshape(shape)


# ------------------------------------------------------------------------------------ fields


def _int(v: Any) -> int:
    if type(v) is not int or not INT64_MIN <= v <= INT64_MAX:
        raise WireError(f"not an int64: {type(v).__name__}")
    return v


def _ints(v: Any) -> list[int]:
    if type(v) is not list or not all(type(x) is int for x in v):
        raise WireError("not a list of ints")
    return v


def _strs(v: Any) -> list[str]:
    if type(v) is not list or not all(type(x) is str for x in v):
        raise WireError("not a list of strings")
    return v


def _list(v: Any) -> list[Any]:
    if type(v) is not list:
        raise WireError("not a list")
    return v

"""The query channel's data-only format (query/wire.py, query/expr_wire.py): every request and
answer type round-trips exactly, expressions travel as text that parses back to the same tree
(or as the tree), and anything outside the allow-list is refused, never run."""

from __future__ import annotations

import ast
import pickle
import struct
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.dataset import DatasetRef
from core.errors import DatasetUnknownError, Internal, Invalid, Unavailable
from query.aggregate import PUSHABLE_OPS, Partial, label_key
from query.executor import NodeAnswer, NodeQuery, ShardsNotHere
from query.expr_wire import (
    MAX_TREE_DEPTH,
    TEXT,
    TREE,
    WireError,
    expr_bytes,
    expr_of,
    pack,
    tree_data,
    tree_of,
)
from query.limits import QueryLimitExceeded, QueryLimits
from query.promql import (
    Binary,
    Call,
    NumberLiteral,
    QueryError,
    Unary,
    VectorSelector,
    parse,
    resolve_at,
    walk,
)
from query.pushdown import absent_count, is_pushable, is_series_local
from query.service import NodeUnavailable, ShardsUnavailable
from query.values import SeriesData, StepMatrix
from query.wire import (
    RemoteQueryError,
    decode_reply,
    decode_request,
    encode_answer,
    encode_error,
    encode_request,
)
from store.api import INT64_MAX, INT64_MIN, LabelMatcher, MatchOp, StaleEpochError, StoreTimeout

REF = DatasetRef.of("m")

# ------------------------------------------------------------------------------- strategies

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=6)
values = st.text(st.characters(codec="utf-8"), max_size=6)
label_sets = st.lists(st.dictionaries(names, values, max_size=3), max_size=4)
# Any 64 bits as a float64: NaN with payloads and signs, infinities, -0.0, subnormals.
float_bits = st.integers(0, (1 << 64) - 1)
int64s = st.integers(INT64_MIN, INT64_MAX)


def f64(bits: list[int], shape: tuple[int, ...]) -> np.ndarray:
    return np.array(bits, np.uint64).view(np.float64).reshape(shape)


@st.composite
def step_matrices(draw: st.DrawFn) -> StepMatrix:
    labels = draw(label_sets)
    n, t = len(labels), draw(st.integers(0, 4))
    times = np.array(draw(st.lists(int64s, min_size=t, max_size=t)), np.int64)
    vals = f64(draw(st.lists(float_bits, min_size=n * t, max_size=n * t)), (n, t))
    present = np.array(draw(st.lists(st.booleans(), min_size=n * t, max_size=n * t)), bool)
    return StepMatrix(times, labels, vals, present.reshape(n, t), draw(st.booleans()))


@st.composite
def partials(draw: st.DrawFn) -> Partial:
    op = draw(st.sampled_from(sorted(PUSHABLE_OPS)))
    labels = draw(label_sets)
    n, t = len(labels), draw(st.integers(0, 4))

    def cells() -> np.ndarray:
        return f64(draw(st.lists(float_bits, min_size=n * t, max_size=n * t)), (n, t))

    times = np.array(draw(st.lists(int64s, min_size=t, max_size=t)), np.int64)
    counts = np.array(draw(st.lists(int64s, min_size=n * t, max_size=n * t)), np.int64)
    m2 = cells() if op in ("stddev", "stdvar") else None
    keys = [label_key(lab) for lab in labels] if draw(st.booleans()) else None
    return Partial(op, times, labels, cells(), counts.reshape(n, t), m2, keys)


@st.composite
def series_lists(draw: st.DrawFn) -> list[SeriesData]:
    out = []
    for labels in draw(label_sets):
        k = draw(st.integers(0, 5))
        ts = np.array(draw(st.lists(int64s, min_size=k, max_size=k)), np.int64)
        out.append(
            SeriesData(labels, ts, f64(draw(st.lists(float_bits, min_size=k, max_size=k)), (k,)))
        )
    return out


results = st.one_of(
    step_matrices(),
    partials(),
    label_sets,
    series_lists(),
    st.dictionaries(st.integers(0, 50), st.one_of(step_matrices(), partials()), max_size=3),
)

# ------------------------------------------------------------------------------- comparison


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bits (NaN payloads and -0.0 included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same(a: Any, b: Any) -> bool:
    if isinstance(a, StepMatrix):
        return (
            isinstance(b, StepMatrix)
            and a.labels == b.labels
            and a.finalized == b.finalized
            and all(same_array(x, y) for x, y in [(a.times, b.times), (a.values, b.values)])
            and same_array(a.present, b.present)
        )
    if isinstance(a, Partial):
        arrays = [(a.times, b.times), (a.values, b.values), (a.counts, b.counts)]
        m2 = (a.m2 is None and b.m2 is None) or (
            a.m2 is not None and b.m2 is not None and same_array(a.m2, b.m2)
        )
        return (
            (a.op, a.labels, a.keys) == (b.op, b.labels, b.keys)
            and m2
            and all(same_array(x, y) for x, y in arrays)
        )
    if isinstance(a, SeriesData):
        return a.labels == b.labels and same_array(a.ts, b.ts) and same_array(a.vals, b.vals)
    if isinstance(a, dict) and a and not all(isinstance(k, str) for k in a):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and a and isinstance(a[0], SeriesData):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def answer_round_trip(answer: NodeAnswer) -> NodeAnswer:
    kind, back = decode_reply(encode_answer(answer))
    assert kind == "ok" and isinstance(back, NodeAnswer)
    return back


# ---------------------------------------------------------------------------------- answers


@given(
    results,
    st.lists(st.integers(0, 1 << 16), max_size=4),
    int64s,
    int64s,
    st.lists(st.text(max_size=20), max_size=2).map(tuple),
)
def test_every_answer_type_round_trips_exactly(
    result: Any, shards: list[int], series: int, samples: int, warnings: tuple[str, ...]
) -> None:
    if isinstance(result, dict) and not result:
        result = []  # an empty batch answer is never sent (a node gets a batch of its parts)
    back = answer_round_trip(NodeAnswer(result, tuple(shards), series, samples, warnings))
    assert same(result, back.result)
    assert (back.shards, back.series, back.samples) == (tuple(shards), series, samples)
    assert back.warnings == warnings


def test_an_answer_without_warnings_is_the_four_fields_older_callers_read() -> None:
    kind, fields = msgpack.unpackb(encode_answer(NodeAnswer([], (1,), 2, 3)))
    assert kind == "ok" and len(fields) == 4 and fields[1:] == [[1], 2, 3]
    kind, fields = msgpack.unpackb(encode_answer(NodeAnswer([], (1,), 2, 3, ("approx",))))
    assert len(fields) == 5 and fields[4] == ["approx"]


def test_decoded_arrays_are_writable_as_unpickled_ones_were() -> None:
    m = StepMatrix(np.arange(2, dtype=np.int64), [{"a": "1"}], np.ones((1, 2)))
    back = answer_round_trip(NodeAnswer(m, (0,), 1, 2)).result
    for a in (back.times, back.values, back.present):
        a[...] = a  # raises on a read-only array


# --------------------------------------------------------------------------------- requests

EXPRS = [
    'rate(http_requests_total{job="api", code=~"5.."}[5m])',
    "abs(x - 3) > bool 2",
    'label_replace(x, "dst", "$1", "src", "(.*)")',
    "x offset 5m @ 1700000000.123",
    "-x * NaN",
    "x / -Inf",
    '{__name__=~"a.+", b!="c"}',
    'x{a="é 😀\\n\\"\\\\"}',
]
AGGS = ["sum by (job) (rate(x[5m]))", "stddev without (a) (x)", "count(present_over_time(x[1m]))"]


def node_queries() -> list[NodeQuery]:
    times = np.array([INT64_MIN, 0, 1_700_000_000_000, INT64_MAX], np.int64)
    matchers = (
        (LabelMatcher("__name__", MatchOp.EQ, "x"), LabelMatcher("a", MatchOp.RE, "b|c")),
        (LabelMatcher("d", MatchOp.NRE, ""), LabelMatcher("e", MatchOp.NE, "😀")),
    )
    parts = tuple(
        (i, "partial" if is_pushable(e) else "series_local", e, (i, i + 1))
        for i, e in enumerate(parse(t) for t in EXPRS + AGGS)
    )
    return [
        *(NodeQuery("series_local", parse(t), times, 60_000) for t in EXPRS),
        *(NodeQuery("partial", parse(t), times[:1], 1) for t in AGGS),
        NodeQuery("series", matchers=matchers, start_ms=INT64_MIN, end_ms=INT64_MAX),
        NodeQuery("series"),
        NodeQuery("raw", matchers=matchers[:1], start_ms=5, end_ms=9),
        NodeQuery("batch", times=times, lookback_ms=300_000, parts=parts),
        NodeQuery("raw", matchers=matchers[:1], limits=QueryLimits("team-a", 10, 0, 4, 1)),
    ]


def same_query(a: NodeQuery, b: NodeQuery) -> bool:
    times = (a.times is None and b.times is None) or (
        a.times is not None and b.times is not None and same_array(a.times, b.times)
    )
    fields = ("kind", "lookback_ms", "matchers", "start_ms", "end_ms", "limits")

    def tree(e: Any) -> bytes | None:  # bit for bit: a NaN literal is not == another
        return None if e is None else pack(tree_data(e))

    def parts(q: NodeQuery) -> list[Any]:
        return [(i, kind, tree(e), shards) for i, kind, e, shards in q.parts]

    return (
        times
        and all(getattr(a, f) == getattr(b, f) for f in fields)
        and tree(a.expr) == tree(b.expr)
        and parts(a) == parts(b)
    )


@pytest.mark.parametrize("query", node_queries(), ids=lambda q: q.kind)
def test_every_request_kind_round_trips_on_the_channel_and_through_ray(query: NodeQuery) -> None:
    ref, shards, back = decode_request(encode_request(REF, [3, 1], query))
    assert ref is REF and shards == [3, 1]
    assert same_query(query, back)
    assert same_query(query, pickle.loads(pickle.dumps(query)))  # the Ray path


@given(
    st.lists(
        st.lists(st.tuples(names, st.sampled_from(["=", "!="]), values), max_size=3), max_size=3
    ),
    int64s,
    int64s,
    st.lists(st.integers(0, 1 << 20), max_size=5),
)
def test_series_requests_round_trip(
    selectors: list[list[tuple[str, str, str]]], start: int, end: int, shards: list[int]
) -> None:
    matchers = tuple(tuple(LabelMatcher(*m) for m in sel) for sel in selectors)
    query = NodeQuery("series", matchers=matchers, start_ms=start, end_ms=end)
    _, got_shards, back = decode_request(encode_request(REF, shards, query))
    assert got_shards == shards and same_query(query, back)


def test_a_node_part_is_pickled_for_ray_without_a_pickle_of_its_tree() -> None:
    expr = parse("sum by (a) (rate(x[5m]))")
    data = pickle.dumps(NodeQuery("partial", expr, np.zeros(1, np.int64), 1))
    assert b"query.promql" not in data  # no class of the tree is named: nothing to build
    assert expr_bytes(expr) == TEXT + b"sum by (a) (rate(x[5m]))"


# ------------------------------------------------------------------------------ expressions


def node_parts(text: str) -> list[Any]:
    """Every tree a node part can hold for the query: its series-local subtrees and pushable
    aggregations (as the service sends them, `@` resolved), and what absent() asks for."""
    expr = parse(text, matrix_ok=True)
    out = []
    for tree in (expr, resolve_at(expr, 1_700_000_000_123, 1_700_000_060_456)):
        out += [x for x in walk(tree) if is_series_local(x) or is_pushable(x)]
        out += [
            absent_count(x)
            for x in walk(tree)
            if isinstance(x, Call) and x.func in ("absent", "absent_over_time")
        ]
    return out


def compliance_queries() -> list[str]:
    from tests.compliance import harness

    return [c.query for c in harness.load_cases()]


def test_every_node_part_of_the_compliance_queries_travels_as_text_that_parses_back() -> None:
    seen = 0
    for text in compliance_queries():
        try:
            parts = node_parts(text)
        except QueryError:
            continue  # a query FiloPy refuses sends nothing
        for part in parts:
            data = expr_bytes(part)
            assert data[:1] == TEXT, (text, part)
            assert pack(tree_data(expr_of(data))) == pack(tree_data(part)), text
            seen += 1
    assert seen > 1000


def query_test_texts() -> list[str]:
    """Every string constant of the query and REST tests (most are queries)."""
    root = Path(__file__).resolve().parent.parent
    out = set()
    for path in [*root.glob("query/*.py"), *root.glob("rest/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.add(node.value)
    return sorted(out)


def test_every_node_part_of_the_query_tests_travels_as_text_that_parses_back() -> None:
    seen = 0
    for text in query_test_texts():
        try:
            parts = node_parts(text)
        except QueryError:
            continue  # not a query, or one FiloPy refuses
        for part in parts:
            data = expr_bytes(part)
            assert data[:1] == TEXT, (text, part)
            assert pack(tree_data(expr_of(data))) == pack(tree_data(part)), text
            seen += 1
    assert seen > 1000


@pytest.mark.parametrize(
    "text",
    [
        *EXPRS,
        "x > nan",
        "x - -(3)",  # a unary minus of a literal, not the literal -3
        "x - -3",
        '{a="1", __name__="foo"}',  # the name matcher where it was written
        '{__name__="foo.bar"}',  # a name that is not an identifier
        '{__name__="inf"}',  # ... or a keyword
        '{__name__="bool"} * 2',
        'x{a="\\x01\\u2028\\U0001F600"}',
        "sum without () (x)",
        "rate(x[5m] @ 100.5 offset -1ms)",
        'quantile_over_time(0.9, x{a=~"b"}[1h:1m])',
    ],
)
def test_edge_case_trees_travel_as_text_and_parse_back_bit_for_bit(text: str) -> None:
    for part in node_parts(text):
        data = expr_bytes(part)
        assert data[:1] == TEXT, (text, data)
        assert pack(tree_data(expr_of(data))) == pack(tree_data(part))


def test_a_tree_without_exact_text_travels_as_the_tree() -> None:
    """A negative `@` (a query started before 1970 with `@ start()`) is text the parser panics
    on; -0 formats as 0; a long chain of unary minus formats deeper than a query may be: each is
    sent as the tree, node by node, and read back the same."""
    trees = [
        resolve_at(parse("rate(x[5m] @ start())"), -5_500, 0),
        Binary("*", parse("x"), NumberLiteral(-0.0)),
        parse("-" * 199 + "x"),
    ]
    for tree in trees:
        data = expr_bytes(tree)
        assert data[:1] == TREE
        assert pack(tree_data(expr_of(data))) == pack(tree_data(tree))
    assert expr_of(expr_bytes(trees[2])) == trees[2]


def test_the_node_reads_each_expression_once() -> None:
    expr = parse("sum by (b) (rate(y[5m]))")
    data = expr_bytes(expr)
    assert expr_bytes(expr) is data  # formatted and checked once per tree
    assert expr_of(bytes(data)) is expr_of(bytes(data))  # parsed once per text


@pytest.mark.parametrize(
    "data",
    [
        ["v", "x", [["a", "=~", "("]], 0, None],  # a regex that does not compile
        ["v", "x", [["a", "~", "b"]], 0, None],  # no such match op
        ["c", "system", [["s", "ls"]]],  # no such function
        ["a", "eval", ["n", 1.0], None, [], False],  # no such aggregation
        ["b", "@", ["n", 1.0], ["n", 1.0], False, ["one-to-one", False, [], []]],
        ["u", "+", ["n", 1.0]],
        ["n", "1"],  # a number as a string
        ["v", "x", [], 1.5, None],  # an offset that is not an int
        ["M", ["n", 1.0], 300_000],  # a range of anything but a selector
        ["Z"],
        "x",
    ],
)
def test_a_tree_outside_the_allow_list_is_refused(data: Any) -> None:
    with pytest.raises(WireError):
        expr_of(TREE + pack(data))


def test_a_tree_too_deep_is_refused_before_it_is_walked_further() -> None:
    deep: Any = ["n", 1.0]
    for _ in range(MAX_TREE_DEPTH + 1):
        deep = ["u", "-", deep]
    with pytest.raises(WireError, match="deeper"):
        tree_of(deep)


def test_expression_bytes_of_no_known_form_are_refused() -> None:
    with pytest.raises(WireError):
        expr_of(pickle.dumps(parse("x")))
    with pytest.raises(WireError):
        expr_of(TEXT + b"\xff\xfe")
    with pytest.raises(QueryError):  # text that does not parse: a query error, as any
        expr_of(TEXT + b"sum(")


# ----------------------------------------------------------------------------------- errors


class Unpicklable(Exception):
    def __reduce__(self) -> object:
        raise TypeError("not today")


def error_round_trip(err: BaseException) -> BaseException:
    kind, back = decode_reply(encode_error(err))
    assert kind == "error" and isinstance(back, BaseException)
    return back


def test_filopy_errors_cross_as_themselves_with_their_fields() -> None:
    back = error_round_trip(ShardsNotHere("m", "n1", [9, 3]))
    assert type(back) is ShardsNotHere and (back.dataset, back.node, back.shards) == (
        "m",
        "n1",
        [9, 3],
    )
    assert str(back) == str(ShardsNotHere("m", "n1", [9, 3]))
    for kind in ("bad_data", "unsupported", "execution", "unavailable"):
        err = QueryError(kind, f"it went {kind}")  # type: ignore[arg-type]
        back = error_round_trip(err)
        assert type(back) is QueryError and (back.kind, back.message, str(back)) == (
            kind,
            err.message,
            str(err),
        )
        assert back.category is err.category
    stale = error_round_trip(StaleEpochError("m", 3, 4, 5))
    assert type(stale) is StaleEpochError and (stale.shard, stale.current_epoch) == (3, 5)
    for err in (
        StoreTimeout("the store timed out"),
        NodeUnavailable("node n1 failed"),
        DatasetUnknownError("nope"),
        Invalid("bad"),
        RemoteQueryError("KeyError: 'x'"),
    ):
        back = error_round_trip(err)
        assert type(back) is type(err) and str(back) == str(err) and vars(back) == vars(err)


@pytest.mark.parametrize(
    "err",
    [ValueError("no"), KeyError("x"), Unpicklable("boom"), AssertionError("a bug")],
)
def test_any_other_error_arrives_as_a_remote_error_with_its_type_and_message(
    err: BaseException,
) -> None:
    back = error_round_trip(err)
    assert type(back) is RemoteQueryError
    assert str(back) == f"{type(err).__name__}: {err}"


# ---------------------------------------------------------------------------------- refusal


class Touch:
    """A pickle that, if ever loaded, creates a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (str(self.path), "w")


def good_request() -> list[Any]:
    query = NodeQuery("series_local", parse("x"), np.zeros(2, np.int64))
    return msgpack.unpackb(encode_request(REF, [1], query))  # type: ignore[no-any-return]


def object_array() -> list[Any]:
    return ["|O", [1], struct.pack("<q", 0)]


def tampered(index: int, value: Any) -> bytes:
    req = good_request()
    req[index] = value
    return pack(req)


def test_a_request_without_limits_is_as_it_was_before_them() -> None:
    """Ten fields, as before the limits: nodes of either version read it."""
    assert len(good_request()) == 10
    _, _, back = decode_request(pack(good_request()))
    assert back.limits is None and back.kind == "series_local"


def limited_request() -> list[Any]:
    matchers = ((LabelMatcher("a", MatchOp.EQ, "b"),),)
    query = NodeQuery("raw", matchers=matchers, limits=QueryLimits("t", 5, 0, 0, 0))
    return msgpack.unpackb(encode_request(REF, [1], query))  # type: ignore[no-any-return]


def with_limits(value: Any) -> bytes:
    req = limited_request()
    req[10] = value
    return pack(req)


class OwnInvalid(Invalid):
    """A node's error that is not on the allow-list."""

    error_type = "bad_shape"


class OwnInternal(Internal):
    pass


def test_a_limit_error_crosses_as_itself() -> None:
    back = error_round_trip(QueryLimitExceeded("team-a", "samples", 1000))
    assert type(back) is QueryLimitExceeded
    assert (back.tenant, back.limit, back.maximum) == ("team-a", "samples", 1000)
    assert "query.tenant_max_samples = 1000" in str(back)


@pytest.mark.parametrize(
    ("err", "category"),
    [
        (OwnInvalid("the shape is wrong"), Invalid),
        (ShardsNotHere("m", "n", [object()]), Unavailable),  # type: ignore[list-item]
        (ShardsUnavailable("m", {2: "Down"}), Unavailable),
    ],
)
def test_a_filopy_error_not_crossing_as_itself_crosses_as_its_category(
    err: BaseException, category: type[BaseException]
) -> None:
    back = error_round_trip(err)
    assert isinstance(back, category) and str(err) in str(back)
    assert getattr(back, "error_type", None) == getattr(err, "error_type", None)


def test_an_internal_error_of_a_node_arrives_as_a_remote_error_with_its_message() -> None:
    back = error_round_trip(OwnInternal("an invariant broke"))
    assert type(back) is RemoteQueryError and str(back) == "OwnInternal: an invariant broke"


REFUSED_REQUESTS = {
    "pickle": lambda p: pickle.dumps((REF, [1], Touch(p))),
    "ext type": lambda p: msgpack.packb([msgpack.ExtType(42, b"\x80\x04")]),
    "ext type in a field": lambda p: tampered(4, msgpack.ExtType(1, b"")),
    "object dtype": lambda p: tampered(4, object_array()),
    "float times": lambda p: tampered(4, ["<f8", [1], struct.pack("<d", 0.5)]),
    "short array": lambda p: tampered(4, ["<i8", [3], b"\0" * 8]),
    "big-endian dtype": lambda p: tampered(4, [">i8", [1], b"\0" * 8]),
    "unknown kind": lambda p: tampered(2, "exec"),
    "bad dataset name": lambda p: tampered(0, "../etc"),
    "expression as a pickle": lambda p: tampered(3, pickle.dumps(Touch(p))),
    "truncated": lambda p: encode_request(REF, [1], NodeQuery("series"))[:-3],
    "not a list": lambda p: pack({"kind": "series"}),
    "extra data": lambda p: encode_request(REF, [1], NodeQuery("series")) + b"\xc0",
    "limits not a list": lambda p: with_limits({"tenant": "a"}),
    "limits short": lambda p: with_limits(["a", 1, 2]),
    "limits of floats": lambda p: with_limits(["a", 1.5, 0, 0, 0]),
    "a field past the limits": lambda p: pack([*limited_request(), None]),
}


@pytest.mark.parametrize("name", list(REFUSED_REQUESTS))
def test_a_request_outside_the_schema_is_refused_and_runs_nothing(
    name: str, tmp_path: Path
) -> None:
    path = tmp_path / "touched"
    with pytest.raises(WireError):
        decode_request(REFUSED_REQUESTS[name](path))
    assert not path.exists()


REFUSED_ANSWERS = {
    "pickle": lambda p: pickle.dumps(("ok", Touch(p))),
    "pickled error": lambda p: pickle.dumps(("error", Touch(p))),
    "object dtype": lambda p: pack(
        ["ok", [["m", object_array(), [], object_array(), object_array(), False], [], 0, 0]]
    ),
    "unknown result": lambda p: pack(["ok", [["x", 1], [], 0, 0]]),
    "ext type": lambda p: msgpack.packb(["ok", msgpack.ExtType(7, b"")]),
    "error field": lambda p: pack(
        ["error", ["query.promql.QueryError", ["m"], {"__class__": "x"}]]
    ),
    "nested batch": lambda p: pack(["ok", [["b", [[0, ["b", []]]]], [], 0, 0]]),
}


@pytest.mark.parametrize("name", list(REFUSED_ANSWERS))
def test_an_answer_outside_the_schema_is_refused_and_runs_nothing(
    name: str, tmp_path: Path
) -> None:
    path = tmp_path / "touched"
    with pytest.raises(WireError):
        decode_reply(REFUSED_ANSWERS[name](path))
    assert not path.exists()


def test_an_error_of_a_newer_node_arrives_as_a_remote_error() -> None:
    kind, err = decode_reply(pack(["error", ["query.future.Error", ["it broke"], {}]]))
    assert kind == "error" and type(err) is RemoteQueryError and str(err) == "Error: it broke"


def test_an_answer_that_does_not_cross_says_so() -> None:
    with pytest.raises(TypeError):
        encode_answer(NodeAnswer(object(), (), 0, 0))
    objects = np.zeros((1, 1), object)
    matrix = StepMatrix(np.zeros(1, np.int64), [{}], objects, np.ones((1, 1), bool))
    with pytest.raises(TypeError):  # an object array is refused on the way out too
        encode_answer(NodeAnswer(matrix, (), 0, 0))


def test_unary_minus_of_a_literal_keeps_its_shape() -> None:
    tree = parse("x - -(3)")
    assert isinstance(tree.rhs, Unary)  # type: ignore[attr-defined]
    assert isinstance(parse("-3"), NumberLiteral)
    assert isinstance(parse('{__name__="inf"}'), VectorSelector)

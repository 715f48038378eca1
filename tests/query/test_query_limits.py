"""Query depth: a query nesting deeper than `MAX_QUERY_DEPTH` is a 400 naming the limit, refused
from its text before the Rust parser (which crashes the process with a stack overflow from a few
thousand levels) or any Python recursion sees it; queries at the limit parse, evaluate, format
and pickle, also called from deep inside a server's stack; and the same over HTTP."""

from __future__ import annotations

import pickle
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import promql_parser as pp
import pytest

from core.dataset import Dataset
from query.evaluator import LocalBackend, evaluate
from query.promql import MAX_QUERY_DEPTH, QueryError, depth_bound, format_expr, parse
from query.values import Scalar, StepMatrix
from tests.query.test_engine import LOOKBACK, QUERIES, SOURCE, START
from tests.rest.conftest import Rest, start_rest

T = TypeVar("T")
N = MAX_QUERY_DEPTH


def shapes(depth: int) -> dict[str, str]:
    """Queries whose expression tree is exactly `depth` levels deep (the leaf included)."""
    k = depth - 1
    return {
        "parentheses": "(" * k + "up" + ")" * k,
        "sum": "sum(" * k + "up" + ")" * k,
        "function": "abs(" * k + "up" + ")" * k,
        "clamp_max": "clamp_max(" * k + "up" + ", 2)" * k,
        "topk": "topk(3, " * k + "up" + ")" * k,
        "left-deep chain": " + ".join(["up"] * depth),
        "set-operator chain": " or ".join(["up"] * depth),
        "scalar chain": " * ".join(["1"] * depth),
        "right-nested": "(" * (k % 2) + "up + (" * (k // 2) + "up" + ")" * (k // 2 + k % 2),
        "unary minus": "-" * k + "up",
        "sum of rates": "sum(" * (depth - 3) + "rate(http_requests_total[5m])" + ")" * (depth - 3),
    }


DEEP = {
    "(((…))) x 5000": "(" * 5000 + "up" + ")" * 5000,
    "sum( x 2000": "sum(" * 2000 + "up" + ")" * 2000,
    "a + a + … + a x 5000": " + ".join(["up"] * 5000),
    "a + (a + (… x 3000": "up + (" * 3000 + "up" + ")" * 3000,
    "abs( x 2000": "abs(" * 2000 + "up" + ")" * 2000,
    "rate in sum( x 2000": "sum(" * 2000 + "rate(up[5m])" + ")" * 2000,
    "- x 5000": "-" * 5000 + "up",
    "(((…))) x 100000, unclosed": "(" * 100_000 + "up",
    "and x 5000": " and ".join(["up"] * 5000),
}


# A request handler's stack (uvicorn, anyio's worker thread or a Ray actor's task) is a few
# dozen frames deep; the queries at the limit must also run this deep, with room to spare.
HANDLER_DEPTH = 180


def deep_stack(depth: int, fn: Callable[[], T]) -> T:
    """Call `fn` at `depth` Python frames from the bottom of the stack, whatever the test
    runner's own depth (pytest-xdist's workers run tests a few frames deeper than pytest)."""
    frame, here = sys._getframe(), 0
    while frame is not None:
        frame, here = frame.f_back, here + 1

    def down(frames: int) -> T:
        return fn() if frames <= 0 else down(frames - 1)

    return down(depth - here)


def parsed_depth(node: Any) -> int:
    """Depth of promql_parser's own tree (parentheses included), without recursion."""
    best, todo = 0, [(node, 1)]
    while todo:
        n, d = todo.pop()
        best = max(best, d)
        kids: list[Any] = []
        if isinstance(n, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
            kids = [n.expr]
        elif isinstance(n, pp.AggregateExpr):
            kids = [n.expr] + ([n.param] if n.param is not None else [])
        elif isinstance(n, pp.Call):
            kids = list(n.args)
        elif isinstance(n, pp.BinaryExpr):
            kids = [n.lhs, n.rhs]
        elif isinstance(n, pp.MatrixSelector):
            kids = [n.vector_selector]
        todo.extend((k, d + 1) for k in kids)
    return best


@pytest.mark.parametrize("name", list(DEEP))
def test_too_deep_queries_are_bad_data_naming_the_limit(name: str) -> None:
    with pytest.raises(QueryError) as err:
        parse(DEEP[name])
    assert err.value.kind == "bad_data"
    assert f"query too deep: its expression nests more than {N} levels" in err.value.message
    # The error crosses Ray (pickled) intact.
    again = pickle.loads(pickle.dumps(err.value))
    assert (again.kind, again.message) == (err.value.kind, err.value.message)


@pytest.mark.parametrize("name", list(shapes(N)))
def test_queries_at_the_limit_run_and_one_more_level_is_refused(name: str) -> None:
    query = shapes(N)[name]
    assert depth_bound(query) == N
    assert parsed_depth(pp.parse(query)) == N
    # Parse, evaluate, format and pickle recurse once or more per level.
    expr = deep_stack(HANDLER_DEPTH, lambda: parse(query))
    value = deep_stack(
        HANDLER_DEPTH,
        lambda: evaluate(expr, LocalBackend(SOURCE), np.array([START + 600_000]), LOOKBACK),
    )
    assert isinstance(value, StepMatrix | Scalar)
    if isinstance(value, StepMatrix):
        assert len(value) > 0 and not np.isnan(value.values).all()
    # format_expr parenthesises every operator operand: more levels by this count, same tree.
    assert parse(deep_stack(HANDLER_DEPTH, lambda: format_expr(expr)), max_depth=3 * N) == expr
    assert deep_stack(HANDLER_DEPTH, lambda: pickle.loads(pickle.dumps(expr))) == expr
    with pytest.raises(QueryError, match="query too deep"):
        parse(shapes(N + 1)[name])


@pytest.mark.parametrize(
    "query",
    [
        *QUERIES,
        'up{job="((((((((", instance!="a+b-c*d"} + on(job) group_left(x) (up)',
        "sum by (job, and) (rate(up[5m] offset -5m)) / ignoring(or) up - -1e-5 ^ 2",
        "  # a comment (((( with - operators\n  max(up) > bool 0.5 unless (up)",
        "`(((`",
        "'\\'(((' ",
        "rate(up[5m:1m])",
        "topk(2, -(-(up)))",
        "vector(1) + vector(2) * vector(3) - scalar(sum(up))",
    ],
)
def test_the_text_bound_is_never_below_the_parsed_depth(query: str) -> None:
    assert depth_bound(query) >= parsed_depth(pp.parse(query))


def test_brackets_and_operators_in_strings_and_matchers_do_not_count() -> None:
    deep_text = "(" * 5000 + "+-*/"
    query = f'count(up{{job="{deep_text}", instance!="x"}}) # {deep_text}\n + 1'
    assert depth_bound(query) == 3
    expr = parse(query)
    assert format_expr(expr).startswith("count (up{")


def test_the_limit_is_a_parameter() -> None:
    assert parse("sum(sum(up))", max_depth=3)
    with pytest.raises(QueryError, match="more than 2 levels"):
        parse("sum(sum(up))", max_depth=2)


# ------------------------------------------------------------------------------------ over HTTP


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rest]:
    """The control plane only: depth is checked before any data is read."""
    yield from start_rest(Path(tmp_path_factory.mktemp("limits")), nodes=2)


@pytest.fixture(scope="module")
def dataset(rest: Rest) -> str:
    name = f"lim{uuid.uuid4().hex[:8]}"
    rest.client.setup_dataset(Dataset(name=name, num_shards=2, min_num_nodes=1))
    rest.wait_for("all shards active", lambda: rest.all_active(name), 60)
    return name


@pytest.mark.ray
@pytest.mark.parametrize("name", list(DEEP))
@pytest.mark.parametrize("endpoint", ["query", "query_range", "explain"])
def test_http_too_deep_is_a_400(rest: Rest, dataset: str, name: str, endpoint: str) -> None:
    form = {"query": DEEP[name], "time": "1700000000"}
    if endpoint == "query_range":
        form.update(start="1700000000", end="1700000600", step="60")
    # POST form: some of these are longer than a URL may be.
    resp = rest.http.post(f"/promql/{dataset}/api/v1/{endpoint}", data=form)
    body = resp.json()
    assert resp.status_code == 400, body
    assert body["status"] == "error" and body["errorType"] == "bad_data"
    assert f"query too deep: its expression nests more than {N} levels" in body["error"]


@pytest.mark.ray
@pytest.mark.parametrize("name", ["sum", "left-deep chain", "function", "parentheses"])
def test_http_queries_at_the_limit_succeed(rest: Rest, dataset: str, name: str) -> None:
    query = shapes(N - 1)[name].replace("up", "vector(1)")  # vector(1) is two levels
    assert depth_bound(query) == N
    resp = rest.http.post(
        f"/promql/{dataset}/api/v1/query", data={"query": query, "time": "1700000000"}
    )
    body = resp.json()
    assert resp.status_code == 200, body
    (row,) = body["data"]["result"]
    expected = {"left-deep chain": N - 1}.get(name, 1)
    assert float(row["value"][1]) == expected
    too_deep = rest.http.post(
        f"/promql/{dataset}/api/v1/query",
        data={"query": shapes(N + 1)[name], "time": "1700000000"},
    )
    assert too_deep.status_code == 400

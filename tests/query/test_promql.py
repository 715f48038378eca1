"""Parsing PromQL into FiloPy's AST: supported constructs, rejected ones, errors, pickling."""

from __future__ import annotations

import pickle

import pytest

from query.promql import (
    Aggregate,
    Binary,
    Call,
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
    resolve_at,
    selectors,
    value_type,
    walk,
)
from store.api import LabelMatcher, MatchOp

NAME_FOO = LabelMatcher("__name__", MatchOp.EQ, "foo")
FOO = VectorSelector("foo", (NAME_FOO,))
BAR = VectorSelector("bar", (LabelMatcher("__name__", MatchOp.EQ, "bar"),))


def sel(metric: str, *matchers: LabelMatcher, offset_ms: int = 0) -> VectorSelector:
    return VectorSelector(
        metric, (LabelMatcher("__name__", MatchOp.EQ, metric), *matchers), offset_ms
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", NumberLiteral(42.0)),
        ("-1.5e3", NumberLiteral(-1500.0)),
        ("0x10", NumberLiteral(16.0)),
        ('"hi"', StringLiteral("hi")),
        ("foo", FOO),
        ("(foo)", FOO),
        (
            'foo{a="1", b!="2", c=~"x.*", d!~"y|z"}',
            sel(
                "foo",
                LabelMatcher("a", MatchOp.EQ, "1"),
                LabelMatcher("b", MatchOp.NE, "2"),
                LabelMatcher("c", MatchOp.RE, "x.*"),
                LabelMatcher("d", MatchOp.NRE, "y|z"),
            ),
        ),
        (
            '{__name__="foo", job="x"}',
            VectorSelector("foo", (NAME_FOO, LabelMatcher("job", MatchOp.EQ, "x"))),
        ),
        (
            '{__name__=~"foo|bar"}',
            VectorSelector(None, (LabelMatcher("__name__", MatchOp.RE, "foo|bar"),)),
        ),
        ("foo offset 5m", sel("foo", offset_ms=300_000)),
        ("foo offset -1h30m", sel("foo", offset_ms=-5_400_000)),
        ("rate(foo[5m])", Call("rate", (MatrixSelector(FOO, 300_000),))),
        (
            "increase(foo[1m30s] offset 1m)",
            Call("increase", (MatrixSelector(sel("foo", offset_ms=60_000), 90_000),)),
        ),
        ("irate(foo[500ms])", Call("irate", (MatrixSelector(FOO, 500),))),
        ("last_over_time(foo[1h])", Call("last_over_time", (MatrixSelector(FOO, 3_600_000),))),
        ("clamp_min(foo, 2)", Call("clamp_min", (FOO, NumberLiteral(2.0)))),
        ("round(foo)", Call("round", (FOO,))),
        ("time()", Call("time", ())),
        ("vector(1)", Call("vector", (NumberLiteral(1.0),))),
        ("scalar(foo)", Call("scalar", (FOO,))),
        ("sum(foo)", Aggregate("sum", FOO)),
        ("sum by (a, b) (foo)", Aggregate("sum", FOO, None, ("a", "b"), False)),
        ("avg(foo) by (a)", Aggregate("avg", FOO, None, ("a",), False)),
        ("count without (a) (foo)", Aggregate("count", FOO, None, ("a",), True)),
        ("max without () (foo)", Aggregate("max", FOO, None, (), True)),
        ("topk(3, foo)", Aggregate("topk", FOO, NumberLiteral(3.0))),
        (
            "bottomk by (a) (scalar(bar), foo)",
            Aggregate("bottomk", FOO, Call("scalar", (BAR,)), ("a",), False),
        ),
        ("-foo", Unary("-", FOO)),
        ("-(1)", Unary("-", NumberLiteral(1.0))),
        ("foo + 1", Binary("+", FOO, NumberLiteral(1.0))),
        ("1 > bool 2", Binary(">", NumberLiteral(1.0), NumberLiteral(2.0), True)),
        ("foo >= bar", Binary(">=", FOO, BAR)),
        ("foo % bar ^ 2", Binary("%", FOO, Binary("^", BAR, NumberLiteral(2.0)))),
        (
            "foo == bool on(a) bar",
            Binary("==", FOO, BAR, True, VectorMatching("one-to-one", True, ("a",))),
        ),
        (
            "foo / ignoring(a, b) bar",
            Binary("/", FOO, BAR, False, VectorMatching(labels=("a", "b"))),
        ),
        (
            "foo * on(a) group_left(b, c) bar",
            Binary("*", FOO, BAR, False, VectorMatching("many-to-one", True, ("a",), ("b", "c"))),
        ),
        (
            "foo - ignoring(a) group_right bar",
            Binary("-", FOO, BAR, False, VectorMatching("one-to-many", False, ("a",))),
        ),
        ("foo and bar", Binary("and", FOO, BAR, False, VectorMatching("many-to-many"))),
        (
            "foo or on() bar",
            Binary("or", FOO, BAR, False, VectorMatching("many-to-many", True, ())),
        ),
        (
            "foo unless ignoring(a) bar",
            Binary("unless", FOO, BAR, False, VectorMatching("many-to-many", False, ("a",))),
        ),
    ],
)
def test_parse_supported(text: str, expected: object) -> None:
    expr = parse(text)
    assert expr == expected
    assert pickle.loads(pickle.dumps(expr)) == expr


@pytest.mark.parametrize(
    ("text", "construct"),
    [
        ("foo[5m:1m]", "range vector"),
        ("limitk(2, foo)", "aggregation 'limitk'"),
        ("foo + fill(0) bar", "fill modifiers"),
        ('{a="1" or b="2"}', "'or' between label matchers"),
        ("foo[5m]", "range vector"),
    ],
)
def test_parse_unsupported(text: str, construct: str) -> None:
    with pytest.raises(QueryError) as err:
        parse(text)
    assert err.value.kind == "unsupported"
    assert str(err.value).startswith("unsupported: ")
    assert construct in str(err.value)


@pytest.mark.parametrize(
    ("text", "parser_message"),
    [
        ("foo{", "unexpected end of input inside braces"),
        ("sum(", "unclosed left parenthesis"),
        ("rate(foo)", "expected type matrix in call to function 'rate'"),
        ("nosuch(foo)", "unknown function with name 'nosuch'"),
        ("1 > 2", "comparisons between scalars must use BOOL modifier"),
        ("foo[5m] + 1", "binary expression must contain only scalar and instant vector types"),
        ('foo{a=~"("}', "illegal regex"),
        ('foo{a=~"(?=x)y"}', "illegal regex"),  # a lookahead: Python's `re` has it, Go not
        ('foo{a=~"(x)\\\\1"}', "illegal regex"),  # a backreference, likewise
        ("", ""),
        ("foo @ -1", "must not be negative"),  # the parser panics reading such a time
        ("rate(foo[5m] @-1.5)", "must not be negative"),
        ("sum(foo[1m:] @ - 100)", "must not be negative"),
    ],
)
def test_parse_bad_data(text: str, parser_message: str) -> None:
    with pytest.raises(QueryError) as err:
        parse(text)
    assert err.value.kind == "bad_data"
    assert parser_message in str(err.value)


def test_an_at_inside_strings_and_comments_is_not_a_modifier() -> None:
    assert parse('foo{a="@ -1"} @ 5').at == 5000  # type: ignore[attr-defined]
    assert parse("# @ -1\nfoo @ 0").at == 0  # type: ignore[attr-defined]


def test_query_error_pickles() -> None:
    for kind in ("bad_data", "unsupported", "execution"):
        err = QueryError(kind, f"{kind}: something")
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is QueryError
        assert (back.kind, back.message, str(back)) == (
            kind,
            f"{kind}: something",
            f"{kind}: something",
        )


def test_selectors_and_walk() -> None:
    expr = parse('sum by (a) (rate(foo{x="1"}[5m] offset 1m)) / on(a) group_left bar + -baz')
    names = [s.metric for s in selectors(expr)]
    assert names == ["foo", "bar", "baz"]
    assert selectors(expr)[0].offset_ms == 60_000
    kinds = [type(n).__name__ for n in walk(expr)]
    assert kinds[0] == "Binary"
    assert kinds.count("VectorSelector") == 3 and "MatrixSelector" in kinds and "Unary" in kinds
    assert selectors(parse("topk(scalar(x), y)")) == [sel("x"), sel("y")]


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("1", "scalar"),
        ('"s"', "string"),
        ("time() + 1", "scalar"),
        ("-scalar(foo)", "scalar"),
        ("foo", "vector"),
        ("1 + foo", "vector"),
        ("vector(1)", "vector"),
        ("sum(foo)", "vector"),
        ("rate(foo[1m])", "vector"),
    ],
)
def test_value_type(text: str, kind: str) -> None:
    assert value_type(parse(text)) == kind


def test_metric_name_is_a_matcher_so_sources_can_filter_on_matchers_alone() -> None:
    s = parse('foo{job="x"}')
    assert isinstance(s, VectorSelector)
    assert s.matchers[0] == NAME_FOO
    assert s.matchers[0].matches({"__name__": "foo", "job": "x"})
    assert not all(m.matches({"__name__": "bar", "job": "x"}) for m in s.matchers)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "max_over_time(rate(foo[1m])[5m:30s] offset 1m)",
            Call(
                "max_over_time",
                (Subquery(Call("rate", (MatrixSelector(FOO, 60_000),)), 300_000, 30_000, 60_000),),
            ),
        ),
        ("sum_over_time(foo[1m:])", Call("sum_over_time", (Subquery(FOO, 60_000),))),
    ],
)
def test_subqueries_parse_and_format_back(text: str, expected: object) -> None:
    expr = parse(text)
    assert expr == expected
    assert parse(format_expr(expr)) == expr
    assert value_type(expected.args[0]) == "matrix"  # type: ignore[attr-defined]
    assert FOO in selectors(expr)


def test_the_at_modifier_parses_formats_back_and_resolves_start_and_end() -> None:
    expr = parse("rate(foo[5m] @ 100.5) + foo @ start() - max_over_time(foo[1m:] @ end())")
    assert parse(format_expr(expr)) == expr
    resolved = resolve_at(expr, 1_000, 9_000)
    ats = [getattr(n, "at", None) for n in walk(resolved) if hasattr(n, "at")]
    assert sorted(a for a in ats if a is not None) == [1_000, 9_000, 100_500]
    assert resolve_at(parse("foo"), 1, 2) == parse("foo")


def test_a_query_text_is_parsed_once_and_a_bad_one_is_refused_every_time() -> None:
    """Parsed trees are kept per text (they are immutable); errors are not kept."""
    text = "sum by (job) (rate(http_requests_total[5m]))"
    assert parse(text) is parse(text)
    assert parse(text, matrix_ok=True) == parse(text)
    for _ in range(2):
        with pytest.raises(QueryError, match="parse error"):
            parse("sum(")
    with pytest.raises(QueryError):
        parse("a[5m]")  # a range vector: refused unless matrix_ok, cached or not
    assert isinstance(parse("a[5m]", matrix_ok=True), MatrixSelector)

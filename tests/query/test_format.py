"""format_expr writes PromQL that parses back to the same expression."""

from __future__ import annotations

import pytest

from query.promql import format_expr, parse

QUERIES = [
    'sum by (job) (rate(x{a="b", c=~"d|e"}[5m] offset 1m)) / 2',
    "topk (3, max without (i) (m))",
    "a + on(job) group_left(x) b",
    "a * ignoring(i) group_right b",
    "-(a > bool 1)",
    'count_over_time({__name__=~"x.*"}[90s])',
    "x offset 90m",
    "irate(http_requests_total[1h])",
    "a and b or c unless d",
    "scalar(sum(a)) * 2.5",
]


@pytest.mark.parametrize("query", QUERIES)
def test_round_trip(query: str) -> None:
    expr = parse(query)
    assert parse(format_expr(expr)) == expr
    assert format_expr(parse(format_expr(expr))) == format_expr(expr)

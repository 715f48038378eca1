"""The engine against the brute-force reference on generated data, plus hand-checked cases."""

from __future__ import annotations

import math
import pickle
from collections.abc import Sequence

import numpy as np
import pytest

from core.staleness import STALE_NAN
from query.aggregate import Partial
from query.evaluator import LocalBackend, eval_series_local, evaluate, range_times
from query.promql import Aggregate, Expr, QueryError, parse
from query.pushdown import Backend, concat_matrices, is_pushable, is_series_local
from query.values import MemorySource, Scalar, SeriesData, StepMatrix, String
from store.api import LabelMatcher
from tests.query.reference import Reference, RefError, key

START = 1_700_000_000_000
MIN = 60_000
SPAN = 60 * MIN
LOOKBACK = 5 * MIN


# ------------------------------------------------------------------------------------ data


def _scrapes(rng: np.random.Generator, start: int, end: int) -> np.ndarray:
    base = np.arange(start + int(rng.integers(0, 15_000)), end, 15_000)
    return base + rng.integers(-3_000, 3_000, len(base))  # jitter < half the interval


def generate(seed: int = 7) -> list[SeriesData]:
    """Counters with resets, gauges (with NaNs), 0/1 `up`, info series; jittered 15 s scrapes;
    late starts, early ends and gaps longer than the lookback."""
    rng = np.random.default_rng(seed)
    out: list[SeriesData] = []
    for job in ("api", "db"):
        for inst in ("a:1", "b:1", "c:1"):
            start, end = START, START + SPAN
            if (job, inst) == ("db", "c:1"):
                start = START + 12 * MIN  # starts late
            if (job, inst) == ("api", "c:1"):
                end = START + 45 * MIN  # ends early
            ts = _scrapes(rng, start, end)
            if (job, inst) == ("db", "b:1"):  # an 8-minute gap
                ts = ts[(ts < START + 20 * MIN) | (ts > START + 28 * MIN)]
            for code in ("200", "500"):
                incs = rng.poisson(3.0 if code == "200" else 0.4, len(ts)).astype(float) * 1.5
                resets = set(rng.choice(len(ts), size=int(rng.integers(0, 3)), replace=False))
                vals, v = [], float(rng.uniform(0, 500))
                for i in range(len(ts)):
                    v = float(rng.uniform(0, 2)) if i in resets else v + incs[i]
                    vals.append(v)
                labels = {"__name__": "http_requests_total", "job": job, "instance": inst}
                out.append(SeriesData({**labels, "code": code}, ts, np.array(vals)))
            temp = 10 + np.cumsum(rng.normal(0, 1.5, len(ts)))
            temp[rng.choice(len(ts), size=2, replace=False)] = np.nan  # NaN samples are ignored
            out.append(
                SeriesData({"__name__": "temperature", "job": job, "instance": inst}, ts, temp)
            )
            up = (rng.random(len(ts)) > 0.1).astype(float)
            out.append(SeriesData({"__name__": "up", "job": job, "instance": inst}, ts, up))
    for inst, version in (("a:1", "1.0"), ("b:1", "2.0")):
        ts = _scrapes(rng, START, START + SPAN)
        labels = {"__name__": "build_info", "instance": inst, "version": version}
        out.append(SeriesData(labels, ts, np.ones(len(ts))))
    return out


DATA = generate()
SOURCE = MemorySource(DATA)
REF = Reference(
    [(s.labels, list(zip(s.ts.tolist(), s.vals.tolist(), strict=True))) for s in DATA], LOOKBACK
)
RANGE = range_times(START + 3 * MIN, START + SPAN + 7 * MIN, 130_000)
INSTANTS = [START + 4 * MIN, START + 25 * MIN, START + 47 * MIN + 13, START + SPAN + 3 * MIN]

RATE = "rate(http_requests_total[5m])"
QUERIES = [
    # selectors and offset
    "http_requests_total",
    'http_requests_total{code="200"}',
    'http_requests_total{code!="200", job="api"}',
    'http_requests_total{instance=~"a.*|c:1"}',
    'temperature{instance!~"a.*"}',
    '{__name__=~"temperature|up", instance="b:1"}',
    "temperature offset 7m",
    "up offset -2m",
    # range functions
    RATE,
    "increase(http_requests_total[3m])",
    "irate(http_requests_total[1m])",
    "delta(temperature[4m])",
    "sum_over_time(temperature[2m])",
    "avg_over_time(temperature[6m])",
    "min_over_time(temperature[3m])",
    "max_over_time(temperature[3m])",
    "count_over_time(temperature[90s])",
    "last_over_time(temperature[2m])",
    "rate(http_requests_total[10m] offset 5m)",
    "stddev_over_time(temperature[5m])",
    "stdvar_over_time(temperature[3m])",
    "quantile_over_time(0.3, temperature[6m])",
    "quantile_over_time(0.95, http_requests_total[4m])",
    "changes(up[10m])",
    "resets(http_requests_total[10m])",
    "deriv(temperature[5m])",
    "idelta(temperature[3m])",
    "present_over_time(up[2m])",
    # math and scalar functions
    "abs(temperature)",
    "ceil(temperature)",
    "floor(temperature)",
    "round(temperature)",
    "clamp_min(temperature, 9)",
    "clamp_max(temperature, 12)",
    "sqrt(temperature)",
    "exp(temperature / 10)",
    "ln(temperature)",
    "log2(temperature)",
    "log10(temperature)",
    "sgn(temperature - 11)",
    "deg(temperature)",
    "rad(temperature)",
    "sin(temperature)",
    "cos(temperature)",
    "atan(temperature)",
    "sinh(temperature / 10)",
    "tanh(temperature - 11)",
    'clamp_min(temperature, scalar(temperature{job="api", instance="a:1"}))',
    "time()",
    "vector(time())",
    "scalar(sum(up))",
    "time() - 5 * 2",
    "1 + 2 ^ 3",
    "2 > bool 1",
    # aggregations
    f"sum({RATE})",
    f"sum by (job) ({RATE})",
    f"sum without (instance) ({RATE})",
    "avg by (instance) (temperature)",
    "min without (job) (temperature)",
    "max by (job) (temperature)",
    "stddev(temperature)",
    "stdvar by (job) (temperature)",
    "group by (job) (up)",
    "quantile(0.3, temperature)",
    f"quantile by (job) (0.9, {RATE})",
    "quantile(1.5, temperature)",
    "count(up == 1)",
    "count by (code) (http_requests_total)",
    "avg(temperature > 10)",
    'sum by (__name__) ({__name__=~"up|temperature"})',
    "topk(2, temperature)",
    "bottomk(2, temperature)",
    f"topk by (job) (1, {RATE})",
    "bottomk(time() % 3, temperature)",  # k varies per step: 0, 1 or 2
    "topk(0, temperature)",
    "sum(topk(3, temperature))",
    "max(temperature) - min(temperature)",
    # vector-scalar arithmetic and comparison
    "temperature + 1",
    "2 * temperature",
    "temperature / 0",
    "temperature % 3",
    "-temperature % 3",
    "temperature ^ 2",
    "1 - temperature",
    "-temperature",
    "temperature > 10",
    "temperature > bool 10",
    "10 < temperature",
    "10 >= bool temperature",
    "temperature != 11",
    "temperature * time()",
    f"sum by (job) ({RATE}) > 1",
    # vector-vector matching
    "temperature + up",
    "temperature * on(job, instance) up",
    "temperature - ignoring(code) up",
    "temperature > up",
    "temperature <= bool on(job, instance) temperature",
    "temperature / on(instance) group_left sum by (instance) (temperature)",
    "temperature * on(instance) group_left(version) build_info",
    "build_info * on(instance) group_right(version) up",
    "build_info <= on(instance) group_right up",
    f"{RATE} / ignoring(code) group_left sum without (code) ({RATE})",
    f"sum by (job, instance) ({RATE}) / on(job, instance) temperature",
    # set operators
    "temperature and up == 1",
    "temperature or up",
    'temperature{job="api"} or temperature',
    "temperature unless up == 0",
    'temperature and on(instance) up{job="db"}',
    "up unless ignoring(job) build_info",
    "http_requests_total or on(job) temperature",
    # nesting
    f"sum by (job) (clamp_max({RATE} * 60, 100)) + on(job) group_left count by (job) (up)",
    "-(sum(temperature) / count(temperature))",
]
ERROR_QUERIES = [
    "temperature + on(job) up",  # many series per job on both sides
    "temperature * on(job) group_left build_info",  # build_info has no job: one match group
    f"{RATE} + on(job, instance) temperature",  # several codes on the left, one-to-one
    '{__name__=~"temperature|up"} * 2',  # same label sets once the name is gone
    'bottomk(scalar(count(up{job="api"})), temperature)',  # k is NaN after the data ends
]


def engine_rows(result: StepMatrix) -> dict:
    rows: dict = {}
    for labels, row, has in zip(result.labels, result.values, result.present, strict=True):
        assert key(labels) not in rows, f"duplicate series {labels}"
        rows[key(labels)] = {
            int(t): float(v) for t, v, h in zip(result.times, row, has, strict=True) if h
        }
    return rows


def assert_same(expected: dict, got: dict, query: str) -> None:
    assert set(got) == set(expected), f"{query}: label sets differ"
    for k, exp in expected.items():
        assert set(got[k]) == set(exp), f"{query}: steps differ for {k}"
        for t, v in exp.items():
            same_nan = math.isnan(v) and math.isnan(got[k][t])
            assert same_nan or math.isclose(got[k][t], v, rel_tol=1e-9, abs_tol=1e-9), (
                query,
                k,
                t,
                got[k][t],
                v,
            )


def check(query: str, times: Sequence[int]) -> None:
    expr = parse(query)
    try:
        expected = REF.evaluate(expr, times)
    except RefError:
        with pytest.raises(QueryError) as err:
            evaluate(expr, LocalBackend(SOURCE), np.array(times), LOOKBACK)
        assert err.value.kind == "execution"
        return
    got = evaluate(expr, LocalBackend(SOURCE), np.array(times), LOOKBACK)
    if isinstance(got, Scalar):
        assert isinstance(expected, list)
        np.testing.assert_allclose(got.values, expected, rtol=1e-9, atol=1e-9)
        return
    assert isinstance(got, StepMatrix), got
    np.testing.assert_array_equal(got.times, times)
    assert got.present.any(axis=1).all(), "empty series returned"
    assert isinstance(expected, dict)
    assert_same(expected, engine_rows(got), query)
    if len(times) == 1:
        assert [key(lb) for lb in got.labels] == REF.instant_order(expr, times[0]), query


def test_generated_data_has_what_the_tests_rely_on() -> None:
    counters = [s for s in DATA if s.labels["__name__"] == "http_requests_total"]
    assert any((np.diff(s.vals) < 0).any() for s in counters), "no counter resets"
    assert any(np.diff(s.ts).max() > LOOKBACK for s in DATA), "no gap longer than the lookback"
    assert any(np.isnan(s.vals).any() for s in DATA)
    assert len({np.diff(s.ts).min() for s in DATA}) > 1, "scrapes are not jittered"


@pytest.mark.parametrize("query", QUERIES)
def test_range_query_matches_reference(query: str) -> None:
    check(query, RANGE.tolist())


@pytest.mark.parametrize("query", QUERIES)
def test_instant_query_matches_reference(query: str) -> None:
    for t in INSTANTS:
        check(query, [t])


@pytest.mark.parametrize("query", ERROR_QUERIES)
def test_matching_errors_match_reference(query: str) -> None:
    with pytest.raises(RefError):
        REF.evaluate(parse(query), RANGE.tolist())
    check(query, RANGE.tolist())


def test_queries_are_not_trivially_empty() -> None:
    empty = []
    for query in QUERIES:
        result = evaluate(query, LocalBackend(SOURCE), RANGE, LOOKBACK)
        if isinstance(result, StepMatrix) and len(result) == 0:
            empty.append(query)
    assert empty == ["topk(0, temperature)"]


def test_string_literal() -> None:
    result = evaluate('"hello"', LocalBackend(SOURCE), [START])
    assert isinstance(result, String) and result.value == "hello"


# ------------------------------------------------------------------------------ hand-checked


def at(query: str, series: list[SeriesData], t_ms: int, lookback_ms: int = LOOKBACK) -> StepMatrix:
    result = evaluate(query, LocalBackend(MemorySource(series)), [t_ms], lookback_ms)
    assert isinstance(result, StepMatrix)
    return result


def only(result: StepMatrix) -> float:
    assert len(result) == 1, result.labels
    return float(result.values[0, 0])


def counter(values: list[float], times_s: list[int], name: str = "c", **labels: str) -> SeriesData:
    return SeriesData({"__name__": name, **labels}, np.array(times_s) * 1000, np.array(values))


def test_rate_extrapolates_to_the_window_edges() -> None:
    # Window (0s, 60s]: 4 samples 15 s apart, 10 s after the start and 5 s before the end.
    c = counter([100, 115, 130, 145], [10, 25, 40, 55])
    assert only(at("increase(c[1m])", [c], 60_000)) == pytest.approx(45 * 60 / 45)
    assert only(at("rate(c[1m])", [c], 60_000)) == pytest.approx(1.0)
    assert at("rate(c[1m])", [c], 60_000).labels == [{}]


def test_rate_does_not_extrapolate_below_zero() -> None:
    # Extrapolating 10 s back would go below zero; the zero point is 2 s before the first sample.
    c = counter([2, 17, 32, 47], [10, 25, 40, 55])
    assert only(at("increase(c[1m])", [c], 60_000)) == pytest.approx(45 + 2 + 5)
    # delta is not a counter function: it extrapolates all the way (and may go negative).
    g = counter([50, 40, 30, 20], [10, 25, 40, 55])
    assert only(at("delta(c[1m])", [g], 60_000)) == pytest.approx(-30 * 60 / 45)


def test_negative_counter_start_is_extrapolated_fully() -> None:
    # The zero-point limit only applies to counters starting at or above zero.
    c = counter([-5, 10, 25, 40], [10, 25, 40, 55])
    assert only(at("increase(c[1m])", [c], 60_000)) == pytest.approx(45 * 60 / 45)


def test_rate_extrapolates_half_an_interval_when_samples_stop_short() -> None:
    # Samples start 40 s into the window: more than 1.1 average intervals, so only 2.5 s is added.
    c = counter([10, 15, 20, 25], [40, 45, 50, 55])
    assert only(at("increase(c[1m])", [c], 60_000)) == pytest.approx(15 * (15 + 2.5 + 5) / 15)


def test_rate_needs_two_samples() -> None:
    c = counter([10], [40])
    assert len(at("rate(c[1m])", [c], 60_000)) == 0
    assert only(at("count_over_time(c[1m])", [c], 60_000)) == 1


def test_counter_reset() -> None:
    c = counter([10, 20, 5, 15], [10, 25, 40, 55])
    # raw increase 5 + 20 lost at the reset; zero point 18 s back is beyond the window start
    assert only(at("increase(c[1m])", [c], 60_000)) == pytest.approx(25 * 60 / 45)
    assert only(at("irate(c[1m])", [c], 60_000)) == pytest.approx(10 / 15)
    assert only(at("irate(c[1m])", [c], 45_000)) == pytest.approx(5 / 15)  # reset: last value
    assert only(at("delta(c[1m])", [c], 60_000)) == pytest.approx(5 * 60 / 45)


def test_lookback_window_is_left_open() -> None:
    s = counter([7.0], [0])
    assert only(at("c", [s], 299_999)) == 7.0
    assert len(at("c", [s], 300_000)) == 0  # (t - 5m, t] excludes t - 5m
    assert only(at("c", [s], 0)) == 7.0
    assert len(at("c", [s], -1)) == 0
    assert len(at("c", [s], 60_000, lookback_ms=60_000)) == 0
    # range windows too: (t - 1m, t]
    s2 = counter([1.0, 2.0], [0, 30])
    assert only(at("count_over_time(c[1m])", [s2], 60_000)) == 1
    assert only(at("count_over_time(c[1m])", [s2], 59_999)) == 2


def test_offset_shifts_the_window() -> None:
    s = counter([1.0, 2.0, 3.0], [0, 60, 120])
    assert only(at("c offset 1m", [s], 120_000)) == 2.0
    assert only(at("c offset 2m", [s], 120_000)) == 1.0
    assert only(at("c offset -1m", [s], 0)) == 2.0
    assert only(at("sum_over_time(c[1m] offset 1m)", [s], 120_000)) == 2.0
    assert at("c offset 1m", [s], 120_000).labels == [{"__name__": "c"}]


def test_comparisons_filter_or_return_bool() -> None:
    series = [counter([3.0], [0], job="a"), counter([8.0], [0], job="b")]
    r = at("c > 5", series, 0)
    assert r.labels == [{"__name__": "c", "job": "b"}] and only(r) == 8.0
    r = at("5 < c", series, 0)  # the vector's value is kept even on the right-hand side
    assert r.labels == [{"__name__": "c", "job": "b"}] and only(r) == 8.0
    r = at("c > bool 5", series, 0)
    assert r.labels == [{"job": "a"}, {"job": "b"}]
    assert r.values[:, 0].tolist() == [0.0, 1.0]
    r = at("c == bool c", series, 0)
    assert r.values[:, 0].tolist() == [1.0, 1.0] and r.labels == [{"job": "a"}, {"job": "b"}]


def test_group_left_copies_labels_from_the_one_side() -> None:
    series = [
        counter([10.0], [0], "mem", instance="x", job="j1"),
        counter([20.0], [0], "mem", instance="x", job="j2"),
        counter([30.0], [0], "mem", instance="y", job="j1"),
        counter([1.0], [0], "info", instance="x", version="v1"),
    ]
    r = at("mem * on(instance) group_left(version) info", series, 0)
    assert r.labels == [
        {"instance": "x", "job": "j1", "version": "v1"},
        {"instance": "x", "job": "j2", "version": "v1"},
    ]
    assert r.values[:, 0].tolist() == [10.0, 20.0]
    r = at("info * on(instance) group_right mem", series, 0)
    assert r.labels == [{"instance": "x", "job": "j1"}, {"instance": "x", "job": "j2"}]
    r = at("info < on(instance) group_right mem", series, 0)  # keeps the left (one) side's value
    assert r.values[:, 0].tolist() == [1.0, 1.0]
    assert r.labels == [
        {"__name__": "mem", "instance": "x", "job": "j1"},
        {"__name__": "mem", "instance": "x", "job": "j2"},
    ]


def test_one_to_one_keeps_only_on_labels() -> None:
    series = [counter([10.0], [0], "a", i="1", j="x"), counter([2.0], [0], "b", i="1", j="y")]
    r = at("a / on(i) b", series, 0)
    assert r.labels == [{"i": "1"}] and only(r) == 5.0
    r = at("a / ignoring(j) b", series, 0)
    assert r.labels == [{"i": "1"}] and only(r) == 5.0
    assert len(at("a / b", series, 0)) == 0  # j differs


def test_duplicate_match_is_an_execution_error() -> None:
    series = [
        counter([1.0], [0], "a", job="j", i="1"),
        counter([2.0], [0], "b", job="j", i="1"),
        counter([3.0], [0], "b", job="j", i="2"),
    ]
    with pytest.raises(QueryError, match="found duplicate series for the match group") as err:
        at("a + on(job) b", series, 0)
    assert err.value.kind == "execution"
    with pytest.raises(QueryError, match=r"duplicate series .* on the left hand-side"):
        at("b + on(job) group_right a", series, 0)
    # Prometheus skips a step where either side is empty, duplicates and all
    late_a = [counter([1.0], [600], "a", job="j", i="1"), *series[1:]]
    r = evaluate("a + on(job) b", LocalBackend(MemorySource(late_a)), [0, 600_000], LOOKBACK)
    assert isinstance(r, StepMatrix) and len(r) == 0


def test_duplicates_on_the_many_side_need_group_left() -> None:
    series = [
        counter([2.0], [0], "b", job="j", i="1"),
        counter([3.0], [0], "b", job="j", i="2"),
        counter([10.0], [0], "a", job="j"),
    ]
    with pytest.raises(QueryError, match="many-to-one matching must be explicit"):
        at("b + on(job) a", series, 0)
    r = at("b + on(job) group_left a", series, 0)
    assert r.values[:, 0].tolist() == [12.0, 13.0]
    # only matches that survive a filtering comparison count as duplicates
    r = at("b > on(job) a - 7.5", series, 0)
    assert r.labels == [{"job": "j"}] and only(r) == 3.0
    with pytest.raises(QueryError, match="many-to-one matching must be explicit"):
        at("b > on(job) a - 11", series, 0)


def test_dropping_the_name_merges_or_clashes() -> None:
    clash = [counter([1.0, 2.0], [0, 30], "x", i="1"), counter([5.0, 6.0], [0, 30], "y", i="1")]
    with pytest.raises(QueryError, match="same labelset") as err:
        at('rate({i="1"}[1m])', clash, 30_000)
    assert err.value.kind == "execution"
    # series that never have a value at the same step merge into one
    apart = [counter([1.0, 2.0], [0, 30], "x", i="1"), counter([5.0, 6.0], [600, 630], "y", i="1")]
    r = evaluate('{i="1"} * 2', LocalBackend(MemorySource(apart)), [30_000, 630_000], LOOKBACK)
    assert isinstance(r, StepMatrix)
    assert r.labels == [{"i": "1"}] and r.values.tolist() == [[4.0, 12.0]]


def test_topk_keeps_labels_and_orders_instant_results_by_value() -> None:
    series = [counter([float(v)], [0], "m", i=str(i)) for i, v in enumerate([5, 9, 1, 9, 7])]
    r = at("topk(3, m)", series, 0)
    assert [lb["i"] for lb in r.labels] == ["1", "3", "4"]  # equal values: by labels
    assert r.values[:, 0].tolist() == [9.0, 9.0, 7.0] and r.labels[0]["__name__"] == "m"
    r = at("bottomk(2, m)", series, 0)
    assert [lb["i"] for lb in r.labels] == ["2", "0"]
    with pytest.raises(QueryError, match="overflows int64"):
        at("topk(scalar(nothing), m)", series, 0)


def test_topk_ties_at_the_cut_are_decided_as_prometheus_heap_decides_them() -> None:
    # Series reach the heap in label order; a later equal value never displaces the root, but
    # a better value replaces the root, which is the first of the equal ones.
    series = [counter([float(v)], [0], "m", i=str(i)) for i, v in enumerate([3, 3, 5])]
    assert sorted(lb["i"] for lb in at("topk(2, m)", series, 0).labels) == ["1", "2"]
    series = [counter([float(v)], [0], "m", i=str(i)) for i, v in enumerate([3, 3, 1])]
    assert sorted(lb["i"] for lb in at("bottomk(2, m)", series, 0).labels) == ["1", "2"]
    series = [counter([float(v)], [0], "m", i=str(i)) for i, v in enumerate([3, 3, 3])]
    assert sorted(lb["i"] for lb in at("topk(2, m)", series, 0).labels) == ["0", "1"]
    nan = float("nan")
    series = [counter([v], [0], "m", i=str(i)) for i, v in enumerate([nan, nan, 2.0, nan])]
    # NaN sorts first in the heap: the number replaces the root NaN (series 1), which then
    # sinks below series 0's NaN; series 3's NaN replaces nothing.
    assert sorted(lb["i"] for lb in at("topk(2, m)", series, 0).labels) == ["0", "2"]
    assert sorted(lb["i"] for lb in at("bottomk(2, m)", series, 0).labels) == ["0", "2"]


def test_without_drops_the_name_and_by_keeps_only_listed_labels() -> None:
    series = [counter([1.0], [0], "m", a="1", b="x"), counter([2.0], [0], "m", a="1", b="y")]
    assert at("sum without (b) (m)", series, 0).labels == [{"a": "1"}]
    assert at("sum by (a, nosuch) (m)", series, 0).labels == [{"a": "1"}]
    assert at("max by (__name__) (m)", series, 0).labels == [{"__name__": "m"}]
    assert only(at("avg(m)", series, 0)) == 1.5


def test_round_takes_halves_up() -> None:
    series = [counter([v], [0], i=str(v)) for v in (2.5, -2.5, 0.5, 1.4999, -0.7)]
    r = at("round(c)", series, 0)
    got = {lb["i"]: v for lb, v in zip(r.labels, r.values[:, 0], strict=True)}
    assert got == {"2.5": 3.0, "-2.5": -2.0, "0.5": 1.0, "1.4999": 1.0, "-0.7": -1.0}


def test_nan_samples_are_values() -> None:
    s = counter([1.0, math.nan], [0, 30])
    assert math.isnan(only(at("c", [s], 40_000)))
    assert only(at("count_over_time(c[1m])", [s], 40_000)) == 2
    assert math.isnan(only(at("sum_over_time(c[1m])", [s], 40_000)))
    assert only(at("max_over_time(c[1m])", [s], 40_000)) == 1.0  # NaN loses to any number


def test_nan_results_are_values() -> None:
    s = counter([0.0], [0])
    assert math.isnan(only(at("c / 0", [s], 0)))
    assert only(at("c / 0 > bool 0", [s], 0)) == 0.0  # a comparison with NaN is false
    assert len(at("c / 0 > 0", [s], 0)) == 0  # ... so a filter drops it
    two = [counter([0.0], [0], i="a"), counter([2.0], [0], i="b")]
    assert math.isnan(only(at("sum(c / 0)", two, 0)))
    assert math.isnan(only(at("avg(c / c)", two, 0)))
    assert only(at("min(c / c)", two, 0)) == 1.0


def test_staleness_marker_ends_a_series() -> None:
    s = counter([1.0, STALE_NAN, 3.0], [0, 30, 60])
    assert len(at("c", [s], 40_000)) == 0  # the latest sample is the marker: nothing
    assert only(at("c", [s], 20_000)) == 1.0
    assert only(at("c", [s], 70_000)) == 3.0
    assert only(at("count_over_time(c[2m])", [s], 70_000)) == 2  # markers are not samples
    assert len(at("count_over_time(c[15s])", [s], 40_000)) == 0
    assert len(at("timestamp(c)", [s], 40_000)) == 0


def test_scalar_and_vector_functions() -> None:
    series = [counter([3.0], [0], job="a"), counter([4.0], [0], job="b")]
    backend = LocalBackend(MemorySource(series))
    s = evaluate('scalar(c{job="a"})', backend, [0, 600_000])
    assert isinstance(s, Scalar)
    assert s.values[0] == 3.0 and math.isnan(s.values[1])  # no sample within the lookback
    s = evaluate("scalar(c)", backend, [0])  # two series: NaN
    assert isinstance(s, Scalar) and math.isnan(s.values[0])
    v = evaluate("vector(time())", backend, [0, 5_000])
    assert isinstance(v, StepMatrix) and v.labels == [{}] and v.values.tolist() == [[0.0, 5.0]]


def test_range_query_steps() -> None:
    times = range_times(0, 100_000, 30_000)
    assert times.tolist() == [0, 30_000, 60_000, 90_000]
    s = counter([1.0, 2.0, 3.0], [0, 40, 80])
    r = evaluate("c", LocalBackend(MemorySource([s])), times, 30_000)
    assert isinstance(r, StepMatrix)
    np.testing.assert_array_equal(r.values, [[1.0, np.nan, 2.0, 3.0]])


# ------------------------------------------------------------------------- distribution shape


class CountingSource:
    def __init__(self, source: MemorySource) -> None:
        self.source = source
        self.calls: list[tuple[tuple[LabelMatcher, ...], int, int]] = []

    def select(
        self, matchers: Sequence[LabelMatcher], start_ms: int, end_ms: int
    ) -> list[SeriesData]:
        self.calls.append((tuple(matchers), start_ms, end_ms))
        return self.source.select(matchers, start_ms, end_ms)


class RecordingBackend:
    """Records what `evaluate` asks for; raw samples are only read through the wrapped one."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.local: list[Expr] = []
        self.partial: list[Aggregate] = []

    def series_local(self, expr: Expr, times: np.ndarray, lookback_ms: int) -> StepMatrix:
        self.local.append(expr)
        return self.inner.series_local(expr, times, lookback_ms)

    def partial_aggregate(self, agg: Aggregate, times: np.ndarray, lookback_ms: int) -> Partial:
        self.partial.append(agg)
        return self.inner.partial_aggregate(agg, times, lookback_ms)


def test_one_select_per_selector_over_the_whole_range() -> None:
    source = CountingSource(SOURCE)
    times = range_times(START + 10 * MIN, START + 20 * MIN, MIN)
    evaluate(
        f"sum({RATE}) / on() group_left sum(temperature offset 1m)", LocalBackend(source), times
    )
    assert len(source.calls) == 2
    windows = {matchers[0].value: (start, end) for matchers, start, end in source.calls}
    assert windows == {
        "http_requests_total": (START + 5 * MIN + 1, START + 20 * MIN),  # rate: (t - 5m, t]
        "temperature": (START + 4 * MIN + 1, START + 19 * MIN),  # offset 1m, lookback 5m
    }


def test_evaluate_delegates_series_local_and_pushable_subtrees() -> None:
    backend = RecordingBackend(LocalBackend(SOURCE))
    query = f"topk(1, sum by (job) ({RATE}) / on(job) group_left max by (job) (temperature + up))"
    evaluate(query, backend, RANGE)
    assert backend.partial == [parse(f"sum by (job) ({RATE})")]
    assert parse(RATE) not in backend.local  # it went into the partial, not to the caller
    assert backend.local == [parse("temperature"), parse("up")]


def test_classification() -> None:
    local = ["up", RATE, "abs(up) * 2", "-up", "1 - clamp_min(up, 0) > bool 0.5", "up * (2 + 3)"]
    for q in local:
        assert is_series_local(parse(q)), q
    for q in ["up + up", "sum(up)", "up * time()", "clamp_min(up, scalar(up))", "vector(1)"]:
        assert not is_series_local(parse(q)), q
    for q in ["sum(up)", "avg by (a) (rate(up[1m]))", "count without (a) (up > 1)"]:
        assert is_pushable(parse(q)), q
    for q in ["topk(1, up)", "sum(up + up)", "up", "max(sum(up))"]:
        assert not is_pushable(parse(q)), q
    with pytest.raises(ValueError):
        eval_series_local(parse("up + up"), SOURCE, RANGE)


def test_results_and_partials_pickle() -> None:
    agg = parse(f"sum by (job) ({RATE})")
    assert isinstance(agg, Aggregate)
    partial = LocalBackend(SOURCE).partial_aggregate(agg, RANGE, LOOKBACK)
    back = pickle.loads(pickle.dumps(partial))
    assert (back.op, back.labels) == (partial.op, partial.labels) and len(back.labels) == 2
    np.testing.assert_array_equal(back.values, partial.values)
    np.testing.assert_array_equal(back.counts, partial.counts)
    matrix = evaluate(agg, LocalBackend(SOURCE), RANGE, LOOKBACK)
    assert isinstance(matrix, StepMatrix)
    again = pickle.loads(pickle.dumps(matrix))
    assert again.labels == matrix.labels
    np.testing.assert_array_equal(again.values, matrix.values)


def test_concat_matrices_of_split_sources_equals_one_source() -> None:
    halves = [MemorySource(DATA[::2]), MemorySource(DATA[1::2])]
    for q in [RATE, "temperature > 10", "last_over_time(up[2m])"]:
        whole = eval_series_local(parse(q), SOURCE, RANGE, LOOKBACK)
        parts = concat_matrices([eval_series_local(parse(q), h, RANGE, LOOKBACK) for h in halves])
        assert parts.labels == whole.labels
        np.testing.assert_array_equal(parts.values, whole.values)


def test_a_subquery_window_without_a_multiple_of_its_step_is_empty() -> None:
    s = counter([float(i) for i in range(20)], list(range(0, 100, 5)), "m")
    # (62.999 s, 63.999 s] holds no multiple of 5 s: no points, so no series ...
    assert at("quantile_over_time(0.9, m[1s:5s])", [s], 63_999).labels == []
    assert at("avg_over_time(m[1s:5s])", [s], 63_999).labels == []
    # ... and absent_over_time of it is 1, labelled by nothing (a subquery has no matchers).
    r = at('absent_over_time(m{job="x"}[1s:5s])', [s], 63_999)
    assert r.labels == [{}] and only(r) == 1.0
    assert at("absent_over_time(m[10s:5s])", [s], 63_999).labels == []
    r = at("absent_over_time(rate(m[10s])[1m:5s])", [s], 200_000)
    assert r.labels == [{}] and only(r) == 1.0

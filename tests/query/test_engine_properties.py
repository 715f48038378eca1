"""Distribution properties: evaluating per source and merging equals evaluating on one source."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from query.aggregate import Partial, group_ids, group_labels
from query.evaluator import LocalBackend, eval_partial, eval_series_local, evaluate
from query.promql import Aggregate, Expr, parse
from query.pushdown import concat_matrices, finish, merge_partials
from query.values import MemorySource, SeriesData, StepMatrix

MIN = 60_000
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SERIES_LOCAL = [
    '{__name__=~"m|n"}',
    "m",
    'rate({__name__=~"m|n"}[2m])',
    "increase(m[3m] offset 1m)",
    'last_over_time({__name__=~"m|n"}[3m])',
    'max_over_time({__name__=~"m|n"}[2m]) * 2 - 1',
    'abs({__name__=~"m|n"} - 50) > 10',
    '{__name__=~"m|n"} >= bool 40',
    "clamp_max(-n, -20)",
]


@st.composite
def series_sets(draw: st.DrawFn) -> list[SeriesData]:
    """Series with distinct (a, b) labels (so dropping the name never makes two equal), random
    names, and irregular samples that include counter-like drops."""
    keys = draw(
        st.lists(
            st.tuples(st.sampled_from(["", "x", "y", "z"]), st.sampled_from(["", "1", "2"])),
            min_size=1,
            max_size=8,
            unique=True,
        )
    )
    out = []
    for a, b in keys:
        labels = {"__name__": draw(st.sampled_from(["m", "n"]))}
        if a:
            labels["a"] = a
        if b:
            labels["b"] = b
        ts = draw(st.lists(st.integers(0, 30 * MIN), min_size=1, max_size=60, unique=True))
        vals = draw(
            st.lists(
                st.floats(0, 100, allow_nan=False).map(lambda v: round(v, 3)),
                min_size=len(ts),
                max_size=len(ts),
            )
        )
        out.append(SeriesData(labels, np.array(sorted(ts), dtype=np.int64), np.array(vals)))
    return out


@st.composite
def splits(draw: st.DrawFn) -> tuple[list[SeriesData], list[MemorySource]]:
    series = draw(series_sets())
    n = draw(st.integers(1, 4))
    owner = draw(st.lists(st.integers(0, n - 1), min_size=len(series), max_size=len(series)))
    sources = [
        MemorySource([s for s, o in zip(series, owner, strict=True) if o == i]) for i in range(n)
    ]
    return series, sources


@st.composite
def step_times(draw: st.DrawFn) -> np.ndarray:
    start = draw(st.integers(0, 20 * MIN))
    step = draw(st.sampled_from([15_000, 30_000, 60_000, 97_000]))
    n = draw(st.integers(1, 25))
    return start + step * np.arange(n, dtype=np.int64)


@st.composite
def aggregations(draw: st.DrawFn) -> Aggregate:
    op = draw(st.sampled_from(["sum", "min", "max", "count", "avg"]))
    grouping = draw(st.lists(st.sampled_from(["a", "b", "__name__"]), unique=True, max_size=3))
    mode = draw(st.sampled_from(["", "by", "without"]))
    inner = draw(st.sampled_from(SERIES_LOCAL))
    clause = f" {mode} ({', '.join(grouping)})" if mode else ""
    expr = parse(f"{op}{clause} ({inner})")
    assert isinstance(expr, Aggregate)
    return expr


def assert_matrices_close(got: StepMatrix, want: StepMatrix) -> None:
    assert got.labels == want.labels
    np.testing.assert_array_equal(got.times, want.times)
    np.testing.assert_array_equal(got.present, want.present)
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(want.values))
    np.testing.assert_allclose(got.values, want.values, rtol=1e-9, atol=1e-9)


class SplitBackend:
    """A distributed backend in miniature: each source plays a node."""

    def __init__(self, sources: list[MemorySource]) -> None:
        self.sources = sources

    def series_local(self, expr: Expr, times: np.ndarray, lookback_ms: int) -> StepMatrix:
        return concat_matrices(
            [eval_series_local(expr, s, times, lookback_ms) for s in self.sources]
        )

    def partial_aggregate(self, agg: Aggregate, times: np.ndarray, lookback_ms: int) -> Partial:
        return merge_partials([eval_partial(agg, s, times, lookback_ms) for s in self.sources])


@SETTINGS
@given(split=splits(), agg=aggregations(), times=step_times(), data=st.data())
def test_merged_partials_equal_single_source(split, agg, times, data) -> None:
    series, sources = split
    lookback = data.draw(st.sampled_from([MIN, 5 * MIN]))
    want = evaluate(agg, LocalBackend(MemorySource(series)), times, lookback)
    assert isinstance(want, StepMatrix)
    parts = [eval_partial(agg, s, times, lookback) for s in sources]
    assert_matrices_close(finish(merge_partials(parts)), want)
    # merging is order- and grouping-independent
    perm = data.draw(st.permutations(parts))
    if len(perm) > 1:
        nested = merge_partials([merge_partials(perm[:1]), merge_partials(perm[1:])])
        assert_matrices_close(finish(nested), want)


@SETTINGS
@given(split=splits(), query=st.sampled_from(SERIES_LOCAL), times=step_times())
def test_series_local_on_split_sources_concatenates_to_single_source(split, query, times) -> None:
    series, sources = split
    expr = parse(query)
    want = eval_series_local(expr, MemorySource(series), times, 5 * MIN)
    got = concat_matrices([eval_series_local(expr, s, times, 5 * MIN) for s in sources])
    assert got.labels == want.labels
    np.testing.assert_array_equal(got.values, want.values)


WHOLE_QUERIES = [
    'topk(2, rate({__name__=~"m|n"}[3m]))',
    "sum by (a) (m) / on(a) group_left max by (a) (n)",
    'count({__name__=~"m|n"} > 30) + scalar(sum(n))',
    "avg without (b) (m) or sum by (a) (n)",
    'bottomk by (a) (1, {__name__=~"m|n"}) and on(a) m',
    "min(sum by (b) (m) > 0)",
    "m + on(b) n",  # duplicate matches are errors, through the split backend too
]


@SETTINGS
@given(split=splits(), query=st.sampled_from(WHOLE_QUERIES), times=step_times())
def test_whole_queries_through_a_split_backend(split, query, times) -> None:
    series, sources = split
    try:
        want = evaluate(query, LocalBackend(MemorySource(series)), times)
    except Exception as e:  # matching errors must surface identically through the split
        try:
            evaluate(query, SplitBackend(sources), times)
        except type(e) as again:
            assert str(again) == str(e)
            return
        raise AssertionError(f"split backend did not raise {e!r}") from None
    got = evaluate(query, SplitBackend(sources), times)
    assert isinstance(want, StepMatrix) and isinstance(got, StepMatrix)
    assert_matrices_close(got, want)


@SETTINGS
@given(
    rows=st.lists(
        st.dictionaries(
            st.sampled_from(["a", "b", "c", "__name__"]), st.sampled_from(["", "1", "2"])
        ),
        max_size=12,
    ),
    grouping=st.lists(st.sampled_from(["a", "b", "c", "__name__", "d"]), max_size=4),
    without=st.booleans(),
)
def test_group_ids_are_the_distinct_group_label_sets_in_first_seen_order(
    rows: list[dict[str, str]], grouping: list[str], without: bool
) -> None:
    """Rows grouped by their `by` values directly (one dict per group) group exactly as their
    `group_labels` do: the same groups, in first-seen order, and the same row -> group."""
    groups, ids = group_ids(rows, grouping, without)
    expected = [group_labels(r, grouping, without) for r in rows]
    assert [groups[i] for i in ids] == expected
    first_seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for g in expected:
        first_seen.setdefault(tuple(sorted(g.items())), g)
    assert groups == list(first_seen.values())

"""Query routing by shard key with spread: exactly the shards that can hold the series."""

from __future__ import annotations

import random

import pytest

from core.dataset import Dataset, SpreadOverride, SpreadSettings
from core.hashing import shard_for_series
from query.routing import literal_values, route, route_selector
from store.api import LabelMatcher, MatchOp

DS = Dataset(
    name="prom",
    num_shards=64,
    spread=SpreadSettings(
        default=2,
        overrides=(SpreadOverride(shard_key={"_ws_": "big", "_ns_": "app"}, spread=4),),
    ),
)


def eq(label: str, value: str) -> LabelMatcher:
    return LabelMatcher(label, MatchOp.EQ, value)


def test_a_full_shard_key_visits_two_to_the_spread_shards_holding_every_series() -> None:
    r = route_selector(
        DS, [eq("__name__", "http_requests_total"), eq("_ws_", "w"), eq("_ns_", "n")]
    )
    assert len(r.shards) == 4 and not r.all_shards
    (key,) = r.shard_keys
    assert key.spread == 2 and dict(key.shard_key) == {
        "_ws_": "w",
        "_ns_": "n",
        "_metric_": "http_requests_total",
    }
    rng = random.Random(7)
    for _ in range(500):  # any series of that shard key, whatever its other labels, is inside
        labels = {
            "_metric_": "http_requests_total",
            "_ws_": "w",
            "_ns_": "n",
            "instance": f"i{rng.randrange(10_000)}",
            "job": rng.choice(["a", "b"]),
        }
        assert shard_for_series(DS, labels) in r.shards


def test_histogram_suffixes_route_like_the_base_metric() -> None:
    base = route_selector(DS, [eq("__name__", "lat"), eq("_ws_", "w"), eq("_ns_", "n")])
    for suffix in ("_bucket", "_count", "_sum"):
        r = route_selector(DS, [eq("__name__", "lat" + suffix), eq("_ws_", "w"), eq("_ns_", "n")])
        assert r.shards == base.shards


def test_spread_override_and_per_query_spread() -> None:
    big = [eq("__name__", "m"), eq("_ws_", "big"), eq("_ns_", "app")]
    assert len(route_selector(DS, big).shards) == 16  # exact-match override: spread 4
    assert len(route_selector(DS, big, spread=0).shards) == 1  # per-query override wins
    with pytest.raises(ValueError, match="spread"):
        route_selector(DS, big, spread=7)


def test_alternations_expand_to_each_combination() -> None:
    r = route_selector(
        DS,
        [
            eq("__name__", "m"),
            LabelMatcher("_ws_", MatchOp.RE, "w1|w2"),
            LabelMatcher("_ns_", MatchOp.RE, "a|b|c"),
        ],
    )
    assert len(r.shard_keys) == 6
    want = set()
    for ws in ("w1", "w2"):
        for ns in ("a", "b", "c"):
            want |= set(
                route_selector(DS, [eq("__name__", "m"), eq("_ws_", ws), eq("_ns_", ns)]).shards
            )
    assert set(r.shards) == want


@pytest.mark.parametrize(
    "matchers",
    [
        [eq("_ws_", "w"), eq("_ns_", "n")],  # no metric name
        [eq("__name__", "m"), eq("_ws_", "w")],  # _ns_ missing
        [eq("__name__", "m"), eq("_ws_", "w"), LabelMatcher("_ns_", MatchOp.NE, "n")],
        [eq("__name__", "m"), eq("_ws_", "w"), LabelMatcher("_ns_", MatchOp.RE, "a.*")],
    ],
)
def test_without_a_pinned_shard_key_every_shard_is_visited(matchers) -> None:
    r = route_selector(DS, matchers)
    assert r.all_shards and r.shards == tuple(range(64))
    assert r.reason


def test_conflicting_equalities_visit_nothing() -> None:
    r = route_selector(DS, [eq("__name__", "m"), eq("_ws_", "a"), eq("_ws_", "b"), eq("_ns_", "n")])
    assert r.shards == ()


def test_literal_values() -> None:
    assert literal_values(eq("a", "x.y")) == ["x.y"]
    assert literal_values(LabelMatcher("a", MatchOp.RE, "b|a|b")) == ["a", "b"]
    assert literal_values(LabelMatcher("a", MatchOp.RE, "a.b")) is None
    assert literal_values(LabelMatcher("a", MatchOp.NRE, "a")) is None


def test_route_unions_selectors() -> None:
    a = [eq("__name__", "m"), eq("_ws_", "w"), eq("_ns_", "n")]
    b = [eq("__name__", "k"), eq("_ws_", "w"), eq("_ns_", "n")]
    routes, shards = route(DS, [a, b])
    assert set(shards) == set(routes[0].shards) | set(routes[1].shards)

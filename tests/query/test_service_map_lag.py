"""A node answers faster than the caller's shard map follows a move: the query waits for the map
to name the shard's new owner (a subscription trails the node's own map by milliseconds), but
not for a shard still starting where the map says (query/service.py, `_Run._caught_up`)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from core.shard_status import IngestionStarted, ShardAssignmentStarted, ShardMapState
from query.service import MAP_CATCH_UP_S, QueryService, ShardsUnavailable
from tests.query.test_service_fanout import DS, FakeMaps, FakeNodes, T, active_map


class LaggingMaps(FakeMaps):
    """The old map until `lag_s` after the first read, then the new one."""

    def __init__(self, old: ShardMapState, new: ShardMapState, lag_s: float) -> None:
        super().__init__(old)
        self.new, self.lag_s = new, lag_s
        self.first: float | None = None

    def shard_map(self, name: str) -> ShardMapState:
        now = time.monotonic()
        self.first = self.first or now
        return self.new if now - self.first >= self.lag_s else self.state

    def latest(self, name: str) -> ShardMapState:
        self.asked_latest = getattr(self, "asked_latest", 0) + 1
        return self.new


def test_the_query_waits_for_its_map_to_name_the_new_owner() -> None:
    m = active_map()
    old = m.snapshot()
    m.update_from_event(ShardAssignmentStarted(DS.ref, 1, "n2", "rebalance"))
    m.update_from_event(IngestionStarted(DS.ref, 1, "n2"))
    nodes = FakeNodes({"n1": [0], "n2": [1, 2, 3]})  # n1 already let shard 1 go
    svc = QueryService(LaggingMaps(old, m.snapshot(), 0.1), nodes)
    began = time.monotonic()
    got = svc.instant(DS.name, "count(a)", T + 500_000)
    assert 0.1 <= time.monotonic() - began < MAP_CATCH_UP_S
    assert got.shards == (0, 1, 2, 3) and not got.warnings
    assert np.array_equal(got.value.values, [[8.0]])  # type: ignore[union-attr]
    assert ("n2", (1,), "partial") in nodes.calls


def test_a_map_that_lags_past_the_catch_up_window_is_replaced_by_the_coordinators() -> None:
    m = active_map()
    old = m.snapshot()
    m.update_from_event(ShardAssignmentStarted(DS.ref, 1, "n2", "rebalance"))
    m.update_from_event(IngestionStarted(DS.ref, 1, "n2"))
    nodes = FakeNodes({"n1": [0], "n2": [1, 2, 3]})
    maps = LaggingMaps(old, m.snapshot(), lag_s=3600)  # the subscription is stuck
    got = QueryService(maps, nodes).instant(DS.name, "count(a)", T + 500_000)
    assert maps.asked_latest == 1
    assert got.shards == (0, 1, 2, 3) and not got.warnings
    assert np.array_equal(got.value.values, [[8.0]])  # type: ignore[union-attr]


def test_a_shard_no_map_names_a_new_owner_for_fails_the_query_after_the_window() -> None:
    nodes = FakeNodes({"n1": [0], "n2": [2, 3]})  # n1 let shard 1 go; nobody runs it
    maps = LaggingMaps(active_map().snapshot(), active_map().snapshot(), lag_s=0)
    began = time.monotonic()
    with pytest.raises(ShardsUnavailable, match="moved from n1"):
        QueryService(maps, nodes).instant(DS.name, "count(a)", T + 500_000)
    assert time.monotonic() - began >= MAP_CATCH_UP_S
    assert maps.asked_latest == 1


def test_a_shard_still_starting_on_its_node_is_not_waited_for() -> None:
    m = active_map()
    m.update_from_event(ShardAssignmentStarted(DS.ref, 1, "n2"))  # Assigned: n2 is starting it
    nodes = FakeNodes({"n1": [0], "n2": [2, 3]})
    svc = QueryService(FakeMaps(m.snapshot()), nodes)
    began = time.monotonic()
    with pytest.raises(ShardsUnavailable, match="not running on n2 yet"):
        svc.instant(DS.name, "count(a)", T + 500_000)
    assert time.monotonic() - began < MAP_CATCH_UP_S / 2

"""What a query keeps from one run to the next: its plan per text, each part's shards per
dataset definition, and each expression's bytes (`query.expr_wire`). Cached state must never
answer a run with another run's times, another definition's shards, or another tree."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from core.dataset import Dataset, DatasetRef, SpreadSettings
from query.evaluator import LocalBackend, evaluate
from query.executor import NodeQuery, run_node_query
from query.promql import parse
from query.service import QueryService, _Routes
from query.values import MemorySource, StepMatrix
from query.wire import decode_reply, decode_request, encode_answer, encode_error, encode_request
from tests.query.test_service_fanout import (
    DS,
    NODES,
    SERIES,
    Done,
    FakeMaps,
    FakeNodes,
    FakeSource,
    T,
    active_map,
    same,
)


class PicklingNodes(FakeNodes):
    """Fake nodes that get their requests as Ray delivers them: pickled."""

    def submit(self, node: str, ref: DatasetRef, shards, request: NodeQuery) -> Done:  # type: ignore[no-untyped-def, override]
        sent = pickle.loads(pickle.dumps((ref, list(shards), request), protocol=5))
        return super().submit(node, *sent)


class ChannelNodes(FakeNodes):
    """Fake nodes that get their requests, and send their answers, as the query channel does
    (`query.wire`)."""

    def submit(self, node: str, ref: DatasetRef, shards, request: NodeQuery) -> Done:  # type: ignore[no-untyped-def, override]
        done = super().submit(node, *decode_request(encode_request(ref, shards, request)))
        if done.error is not None:
            _, error = decode_reply(encode_error(done.error))
            return Done(error=error)
        assert done.answer is not None
        _, answer = decode_reply(encode_answer(done.answer))
        return Done(answer)


def reference(query: str, at_ms: int) -> StepMatrix:
    every = MemorySource(x for s in SERIES.values() for x in s)
    value = evaluate(query, LocalBackend(every), [at_ms])
    assert isinstance(value, StepMatrix)
    return value


@pytest.mark.parametrize("nodes", [PicklingNodes, ChannelNodes], ids=["ray", "channel"])
def test_a_tree_sent_again_is_read_as_the_same_tree_and_answers_alike(
    nodes: type[FakeNodes],
) -> None:
    query = "sum by (instance) (rate(a[5m])) / on(instance) sum by (instance) (rate(b[5m]))"
    svc = QueryService(FakeMaps(active_map().snapshot()), nodes(NODES))
    for at in (T + 400_000, T + 500_000):  # the second run: same trees, other times
        got = svc.instant(DS.name, query, at)
        assert isinstance(got.value, StepMatrix)
        assert same(got.value, reference(query, at)), at


def test_node_query_pickles_round_trip_with_the_expression_read_once() -> None:
    expr = parse("sum by (instance) (rate(a[5m]))")
    times = np.array([T, T + 60_000], np.int64)
    batch = NodeQuery("batch", times=times, lookback_ms=60_000, parts=((0, "partial", expr, (1,)),))
    single = NodeQuery("partial", expr, times, 60_000)
    raw = NodeQuery("raw", matchers=(), start_ms=5, end_ms=9)
    first, again = pickle.loads(pickle.dumps(batch)), pickle.loads(pickle.dumps(batch))
    assert first.parts[0][:2] == (0, "partial") and first.parts[0][3] == (1,)
    assert first.parts[0][2] == expr and first.parts[0][2] is again.parts[0][2]
    assert np.array_equal(first.times, times) and first.lookback_ms == 60_000
    back = pickle.loads(pickle.dumps(single))
    assert back.expr == expr and back.kind == "partial" and np.array_equal(back.times, times)
    assert pickle.loads(pickle.dumps(raw)) == raw
    # the node evaluates what was read as what was sent
    sent = run_node_query(single, FakeSource([0, 1]))  # type: ignore[arg-type]
    read = run_node_query(back, FakeSource([0, 1]))  # type: ignore[arg-type]
    assert sent.result.labels == read.result.labels
    assert np.array_equal(sent.result.values, read.result.values)


def test_at_end_is_resolved_for_each_run() -> None:
    """`@ end()` pins the selector to the run's own end: a plan kept from an earlier run must
    not pin it to that run's."""
    svc = QueryService(FakeMaps(active_map().snapshot()), FakeNodes(NODES))
    for at in (T + 300_000, T + 500_000):
        got = svc.instant(DS.name, "a @ end()", at)
        want = reference(f"a @ {at / 1000:.3f}", at)
        assert isinstance(got.value, StepMatrix) and same(got.value, want), at


def test_routes_are_kept_per_definition() -> None:
    expr = parse('a{_ws_="w", _ns_="n"}')
    wide = Dataset(name=DS.name, num_shards=8, spread=SpreadSettings(default=3))
    narrow = Dataset(name=DS.name, num_shards=8, spread=SpreadSettings(default=0))
    routes = _Routes()
    assert routes.shards(wide, expr, None) == tuple(range(8))
    one = routes.shards(narrow, expr, None)  # the same tree, a re-created definition
    assert len(one) == 1 and routes.shards(narrow, expr, None) == one
    assert len(routes.shards(narrow, expr, 1)) == 2  # a query's own spread
    assert routes.shards(wide, expr, None) == tuple(range(8))

"""DefaultShardAssignmentStrategy: the spec's worked examples and the formula's edge cases."""

from __future__ import annotations

import pytest

from coordinator import DefaultShardAssignmentStrategy, ShardAssignmentStrategy
from coordinator.strategy import max_shards_per_node
from filopy import IngestionError, ShardDown, ShardMapper
from tests.mapper_helpers import num_assigned_shards, register_node

from .support import dataset, ref

STRATEGY = DefaultShardAssignmentStrategy()


def assign_in_order(num_shards: int, min_nodes: int, nodes: int) -> list[list[int]]:
    """Ask each node in turn, applying its answer before asking the next."""
    ds = dataset(num_shards=num_shards, min_num_nodes=min_nodes)
    m = ShardMapper(num_shards)
    result = []
    for i in range(nodes):
        shards = STRATEGY.shard_assignments(f"n{i}", ds, m)
        register_node(m, shards, f"n{i}")
        result.append(shards)
    return result


def test_8_shards_over_3_nodes() -> None:
    assert assign_in_order(8, 3, 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_16_shards_over_5_nodes() -> None:
    assert assign_in_order(16, 5, 5) == [
        [0, 1, 2, 3],
        [4, 5, 6],
        [7, 8, 9],
        [10, 11, 12],
        [13, 14, 15],
    ]


def test_2_shards_over_3_nodes() -> None:
    assert assign_in_order(2, 3, 3) == [[0], [1], []]


def test_extra_nodes_get_nothing_once_everything_is_owned() -> None:
    assert assign_in_order(8, 2, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [], []]


def test_max_shards_per_node_is_the_ceiling() -> None:
    assert max_shards_per_node(dataset(num_shards=16, min_num_nodes=5)) == 4
    assert max_shards_per_node(dataset(num_shards=16, min_num_nodes=4)) == 4
    assert max_shards_per_node(dataset(num_shards=2, min_num_nodes=3)) == 1


def test_node_with_shards_counts_itself() -> None:
    # 8 shards, 2 nodes: a holds 0-3, b held 4-7 but lost 4 and 5.
    ds = dataset(num_shards=8, min_num_nodes=2)
    m = ShardMapper(8)
    register_node(m, [0, 1, 2, 3], "a")
    register_node(m, [6, 7], "b")
    # b: U=2, A=2, C=2 -> want ceil(4/1)=4 -> capacity 2.
    assert STRATEGY.remaining_capacity("b", ds, m) == 2
    assert STRATEGY.shard_assignments("b", ds, m) == [4, 5]
    # a is full.
    assert STRATEGY.remaining_capacity("a", ds, m) == 0
    assert STRATEGY.shard_assignments("a", ds, m) == []


def test_denominator_is_guarded_when_enough_nodes_already_hold_shards() -> None:
    # min 2 nodes, but a and b (A=2) already hold shards; newcomer c has none (C=0):
    # the formula's divisor (2 - 2) + 0 would be 0.
    ds = dataset(num_shards=4, min_num_nodes=2)
    m = ShardMapper(4)
    register_node(m, [0, 1], "a")
    register_node(m, [2], "b")
    assert STRATEGY.remaining_capacity("c", ds, m) == 1
    assert STRATEGY.shard_assignments("c", ds, m) == [3]
    # A > min_num_nodes: the divisor would be negative.
    ds8 = dataset(num_shards=8, min_num_nodes=2)
    m2 = ShardMapper(8)
    for shard, node in enumerate("abc"):
        register_node(m2, [shard], node)
    assert STRATEGY.remaining_capacity("d", ds8, m2) == 4
    assert STRATEGY.shard_assignments("d", ds8, m2) == [3, 4, 5, 6]


def test_down_and_error_shards_count_as_unassigned() -> None:
    ds = dataset(num_shards=4, min_num_nodes=2)
    m = ShardMapper(4)
    register_node(m, [0, 1, 2, 3], "a")
    m.update_from_event(ShardDown(ref(), 1, "a"))
    m.update_from_event(IngestionError(ref(), 3, "a", "boom"))
    assert STRATEGY.shard_assignments("b", ds, m) == [1, 3]


def test_no_unassigned_shards_means_no_capacity() -> None:
    ds = dataset(num_shards=4, min_num_nodes=2)
    m = ShardMapper(4)
    register_node(m, [0, 1, 2, 3], "a")
    assert STRATEGY.remaining_capacity("b", ds, m) == 0
    assert STRATEGY.remaining_capacity("a", ds, m) == 0


def test_strategy_is_stateless() -> None:
    ds = dataset(num_shards=16, min_num_nodes=4)
    m = ShardMapper(16)
    first = STRATEGY.shard_assignments("x", ds, m)
    assert STRATEGY.shard_assignments("x", ds, m) == first
    assert DefaultShardAssignmentStrategy().shard_assignments("x", ds, m) == first
    assert num_assigned_shards(m) == 0


def test_default_strategy_satisfies_the_protocol() -> None:
    assert isinstance(STRATEGY, ShardAssignmentStrategy)


@pytest.mark.parametrize(("num_shards", "min_nodes"), [(64, 5), (256, 7), (1024, 3), (4, 8)])
def test_shards_spread_evenly_when_asked_in_order(num_shards: int, min_nodes: int) -> None:
    counts = [len(s) for s in assign_in_order(num_shards, min_nodes, min_nodes)]
    assert sum(counts) == num_shards
    assert max(counts) - min(counts) <= 1
    cap = max_shards_per_node(dataset(num_shards=num_shards, min_num_nodes=min_nodes))
    assert max(counts) <= cap

"""Which shards a node should take: a stateless policy the shard manager consults per node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from coordinator.rebalance import version_key
from core.dataset import Dataset
from core.mapper import ShardMapper

__all__ = [
    "DefaultShardAssignmentStrategy",
    "ShardAssignmentStrategy",
    "assignment_order",
    "max_shards_per_node",
]


@runtime_checkable
class ShardAssignmentStrategy(Protocol):
    """Recommends shards for one node; must be a pure function of its arguments."""

    def shard_assignments(self, node: str, dataset: Dataset, mapper: ShardMapper) -> list[int]:
        """Shards ``node`` should start now (possibly none)."""
        ...

    def remaining_capacity(self, node: str, dataset: Dataset, mapper: ShardMapper) -> int:
        """How many more shards ``node`` may take now."""
        ...


def assignment_order(nodes: Mapping[str, str]) -> list[str]:
    """Who is offered free shards first, of `nodes` (name -> version, oldest member first): the
    newest version, then the newest member (deployment order is join order, which suits rolling
    upgrades)."""
    newest_first = list(reversed(nodes))
    return sorted(newest_first, key=lambda n: version_key(nodes[n]), reverse=True)


def max_shards_per_node(dataset: Dataset) -> int:
    """``ceil(num_shards / min_num_nodes)``: the most shards any node is asked to carry."""
    return -(-dataset.num_shards // dataset.min_num_nodes)


class DefaultShardAssignmentStrategy:
    """Spread unowned shards evenly over the nodes the dataset is sized for.

    Dividing the free shards by the nodes still expected to take some (counting a node that
    already holds shards as one of them) spreads 16 shards over 5 nodes as 4,3,3,3,3 rather
    than 4,4,4,4,0. No node is ever asked to hold more than ``max_shards_per_node``.
    """

    def remaining_capacity(self, node: str, dataset: Dataset, mapper: ShardMapper) -> int:
        """For an operator's start: every unowned shard counts as free, Stopped ones included
        (they are the shards an operator moves)."""
        return _capacity(node, dataset, mapper, mapper.num_unassigned_shards)

    def shard_assignments(self, node: str, dataset: Dataset, mapper: ShardMapper) -> list[int]:
        """The lowest-numbered shards free for automatic assignment (Stopped shards stay where
        the operator left them), up to the node's share of them."""
        free = mapper.num_assignable_shards
        return mapper.assignable_shards(limit=_capacity(node, dataset, mapper, free))


def _capacity(node: str, dataset: Dataset, mapper: ShardMapper, free: int) -> int:
    held = mapper.num_shards_for_node(node)
    # Nodes yet to get shards, plus this node if it already has some. Once as many nodes
    # hold shards as the dataset needs, a newcomer is the only candidate: never divide by <= 0.
    nodes = max(1, dataset.min_num_nodes - mapper.num_assigned_nodes + (1 if held else 0))
    want = -(-(free + held) // nodes)
    return max(0, min(want, max_shards_per_node(dataset)) - held)

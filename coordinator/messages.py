"""What the shard manager says: replies to its callers and messages for nodes and subscribers.

Plain frozen values, so the manager stays pure (it returns them as data; the singleton delivers
them) and Ray can pickle them to any process.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from core.dataset import Dataset, DatasetRef
from core.shard_status import CurrentShardSnapshot, ShardEvent, ShardMapState
from store.api import OwnershipChange

__all__ = [
    "DatasetExists",
    "DatasetRemoved",
    "DatasetUnknown",
    "DatasetVerified",
    "EventApplied",
    "EventIgnored",
    "EventsApplied",
    "MemberAdded",
    "MemberRemoved",
    "Message",
    "MovesForced",
    "MovesStarted",
    "NodeShardMap",
    "NodeUnknown",
    "RejectReason",
    "Reply",
    "Result",
    "ShardRequestRejected",
    "ShardsRecovered",
    "ShardsStarted",
    "ShardsStopped",
    "StaleNodesRemoved",
    "Subscribed",
    "SubscriberMessage",
    "SubscriberPayload",
    "SubscriptionsChanged",
    "Unsubscribed",
]


# ----- replies ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DatasetVerified:
    """The dataset was added and its shards assigned to the current members."""

    ref: DatasetRef


@dataclass(frozen=True, slots=True)
class DatasetExists:
    ref: DatasetRef


@dataclass(frozen=True, slots=True)
class DatasetUnknown:
    ref: DatasetRef


@dataclass(frozen=True, slots=True)
class DatasetRemoved:
    """Reply to ``remove_dataset``, and the last message its subscribers get."""

    ref: DatasetRef


@dataclass(frozen=True, slots=True)
class Subscribed:
    ref: DatasetRef | None  # None: subscribed to everything (``subscribe_all``)


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    subscriber: str


@dataclass(frozen=True, slots=True)
class MemberAdded:
    node: str
    assignments: tuple[tuple[DatasetRef, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class MemberRemoved:
    node: str
    freed: tuple[tuple[DatasetRef, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class StaleNodesRemoved:
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShardsStarted:
    ref: DatasetRef
    node: str
    shards: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ShardsStopped:
    ref: DatasetRef
    shards: tuple[int, ...]


class RejectReason(StrEnum):
    UNKNOWN_NODE = "unknown_node"
    INVALID_SHARDS = "invalid_shards"
    SAME_NODE = "same_node"
    OWNED_BY_OTHER = "owned_by_other"
    CAPACITY_EXCEEDED = "capacity_exceeded"
    NOT_ASSIGNED = "not_assigned"


@dataclass(frozen=True, slots=True)
class ShardRequestRejected:
    """A start/stop request failed validation; nothing changed."""

    ref: DatasetRef
    reason: RejectReason
    message: str


@dataclass(frozen=True, slots=True)
class EventApplied:
    event: ShardEvent


@dataclass(frozen=True, slots=True)
class EventIgnored:
    event: ShardEvent
    reason: str


@dataclass(frozen=True, slots=True)
class EventsApplied:
    """Reply to ``update_from_external_shard_events``: how many applied, and the rest."""

    applied: int
    ignored: tuple[EventIgnored, ...] = ()


@dataclass(frozen=True, slots=True)
class ShardsRecovered:
    ref: DatasetRef
    installed: bool  # False: the manager already had a newer map
    version: int


@dataclass(frozen=True, slots=True)
class MovesStarted:
    """Reply to ``rebalance`` and ``drain_node``: the handoffs begun, per dataset, and per
    dataset why no more were (``coordinator.rebalance.Plan.held_back``)."""

    moves: tuple[tuple[DatasetRef, int, str, str], ...]  # (dataset, shard, from, to)
    held_back: tuple[tuple[DatasetRef, str], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeUnknown:
    """Reply to a request naming a node that is not a member."""

    node: str
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Member:
    """A member node: its id (Ray's), its readable name and the version it advertises."""

    node: str
    name: str
    version: str


@dataclass(frozen=True, slots=True)
class ClusterNodes:
    """Reply to ``nodes``: the members (oldest first) and the nodes refused (id -> why), read
    at one instant, so a node leaving meanwhile is in both or in neither."""

    members: tuple[Member, ...]
    refused: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class MovesForced:
    """Reply to ``expire_handoffs``: handoffs whose drain did not finish in time, forced."""

    moves: tuple[tuple[DatasetRef, int, str, str], ...]


Reply = (
    DatasetVerified
    | DatasetExists
    | DatasetUnknown
    | DatasetRemoved
    | Subscribed
    | Unsubscribed
    | MemberAdded
    | MemberRemoved
    | StaleNodesRemoved
    | ShardsStarted
    | ShardsStopped
    | ShardRequestRejected
    | EventApplied
    | EventIgnored
    | EventsApplied
    | ShardsRecovered
    | MovesStarted
    | MovesForced
    | NodeUnknown
)


# ----- messages ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubscriptionsChanged:
    """All subscriptions, for guardians to keep so a new singleton can recover them."""

    by_dataset: tuple[tuple[DatasetRef, tuple[str, ...]], ...]
    watchers: tuple[str, ...]

    def subscribers(self, ref: DatasetRef) -> tuple[str, ...]:
        for r, subs in self.by_dataset:
            if r == ref:
                return subs
        return ()


SubscriberPayload = (
    CurrentShardSnapshot | ShardEvent | DatasetUnknown | DatasetRemoved | SubscriptionsChanged
)


@dataclass(frozen=True, slots=True)
class SubscriberMessage:
    """``payload`` for ``subscriber``; ``version`` is the dataset's map version after it."""

    subscriber: str
    payload: SubscriberPayload
    version: int | None = None


@dataclass(frozen=True, slots=True)
class NodeShardMap:
    """The full shard map of one dataset for one node: run exactly your ingesting shards.

    ``removed`` means the dataset is gone: stop everything for it and forget its version.
    """

    node: str
    ref: DatasetRef
    dataset: Dataset
    state: ShardMapState
    removed: bool = False

    @property
    def version(self) -> int:
        return self.state.version

    def shards(self) -> list[int]:
        return [] if self.removed else self.state.shards_for_node(self.node)

    def ingesting_shards(self) -> list[int]:
        return [] if self.removed else self.state.ingesting_shards(self.node)

    def draining_shards(self) -> list[int]:
        """Shards of this node being handed off: stop consuming, flush, report drained."""
        return [] if self.removed else self.state.draining_shards(self.node)


Message = NodeShardMap | SubscriberMessage


@dataclass(frozen=True, slots=True)
class Result:
    """What a manager call produced: messages to deliver, a reply for the caller, and the
    ownership changes to append to the MetaStore's history."""

    messages: tuple[Message, ...] = ()
    reply: Reply | None = None
    history: tuple[OwnershipChange, ...] = ()

    def node_maps(self, node: str | None = None) -> list[NodeShardMap]:
        return [
            m
            for m in self.messages
            if isinstance(m, NodeShardMap) and (node is None or m.node == node)
        ]

    def payloads_for(self, subscriber: str) -> list[SubscriberPayload]:
        return [
            m.payload
            for m in self.messages
            if isinstance(m, SubscriberMessage) and m.subscriber == subscriber
        ]

"""Every Ray actor name and subscriber id FiloPy builds, and the parsing of them, in one place.

Names are how processes find each other after restarts (Ray named actors): the singleton finds
node coordinators and a client's event sink by name, a node finds the singleton. Subscriber ids
carry the name of the actor that receives their events, so a restarted singleton can find it.
"""

from __future__ import annotations

import uuid

CLUSTER_ACTOR_NAME = "NodeClusterActor"
# The Ray resource a head started by `filopy head` offers: the singleton asks for a sliver of it,
# so Ray restarts it on whichever node offers it (a head started again after its machine died).
HEAD_RESOURCE = "filopy_head"
GUARDIAN_PREFIX = "guardian:"


def node_actor_name(node_id: str) -> str:
    """The node coordinator of a Ray node."""
    return f"filopy-node-{node_id}"


def guardian_id(node_id: str) -> str:
    """The subscriber id of a node's guardian (it subscribes to everything)."""
    return GUARDIAN_PREFIX + node_id


def is_guardian(subscriber: str) -> bool:
    return subscriber.startswith(GUARDIAN_PREFIX)


def new_sink_name() -> str:
    """A client process's event sink actor: one per client, unique."""
    return f"filopy-sink-{uuid.uuid4().hex}"


def new_subscription_id(sink_name: str) -> str:
    """`<sink name>/<suffix>`: one subscription of the client whose sink is `sink_name`."""
    return f"{sink_name}/{uuid.uuid4().hex[:12]}"


def sink_of(subscription_id: str) -> str:
    """The name of the sink actor that receives a subscription's events."""
    return subscription_id.split("/", 1)[0]


__all__ = [
    "CLUSTER_ACTOR_NAME",
    "GUARDIAN_PREFIX",
    "guardian_id",
    "is_guardian",
    "new_sink_name",
    "new_subscription_id",
    "node_actor_name",
    "sink_of",
]

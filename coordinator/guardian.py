"""The node guardian: every node's copy of the singleton's state, kept for its recovery.

The singleton keeps its shard maps and subscriptions in memory only. Each node's guardian is
subscribed to everything (``ShardManager.subscribe_all``) and mirrors it, so when the singleton
restarts it asks the guardians and takes, per dataset, the newest map any of them holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.messages import DatasetRemoved, SubscriberMessage, SubscriptionsChanged
from core.dataset import DatasetRef
from core.mapper import ShardMapper
from core.shard_status import CurrentShardSnapshot, ShardEvent, ShardMapState


@dataclass(frozen=True, slots=True)
class GuardianState:
    """What one guardian remembers: the maps it mirrors and the subscriptions it last saw."""

    maps: tuple[tuple[DatasetRef, ShardMapState], ...]
    subscriptions: SubscriptionsChanged | None

    def map_for(self, ref: DatasetRef) -> ShardMapState | None:
        return next((s for r, s in self.maps if r == ref), None)


def newest_maps(states: list[GuardianState]) -> dict[DatasetRef, ShardMapState]:
    """Per dataset, the highest-version map any guardian holds."""
    best: dict[DatasetRef, ShardMapState] = {}
    for state in states:
        for ref, m in state.maps:
            if ref not in best or m.version > best[ref].version:
                best[ref] = m
    return best


def merged_subscriptions(states: list[GuardianState]) -> SubscriptionsChanged:
    """The union of all guardians' subscription lists (a dead subscriber is dropped later)."""
    by_dataset: dict[DatasetRef, dict[str, None]] = {}
    watchers: dict[str, None] = {}
    for state in states:
        if state.subscriptions is None:
            continue
        for ref, subs in state.subscriptions.by_dataset:
            by_dataset.setdefault(ref, {}).update(dict.fromkeys(subs))
        watchers.update(dict.fromkeys(state.subscriptions.watchers))
    return SubscriptionsChanged(
        tuple((r, tuple(s)) for r, s in by_dataset.items()), tuple(watchers)
    )


class NodeGuardian:
    """Mirrors every dataset's shard map and the subscription lists from the singleton's feed."""

    def __init__(self) -> None:
        self._mappers: dict[DatasetRef, ShardMapper] = {}
        self._subscriptions: SubscriptionsChanged | None = None

    def apply(self, message: SubscriberMessage) -> None:
        payload = message.payload
        if isinstance(payload, CurrentShardSnapshot):
            current = self._mappers.get(payload.ref)
            if current is None or payload.state.version >= current.version:
                self._mappers[payload.ref] = ShardMapper.from_state(payload.state)
        elif isinstance(payload, ShardEvent):
            mapper = self._mappers.get(payload.ref)
            if mapper is not None:
                mapper.update_from_event(payload)
                if message.version is not None:
                    mapper.advance_version(message.version)
        elif isinstance(payload, DatasetRemoved):
            self._mappers.pop(payload.ref, None)
        elif isinstance(payload, SubscriptionsChanged):
            self._subscriptions = payload

    def state(self) -> GuardianState:
        return GuardianState(
            tuple((ref, m.snapshot()) for ref, m in self._mappers.items()), self._subscriptions
        )

"""Who listens to which dataset's shard events: an immutable value, as FiloDB's
``ShardSubscriptions``.

Every change returns a new value, so the manager can compare before and after to know whether
guardians must hear about it, and a value handed out can never change under its holder.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.messages import SubscriptionsChanged
from core.dataset import DatasetRef


def _with(items: tuple[str, ...], item: str) -> tuple[str, ...]:
    return items if item in items else (*items, item)


def _without(items: tuple[str, ...], item: str) -> tuple[str, ...]:
    return tuple(i for i in items if i != item) if item in items else items


@dataclass(frozen=True, slots=True)
class ShardSubscriptions:
    """Subscribers per dataset (in subscription order) and watchers of every dataset."""

    by_dataset: tuple[tuple[DatasetRef, tuple[str, ...]], ...] = ()
    watchers: tuple[str, ...] = ()

    def subscribers(self, ref: DatasetRef) -> tuple[str, ...]:
        for r, subs in self.by_dataset:
            if r == ref:
                return subs
        return ()

    def audience(self, ref: DatasetRef) -> tuple[str, ...]:
        """Everyone who hears about `ref`: its subscribers, then the watchers."""
        subs = self.subscribers(ref)
        return subs + tuple(w for w in self.watchers if w not in subs)

    def _replace(self, ref: DatasetRef, subs: tuple[str, ...]) -> ShardSubscriptions:
        rest = tuple((r, s) for r, s in self.by_dataset if r != ref)
        if subs:
            known = any(r == ref for r, _ in self.by_dataset)
            if known:  # keep the dataset's place
                rest = tuple((r, subs if r == ref else s) for r, s in self.by_dataset)
            else:
                rest = (*rest, (ref, subs))
        return ShardSubscriptions(rest, self.watchers)

    def subscribe(self, subscriber: str, ref: DatasetRef) -> ShardSubscriptions:
        return self._replace(ref, _with(self.subscribers(ref), subscriber))

    def watch(self, watcher: str) -> ShardSubscriptions:
        return ShardSubscriptions(self.by_dataset, _with(self.watchers, watcher))

    def unsubscribe(self, subscriber: str, ref: DatasetRef | None = None) -> ShardSubscriptions:
        """From one dataset, or (``ref`` None) from every dataset and from watching."""
        if ref is not None:
            return self._replace(ref, _without(self.subscribers(ref), subscriber))
        by_dataset = tuple(
            (r, s) for r, subs in self.by_dataset for s in [_without(subs, subscriber)] if s
        )
        return ShardSubscriptions(by_dataset, _without(self.watchers, subscriber))

    def without_dataset(self, ref: DatasetRef) -> ShardSubscriptions:
        return self._replace(ref, ())

    def merged(self, state: SubscriptionsChanged) -> ShardSubscriptions:
        """Add what a guardian remembered (a previous singleton's subscriptions)."""
        out = self
        for ref, subs in state.by_dataset:
            for s in subs:
                out = out.subscribe(s, ref)
        for w in state.watchers:
            out = out.watch(w)
        return out

    def as_message(self) -> SubscriptionsChanged:
        """The state guardians keep: datasets by name, names sorted, so equal states compare
        equal whatever order they were built in."""
        return SubscriptionsChanged(
            tuple(
                (r, tuple(sorted(s))) for r, s in sorted(self.by_dataset, key=lambda x: x[0].name)
            ),
            tuple(sorted(self.watchers)),
        )


__all__ = ["ShardSubscriptions"]

"""What a node coordinator needs from a shard ingester, whatever it reads and how."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from filopy.config import Settings
from filopy.dataset import Dataset
from filopy.shard_status import ShardEvent
from filopy.store import ColumnStore, MetaStore

EventReporter = Callable[[ShardEvent], None]


class ShardIngester(Protocol):
    """Ingests one shard of one dataset on this node, from `start()` until `stop()`.

    It reports its own progress (`RecoveryInProgress`, `IngestionStarted`, `IngestionError`)
    through the reporter it was built with; the node coordinator reports `IngestionStopped`.
    """

    @property
    def epoch(self) -> int | None:
        """The ownership epoch claimed for the shard, once claimed."""
        ...

    @property
    def last_event(self) -> ShardEvent | None:
        """The last progress event it reported, for re-reporting when the singleton missed it."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class IngesterFactory(Protocol):
    def __call__(
        self,
        dataset: Dataset,
        shard: int,
        node: str,
        *,
        meta: MetaStore,
        columns: ColumnStore,
        settings: Settings,
        report: EventReporter,
    ) -> ShardIngester: ...

"""What a node coordinator needs from a shard ingester, whatever it reads and how."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from core.config import Settings
from core.dataset import Dataset
from core.shard_status import ShardEvent
from store import ColumnStore, MetaStore

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


class ReportingIngester:
    """What every ingester keeps alike: the epoch it claimed and the last event it reported
    (the node coordinator re-sends that event when the singleton's map shows it was lost)."""

    def __init__(self, report: EventReporter) -> None:
        self._report_to = report
        self._epoch: int | None = None
        self._last_event: ShardEvent | None = None

    @property
    def epoch(self) -> int | None:
        return self._epoch

    @property
    def last_event(self) -> ShardEvent | None:
        return self._last_event

    def _emit(self, event: ShardEvent) -> None:
        self._last_event = event
        self._report_to(event)


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

"""The ingester for `ingest.source = "none"`: claims the shard's epoch and reports it live.

It exercises the whole control path (assignment, epoch fencing, status events) without reading
Kafka: for control-plane dry runs and the runtime tests.
"""

from __future__ import annotations

import asyncio

from filopy.config import Settings
from filopy.dataset import Dataset
from filopy.shard_status import IngestionError, IngestionStarted, ShardEvent
from filopy.store import ColumnStore, MetaStore, StoreError
from ingest.base import EventReporter


class EpochClaimingIngester:
    def __init__(
        self,
        dataset: Dataset,
        shard: int,
        node: str,
        *,
        meta: MetaStore,
        columns: ColumnStore,
        settings: Settings,
        report: EventReporter,
    ) -> None:
        self._dataset, self._shard, self._node = dataset, shard, node
        self._meta, self._report = meta, report
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
        self._report(event)

    async def start(self) -> None:
        ref = self._dataset.ref
        try:
            self._epoch = await asyncio.to_thread(
                self._meta.claim_epoch, ref, self._shard, self._node
            )
        except StoreError as e:
            self._emit(IngestionError(ref, self._shard, self._node, f"claiming epoch: {e}"))
            return
        self._emit(IngestionStarted(ref, self._shard, self._node))

    async def stop(self) -> None:
        return None

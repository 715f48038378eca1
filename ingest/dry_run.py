"""The ingester for `ingest.source = "none"`: claims the shard's epoch and reports it live.

It exercises the whole control path (assignment, epoch fencing, status events) without reading
Kafka: for control-plane dry runs and the runtime tests.
"""

from __future__ import annotations

import asyncio

from core.config import Settings
from core.dataset import Dataset
from core.shard_status import IngestionError, IngestionStarted
from ingest.base import EventReporter, ReportingIngester
from store import ColumnStore, MetaStore, StoreError, StoreUnavailable


class EpochClaimingIngester(ReportingIngester):
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
        super().__init__(report)
        self._dataset, self._shard, self._node = dataset, shard, node
        self._meta = meta

    async def start(self) -> None:
        ref = self._dataset.ref
        try:
            self._epoch = await asyncio.to_thread(
                self._meta.claim_epoch, ref, self._shard, self._node
            )
        except StoreUnavailable:
            raise  # an outage, not an error: the node coordinator retries the start
        except StoreError as e:
            self._emit(IngestionError(ref, self._shard, self._node, f"claiming epoch: {e}"))
            return
        self._emit(
            IngestionStarted(ref, self._shard, self._node, epoch=self._epoch, replayed_offsets=0)
        )

    async def stop(self) -> None:
        return None

"""The node coordinator: one Ray actor per FiloPy node, running the shards its maps name.

It receives each dataset's full, versioned shard map from the singleton and converges on it:
start an ingester for every shard the map says this node should ingest, stop every other one.
Stale versions are ignored, so a delayed message can never undo a newer decision. It also hosts
the node's guardian (the singleton's recovery copy) and keeps the latest maps for query routing,
which keeps working while the singleton is away.

The actor is detached: it outlives a singleton restart, so ingestion never stops for one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import ray

from coordinator.guardian import GuardianState, NodeGuardian
from coordinator.inbox import Delivery, OrderedInbox
from coordinator.manager import NodeShardMap
from filopy.config import Settings
from filopy.dataset import Dataset, DatasetRef
from filopy.shard_status import Assigned, IngestionStopped, ShardEvent, ShardMapState
from filopy.store import ColumnStore, MetaStore, open_stores
from ingest.base import EventReporter, IngesterFactory, ShardIngester
from ingest.ingester import KafkaShardIngester
from ingest.memstore import ShardMemstore
from ingest.placeholder import EpochClaimingIngester
from query.executor import NodeAnswer, NodeQuery, ShardsNotHere, ShardSource, run_node_query

log = logging.getLogger(__name__)

CLUSTER_ACTOR_NAME = "NodeClusterActor"


def node_actor_name(node_id: str) -> str:
    return f"filopy-node-{node_id}"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node coordinator's answer to a ping."""

    node_id: str
    joined_at: float  # wall clock, orders members after a singleton restart
    pid: int


class NodeCoordinator:
    """Converges this node's ingesters on the shard maps it is sent."""

    def __init__(
        self,
        node_id: str,
        settings: Settings,
        ingester_factory: IngesterFactory | None = None,
        reporter: EventReporter | None = None,
    ) -> None:
        self._info = NodeInfo(node_id, time.time(), os.getpid())
        self._settings = settings
        self._factory: IngesterFactory = ingester_factory or (
            KafkaShardIngester if settings.ingest.source == "kafka" else EpochClaimingIngester
        )
        self._guardian = NodeGuardian()
        self._inbox = OrderedInbox()
        self._report_seq = itertools.count(1)  # orders this process's reports at the singleton
        self._maps: dict[DatasetRef, NodeShardMap] = {}
        self._ingesters: dict[tuple[DatasetRef, int], ShardIngester] = {}
        self._stores: tuple[MetaStore, ColumnStore] | None = None
        self._converge_lock = asyncio.Lock()
        self._draining = False
        self._queried: Counter[tuple[str, int]] = Counter()
        self._report: EventReporter = reporter or self._report_to_singleton

    @property
    def node_id(self) -> str:
        return self._info.node_id

    # ----- from the singleton ----------------------------------------------------------------

    async def ping(self) -> NodeInfo:
        return self._info

    async def apply_map(self, message: NodeShardMap) -> bool:
        """Take a dataset's full map if it is newer than the one held; returns whether taken."""
        held = self._maps.get(message.ref)
        if held is not None and message.version <= held.version and not message.removed:
            if message.version == held.version:
                self._rereport(message)
            return False
        if message.removed:
            self._maps.pop(message.ref, None)
        else:
            self._maps[message.ref] = message
        await self._converge(message.ref, message.dataset, set(message.ingesting_shards()))
        return True

    async def deliver(self, delivery: Delivery) -> None:
        """The guardian's feed: every dataset's snapshots and events, and subscription lists,
        applied in the order the singleton sent them."""
        for m in self._inbox.push(delivery):
            self._guardian.apply(m)

    async def guardian_state(self) -> GuardianState:
        return self._guardian.state()

    async def drain(self) -> int:
        """Stop every ingester cleanly (each flushes all it holds, so the next owner replays
        nothing) and start no new ones: for shutting the cluster down. Returns how many stopped.
        The node stays a member; its shards move only when the node leaves."""
        async with self._converge_lock:
            self._draining = True
            stopping = list(self._ingesters.items())
            self._ingesters.clear()
            await asyncio.gather(*(ing.stop() for _, ing in stopping))
            for ref, shard in (key for key, _ in stopping):
                self._report(IngestionStopped(ref, shard, self.node_id))
            return len(stopping)

    # ----- for queries and operators ---------------------------------------------------------

    async def shard_map(self, ref: DatasetRef) -> ShardMapState | None:
        """The latest map this node was sent (usable while the singleton is away)."""
        held = self._maps.get(ref)
        return None if held is None else held.state

    async def running_shards(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for ref, shard in sorted(self._ingesters, key=lambda k: (k[0].name, k[1])):
            out.setdefault(ref.name, []).append(shard)
        return out

    async def epochs(self) -> dict[str, dict[int, int | None]]:
        """The ownership epoch each running ingester claimed, per dataset and shard."""
        out: dict[str, dict[int, int | None]] = {}
        for (ref, shard), ing in self._ingesters.items():
            out.setdefault(ref.name, {})[shard] = ing.epoch
        return out

    async def series_samples(self, ref: DatasetRef) -> dict[str, Any]:
        """Per series of this node's shards: its timestamps in store + memory (exactness checks)."""
        out: dict[str, Any] = {}
        for (r, _), ing in list(self._ingesters.items()):
            if r == ref and isinstance(ing, KafkaShardIngester):
                out.update(await asyncio.to_thread(ing.series_samples))
        return out

    async def query(self, ref: DatasetRef, shards: list[int], request: NodeQuery) -> NodeAnswer:
        """Evaluate a node's part of a query (`query.executor.NodeQuery`) over the given shards,
        which must run here: a caller with a stale map gets `ShardsNotHere` naming them."""
        held = self._maps.get(ref)
        missing = [s for s in shards if (ref, s) not in self._ingesters]
        if held is None or missing:
            raise ShardsNotHere(ref.name, self.node_id, missing or shards)
        memstores: dict[int, ShardMemstore] = {}
        for shard in shards:
            ing = self._ingesters[(ref, shard)]
            if isinstance(ing, KafkaShardIngester):  # else it reads nothing: an empty shard
                memstores[shard] = ing.memstore
        for shard in shards:
            self._queried[(ref.name, shard)] += 1
        _, columns = await self._open_stores()
        source = ShardSource(held.dataset, memstores, columns)
        return await asyncio.to_thread(run_node_query, request, source)

    async def query_stats(self) -> dict[str, dict[int, int]]:
        """Per dataset and shard: how many query parts this node evaluated on it."""
        out: dict[str, dict[int, int]] = {}
        for (name, shard), n in sorted(self._queried.items()):
            out.setdefault(name, {})[shard] = n
        return out

    async def ingest_stats(self, ref: DatasetRef) -> dict[int, dict[str, Any]]:
        """Per shard of this node: messages, bad records by reason, memstore counters."""
        return {
            shard: ing.stats()
            for (r, shard), ing in list(self._ingesters.items())
            if r == ref and isinstance(ing, KafkaShardIngester)
        }

    # ----- convergence -----------------------------------------------------------------------

    def _rereport(self, message: NodeShardMap) -> None:
        """A resent map still shows a shard as merely Assigned although its ingester reported
        progress: the report was lost on the way, so send it again."""
        for shard in message.ingesting_shards():
            ingester = self._ingesters.get((message.ref, shard))
            last = None if ingester is None else ingester.last_event
            if last is not None and isinstance(message.state.statuses[shard], Assigned):
                self._report(last)

    async def _converge(self, ref: DatasetRef, dataset: Dataset, wanted: set[int]) -> None:
        async with self._converge_lock:
            if self._draining:
                return
            running = {s for r, s in self._ingesters if r == ref}
            for shard in sorted(running - wanted):
                ingester = self._ingesters.pop((ref, shard))
                await ingester.stop()
                self._report(IngestionStopped(ref, shard, self.node_id))
            if not wanted - running:
                return
            meta, columns = await self._open_stores()
            for shard in sorted(wanted - running):
                ingester = self._factory(
                    dataset,
                    shard,
                    self.node_id,
                    meta=meta,
                    columns=columns,
                    settings=self._settings,
                    report=self._report,
                )
                self._ingesters[(ref, shard)] = ingester
                await ingester.start()

    async def _open_stores(self) -> tuple[MetaStore, ColumnStore]:
        if self._stores is None:
            self._stores = await asyncio.to_thread(open_stores, self._settings)
        return self._stores

    def _report_to_singleton(self, event: ShardEvent) -> None:
        """Send a shard event to the singleton; fire and forget (the resync heals a loss)."""
        try:
            cluster = ray.get_actor(CLUSTER_ACTOR_NAME, namespace=self._settings.ray.namespace)
        except ValueError:
            log.warning(
                "no %s to report %s to; the next resync will heal", CLUSTER_ACTOR_NAME, event
            )
            return
        cluster.shard_event.remote(self.node_id, event, next(self._report_seq))

"""The node coordinator: one Ray actor per FiloPy node, running the shards its maps name.

It receives each dataset's full, versioned shard map from the singleton and converges on it:
start an ingester for every shard the map says this node should ingest, stop every other one.
Stale versions are ignored, so a delayed message can never undo a newer decision. A shard it
cannot start (the store cannot be opened, the ingester fails to start) is retried with backoff
(`ingest.store_retry_initial_s` doubling to `store_retry_max_s`) and reported `IngestionDegraded`
meanwhile; after `ingest.start_max_attempts` failed attempts it is reported `IngestionError`, so
the singleton can move it to another node. It also hosts
the node's guardian (the singleton's recovery copy) and keeps the latest maps for query routing,
which keeps working while the singleton is away.

Reports on its shards (`ShardEvent`s from its ingesters and itself) go to the singleton in
batches (`ReportSender`): one `shard_events` call per few milliseconds whatever the number of
shards changing, numbered so the singleton drops stale ones.

The actor is detached: it outlives a singleton restart, so ingestion never stops for one.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import itertools
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coordinator.guardian import GuardianState, NodeGuardian
from coordinator.inbox import Delivery, OrderedInbox
from coordinator.messages import NodeShardMap
from coordinator.names import CLUSTER_ACTOR_NAME
from coordinator.query_channel import QueryEndpoint, QueryServer
from core.backoff import Backoff
from core.config import Settings
from core.dataset import Dataset, DatasetRef
from core.heap import keep_long_lived_frozen
from core.jit import warm
from core.shard_status import (
    Assigned,
    Handoff,
    IngestionDegraded,
    IngestionError,
    IngestionStopped,
    ShardDrained,
    ShardEvent,
    ShardMapState,
)
from ingest import tenure
from ingest.base import EventReporter, IngesterFactory, ShardIngester
from ingest.dry_run import EpochClaimingIngester
from ingest.ingester import KafkaShardIngester, stale_epoch_rejections
from ingest.memstore import ShardMemstore
from ingest.tenure import Tenure
from query.executor import NodeAnswer, NodeQuery, ShardsNotHere, ShardSource, run_node_query
from store import ColumnStore, MetaStore, StoreUnavailable, open_stores
from store.api import LabelMatcher

if TYPE_CHECKING:
    from ray.actor import ActorHandle

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node coordinator's answer to a ping."""

    node_id: str
    joined_at: float  # wall clock, orders members after a singleton restart
    pid: int
    version: str = ""  # what the node advertises (cluster.node_version, or the package's)
    name: str = ""  # what people call it (`node_name`); unique among members


# Ingesters started at once when a map brings many shards (their starts may wait on the store).
START_CONCURRENCY = 16
# A node's reports leave in batches: one singleton call carries everything queued meanwhile.
REPORT_BATCH_MAX = 8192
REPORT_LINGER_S = 0.01  # how long the first report of a batch waits for others
REPORT_CALL_TIMEOUT_S = 30.0
DELETE_TIMEOUT_S = 120.0  # a shard's delete: two flushes of everything and the store's deletes
REPORT_RETRY_FOR_S = 60.0  # a batch the singleton does not take by then is dropped (resync heals)


VERSION_LABEL = "filopy.io/version"  # a Ray node label: `ray start --labels filopy.io/version=…`
NAME_LABEL = "filopy.io/name"
# The `node.name` setting, per node: in the environment of `ray start` on that node (the config
# file is the same for every node, so a name there would be every node's).
NAME_ENV = "FILOPY_NODE__NAME"


def node_name(node_id: str, labels: Mapping[str, str] | None = None) -> str:
    """The name a node is shown by: its Ray node's `filopy.io/name` label, else
    `FILOPY_NODE__NAME` in the node's environment, else its host name and the start of its Ray
    id (several nodes may share a host). Ray ids are 56 hex characters no one reads; names are
    unique in the cluster (the singleton refuses a node whose name a member has)."""
    if labels and labels.get(NAME_LABEL):
        return labels[NAME_LABEL]
    if named := os.environ.get(NAME_ENV, "").strip():
        return named
    return f"{socket.gethostname().split('.')[0]}-{node_id[:6]}"


def node_version(settings: Settings, labels: Mapping[str, str] | None = None) -> str:
    """The version a node advertises: its Ray node's `filopy.io/version` label (set per node,
    e.g. by a rolling update's tooling), else `cluster.node_version` (the same on every node),
    else the FiloPy package installed where the node runs."""
    if labels and labels.get(VERSION_LABEL):
        return labels[VERSION_LABEL]
    if settings.cluster.node_version:
        return settings.cluster.node_version
    try:
        return importlib.metadata.version("filopy")
    except importlib.metadata.PackageNotFoundError:
        return ""


class ReportSender:
    """Sends a node's shard reports to the singleton in order, in batches, from one thread.

    Reports are numbered as they are queued (the singleton drops one older than a report it
    already applied for the same shard). The thread lets reports gather for `REPORT_LINGER_S`,
    sends them in one `shard_events` call and waits for it; what is reported meanwhile goes in
    the next call, so a burst (thousands of shards starting at once) costs a few calls, not one
    per report. The
    singleton's handle is cached and resolved again when a call finds it gone (it restarts under
    the same name); a batch is retried while the singleton is away, for `REPORT_RETRY_FOR_S`.
    """

    def __init__(self, node_id: str, namespace: str) -> None:
        self._node_id, self._namespace = node_id, namespace
        self._cond = threading.Condition()
        self._queue: list[tuple[ShardEvent, int]] = []
        self._seq = itertools.count(1)
        self._sending = False
        self._thread: threading.Thread | None = None
        self._handle: ActorHandle | None = None
        self.calls = 0
        self.sent = 0
        self.dropped = 0

    def report(self, event: ShardEvent) -> None:
        """Queue a report (any thread; never blocks on the singleton)."""
        with self._cond:
            self._queue.append((event, next(self._seq)))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"reports-{self._node_id[:8]}", daemon=True
                )
                self._thread.start()
            if len(self._queue) == 1 or len(self._queue) >= REPORT_BATCH_MAX:
                self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued report was sent (or given up); whether that happened."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stats(self) -> dict[str, int]:
        with self._cond:
            queued = len(self._queue)
        return {"calls": self.calls, "sent": self.sent, "dropped": self.dropped, "queued": queued}

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                # Let a burst gather for a moment: one call per few ms, not one per report.
                deadline = time.monotonic() + REPORT_LINGER_S
                while len(self._queue) < REPORT_BATCH_MAX:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = self._queue[:REPORT_BATCH_MAX]
                del self._queue[:REPORT_BATCH_MAX]
                self._sending = True
            try:
                self._send(batch)
            except Exception:
                log.exception("sending %d reports failed", len(batch))
            finally:
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()

    def _send(self, batch: list[tuple[ShardEvent, int]]) -> None:
        give_up = time.monotonic() + REPORT_RETRY_FOR_S
        backoff = Backoff(0.05, 2.0)
        while True:
            why = self._call(batch)
            if why is None:
                self.calls += 1
                self.sent += len(batch)
                return
            delay = backoff.next()
            if time.monotonic() + delay > give_up:
                self.dropped += len(batch)
                log.warning(
                    "dropped %d shard reports the singleton did not take for %.0f s (%s); "
                    "the next resync heals",
                    len(batch),
                    REPORT_RETRY_FOR_S,
                    why,
                )
                return
            time.sleep(delay)

    def _call(self, batch: list[tuple[ShardEvent, int]]) -> str | None:
        """One attempt; None if the singleton took the batch, else why not. A batch sent again
        is harmless: its reports carry the same numbers, so the singleton ignores repeats."""
        import ray  # here: the node's code runs under Ray, its unit tests import it without

        if self._handle is None:
            try:
                self._handle = ray.get_actor(CLUSTER_ACTOR_NAME, namespace=self._namespace)
            except ValueError:
                return f"no {CLUSTER_ACTOR_NAME}"
        try:
            # A future, not ray.get: this thread may wait, the actor's event loop never does.
            call = self._handle.shard_events.remote(self._node_id, batch)
            call.future().result(timeout=REPORT_CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError as e:
            self._handle = None  # gone or restarting: look it up again
            return type(e).__name__
        except TimeoutError:
            return f"no answer in {REPORT_CALL_TIMEOUT_S:.0f} s"
        except ray.exceptions.RayError as e:  # e.g. the singleton still recovering
            return f"{type(e).__name__}: {e}"
        return None


@dataclass(slots=True)
class _PendingStart:
    """A shard this node should run but has not started yet: waiting for the next attempt."""

    dataset: Dataset
    failures: int = 0  # failed attempts so far
    since: float = field(default_factory=time.monotonic)
    last_event: ShardEvent | None = None  # the last Degraded report, re-sent if lost


class NodeCoordinator:
    """Converges this node's ingesters on the shard maps it is sent."""

    def __init__(
        self,
        node_id: str,
        settings: Settings,
        ingester_factory: IngesterFactory | None = None,
        reporter: EventReporter | None = None,
        labels: Mapping[str, str] | None = None,
        *,
        own_process: bool = False,
    ) -> None:
        """`labels`: the Ray node's labels, as the singleton read them from Ray. `own_process`:
        this coordinator is its process's server (a Ray actor), which then keeps its long-lived
        objects out of the garbage collector's way (`core.heap`)."""
        self._heap = keep_long_lived_frozen() if own_process else None
        self._info = NodeInfo(
            node_id,
            time.time(),
            os.getpid(),
            node_version(settings, labels),
            node_name(node_id, labels),
        )
        self._settings = settings
        self._factory: IngesterFactory = ingester_factory or (
            KafkaShardIngester if settings.ingest.source == "kafka" else EpochClaimingIngester
        )
        self._guardian = NodeGuardian()
        self._inbox = OrderedInbox()
        self._sender = ReportSender(node_id, settings.ray.namespace)
        self._maps: dict[DatasetRef, NodeShardMap] = {}
        self._ingesters: dict[tuple[DatasetRef, int], ShardIngester] = {}
        # Ingesters drained for a handoff: stopped (all flushed and checkpointed), kept in
        # `_ingesters` so this node answers queries for the shard until the move completes.
        self._drained: set[tuple[DatasetRef, int]] = set()
        # Per running shard: (when, samples ingested) at the last `shard_loads` call.
        self._load_marks: dict[tuple[DatasetRef, int], tuple[float, int]] = {}
        self._stores: tuple[MetaStore, ColumnStore] | None = None
        self._stores_lock = asyncio.Lock()
        self._converge_lock = asyncio.Lock()
        # Shards to run that could not be started yet, retried together with backoff.
        self._pending: dict[tuple[DatasetRef, int], _PendingStart] = {}
        self._retry = Backoff(
            settings.ingest.store_retry_initial_s, settings.ingest.store_retry_max_s
        )
        self._retry_task: asyncio.Task[None] | None = None
        self._draining = False
        self._queried: Counter[tuple[str, int]] = Counter()
        self._queried_lock = threading.Lock()  # counted from the query channel's threads too
        self._channel: QueryServer | None = None  # started by the first `query_endpoint`
        self._loop: asyncio.AbstractEventLoop | None = None
        self._report: EventReporter = reporter or self._sender.report
        # The query kernels, loaded from numba's disk cache (or compiled) off the actor's
        # thread: not in a node's first query.
        threading.Thread(target=warm, name="warm-kernels", daemon=True).start()

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
        await self._converge(
            message.ref,
            message.dataset,
            set(message.ingesting_shards()),
            set(message.draining_shards()),
        )
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
            self._pending.clear()
            stopping = list(self._ingesters.items())
            self._ingesters.clear()
            self._drained.clear()
            await asyncio.gather(*(ing.stop() for _, ing in stopping))
            for ref, shard in (key for key, _ in stopping):
                self._report(IngestionStopped(ref, shard, self.node_id))
            self._released(len(stopping))
            await asyncio.to_thread(self._sender.flush, 10.0)
            return len(stopping)

    def _released(self, stopped: int) -> None:
        """Ingesters were let go: have their memory back soon, not at the hourly sweep."""
        if stopped and self._heap is not None:
            self._heap.sweep_soon()

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

    async def report_stats(self) -> dict[str, int]:
        """Reports sent to the singleton: calls, reports, dropped ones, still queued."""
        return self._sender.stats()

    async def pending_shards(self) -> dict[str, dict[int, int]]:
        """Shards this node should run but could not start yet: failed attempts per shard."""
        out: dict[str, dict[int, int]] = {}
        for (ref, shard), p in sorted(
            self._pending.items(), key=lambda kv: (kv[0][0].name, kv[0][1])
        ):
            out.setdefault(ref.name, {})[shard] = p.failures
        return out

    async def epochs(self) -> dict[str, dict[int, int | None]]:
        """The ownership epoch each running ingester claimed, per dataset and shard."""
        out: dict[str, dict[int, int | None]] = {}
        for (ref, shard), ing in self._ingesters.items():
            out.setdefault(ref.name, {})[shard] = ing.epoch
        return out

    async def tenures(self, dataset: str) -> list[Tenure]:
        """This node's holds on the dataset's shards, finished then running: who ingested which
        offsets when (moves are checked against it: one ingesting owner at a time)."""
        running = [
            ing.tenure
            for (ref, _), ing in list(self._ingesters.items())
            if ref.name == dataset and isinstance(ing, KafkaShardIngester) and ing.tenure
        ]
        # Read after `running`: an ingester that ended meanwhile (or has ended but is not yet
        # removed) is in both, and once only, as it ended.
        finished = tenure.finished(dataset)
        ended = {t.hold for t in finished}
        return [*finished, *(t for t in running if t.hold not in ended)]

    async def series_samples(self, ref: DatasetRef) -> dict[str, Any]:
        """Per series of this node's shards: its timestamps in store + memory (exactness checks)."""
        out: dict[str, Any] = {}
        for (r, _), ing in list(self._ingesters.items()):
            if r == ref and isinstance(ing, KafkaShardIngester):
                out.update(await asyncio.to_thread(ing.series_samples))
        return out

    async def delete_series(
        self, ref: DatasetRef, shards: list[int], selectors: list[list[tuple[str, str, str]]]
    ) -> dict[int, int]:
        """Delete the matching series from those of `shards` this node ingests (memory and
        store, `KafkaShardIngester.delete_series`, all shards at once): series deleted per
        shard handled. A shard not handled here (not running here, or drained for a move) is
        left to the caller, which deletes it from the store."""
        matchers = [[LabelMatcher(*m) for m in sel] for sel in selectors]
        running = {
            s: ing
            for s in shards
            if (ref, s) not in self._drained
            and isinstance(ing := self._ingesters.get((ref, s)), KafkaShardIngester)
        }
        counts = await asyncio.gather(
            *(
                asyncio.to_thread(ing.delete_series, matchers, DELETE_TIMEOUT_S)
                for ing in running.values()
            )
        )
        return dict(zip(running, counts, strict=True))

    async def query(self, ref: DatasetRef, shards: list[int], request: NodeQuery) -> NodeAnswer:
        """Evaluate a node's part of a query (`query.executor.NodeQuery`) over the given shards,
        which must run here: a caller with a stale map gets `ShardsNotHere` naming them. The
        Ray path; callers use the query channel (`query_endpoint`) when they can."""
        dataset, memstores = self._query_shards(ref, shards)
        _, columns = await self._open_stores()
        source = ShardSource(dataset, memstores, columns)
        return await asyncio.to_thread(run_node_query, request, source)

    async def query_endpoint(self) -> QueryEndpoint:
        """Where this node takes query parts over TCP, and the key to sign them with
        (`coordinator.query_channel`): callers fetch it once and skip a Ray call per query. The
        channel listens on this Ray node's address; it starts on the first ask."""
        if self._channel is None:
            import ray

            self._loop = asyncio.get_running_loop()
            self._channel = QueryServer(ray.util.get_node_ip_address(), self._query_here)
            log.info("node %s: query channel on %s", self.node_id, self._channel.endpoint)
        return self._channel.endpoint

    async def query_channel_stats(self) -> dict[str, float]:
        """The query channel's counters: parts served and their CPU seconds, connections
        refused and open now."""
        return {} if self._channel is None else self._channel.stats()

    def _query_here(self, ref: DatasetRef, shards: list[int], request: NodeQuery) -> NodeAnswer:
        """`query`, on a query channel's thread: evaluated where the frame was read (no hop to
        the event loop and back); only opening the store, once, goes through the loop."""
        dataset, memstores = self._query_shards(ref, shards)
        stores = self._stores
        if stores is None:
            assert self._loop is not None
            opening = asyncio.run_coroutine_threadsafe(self._open_stores(), self._loop)
            stores = opening.result(timeout=120)
        return run_node_query(request, ShardSource(dataset, memstores, stores[1]))

    def _query_shards(
        self, ref: DatasetRef, shards: list[int]
    ) -> tuple[Dataset, dict[int, ShardMemstore]]:
        """The dataset and the memstores of `shards`, counted as queried; `ShardsNotHere` if
        this node does not run them all. Safe off the event loop: it only looks things up."""
        held = self._maps.get(ref)
        ingesters = [self._ingesters.get((ref, s)) for s in shards]
        missing = [s for s, ing in zip(shards, ingesters, strict=True) if ing is None]
        if held is None or missing:
            raise ShardsNotHere(ref.name, self.node_id, missing or shards)
        memstores: dict[int, ShardMemstore] = {}
        for shard, ing in zip(shards, ingesters, strict=True):
            if isinstance(ing, KafkaShardIngester):  # else it reads nothing: an empty shard
                memstores[shard] = ing.memstore
        with self._queried_lock:
            for shard in shards:
                self._queried[(ref.name, shard)] += 1
        return held.dataset, memstores

    async def query_stats(self) -> dict[str, dict[int, int]]:
        """Per dataset and shard: how many query parts this node evaluated on it."""
        out: dict[str, dict[int, int]] = {}
        with self._queried_lock:
            queried = sorted(self._queried.items())
        for (name, shard), n in queried:
            out.setdefault(name, {})[shard] = n
        return out

    async def stale_epoch_rejections(self, ref: DatasetRef) -> dict[int, int]:
        """Per shard: commits this node's ingesters had refused because another node owns the
        shard now. Kept after those ingesters are gone: a node cut off and back has none left."""
        return stale_epoch_rejections(ref.name)

    async def ingest_stats(self, ref: DatasetRef) -> dict[int, dict[str, Any]]:
        """Per shard of this node: messages, bad records by reason, memstore counters."""
        return {
            shard: ing.stats()
            for (r, shard), ing in list(self._ingesters.items())
            if r == ref and isinstance(ing, KafkaShardIngester)
        }

    async def shard_loads(self) -> dict[str, dict[int, float]]:
        """Samples/s ingested per running shard since the previous call (per dataset name):
        what load-aware rebalancing balances. A shard first seen counts from now."""
        now = time.monotonic()
        out: dict[str, dict[int, float]] = {}
        seen: dict[tuple[DatasetRef, int], tuple[float, int]] = {}
        for key, ing in list(self._ingesters.items()):
            if key in self._drained or not isinstance(ing, KafkaShardIngester):
                continue
            ingested = ing.memstore.stats.ingested
            before = self._load_marks.get(key)
            seen[key] = (now, ingested)
            if before is not None and now > before[0]:
                rate = max(0, ingested - before[1]) / (now - before[0])
                out.setdefault(key[0].name, {})[key[1]] = rate
        self._load_marks = seen
        return out

    # ----- convergence -----------------------------------------------------------------------

    def _rereport(self, message: NodeShardMap) -> None:
        """A resent map still shows a shard as merely Assigned although its ingester reported
        progress, or as being handed off although this node reported it drained: the report
        was lost on the way (or the singleton restarted), so send it again."""
        for shard in message.draining_shards():
            if (message.ref, shard) in self._drained:
                self._report(ShardDrained(message.ref, shard, self.node_id))
        for shard in message.ingesting_shards():
            key = (message.ref, shard)
            ingester = self._ingesters.get(key)
            pending = self._pending.get(key)
            if ingester is not None:
                last = ingester.last_event
            else:
                last = None if pending is None else pending.last_event
            status = message.state.statuses[shard]
            starting = isinstance(status, Assigned) or (
                isinstance(status, Handoff) and status.target == self.node_id
            )
            if last is not None and starting:
                self._report(last)

    async def _converge(
        self,
        ref: DatasetRef,
        dataset: Dataset,
        wanted: set[int],
        draining: AbstractSet[int] = frozenset(),
    ) -> None:
        """Run `wanted` shards; drain `draining` ones (a subset of `wanted`: stop consuming,
        flush and checkpoint everything, report drained, keep answering queries); stop the
        rest."""
        async with self._converge_lock:
            if self._draining:
                return
            for key in [
                k for k in self._pending if k[0] == ref and (k[1] not in wanted or k[1] in draining)
            ]:
                del self._pending[key]
            running = {s for r, s in self._ingesters if r == ref}
            for shard in sorted(running - wanted):
                key = (ref, shard)
                ingester = self._ingesters.pop(key)
                if key in self._drained:
                    self._drained.discard(key)  # handed over: it stopped when it drained
                    continue
                await ingester.stop()
                self._report(IngestionStopped(ref, shard, self.node_id))
            self._released(len(running - wanted))
            await self._drain_shards(ref, draining)
            # A handoff cancelled after the drain: the shard is this node's again, start afresh.
            for shard in sorted(s for r, s in self._drained if r == ref and s not in draining):
                self._drained.discard((ref, shard))
                self._ingesters.pop((ref, shard), None)
            running = {s for r, s in self._ingesters if r == ref}
            wanted = wanted - draining
            waiting = {s for r, s in self._pending if r == ref}
            new = sorted(wanted - running - waiting)
            if not new:
                return
            if self._pending and self._stores is None:
                # The store cannot be opened: the new shards wait for the next attempt.
                for shard in new:
                    self._pending[(ref, shard)] = _PendingStart(dataset)
                self._schedule_retry()
                return
            await self._attempt([(ref, dataset, new)])

    async def _drain_shards(self, ref: DatasetRef, shards: set[int]) -> None:
        """Drain each shard for its handoff, all at once, and report each drained; a shard
        this node never got running has nothing to flush: drained at once. A shard drained
        already is reported again: a newer map still showing its handoff (e.g. from a restarted
        singleton) may not have heard of it."""
        for shard in sorted(s for s in shards if (ref, s) in self._drained):
            self._report(ShardDrained(ref, shard, self.node_id))
        todo = sorted(s for s in shards if (ref, s) not in self._drained)

        async def drain_one(shard: int) -> None:
            key = (ref, shard)
            ingester = self._ingesters.get(key)
            began = time.monotonic()
            if ingester is not None:
                await ingester.stop()  # stops consuming, then flushes and checkpoints it all
                self._drained.add(key)
            log.info(
                "%s shard %d: drained for a handoff in %.1f s",
                ref.name,
                shard,
                time.monotonic() - began,
            )
            self._report(ShardDrained(ref, shard, self.node_id))

        for i in range(0, len(todo), START_CONCURRENCY):
            await asyncio.gather(*(drain_one(s) for s in todo[i : i + START_CONCURRENCY]))

    async def _attempt(
        self, groups: list[tuple[DatasetRef, Dataset, list[int]]], store_error: str | None = None
    ) -> None:
        """One attempt at starting these shards (under the converge lock): what cannot start
        waits for the next attempt, or is given up after `ingest.start_max_attempts`."""
        failed: list[tuple[DatasetRef, Dataset, int, str]] = []
        for ref, dataset, shards in groups:
            failed += await self._start(ref, dataset, shards, store_error)
        if failed:
            self._start_failed(failed)
        elif not self._pending:
            self._retry.reset()

    async def _start(
        self, ref: DatasetRef, dataset: Dataset, shards: list[int], store_error: str | None
    ) -> list[tuple[DatasetRef, Dataset, int, str]]:
        """Start ingesters for `shards`; returns the ones that failed, with why."""
        if store_error is None:
            try:
                meta, columns = await self._open_stores()
            except Exception as e:
                store_error = f"cannot open the store: {_describe(e)}"
        if store_error is not None:
            return [(ref, dataset, shard, store_error) for shard in shards]
        failed: list[tuple[DatasetRef, Dataset, int, str]] = []

        async def start_one(shard: int) -> None:
            key = (ref, shard)
            ingester: ShardIngester | None = None
            try:
                ingester = self._factory(
                    dataset,
                    shard,
                    self.node_id,
                    meta=meta,
                    columns=columns,
                    settings=self._settings,
                    report=self._report,
                )
                self._ingesters[key] = ingester
                await ingester.start()
            except Exception as e:
                if not isinstance(e, StoreUnavailable):  # an outage is logged once per attempt
                    log.exception("%s shard %d: the ingester failed to start", ref.name, shard)
                self._ingesters.pop(key, None)
                if ingester is not None:
                    try:
                        await ingester.stop()
                    except Exception:
                        log.exception("%s shard %d: stopping it failed too", ref.name, shard)
                failed.append(
                    (ref, dataset, shard, f"the ingester failed to start: {_describe(e)}")
                )
                return
            pending = self._pending.pop(key, None)
            if pending is not None and pending.failures:
                log.warning(
                    "%s shard %d: started on node %s after %d failed attempts",
                    ref.name,
                    shard,
                    self.node_id,
                    pending.failures,
                )

        # A few starts at a time: an ingester's start may wait on the store (an epoch claim).
        for i in range(0, len(shards), START_CONCURRENCY):
            await asyncio.gather(*(start_one(s) for s in shards[i : i + START_CONCURRENCY]))
        return failed

    def _start_failed(self, failed: list[tuple[DatasetRef, Dataset, int, str]]) -> None:
        """Count a failed attempt for each shard: report it Degraded and retry after the
        backoff, or, at `ingest.start_max_attempts`, report IngestionError and let it go (the
        singleton moves it to another node if one can take it)."""
        cfg = self._settings.ingest
        delay = self._retry.fail(time.monotonic())
        by_reason: dict[tuple[str, str], list[int]] = {}
        for ref, dataset, shard, why in failed:
            by_reason.setdefault((ref.name, why), []).append(shard)
            key = (ref, shard)
            pending = self._pending.setdefault(key, _PendingStart(dataset))
            pending.failures += 1
            if pending.failures >= cfg.start_max_attempts:
                del self._pending[key]
                self._report(
                    IngestionError(
                        ref,
                        shard,
                        self.node_id,
                        f"could not start on node {self.node_id} in {pending.failures} attempts "
                        f"(ingest.start_max_attempts): {why}",
                    )
                )
                continue
            pending.last_event = IngestionDegraded(
                ref,
                shard,
                self.node_id,
                f"cannot start for {time.monotonic() - pending.since:.0f} s, attempt "
                f"{pending.failures} of {cfg.start_max_attempts}, retrying in {delay:.1f} s: {why}",
            )
            self._report(pending.last_event)
        for (name, why), shards in by_reason.items():
            log.warning(
                "%s shards %s: cannot start on node %s (%s); retrying in %.1f s, at most %d "
                "attempts in all",
                name,
                _ranges(shards),
                self.node_id,
                why,
                delay,
                cfg.start_max_attempts,
            )
        if self._pending:
            self._schedule_retry()

    def _schedule_retry(self) -> None:
        if self._retry_task is None or self._retry_task.done():
            self._retry_task = asyncio.get_running_loop().create_task(self._retry_starts())

    async def _retry_starts(self) -> None:
        """Attempt the pending starts when the backoff says, until none is left. The store is
        opened outside the converge lock, so maps keep being applied while it is tried."""
        while self._pending and not self._draining:
            await asyncio.sleep(max(0.0, self._retry.retry_at - time.monotonic()))
            error: str | None = None
            try:
                await self._open_stores()
            except Exception as e:
                error = f"cannot open the store: {_describe(e)}"
            async with self._converge_lock:
                if self._draining:
                    return
                groups: dict[DatasetRef, tuple[Dataset, list[int]]] = {}
                for (ref, shard), p in self._pending.items():
                    groups.setdefault(ref, (p.dataset, []))[1].append(shard)
                await self._attempt(
                    [(ref, ds, sorted(shards)) for ref, (ds, shards) in groups.items()], error
                )

    async def _open_stores(self) -> tuple[MetaStore, ColumnStore]:
        if self._stores is None:
            async with self._stores_lock:
                if self._stores is None:
                    self._stores = await asyncio.to_thread(open_stores, self._settings)
        return self._stores


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _ranges(shards: list[int]) -> str:
    """`[0, 1, 2, 5]` as "0-2,5", for logs."""
    runs: list[list[int]] = []
    for shard in shards:
        if runs and shard == runs[-1][1] + 1:
            runs[-1][1] = shard
        else:
            runs.append([shard, shard])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)

"""The NodeClusterActor: the cluster singleton, a named, detached, restartable Ray actor.

It wraps the synchronous `ShardManager` and does only what the manager cannot: watch Ray for
FiloPy nodes joining and leaving, ping node coordinators to catch the ones that hang, deliver
the messages each manager call returns, persist dataset definitions, and rebuild its state after
a restart from the MetaStore and the node guardians.

Every manager call and the delivery of its messages happen without an `await` in between, so
messages to one target leave in the order the manager produced them (Ray keeps that order).
Every resync interval each subscriber also gets its full state as a resync batch, which heals a
subscriber that lost a delivery (see `coordinator.inbox`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import ray
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from coordinator.guardian import GuardianState, merged_subscriptions, newest_maps
from coordinator.inbox import Sequencer, Stream
from coordinator.manager import ShardManager
from coordinator.membership import Change, Membership, NodeState
from coordinator.messages import (
    ClusterNodes,
    DatasetUnknown,
    EventIgnored,
    EventsApplied,
    Member,
    NodeShardMap,
    Reply,
    Result,
    SubscriberMessage,
    SubscriptionsChanged,
)
from coordinator.names import (
    CLUSTER_ACTOR_NAME,
    HEAD_RESOURCE,
    guardian_id,
    is_guardian,
    node_actor_name,
    sink_of,
)
from coordinator.rebalance import Plan
from core.backoff import Backoff, poll_until
from core.config import Settings
from core.dataset import Dataset, DatasetInvalid, DatasetRef
from core.errors import Unavailable
from core.shard_status import ShardEvent, ShardMapState
from ingest.topics import ensure_topic
from store import ColumnStore, MetaStore, OwnershipChange, StoreUnavailable, open_stores
from store.api import LabelMatcher

if TYPE_CHECKING:
    from coordinator.node_coordinator import NodeInfo

log = logging.getLogger(__name__)

# Recovery retries an unreachable MetaStore with backoff between these bounds, indefinitely:
# the singleton is useless without its state, and the store usually comes back.
RECOVERY_RETRY_MIN_S = 0.5
RECOVERY_RETRY_MAX_S = 10.0
HISTORY_QUEUE_MAX = 100_000  # ownership changes waiting for the store (~100 B each)
HISTORY_BATCH = 1000


class NodeClusterActor:
    """The singleton. Create it with `start_cluster_actor`; talk to it through `filopy.connect`."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        c = settings.cluster
        self._mgr = ShardManager(
            reassignment_min_interval=c.reassignment_min_interval_s,
            drain_timeout=settings.rebalance.drain_timeout_s,
            max_concurrent_moves=settings.rebalance.max_concurrent_moves,
            move_cooldown=settings.rebalance.move_cooldown_s,
        )
        self._labels: dict[str, dict[str, str]] = {}  # node -> its Ray node labels
        self._versions: dict[str, str] = {}  # node -> the version its last ping answer named
        self._names: dict[str, str] = {}  # node -> the name its last ping answer gave
        self._refused: dict[str, str] = {}  # node -> why it may not join (its name is taken)
        # Who is a member (joining, member, quarantined: coordinator/membership.py) and the
        # coordinator actor of every node it knows.
        self._membership = Membership(c.failure_timeout_s, c.ping_interval_s)
        self._handles: dict[str, ActorHandle] = {}
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._subscribers: dict[str, ActorHandle] = {}  # subscriber id -> its handle
        self._meta: MetaStore | None = None
        self._columns: ColumnStore | None = None  # for retention: its sweeps and bytes stored
        # Per dataset name, the retention sweeps' progress: shown by `storage` and /metrics.
        self._sweeps: dict[str, dict[str, Any]] = {}
        self._recovered = asyncio.Event()
        self._first_attempt = asyncio.Event()  # set once the first recovery attempt has ended
        self._recovery_error: str | None = None
        self._started_at = time.time()
        # Async actors may run calls out of order: stamp deliveries so receivers can reorder them.
        self._sequencer = Sequencer(self._started_at)
        # Per receiver, the (stream, seq) of the last resync batch it took: a receiver sent
        # nothing since then has missed nothing, and needs no resync.
        self._resynced: dict[str, tuple[Stream, int]] = {}
        self._last_event_seq: dict[tuple[str, DatasetRef, int], int] = {}
        # Ownership changes waiting to be written to the MetaStore's history.
        self._history_queue: deque[OwnershipChange] = deque()
        self._history_ready = asyncio.Event()
        self.history_dropped = 0
        self._tasks = [asyncio.get_running_loop().create_task(self._main())]

    # ----- public API (through coordinator.client) -------------------------------------------

    async def ready(self) -> float:
        """Returns once recovery is done; the value is when this incarnation started."""
        await self._ready()
        return self._started_at

    async def _ready(self) -> None:
        """Wait for recovery; if it failed (and is being retried), fail the call clearly rather
        than serve state the singleton has not recovered, or keep the caller waiting."""
        await self._first_attempt.wait()
        if not self._recovered.is_set():
            raise StoreUnavailable(
                "the cluster singleton could not recover its state from the MetaStore "
                f"({self._recovery_error}); it keeps retrying, so retry shortly"
            )

    def _store(self) -> MetaStore:
        assert self._meta is not None, "used before recovery"
        return self._meta

    async def setup_dataset(self, dataset: Dataset) -> Reply:
        """Persist the definition first (so a restart remembers it), then assign its shards.

        A definition naming no Kafka gets this cluster's `kafka.bootstrap_servers`, so the
        stored definition names the broker it really uses. One the cluster can never hold as
        asked is refused with `DatasetInvalid`."""
        await self._ready()
        meta = self._store()
        dataset = dataset.with_cluster_kafka(self._settings.kafka.bootstrap_servers)
        if dataset.min_num_nodes > dataset.num_shards:
            raise DatasetInvalid(
                f"min_num_nodes is {dataset.min_num_nodes}, more than num_shards "
                f"({dataset.num_shards}): a node of the dataset holds at least one shard, so it "
                f"can be spread over at most {dataset.num_shards} nodes"
            )
        span = dataset.store.chunk_span_ms
        if span is not None and span > self._settings.store.max_chunk_span_ms:
            raise DatasetInvalid(
                f"store.chunk_span_ms is {span}, more than this cluster's store.max_chunk_span_ms "
                f"({self._settings.store.max_chunk_span_ms}): queries would miss such chunks"
            )
        if self._settings.ingest.source == "kafka":
            # One partition per shard; a topic with another partition count is refused here
            # (TopicMismatch) rather than silently mis-routing samples later.
            await asyncio.to_thread(ensure_topic, dataset, kafka=self._settings.kafka)
        # DatasetConflict (same name, other definition) propagates to the caller as is.
        await asyncio.to_thread(meta.create_dataset, dataset)
        return self._deliver(self._mgr.add_dataset(dataset))

    async def remove_dataset(self, ref: DatasetRef) -> Reply:
        await self._ready()
        meta = self._store()
        await asyncio.to_thread(meta.delete_dataset, ref)
        self._last_event_seq = {k: v for k, v in self._last_event_seq.items() if k[1] != ref}
        return self._deliver(self._mgr.remove_dataset(ref))

    async def datasets(self) -> list[Dataset]:
        await self._ready()
        return list(self._mgr.datasets.values())

    async def shard_map(self, ref: DatasetRef) -> ShardMapState | None:
        await self._ready()
        snap = self._mgr.snapshot(ref)
        return None if isinstance(snap, DatasetUnknown) else snap.state

    async def members(self) -> list[str]:
        await self._ready()
        return list(self._mgr.members)

    async def node_names(self) -> dict[str, str]:
        """Each member's name, by node id."""
        await self._ready()
        return {n: self._names.get(n, n) for n in self._mgr.members}

    async def suspect_self(self) -> str | None:
        """Why failover is held back (more members silent than answering), or None."""
        return self._membership.suspect_self

    async def nodes(self) -> ClusterNodes:
        """Members with their names and versions, and the refused nodes, as one reading (the
        separate calls can straddle a leave: a member listed, its name already forgotten)."""
        await self._ready()
        versions = self._mgr.versions()
        members = tuple(
            Member(n, self._names.get(n, n), versions.get(n, "")) for n in self._mgr.members
        )
        return ClusterNodes(members, tuple(self._refused.items()))

    async def set_retention(self, ref: DatasetRef, retention_ms: int | None) -> bool:
        """Set a live dataset's retention (None: the cluster default); False if no such dataset.
        A sweep follows at once, so a shorter retention frees the space without waiting."""
        await self._ready()
        if ref not in self._mgr.datasets:
            return False
        await asyncio.to_thread(self._store().set_retention, ref, retention_ms)
        await self._sweep_dataset(ref)
        return True

    async def set_size_limit(self, ref: DatasetRef, max_bytes: int | None) -> bool:
        """Bound a live dataset's stored bytes (None: no bound; SQLite only); False if no such
        dataset. A sweep follows at once."""
        await self._ready()
        if ref not in self._mgr.datasets:
            return False
        await asyncio.to_thread(self._store().set_size_limit, ref, max_bytes)
        await self._sweep_dataset(ref)
        return True

    async def storage(self, ref: DatasetRef) -> dict[str, Any] | None:
        """A dataset's retention (its own, the default, the one in force), bytes stored (per
        time bucket too) and its sweeps' progress; None if no such dataset."""
        await self._ready()
        if ref not in self._mgr.datasets or self._columns is None:
            return None
        meta, columns = self._store(), self._columns

        def read() -> dict[str, Any]:
            stored = columns.stored_bytes(ref)
            return {
                "retention_ms": columns.retention_ms(ref),
                "own_retention_ms": meta.get_retention(ref),
                "default_retention_ms": columns.default_retention_ms,
                "max_bytes": meta.get_size_limit(ref),
                "bytes": stored.bytes,
                "chunks": stored.chunks,
                "buckets": [list(b) for b in stored.buckets],
                "downsampled": {
                    res: {"bytes": columns.downsampled_bytes(ref, res).bytes, "retention_ms": kept}
                    for res, kept in sorted(columns.downsample_retention_ms.items())
                },
            }

        info = await asyncio.to_thread(read)
        info["sweep"] = dict(self._sweeps.get(ref.name, {}))
        return info

    async def delete_series(
        self, ref: DatasetRef, selectors: list[list[tuple[str, str, str]]]
    ) -> dict[str, int] | None:
        """Delete the series any selector matches on every shard (docs/lifecycle.md, "Deleting
        series"): each shard's owner from its memory and the store, every shard at once; a
        shard no node runs, from the store here. None if no such dataset; a failure on any
        shard fails the call (what was deleted stays deleted: retrying is safe)."""
        await self._ready()
        mapper, dataset = self._mgr.mapper(ref), self._mgr.dataset(ref)
        if mapper is None or dataset is None:
            return None
        # Prometheus' metric name is the dataset's metric column in the store (as queries do).
        metric = dataset.metric_column
        selectors = [
            [(metric if label == "__name__" else label, op, v) for label, op, v in sel]
            for sel in selectors
        ]
        by_node: dict[str, list[int]] = {}
        for shard, owner in enumerate(mapper.owners):
            if owner is not None and owner in self._handles:
                by_node.setdefault(owner, []).append(shard)
        nodes = list(by_node)
        answers = await asyncio.gather(
            *(self._handles[n].delete_series.remote(ref, by_node[n], selectors) for n in nodes)
        )
        handled: dict[int, int] = {}
        for answer in answers:
            handled.update(answer)
        rest = [s for s in range(mapper.num_shards) if s not in handled]
        if rest:
            columns = self._columns
            if columns is None:
                raise StoreUnavailable("the singleton has not opened the store yet: retry")
            matchers = [[LabelMatcher(*m) for m in sel] for sel in selectors]

            def from_store() -> dict[int, int]:
                out = {}
                for shard in rest:
                    keys = {
                        r.part_key
                        for sel in matchers
                        for r in columns.list_part_keys(ref, shard, matchers=sel)
                    }
                    out[shard] = columns.delete_series(ref, shard, keys) if keys else 0
                return out

            handled.update(await asyncio.to_thread(from_store))
        deleted = sum(handled.values())
        log.info("dataset %s: deleted %d series (%s)", ref.name, deleted, selectors)
        return {"series": deleted, "shards": len(handled), "by_nodes": len(handled) - len(rest)}

    async def _sweep(self) -> None:
        """One retention sweep over every dataset (the store makes concurrent sweeps safe)."""
        for ref in list(self._mgr.datasets):
            await self._sweep_dataset(ref)

    async def _sweep_dataset(self, ref: DatasetRef) -> None:
        if self._columns is None:
            return
        state = self._sweeps.setdefault(
            ref.name,
            {"runs": 0, "errors": 0, "buckets_dropped": 0, "bytes_freed": 0,
             "part_keys_deleted": 0, "last_ms": None, "last_error": None,
             "size_buckets_dropped": 0, "size_bytes_freed": 0, "last_size_drop_ms": None},
        )  # fmt: skip
        try:
            result = await asyncio.to_thread(self._columns.sweep, ref)
        except Exception as e:  # the store is out: counted, shown, retried next round
            state["errors"] += 1
            state["last_error"] = f"{type(e).__name__}: {e}"
            log.warning("retention sweep of %s failed: %s", ref.name, e)
            return
        state["runs"] += 1
        state["last_ms"] = int(time.time() * 1000)
        state["last_error"] = None
        state["buckets_dropped"] += result.buckets_dropped
        state["bytes_freed"] += result.bytes_freed
        state["part_keys_deleted"] += result.part_keys_deleted
        if result.size_buckets_dropped:  # data lost to the size limit, not to time: say so
            state["size_buckets_dropped"] += result.size_buckets_dropped
            state["size_bytes_freed"] += result.size_bytes_freed
            state["last_size_drop_ms"] = state["last_ms"]
            log.warning(
                "dataset %s over its size limit: dropped its %d oldest buckets (%d bytes)",
                ref.name,
                result.size_buckets_dropped,
                result.size_bytes_freed,
            )
        if result.buckets_dropped or result.part_keys_deleted:
            log.info("retention sweep of %s: %s", ref.name, result)

    async def reassignment_stats(self) -> dict[str, tuple[int, int]]:
        """Per dataset name: shards moved after an ingestion error, and moves skipped because
        the shard had moved too recently (read-only, for metrics)."""
        await self._ready()
        return {
            ref.name: (s.done, s.skipped)
            for ref in self._mgr.datasets
            for s in [self._mgr.error_reassignments(ref)]
        }

    async def subscribers(self, ref: DatasetRef | None = None) -> list[str]:
        await self._ready()
        return list(self._mgr.watchers if ref is None else self._mgr.subscribers(ref))

    async def start_shards(self, ref: DatasetRef, node: str, shards: list[int]) -> Reply:
        await self._ready()
        return self._deliver(self._mgr.start_shards(ref, node, shards))

    async def stop_shards(self, ref: DatasetRef, shards: list[int]) -> Reply:
        await self._ready()
        return self._deliver(self._mgr.stop_shards(ref, shards))

    async def plan(
        self,
        ref: DatasetRef,
        add_nodes: int = 0,
        remove_nodes: tuple[str, ...] = (),
        drain_nodes: tuple[str, ...] = (),
        throttled: bool = False,
    ) -> Plan | DatasetUnknown:
        """What a rebalance would do (`throttled`: this round only), without applying it."""
        await self._ready()
        budget = self._mgr.free_move_slots(ref) if throttled else None
        return self._mgr.plan(
            ref,
            add_nodes=add_nodes,
            remove_nodes=remove_nodes,
            drain_nodes=drain_nodes,
            budget=budget,
        )

    async def rebalance(self, ref: DatasetRef) -> Reply:
        """One rebalance round of `ref` now, whether or not periodic rebalancing is on."""
        await self._ready()
        if self._mgr.dataset(ref) is None:
            return DatasetUnknown(ref)
        return self._deliver(self._mgr.rebalance([ref]))

    async def drain_node(self, node: str, cancel: bool = False) -> Reply:
        """Empty `node` through handoffs (or stop doing so)."""
        await self._ready()
        return self._deliver(self._mgr.drain_node(node, cancel=cancel))

    async def moves(self) -> dict[str, Any]:
        """Handoffs in flight (dataset, shard, from, to, since) and draining nodes."""
        await self._ready()
        in_flight = []
        for (ref, shard), began in sorted(self._mgr.handoffs().items()):
            state = self._mgr.snapshot(ref)
            if isinstance(state, DatasetUnknown):
                continue
            status = state.state.statuses[shard]
            target = getattr(status, "target", None)
            in_flight.append((ref.name, shard, state.state.owners[shard], target, began))
        return {"in_flight": in_flight, "draining": sorted(self._mgr.draining_nodes)}

    async def subscribe(self, subscriber: str, handle: ActorHandle, ref: DatasetRef) -> Reply:
        """`handle.deliver(Delivery)` gets a snapshot now, then every event, stamped for order."""
        await self._ready()
        self._subscribers[subscriber] = handle
        self._sequencer.register(subscriber)
        return self._deliver(self._mgr.subscribe(subscriber, ref))

    async def unsubscribe(self, subscriber: str, ref: DatasetRef | None = None) -> Reply:
        await self._ready()
        reply = self._deliver(self._mgr.unsubscribe(subscriber, ref))
        if ref is None:
            self._subscribers.pop(subscriber, None)
            self._sequencer.forget(subscriber)
            self._resynced.pop(subscriber, None)
        return reply

    async def shard_event(self, node: str, event: ShardEvent, seq: int | None = None) -> Reply:
        """A node's report on one of its shards. `seq` grows with every report a node sends:
        a report older than one already applied for the same shard arrived late and is stale."""
        await self._ready()
        if seq is not None:
            key = (node, event.ref, event.shard)
            if seq <= self._last_event_seq.get(key, 0):
                return EventIgnored(event, f"stale report {seq} from {node}")
            self._last_event_seq[key] = seq
        return self._deliver(self._mgr.update_from_external_shard_event(node, event))

    async def shard_events(self, node: str, events: list[tuple[ShardEvent, int]]) -> Reply:
        """A batch of a node's reports, in the order it sent them, each with its `seq` (see
        `shard_event`): a report older than one already applied for its shard is ignored, the
        rest go through the manager in one call, so the batch is published once."""
        await self._ready()
        fresh: list[ShardEvent] = []
        stale: list[EventIgnored] = []
        last = self._last_event_seq
        for event, seq in events:
            key = (node, event.ref, event.shard)
            if seq <= last.get(key, 0):
                stale.append(EventIgnored(event, f"stale report {seq} from {node}"))
                continue
            last[key] = seq
            fresh.append(event)
        reply = self._deliver(self._mgr.update_from_external_shard_events(node, fresh))
        if stale and isinstance(reply, EventsApplied):
            reply = EventsApplied(reply.applied, (*stale, *reply.ignored))
        return reply

    # ----- delivery --------------------------------------------------------------------------

    def _deliver(self, result: Result, *, resync: bool = False) -> Reply:
        """Send the messages of a manager call: maps to nodes, one stamped batch per subscriber.
        `resync`: the batches are their subscribers' full state (see `_resync_subscribers`)."""
        batches: dict[str, list[SubscriberMessage]] = {}
        for m in result.messages:
            if isinstance(m, NodeShardMap):
                handle = self._node_handle(m.node)
                if handle is not None:
                    self._watch(handle.apply_map.remote(m))
            else:
                batches.setdefault(m.subscriber, []).append(m)
        if result.history:
            self._record_history(result.history)
        for sub, msgs in batches.items():
            handle = self._subscribers.get(sub)
            if handle is not None:
                delivery = self._sequencer.stamp(sub, tuple(msgs), resync=resync)
                at = (delivery.stream, delivery.seq)
                self._watch(
                    handle.deliver.remote(delivery),
                    on_dead=lambda s=sub: self._drop(s),
                    on_done=(lambda s=sub, a=at: self._took_resync(s, a)) if resync else None,
                )
        return result.reply

    def _record_history(self, changes: Sequence[OwnershipChange]) -> None:
        """Queue ownership changes for the MetaStore (written in order by `_write_history`);
        past HISTORY_QUEUE_MAX waiting (a long store outage) the oldest are dropped, counted."""
        queue = self._history_queue
        overflow = len(queue) + len(changes) - HISTORY_QUEUE_MAX
        if overflow > 0:
            self.history_dropped += overflow
            log.warning("ownership history: store unavailable, dropped %d changes", overflow)
        queue.extend(changes)
        self._history_ready.set()

    async def _write_history(self) -> None:
        """Write queued ownership changes in batches; a store error is retried with backoff."""
        retention_ms = int(self._settings.store.history_retention_days * 86_400_000)
        backoff = Backoff(RECOVERY_RETRY_MIN_S, RECOVERY_RETRY_MAX_S)
        while True:
            await self._history_ready.wait()
            self._history_ready.clear()
            while self._history_queue:
                batch = list(itertools.islice(self._history_queue, HISTORY_BATCH))
                try:
                    await asyncio.to_thread(self._store().record_ownership, batch, retention_ms)
                except Exception as e:
                    delay = backoff.next()
                    log.warning(
                        "ownership history: writing failed (%s); retrying in %.1f s", e, delay
                    )
                    await asyncio.sleep(delay)
                    continue
                for _ in batch:
                    self._history_queue.popleft()
                backoff.reset()

    async def history(
        self, ref: DatasetRef, shard: int | None = None, limit: int = 100
    ) -> list[OwnershipChange]:
        """The dataset's ownership changes, newest first (those still queued included)."""
        await self._ready()
        queued = [
            c
            for c in reversed(self._history_queue)
            if c.dataset == ref.name and (shard is None or c.shard == shard)
        ]
        stored = await asyncio.to_thread(self._store().ownership_history, ref, shard, limit)
        return (queued + [c for c in stored if c not in queued])[:limit]

    def _took_resync(self, subscriber: str, at: tuple[Stream, int]) -> None:
        if subscriber in self._subscribers:
            self._resynced[subscriber] = at

    def _node_handle(self, node: str) -> ActorHandle | None:
        return self._handles.get(node)

    def _watch(
        self,
        ref: Any,
        on_dead: Callable[[], None] | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        """Observe a fire-and-forget call: a dead receiver is dropped, never left behind."""

        async def wait() -> None:
            try:
                await ref
                if on_done is not None:
                    on_done()
            except ray.exceptions.ActorUnavailableError:
                pass  # unreachable for now (a cut link), not dead: the next resync heals it
            except ray.exceptions.RayActorError:
                if on_dead is not None:
                    on_dead()
            except Exception:
                log.exception("delivery failed")

        asyncio.get_running_loop().create_task(wait())

    def _drop(self, subscriber: str) -> None:
        if subscriber in self._subscribers:
            log.info("subscriber %s is gone; unsubscribing it", subscriber)
            self._subscribers.pop(subscriber, None)
            self._sequencer.forget(subscriber)
            self._resynced.pop(subscriber, None)
            self._deliver(self._mgr.unsubscribe(subscriber))

    # ----- membership ------------------------------------------------------------------------

    def _changed(self, change: Change | None) -> None:
        """Carry out a membership move: the manager learns of joins and leaves, guardians are
        subscribed and unsubscribed, forgotten nodes' handles dropped."""
        if change is None:
            return
        node = change.node
        if change.left:
            log.warning("node %s left (%s)", self._shown(node), change.why)
            # Silent past the timeout: failed; gone from Ray (stopped, or its process died): left.
            kind = "failed" if change.after is NodeState.QUARANTINED else "left"
            self._deliver(self._mgr.remove_member(node, reason=f"{kind} ({change.why})"))
            self._subscribers.pop(guardian_id(node), None)
            self._deliver(self._mgr.unsubscribe(guardian_id(node)))
        if change.after is NodeState.GONE:
            self._handles.pop(node, None)
            self._names.pop(node, None)
            self._refused.pop(node, None)
        if change.joined:
            handle = self._handles[node]
            self._subscribers[guardian_id(node)] = handle
            self._sequencer.register(guardian_id(node))
            # A (new) coordinator process numbers its reports from 1 again.
            self._last_event_seq = {k: v for k, v in self._last_event_seq.items() if k[0] != node}
            log.info("node %s joined", self._shown(node))
            self._deliver(self._mgr.add_member(node, self._versions.get(node, "")))
            self._deliver(self._mgr.subscribe_all(guardian_id(node)))

    async def _live_filopy_nodes(self) -> set[str]:
        resource = self._settings.cluster.node_resource
        nodes = await asyncio.to_thread(ray.nodes)
        live = [n for n in nodes if n.get("Alive") and n.get("Resources", {}).get(resource)]
        # For the nodes' coordinators: what the operator set on each Ray node.
        self._labels = {n["NodeID"]: dict(n.get("Labels") or {}) for n in live}
        return {n["NodeID"] for n in live}

    def _coordinator(self, node: str) -> ActorHandle:
        """The node's coordinator actor: the existing one, or a new one pinned to the node."""
        # Imported here, not with this module: every driver that looks the singleton up by name
        # (`ray.get_actor`) imports this module, and the node's module brings all of ingestion
        # and query execution (numba, Kafka, the stores' drivers) into each CLI call.
        from coordinator.node_coordinator import NodeCoordinator

        return (
            ray.remote(NodeCoordinator)
            .options(
                name=node_actor_name(node),
                namespace=self._settings.ray.namespace,
                get_if_exists=True,
                lifetime="detached",
                num_cpus=0,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            )
            .remote(node, self._settings, labels=self._labels.get(node), own_process=True)
        )

    async def _sync_membership(self) -> None:
        live = await self._live_filopy_nodes()
        for node in sorted(live - self._membership.known()):
            self._handles[node] = self._coordinator(node)
            self._changed(self._membership.discovered(node))
        for change in self._membership.vanished(live):
            self._changed(change)

    async def _ping(self, node: str, handle: ActorHandle) -> None:
        try:
            info = await asyncio.wait_for(
                asyncio.wrap_future(handle.ping.remote().future()),
                self._settings.cluster.ping_timeout_s,
            )
        except (TimeoutError, ray.exceptions.ActorUnavailableError):
            return  # silent, perhaps a cut link: membership's timeout (and suspect-self) decide
        except ray.exceptions.RayActorError:
            # Ray knows the process is gone: act now rather than wait out the timeout.
            if self._handles.get(node) is handle:
                self._changed(self._membership.died(node, await self._why_dead(node)))
            return
        finally:
            self._inflight.pop(node, None)
        if self._handles.get(node) is handle:  # not a late answer from a replaced coordinator
            if self._name_taken(node, getattr(info, "name", "") or node):
                return  # never answered, so never a member: it gets no shards
            self._versions[node] = getattr(info, "version", "")
            self._changed(self._membership.answered(node))

    async def _why_dead(self, node: str) -> str:
        """Why a coordinator's process is gone, as history and the log say it: the whole node
        (machine, raylet) or only the process."""
        nodes = await asyncio.to_thread(ray.nodes)
        alive = any(n["NodeID"] == node and n.get("Alive") for n in nodes)
        return "its coordinator died" if alive else "its node died"

    def _shown(self, node: str) -> str:
        """A node as the log shows it: its name and its Ray id."""
        name = self._names.get(node)
        return f"{name} ({node})" if name else node

    def _name_taken(self, node: str, name: str) -> bool:
        """Whether another member goes by `name`: then `node` is refused (said once in the log,
        and by `nodes` to `filopy status` and REST) until that member leaves."""
        other = next(
            (m for m in self._membership.members if m != node and self._names.get(m) == name),
            None,
        )
        if other is None:
            self._names[node] = name
            if self._refused.pop(node, None):
                log.info("node %s (%s) may join now: its name is free", name, node)
            return False
        if node not in self._refused:
            log.error(
                "node %s refused: its name %r is taken by member %s; give it another "
                "(the filopy.io/name label of its Ray node, or FILOPY_NODE__NAME)",
                node,
                name,
                other,
            )
        self._refused[node] = f"name {name!r} is taken by member {other}"
        return True

    def _ping_all(self) -> None:
        loop = asyncio.get_running_loop()
        for node, handle in self._handles.items():
            if node not in self._inflight:
                self._inflight[node] = loop.create_task(self._ping(node, handle))
        suspected = self._membership.suspect_self
        for change in self._membership.tick():
            self._changed(change)
        if self._membership.suspect_self != suspected:
            if self._membership.suspect_self:
                log.warning("holding back failover: %s", self._membership.suspect_self)
            else:
                log.warning("enough members answer again: failover as usual")

    def _resync(self) -> None:
        """Republish every full map to its members, so a lost message heals by itself."""
        for ref, dataset in self._mgr.datasets.items():
            snap = self._mgr.snapshot(ref)
            if isinstance(snap, DatasetUnknown):
                continue
            for node in self._membership.members:
                handle = self._handles[node]
                self._watch(handle.apply_map.remote(NodeShardMap(node, ref, dataset, snap.state)))
        # One liveness check per sink actor (a client's subscriptions share one), not per id.
        by_sink: dict[str, list[str]] = {}
        for sub in self._subscribers:
            if not is_guardian(sub):
                by_sink.setdefault(sink_of(sub), []).append(sub)
        for subs in by_sink.values():
            self._watch(
                self._subscribers[subs[0]].ping.remote(),
                on_dead=lambda ss=subs: [self._drop(s) for s in ss],
            )

    def _resync_subscribers(self) -> None:
        """Send every subscriber its full state as one resync batch: a fresh snapshot of each
        dataset it follows, plus the subscription lists for watchers (guardians). An inbox that
        lost a batch, and so holds back everything after it, resumes from this one; an inbox
        that missed nothing drops it. One snapshot per dataset, shared by its audience.

        Receivers sent nothing since the last resync they took are skipped: they missed nothing,
        so an idle cluster sends no snapshots (a big dataset's is costly: docs/architecture.md)."""
        stale = {
            sub
            for sub in self._subscribers
            if self._resynced.get(sub) != self._sequencer.position(sub)
        }
        if not stale:
            return
        messages = [
            m for m in self._mgr.snapshots_to_subscribers().messages if m.subscriber in stale
        ]
        state = self._mgr.subscription_state()
        messages += [SubscriberMessage(w, state) for w in self._mgr.watchers if w in stale]
        self._deliver(Result(tuple(messages)), resync=True)

    # ----- loops and recovery ----------------------------------------------------------------

    async def _main(self) -> None:
        backoff = Backoff(RECOVERY_RETRY_MIN_S, RECOVERY_RETRY_MAX_S)
        while True:
            try:
                datasets = await self._load_datasets()
                break
            except Exception as e:  # the store is down or unreachable: retry, do not give up
                self._recovery_error = f"{type(e).__name__}: {e}"
                delay = backoff.next()
                log.warning("singleton recovery failed (%s); retrying in %.1f s", e, delay)
                self._first_attempt.set()
                await asyncio.sleep(delay)
        try:
            await self._recover(datasets)
        except Exception:
            # A bug, not an outage: leave the process so Ray restarts the singleton afresh
            # rather than serve a half-recovered state.
            log.exception("singleton recovery failed unexpectedly; exiting to be restarted")
            os._exit(1)
        self._recovered.set()
        self._first_attempt.set()
        c = self._settings.cluster
        await asyncio.gather(
            self._every(c.membership_interval_s, self._sync_membership),
            self._every(c.ping_interval_s, self._ping_all),
            self._every(c.resync_interval_s, self._resync),
            self._every(c.resync_interval_s, self._resync_subscribers),
            self._every(min(1.0, self._settings.rebalance.drain_timeout_s), self._expire_moves),
            self._every(self._settings.rebalance.interval_s, self._rebalance),
            self._every(self._settings.store.retention_sweep_interval_s, self._sweep),
            self._write_history(),
        )

    async def _shard_loads(self) -> dict[DatasetRef, dict[int, float]]:
        """Samples/s per shard, from every member that answers in time (others count as
        unmeasured)."""
        members = [(n, self._handles[n]) for n in self._membership.members if n in self._handles]
        answers = await asyncio.gather(
            *(
                asyncio.wait_for(
                    asyncio.wrap_future(h.shard_loads.remote().future()),
                    self._settings.cluster.ping_timeout_s,
                )
                for _, h in members
            ),
            return_exceptions=True,
        )
        loads: dict[DatasetRef, dict[int, float]] = {}
        for answer in answers:
            if isinstance(answer, BaseException):
                continue
            for name, per_shard in answer.items():
                loads.setdefault(DatasetRef(name=name), {}).update(per_shard)
        return loads

    def _expire_moves(self) -> None:
        """Force the handoffs whose drain did not finish in time."""
        result = self._mgr.expire_handoffs()
        if result.messages:
            log.warning(
                "moves forced (drain or start past rebalance.drain_timeout_s): %s", result.reply
            )
        self._deliver(result)

    async def _rebalance(self) -> None:
        """One round: empty draining nodes, and balance if rebalancing is enabled (by the load
        the nodes measure, samples/s per shard), starting the moves the throttle allows."""
        r = self._settings.rebalance
        loads = await self._shard_loads() if r.enabled and r.by_load else None
        result = self._mgr.rebalance(balance=self._settings.rebalance.enabled, loads=loads)
        if result.messages:
            log.info("rebalance: %s", result.reply)
        self._deliver(result)

    @staticmethod
    async def _every(interval: float, step: Callable[[], Awaitable[None] | None]) -> None:
        while True:
            try:
                out = step()
                if out is not None:
                    await out
            except Exception:
                log.exception("periodic step %s failed", getattr(step, "__name__", step))
            await asyncio.sleep(interval)

    async def _load_datasets(self) -> list[Dataset]:
        """Open the MetaStore and read the datasets: the part of recovery that can fail."""
        if self._meta is None:
            self._meta, self._columns = await asyncio.to_thread(open_stores, self._settings)
        return await asyncio.to_thread(self._meta.list_datasets)

    async def _recover(self, datasets: list[Dataset]) -> None:
        """Rebuild state: datasets from the MetaStore, maps and subscriptions from guardians."""
        live = await self._live_filopy_nodes()
        existing: dict[str, ActorHandle] = {}
        for node in live:
            try:
                existing[node] = ray.get_actor(
                    node_actor_name(node), namespace=self._settings.ray.namespace
                )
            except ValueError:
                continue
        answers = await asyncio.gather(
            *(self._guardian_state(h) for h in existing.values()), return_exceptions=True
        )
        alive = {
            node: ans
            for node, ans in zip(existing, answers, strict=True)
            if not isinstance(ans, BaseException)
        }
        states = [state for _, state in alive.values()]
        maps = newest_maps(states)
        for dataset in datasets:
            if dataset.ref in maps:
                self._deliver(self._mgr.recover_shards(dataset.ref, maps[dataset.ref], dataset))
        self._deliver(self._mgr.recover_subscriptions(self._resolve(merged_subscriptions(states))))
        for node in sorted(alive, key=lambda n: alive[n][0].joined_at):  # the old join order
            self._handles[node] = existing[node]
            self._versions[node] = alive[node][0].version
            self._names[node] = alive[node][0].name or node
            self._changed(self._membership.discovered(node))
            self._changed(self._membership.answered(node))
        self._deliver(self._mgr.remove_stale_coordinators(self._membership.members))
        for dataset in datasets:
            if dataset.ref not in maps:
                self._deliver(self._mgr.add_dataset(dataset))
        log.info(
            "recovered %d datasets, %d members, %d subscribers",
            len(datasets),
            len(self._membership.members),
            len(self._subscribers),
        )

    async def _guardian_state(self, handle: ActorHandle) -> tuple[NodeInfo, GuardianState]:
        timeout = self._settings.cluster.ping_timeout_s
        info, state = await asyncio.wait_for(
            asyncio.gather(handle.ping.remote(), handle.guardian_state.remote()), timeout
        )
        return info, state

    def _resolve(self, subs: SubscriptionsChanged) -> SubscriptionsChanged:
        """Keep the remembered subscribers whose actors still exist, and re-learn their handles."""
        keep: set[str] = set()
        names = {s for _, ss in subs.by_dataset for s in ss}
        for name in names:
            sink = sink_of(name)
            try:
                handle = ray.get_actor(sink, namespace=self._settings.ray.namespace)
            except ValueError:
                log.info("remembered subscriber %s is gone", name)
                continue
            self._subscribers[name] = handle
            keep.add(name)
        return SubscriptionsChanged(
            tuple((r, tuple(s for s in ss if s in keep)) for r, ss in subs.by_dataset), ()
        )


def _head_node() -> dict[str, Any] | None:
    """The Ray head node's entry (the node holding Ray's `node:__internal_head__` marker)."""
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}):
            return n
    return None


# How long a singleton Ray restarts (its head died and came back) may take to be created
# before `start_cluster_actor` creates it anew here (see there).
RESTART_GRACE_S = 5.0
# How long Ray may take to free the name of a singleton ended for being stuck in its restart.
NAME_RELEASE_TIMEOUT_S = 60.0


class SingletonUnavailable(Unavailable):
    """The cluster singleton could not be created: the name of the one Ray failed to restart
    stayed taken, and a handle by that name would reach the ended one. Nothing else changed:
    starting again once Ray's control store answers may succeed."""


def start_cluster_actor(
    settings: Settings, restart_grace_s: float = RESTART_GRACE_S
) -> ActorHandle:
    """Get or create the singleton (detached; Ray restarts it if its process or node dies).

    It runs on the Ray head node: the cluster cannot outlive the head without Ray's control
    state kept elsewhere, while any other node may come and go, and every move of the singleton
    is a recovery (losing a worker that hosted it costs a recovery on top of the node's own
    failover). A head started by `filopy head` offers the `HEAD_RESOURCE`; the singleton asks for
    a sliver of it, so when the head's machine dies and a head is started again (its control
    state in Redis), Ray restarts the singleton there. Other heads (`filopy up`, a plain
    `ray start --head`) are pinned by a strict node affinity (Ray 2.60 placed a `soft=True`
    affinity on a worker even with the head free).

    A restart Ray's control store schedules may stall: it sends the lease request through a
    node picked at random among those it counts alive, and right after its own restart that
    includes a node that died shortly before, which it declares dead only after its health
    checks fail (a minute; see `filopy head`). A singleton found not created within
    `restart_grace_s` is therefore ended and created anew from here: a creation's request goes
    through the creator's node, this head. Ending it loses nothing (it never ran), and Ray frees
    its name before the new one takes it, so there is never a second singleton; if Ray does not
    free it within `NAME_RELEASE_TIMEOUT_S`, `SingletonUnavailable`.
    """
    try:
        restarting: ActorHandle | None = cluster_actor(settings)
    except ValueError:
        restarting = None
    if restarting is None:
        return _create_cluster_actor(settings)
    try:
        ray.get(restarting.__ray_ready__.remote(), timeout=restart_grace_s)
        return restarting
    except ray.exceptions.GetTimeoutError:
        pass
    log.warning(
        "the cluster singleton was not created again within %.0f s of being restarted by Ray "
        "(its lease may wait on a dead node); creating it anew on this head",
        restart_grace_s,
    )
    ray.kill(restarting, no_restart=True)

    def name_free() -> bool:
        try:
            cluster_actor(settings)
        except ValueError:
            return True
        return False

    if poll_until(name_free, NAME_RELEASE_TIMEOUT_S, 0.2):
        return _create_cluster_actor(settings)
    raise SingletonUnavailable(
        f"the cluster singleton could not be created: Ray did not free the name "
        f"{CLUSTER_ACTOR_NAME!r} within {NAME_RELEASE_TIMEOUT_S:.0f} s of ending the singleton it "
        "failed to restart; try again once Ray's control store answers"
    )


def _create_cluster_actor(settings: Settings) -> ActorHandle:
    head = _head_node()
    if head is None:
        placement: dict[str, Any] = {}
    elif head.get("Resources", {}).get(HEAD_RESOURCE):
        placement = {"resources": {HEAD_RESOURCE: 0.01}}
    else:
        strategy = NodeAffinitySchedulingStrategy(node_id=head["NodeID"], soft=False)
        placement = {"scheduling_strategy": strategy}
    return (
        ray.remote(NodeClusterActor)
        .options(
            **placement,
            name=CLUSTER_ACTOR_NAME,
            namespace=settings.ray.namespace,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_restarts=-1,
            max_task_retries=3,
        )
        .remote(settings)
    )


def cluster_actor(settings: Settings) -> ActorHandle:
    """The running singleton; `ValueError` if there is none."""
    return ray.get_actor(CLUSTER_ACTOR_NAME, namespace=settings.ray.namespace)


__all__ = [
    "NodeClusterActor",
    "SingletonUnavailable",
    "cluster_actor",
    "start_cluster_actor",
]

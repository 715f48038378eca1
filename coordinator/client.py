"""The Python client of a FiloPy cluster: datasets, shard maps, start/stop, shard updates.

`filopy.connect()` joins the Ray cluster as a driver and talks to the `NodeClusterActor`.
`subscribe(dataset)` is SubscribeShardUpdates: a `CurrentShardSnapshot` first, then every
`ShardEvent` in order, as a blocking or an async iterator. Events are pushed by the singleton to
a small actor owned by this process; when this process exits, Ray ends that actor and the
singleton drops the subscription on its next delivery or liveness check.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Self

from coordinator import ray_env

# isort: split
import ray
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from coordinator.cluster_actor import cluster_actor
from coordinator.inbox import Delivery, OrderedInbox
from coordinator.messages import (
    ClusterNodes,
    DatasetExists,
    DatasetRemoved,
    DatasetUnknown,
    DatasetVerified,
    MovesStarted,
    NodeUnknown,
    ShardRequestRejected,
    ShardsStarted,
    ShardsStopped,
    SubscriberMessage,
)
from coordinator.names import new_sink_name, new_subscription_id, node_actor_name
from coordinator.rebalance import Plan
from core.config import Settings, load_settings
from core.dataset import Dataset, DatasetRef
from core.errors import DatasetUnknownError, FiloPyError, Invalid, NotFound
from core.mapper import ShardMapper
from core.shard_status import CurrentShardSnapshot, ShardEvent
from store.api import LabelMatcher, OwnershipChange

ShardUpdate = CurrentShardSnapshot | ShardEvent


class NodeUnknownError(NotFound):
    """No member has that node id (or a unique id prefix)."""

    def __init__(self, name: str, members: Sequence[str], ambiguous: bool = False) -> None:
        what = "matches several members" if ambiguous else "is not a member"
        super().__init__(f"node {name!r} {what}; members are {sorted(members)}")
        self.name, self.members = name, list(members)


class ShardRequestError(Invalid):
    """A start/stop shards request the shard manager refused; nothing changed. Its reason
    (`invalid_shards`, `unknown_node`, ...) is the REST errorType."""

    def __init__(self, rejected: ShardRequestRejected) -> None:
        super().__init__(rejected.message)
        self.reason = rejected.reason

    @property
    def error_type(self) -> str:
        return str(self.reason)


def _ref(dataset: str | DatasetRef) -> DatasetRef:
    return dataset if isinstance(dataset, DatasetRef) else DatasetRef(name=dataset)


def resolve_address(address: str) -> str:
    """Resolve `auto` and check that something listens there, so a wrong address fails in
    seconds with a clear message instead of `ray.init` retrying forever."""
    from core.local_state import ray_token_path, running

    local = running()  # a cluster started by `filopy up` from this directory
    if address == "auto":
        from ray._private.utils import read_ray_address

        resolved = (
            os.environ.get("RAY_ADDRESS")
            or (local.ray_address if local is not None else None)
            or read_ray_address()
        )
        if not resolved:
            raise FiloPyError(
                "no running Ray cluster found on this machine; start one or pass its address"
            )
        address = resolved
    if local is not None and address == local.ray_address:
        ray_env.use_ray_token(ray_token_path())  # it admits only holders of its Ray token
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=3).close()
    except (OSError, ValueError) as e:
        raise FiloPyError(f"no Ray cluster answers at {address} ({e})") from None
    return address


def connect(
    address: str = "auto", *, settings: Settings | None = None, timeout_s: float = 60.0
) -> FiloPyClient:
    """Connect to the FiloPy cluster on the Ray cluster at `address` (a no-op join if already)."""
    settings = settings or load_settings()
    if not ray.is_initialized():
        ray_env.bind_loopback()
        ray.init(
            address=resolve_address(address),
            namespace=settings.ray.namespace,
            logging_level="WARNING",
        )
    try:
        handle = cluster_actor(settings)
    except ValueError:
        raise FiloPyError(
            f"no FiloPy cluster singleton in Ray namespace {settings.ray.namespace!r}"
        ) from None
    ray.get(handle.ready.remote(), timeout=timeout_s)
    return FiloPyClient(handle, settings)


class FiloPyClient:
    def __init__(self, cluster: ActorHandle, settings: Settings) -> None:
        self._cluster = cluster
        self._settings = settings
        self._query_service: Any = None
        self.timeout_s = settings.cluster.ping_timeout_s * 15
        self._sink: ActorHandle | None = None
        self._create_lock = threading.Lock()
        self._sink_name = new_sink_name()

    def _event_sink(self) -> tuple[str, ActorHandle]:
        """This client's one sink actor, created on first subscribe, shared by its subscriptions.

        It lives on this process's own node and is owned by this process: it shares the
        subscriber's fate, neither dying with another node nor outliving the subscriber.
        Subscriptions opened from several threads at once (the REST app's SSE streams) get the
        same actor: a process-local lock, and get-or-create by name behind it.
        """
        with self._create_lock:
            if self._sink is None:
                here = NodeAffinitySchedulingStrategy(
                    ray.get_runtime_context().get_node_id(), soft=False
                )
                self._sink = (
                    ray.remote(ShardEventSink)
                    .options(
                        name=self._sink_name,
                        namespace=self._settings.ray.namespace,
                        get_if_exists=True,
                        num_cpus=0,
                        scheduling_strategy=here,
                    )
                    .remote()
                )
            return self._sink_name, self._sink

    @property
    def settings(self) -> Settings:
        return self._settings

    def _call(self, method: str, *args: Any) -> Any:
        return ray.get(getattr(self._cluster, method).remote(*args), timeout=self.timeout_s)

    def setup_dataset(self, dataset: Dataset) -> bool:
        """SetupDataset: True if created, False if the same definition already existed.

        Raises `store.DatasetConflict` if it exists with another definition.
        """
        reply = self._call("setup_dataset", dataset)
        assert isinstance(reply, DatasetVerified | DatasetExists)
        return isinstance(reply, DatasetVerified)

    def remove_dataset(self, dataset: str | DatasetRef) -> None:
        if isinstance(self._call("remove_dataset", _ref(dataset)), DatasetUnknown):
            raise DatasetUnknownError(_ref(dataset).name)

    def datasets(self) -> list[Dataset]:
        return list(self._call("datasets"))

    def members(self) -> list[str]:
        """Node ids of the FiloPy nodes, oldest first."""
        return list(self._call("members"))

    def shard_map(self, dataset: str | DatasetRef) -> ShardMapper:
        state = self._call("shard_map", _ref(dataset))
        if state is None:
            raise DatasetUnknownError(_ref(dataset).name)
        return ShardMapper.from_state(state)

    def start_shards(
        self, dataset: str | DatasetRef, node: str, shards: list[int]
    ) -> ShardsStarted:
        return self._checked(self._call("start_shards", _ref(dataset), node, list(shards)), dataset)

    def stop_shards(self, dataset: str | DatasetRef, shards: list[int]) -> ShardsStopped:
        return self._checked(self._call("stop_shards", _ref(dataset), list(shards)), dataset)

    def node_names(self) -> dict[str, str]:
        """Each member's readable name (`filopy.io/name` label, `FILOPY_NODE__NAME`, or host
        name and id prefix), by node id."""
        return dict(self._call("node_names"))

    def suspect_self(self) -> str | None:
        """Why the singleton holds failover back (it hears fewer members than are silent:
        likely cut off itself), or None."""
        result = self._call("suspect_self")
        return None if result is None else str(result)

    def nodes(self) -> ClusterNodes:
        """Members (id, name, advertised version: docs/operations.md, rolling updates; oldest
        first) and the nodes the cluster keeps out with why (their name is a member's), read at
        one instant."""
        found: ClusterNodes = self._call("nodes")
        return found

    def node(self, name: str) -> str:
        """The member a node name, id or unique id prefix names; `NodeUnknownError` if none."""
        members = self.members()
        if name in members:
            return name
        by_name = [n for n, shown in self.node_names().items() if shown == name]
        if len(by_name) == 1:
            return by_name[0]
        found = [m for m in members if m.startswith(name)] if name else []
        if len(found) == 1:
            return found[0]
        raise NodeUnknownError(name, members, ambiguous=len(found) > 1)

    def plan(
        self,
        dataset: str | DatasetRef,
        *,
        add_nodes: int = 0,
        remove_nodes: Sequence[str] = (),
        drain_nodes: Sequence[str] = (),
        throttled: bool = False,
    ) -> Plan:
        """What rebalancing would do now, or after nodes join, leave or are drained: applies
        nothing (`throttled`: only the moves the next round may start)."""
        reply = self._call(
            "plan",
            _ref(dataset),
            add_nodes,
            tuple(self.node(n) for n in remove_nodes),
            tuple(self.node(n) for n in drain_nodes),
            throttled,
        )
        if isinstance(reply, DatasetUnknown):
            raise DatasetUnknownError(_ref(dataset).name)
        return reply

    def rebalance(self, dataset: str | DatasetRef) -> MovesStarted:
        """Run one rebalance round of the dataset now: start the moves the throttle allows."""
        return self._checked(self._call("rebalance", _ref(dataset)), dataset)

    def drain_node(self, node: str, *, cancel: bool = False) -> MovesStarted:
        """Move every shard off `node` through handoffs, a few at a time (or stop doing so)."""
        reply = self._call("drain_node", self.node(node), cancel)
        if isinstance(reply, NodeUnknown):
            raise NodeUnknownError(node, list(reply.members))
        return reply

    def history(
        self, dataset: str | DatasetRef, shard: int | None = None, limit: int = 100
    ) -> list[OwnershipChange]:
        """The dataset's ownership changes, newest first: who owned which shard when, why,
        under which epoch and with how many offsets replayed."""
        ref = _ref(dataset)
        if self._call("shard_map", ref) is None:
            raise DatasetUnknownError(ref.name)
        return list(self._call("history", ref, shard, limit))

    def moves(self) -> dict[str, Any]:
        """Handoffs in flight and draining nodes."""
        return dict(self._call("moves"))

    @staticmethod
    def _checked(reply: Any, dataset: str | DatasetRef) -> Any:
        if isinstance(reply, DatasetUnknown):
            raise DatasetUnknownError(_ref(dataset).name)
        if isinstance(reply, ShardRequestRejected):
            raise ShardRequestError(reply)
        return reply

    def set_retention(self, dataset: str | DatasetRef, retention_ms: int | None) -> None:
        """Keep the dataset's raw data this long after its last sample (0: forever; None: the
        cluster's `store.retention_days`). Takes effect on reads at once (docs/storage.md)."""
        if not self._call("set_retention", _ref(dataset), retention_ms):
            raise DatasetUnknownError(_ref(dataset).name)

    def set_size_limit(self, dataset: str | DatasetRef, max_bytes: int | None) -> None:
        """Keep at most this many chunk bytes of the dataset, dropping its oldest time buckets
        first (None: no limit). SQLite only: Cassandra refuses it (`Unsupported`)."""
        if not self._call("set_size_limit", _ref(dataset), max_bytes):
            raise DatasetUnknownError(_ref(dataset).name)

    def storage(self, dataset: str | DatasetRef) -> dict[str, Any]:
        """The dataset's retention, bytes stored and retention sweeps
        (`NodeClusterActor.storage`)."""
        info = self._call("storage", _ref(dataset))
        if info is None:
            raise DatasetUnknownError(_ref(dataset).name)
        return dict(info)

    def delete_series(
        self, dataset: str | DatasetRef, selectors: Sequence[Sequence[LabelMatcher]]
    ) -> dict[str, int]:
        """Delete the series any selector matches, from every shard's memory and the store
        (Prometheus' delete_series; docs/lifecycle.md): {"series": deleted, "shards": ...}."""
        plain = [[(m.label, str(m.op), m.value) for m in sel] for sel in selectors]
        call = self._cluster.delete_series.remote(_ref(dataset), plain)
        info = ray.get(call, timeout=max(self.timeout_s, 150.0))  # flushes every shard
        if info is None:
            raise DatasetUnknownError(_ref(dataset).name)
        return dict(info)

    def reassignment_stats(self) -> dict[str, tuple[int, int]]:
        """Per dataset: (shards moved after an ingestion error, such moves skipped as too soon)."""
        return dict(self._call("reassignment_stats"))

    def ingest_stats(self, dataset: str | DatasetRef) -> dict[str, dict[int, dict[str, Any]]]:
        """Per member node, per shard it ingests from Kafka: its ingester's counters."""
        return self._per_member("ingest_stats", _ref(dataset))

    def stale_epoch_rejections(self, dataset: str | DatasetRef) -> dict[str, dict[int, int]]:
        """Per member node, per shard: commits refused because another node owned the shard."""
        return self._per_member("stale_epoch_rejections", _ref(dataset))

    def series_samples(self, dataset: str | DatasetRef) -> dict[str, dict[str, Any]]:
        """Per member node, per series of its shards: the series' timestamps in the ColumnStore
        and memory, nothing de-duplicated (for exactness checks and debugging)."""
        return self._per_member("series_samples", _ref(dataset))

    def _per_member(self, method: str, *args: Any) -> dict[str, Any]:
        """Call a node coordinator method on every member at once. A node that fails or does
        not answer within the timeout is left out rather than failing the whole call."""
        calls: dict[str, ray.ObjectRef] = {}
        for node in self.members():
            try:
                actor = ray.get_actor(node_actor_name(node), namespace=self._settings.ray.namespace)
            except ValueError:
                continue
            calls[node] = getattr(actor, method).remote(*args)
        if not calls:
            return {}
        ready, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=self.timeout_s)
        done = set(ready)
        out: dict[str, Any] = {}
        for node, call in calls.items():
            if call in done:
                try:
                    out[node] = ray.get(call)
                except ray.exceptions.RayError:
                    continue
        return out

    def queries(self) -> Any:
        """The `query.service.QueryService` of this client (created on first use): PromQL
        instant/range queries, series, explain. It follows each queried dataset's shard map
        through a subscription, so queries cost no call to the singleton."""
        with self._create_lock:  # REST requests ask from several threads: one service
            if self._query_service is None:
                from coordinator.cluster_queries import cluster_query_service  # builds on this

                self._query_service = cluster_query_service(self, self.timeout_s)
            return self._query_service

    def close(self) -> None:
        """Close the query service, if one was made (its shard map subscriptions and node
        connections): before disconnecting from a cluster this process outlives."""
        with self._create_lock:
            service, self._query_service = self._query_service, None
        if service is not None:
            service.close()

    def query(self, dataset: str, promql: str, time_ms: int | None = None, **options: Any) -> Any:
        """An instant PromQL query at `time_ms` (default: now); see `QueryService.instant`."""
        at = int(time.time() * 1000) if time_ms is None else time_ms
        return self.queries().instant(dataset, promql, at, **options)

    def query_range(
        self, dataset: str, promql: str, start_ms: int, end_ms: int, step_ms: int, **options: Any
    ) -> Any:
        """A PromQL range query; see `QueryService.range`."""
        return self.queries().range(dataset, promql, start_ms, end_ms, step_ms, **options)

    def subscribe(self, dataset: str | DatasetRef) -> Subscription:
        """SubscribeShardUpdates: iterate for the snapshot, then every event, in order."""
        return Subscription(self, _ref(dataset))


# How long a subscriber's inbox holds a resync that found a gap, waiting for the late batches
# before it (Ray may run deliveries out of order): events that arrive within it all reach the
# subscriber; past it the resync's snapshot replaces what is missing.
RESYNC_GRACE_S = 2.0


class ShardEventSink:
    """Receives the singleton's pushes for all of one client's subscriptions.

    Subscription ids are `<sink name>/<suffix>`, so a restarted singleton finds the sink by name.
    """

    def __init__(self) -> None:
        self._messages: dict[str, list[SubscriberMessage]] = {}
        self._arrived: dict[str, asyncio.Event] = {}
        self._inboxes: dict[str, OrderedInbox] = {}  # deliveries may run out of order

    def _event(self, subscription: str) -> asyncio.Event:
        return self._arrived.setdefault(subscription, asyncio.Event())

    async def deliver(self, delivery: Delivery) -> None:
        if not delivery.messages:
            return
        subscription = delivery.messages[0].subscriber  # one batch, one subscription
        inbox = self._inboxes.setdefault(subscription, OrderedInbox(RESYNC_GRACE_S))
        self._ready(subscription, inbox.push(delivery))

    def _ready(self, subscription: str, messages: list[SubscriberMessage]) -> None:
        if messages:
            self._messages.setdefault(subscription, []).extend(messages)
            self._event(subscription).set()

    async def ping(self) -> bool:
        return True

    async def take(self, subscription: str, timeout_s: float) -> list[SubscriberMessage]:
        """Everything delivered so far; waits up to `timeout_s` when nothing is there yet (and
        applies a resync held for late batches once its grace is over)."""
        deadline = time.monotonic() + timeout_s
        while not self._messages.get(subscription):
            inbox = self._inboxes.get(subscription)
            if inbox is not None:
                self._ready(subscription, inbox.expire())
                if self._messages.get(subscription):
                    break
            now = time.monotonic()
            wait = deadline - now
            due = None if inbox is None else inbox.due()
            if wait <= 0:
                return []
            if due is not None:
                wait = min(wait, max(0.0, due - now) + 0.01)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event(subscription).wait(), wait)
        out = self._messages.pop(subscription, [])
        self._event(subscription).clear()
        return out

    async def forget(self, subscription: str) -> None:
        self._messages.pop(subscription, None)
        self._arrived.pop(subscription, None)
        self._inboxes.pop(subscription, None)


class Subscription:
    """A live subscription: a blocking and async iterator of `ShardUpdate`s."""

    POLL_S = 1.0

    def __init__(self, client: FiloPyClient, ref: DatasetRef) -> None:
        self.ref = ref
        sink_name, self._sink = client._event_sink()
        self.id = new_subscription_id(sink_name)
        self._client = client
        self._buffer: deque[ShardUpdate] = deque()
        self._closed = False
        self._unsubscribed = False
        reply = client._call("subscribe", self.id, self._sink, ref)
        if isinstance(reply, DatasetUnknown):
            raise DatasetUnknownError(ref.name)

    def _absorb(self, messages: list[SubscriberMessage]) -> None:
        for m in messages:
            if isinstance(m.payload, CurrentShardSnapshot | ShardEvent):
                self._buffer.append(m.payload)
            elif isinstance(m.payload, DatasetRemoved | DatasetUnknown):
                self._closed = True

    def next(self, timeout_s: float) -> ShardUpdate:
        """The next update; `TimeoutError` if none comes within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self._buffer:
            if self._closed:
                raise StopIteration
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no shard update for {self.ref.name} within {timeout_s} s")
            self._absorb(ray.get(self._sink.take.remote(self.id, min(left, self.POLL_S))))
        return self._buffer.popleft()

    def __iter__(self) -> Iterator[ShardUpdate]:
        while True:
            try:
                yield self.next(self.POLL_S)
            except TimeoutError:
                continue
            except StopIteration:
                return

    async def __aiter__(self) -> AsyncIterator[ShardUpdate]:
        while True:
            while not self._buffer:
                if self._closed:
                    return
                self._absorb(await self._sink.take.remote(self.id, self.POLL_S))
            yield self._buffer.popleft()

    def unsubscribe(self) -> None:
        if self._unsubscribed:
            return
        self._unsubscribed = self._closed = True
        try:
            self._client._call("unsubscribe", self.id, None)
        finally:
            self._sink.forget.remote(self.id)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unsubscribe()

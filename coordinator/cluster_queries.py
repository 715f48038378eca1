"""The query layer's access to a running cluster: shard maps through subscriptions, node parts
through each node's query channel, or Ray calls where there is none (`query.service.MapSource`
and `NodeCaller`, implemented on the cluster).

Kept apart from `query/`, which owns the protocols and stays testable with fakes, and from the
client's own module, which is about talking to the singleton.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray

from coordinator.names import node_actor_name
from coordinator.query_channel import (
    ChannelError,
    ChannelPool,
    Connection,
    QueryEndpoint,
    request_payload,
)
from core.backoff import Backoff
from core.config import QuerySettings
from core.dataset import Dataset, DatasetRef
from core.errors import DatasetUnknownError
from core.mapper import ShardMapper
from core.shard_status import CurrentShardSnapshot, ShardEvent, ShardMapState
from core.worker import Worker
from query.executor import NodeAnswer, NodeQuery, ShardsNotHere
from query.service import NodeCaller, NodeUnavailable, PendingAnswer, QueryService

if TYPE_CHECKING:  # the client builds on this module, not the other way round
    from coordinator.client import FiloPyClient, Subscription

log = logging.getLogger("filopy.query")


class _MapWatch(Worker):
    """A dataset's shard map kept current by a subscription, on a daemon thread.

    Queries read the map's immutable snapshot (`ShardMapState`, rebuilt at most once per change
    and shared), never a copy of the mapper: O(1) per query even for 65536 shards."""

    def __init__(self, client: FiloPyClient, name: str) -> None:
        super().__init__(f"map-{name}")
        self._sub: Subscription = client.subscribe(name)
        first = self._sub.next(timeout_s=30)
        assert isinstance(first, CurrentShardSnapshot)
        self._mapper = ShardMapper.from_state(first.state)
        self._lock = threading.Lock()
        self.start()

    @property
    def closed(self) -> bool:
        """Not following any more: closed, or the subscription ended."""
        return self.stopping

    def _run(self) -> None:
        try:
            while not self.stopping:
                try:
                    update = self._sub.next(timeout_s=self._sub.POLL_S)
                except TimeoutError:
                    continue
                except StopIteration:  # the dataset was removed
                    break
                with self._lock:
                    if isinstance(update, CurrentShardSnapshot):
                        self._mapper = ShardMapper.from_state(update.state)
                    elif isinstance(update, ShardEvent):
                        self._mapper.update_from_event(update)
        except (Exception, SystemExit) as e:  # Ray raises SystemExit when the driver shuts down
            log.info("shard map subscription ended (%s); the next query re-subscribes", e)
        self._stop.set()  # closed: the next query subscribes afresh

    def state(self) -> ShardMapState:
        with self._lock:
            return self._mapper.snapshot()

    def close(self) -> None:
        """Stop following (within one poll) and unsubscribe; call before Ray shuts down."""
        self.stop(timeout=self._sub.POLL_S + 5)
        with contextlib.suppress(Exception):  # the cluster may be gone already
            self._sub.unsubscribe()


class ClusterMaps:
    """`MapSource` of a cluster: definitions from the singleton (cached), each queried
    dataset's map followed through its own subscription."""

    def __init__(self, client: FiloPyClient) -> None:
        self._client = client
        self._datasets: dict[str, Dataset] = {}
        self._maps: dict[str, _MapWatch] = {}
        self._lock = threading.Lock()

    def dataset(self, name: str) -> Dataset:
        ds = self._datasets.get(name)
        if ds is None:
            self._datasets = {d.name: d for d in self._client.datasets()}
            ds = self._datasets.get(name)
            if ds is None:
                raise DatasetUnknownError(name)
        return ds

    def shard_map(self, name: str) -> ShardMapState:
        with self._lock:
            watch = self._maps.get(name)
            if watch is None or watch.closed:
                if watch is not None:  # the dataset may have been removed and re-created
                    self._datasets.pop(name, None)
                watch = self._maps[name] = _MapWatch(self._client, name)
        return watch.state()

    def latest(self, name: str) -> ShardMapState:
        return self._client.shard_map(name).snapshot()

    def close(self) -> None:
        for watch in self._maps.values():
            watch.close()
        self._maps.clear()


class _Call:
    def __init__(self, caller: RayNodeCaller, node: str, ref: Any, error: str | None) -> None:
        self._caller, self._node, self._ref, self._error = caller, node, ref, error

    def result(self, timeout_s: float) -> NodeAnswer:
        if self._error is not None:
            raise NodeUnavailable(self._error)
        try:
            return ray.get(self._ref, timeout=timeout_s)
        except ShardsNotHere as e:  # Ray's wrapper is also a ShardsNotHere; raise the cause
            cause = getattr(e, "cause", e)
            raise ShardsNotHere(cause.dataset, cause.node, cause.shards) from None
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            self._caller.forget(self._node)
            raise NodeUnavailable(f"node {self._node} failed: {type(e).__name__}") from None


class RayNodeCaller:
    """`NodeCaller` over Ray: each node coordinator's `query` method, handles cached."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        self._handles: dict[str, Any] = {}

    def forget(self, node: str) -> None:
        self._handles.pop(node, None)

    def handle(self, node: str) -> Any | None:
        """The node's coordinator (cached), or None if it is gone."""
        handle = self._handles.get(node)
        if handle is None:
            try:
                handle = ray.get_actor(node_actor_name(node), namespace=self._namespace)
            except ValueError:
                return None
            self._handles[node] = handle
        return handle

    def submit(
        self, node: str, ref: DatasetRef, shards: Sequence[int], request: NodeQuery
    ) -> _Call:
        handle = self.handle(node)
        if handle is None:
            return _Call(self, node, None, f"node {node} is gone")
        return _Call(self, node, handle.query.remote(ref, list(shards), request), None)


# How long a node whose query channel cannot be used is asked through Ray instead: doubling
# while it stays unusable (a connect that times out costs the query that tries it).
CHANNEL_RETRY_S = 30.0
CHANNEL_RETRY_MAX_S = 600.0
ENDPOINT_TIMEOUT_S = 5.0  # for fetching a node's endpoint through Ray (once per node)
CONNECT_TIMEOUT_S = 2.0


class _ChannelCall:
    """A query part sent on a query channel connection; the answer is read by `result`."""

    def __init__(self, caller: SocketNodeCaller, node: str, pool: ChannelPool, conn: Connection):
        self._caller, self._node, self._pool = caller, node, pool
        self._conn: Connection | None = conn

    def result(self, timeout_s: float) -> NodeAnswer:
        conn, self._conn = self._conn, None
        assert conn is not None, "an answer is read once"
        try:
            kind, value = conn.receive(time.monotonic() + timeout_s)
        except TimeoutError:
            conn.close()  # its answer may still come: the connection cannot be reused
            raise NodeUnavailable(
                f"node {self._node} failed: no answer within {timeout_s:g} s"
            ) from None
        except (OSError, ChannelError) as e:  # the node died, or the connection broke
            conn.close()
            self._caller.forget(self._node)
            raise NodeUnavailable(f"node {self._node} failed: {type(e).__name__}") from None
        except BaseException:  # interrupted mid-answer: the connection cannot be reused
            conn.close()
            raise
        self._pool.checkin(conn)
        if kind == "ok":
            return value  # type: ignore[no-any-return]
        raise value  # ShardsNotHere (a stale map) as itself, or whatever the node raised

    def __del__(self) -> None:  # never read (another node's error ended the query first)
        if self._conn is not None:
            self._conn.close()


class SocketNodeCaller:
    """`NodeCaller` over the nodes' query channels (`coordinator.query_channel`): per node, a
    pool of long-lived connections; the calling thread writes the request and later reads the
    answer, with no Ray call and no thread hop on the way.

    A node's endpoint is fetched once through Ray and forgotten when its connection fails (a
    node that died comes back as a new process, on a new port). A node whose channel cannot
    be used (an older node without one, a port that cannot be reached) is asked through Ray,
    for `CHANNEL_RETRY_S` (doubling up to `CHANNEL_RETRY_MAX_S` while it stays so) before the
    channel is tried again; so is a part whose connection cannot be opened: Ray tells a dead
    node from an unreachable port."""

    def __init__(self, namespace: str, *, ray_caller: RayNodeCaller | None = None) -> None:
        self._ray = ray_caller or RayNodeCaller(namespace)
        self._lock = threading.Lock()
        self._pools: dict[str, ChannelPool] = {}
        # node -> when its channel is tried again (`retry_at`), asked through Ray until then
        self._ray_until: dict[str, Backoff] = {}
        self.fallbacks = 0  # parts sent through Ray because the channel could not be used

    def forget(self, node: str) -> None:
        """Drop what is cached about the node (a failure): the next part looks it up again."""
        with self._lock:
            pool = self._pools.pop(node, None)
        if pool is not None:
            pool.close()
        self._ray.forget(node)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()

    def submit(
        self, node: str, ref: DatasetRef, shards: Sequence[int], request: NodeQuery
    ) -> PendingAnswer:
        pool = self._pool(node)
        if pool is not None:
            try:
                conn = pool.checkout()
            except (OSError, ChannelError) as e:
                self._channel_failed(node, pool, f"cannot connect: {type(e).__name__}: {e}")
            else:
                if self._ray_until:
                    with self._lock:
                        self._ray_until.pop(node, None)  # usable again
                try:
                    conn.send(request_payload(ref, shards, request))
                except OSError as e:
                    conn.close()
                    self._channel_failed(node, pool, f"cannot send: {type(e).__name__}: {e}")
                else:
                    return _ChannelCall(self, node, pool, conn)
        self.fallbacks += 1
        return self._ray.submit(node, ref, shards, request)

    def _pool(self, node: str) -> ChannelPool | None:
        """The node's connection pool, its endpoint fetched through Ray on first use; None
        when the node is to be asked through Ray."""
        with self._lock:
            pool = self._pools.get(node)
            if pool is not None:
                return pool
            until = self._ray_until.get(node)
            if until is not None and not until.ready(time.monotonic()):
                return None
        endpoint = self._endpoint(node)
        if endpoint is None:
            return None
        with self._lock:
            return self._pools.setdefault(
                node, ChannelPool(endpoint, connect_timeout_s=CONNECT_TIMEOUT_S)
            )

    def _endpoint(self, node: str) -> QueryEndpoint | None:
        handle = self._ray.handle(node)
        if handle is None:
            return None  # gone: the Ray path says so
        try:
            endpoint = ray.get(handle.query_endpoint.remote(), timeout=ENDPOINT_TIMEOUT_S)
        except ray.exceptions.RayActorError:
            self._ray.forget(node)  # dead: the Ray path says so, and looks it up next time
            return None
        except Exception as e:  # an older node without a channel, a busy one
            self._use_ray(node, f"no endpoint: {type(e).__name__}: {e}")
            return None
        if not isinstance(endpoint, QueryEndpoint):
            self._use_ray(node, f"no endpoint: {endpoint!r}")
            return None
        return endpoint

    def _channel_failed(self, node: str, pool: ChannelPool, why: str) -> None:
        """A connection could not be opened or written: forget the endpoint. If it had worked
        before, the node probably restarted (look it up again next time); if it never did,
        the address cannot be reached from here: use Ray for a while."""
        with self._lock:
            if self._pools.get(node) is pool:
                del self._pools[node]
        pool.close()
        self._ray.forget(node)
        if not pool.connected:
            self._use_ray(node, why)

    def _use_ray(self, node: str, why: str) -> None:
        with self._lock:
            until = self._ray_until.setdefault(node, Backoff(CHANNEL_RETRY_S, CHANNEL_RETRY_MAX_S))
            delay = until.fail(time.monotonic())
        log.warning(
            "node %s: query channel unusable (%s); querying it through Ray for %.0f s",
            node,
            why,
            delay,
        )


TRANSPORTS = ("channel", "ray")
# What `cluster_query_service` uses when not told: the channel, Ray as its fallback ("ray":
# Ray calls only, e.g. to compare the two, as bench/bench_promql.py --transport does).
DEFAULT_TRANSPORT = "channel"


def cluster_query_service(
    client: FiloPyClient,
    timeout_s: float = 60.0,
    transport: str | None = None,
    limits: QuerySettings | None = None,
) -> QueryService:
    """PromQL over the cluster `client` is connected to, with per-tenant query `limits` (the
    client's settings' if not given); `close()` it before disconnecting."""
    transport = transport or DEFAULT_TRANSPORT
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r}: one of {', '.join(TRANSPORTS)}")
    namespace = client.settings.ray.namespace
    nodes: NodeCaller = (
        SocketNodeCaller(namespace) if transport == "channel" else RayNodeCaller(namespace)
    )
    limits = limits or client.settings.query
    return QueryService(
        ClusterMaps(client),
        nodes,
        timeout_s,
        max_samples=limits.tenant_max_samples,
        max_series=limits.tenant_max_series,
    )


__all__ = ["ClusterMaps", "RayNodeCaller", "SocketNodeCaller", "cluster_query_service"]

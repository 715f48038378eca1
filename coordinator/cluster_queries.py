"""The query layer's access to a running cluster: shard maps through subscriptions, node parts
through Ray (`query.service.MapSource` and `NodeCaller`, implemented on Ray).

Kept apart from `query/`, which owns the protocols and stays testable with fakes, and from the
client's own module, which is about talking to the singleton.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray

from coordinator.names import node_actor_name
from filopy.dataset import Dataset, DatasetRef
from filopy.errors import DatasetUnknownError
from filopy.mapper import ShardMapper
from filopy.shard_status import CurrentShardSnapshot, ShardEvent, ShardMapState
from query.executor import NodeAnswer, NodeQuery, ShardsNotHere
from query.service import NodeUnavailable, QueryService

if TYPE_CHECKING:  # the client builds on this module, not the other way round
    from coordinator.client import FiloPyClient, Subscription

log = logging.getLogger("filopy.query")


class _MapWatch:
    """A dataset's shard map kept current by a subscription, on a daemon thread.

    Queries read the map's immutable snapshot (`ShardMapState`, rebuilt at most once per change
    and shared), never a copy of the mapper: O(1) per query even for 65536 shards."""

    def __init__(self, client: FiloPyClient, name: str) -> None:
        self._sub: Subscription = client.subscribe(name)
        first = self._sub.next(timeout_s=30)
        assert isinstance(first, CurrentShardSnapshot)
        self._mapper = ShardMapper.from_state(first.state)
        self._lock = threading.Lock()
        self.closed = False
        self._thread = threading.Thread(target=self._follow, name=f"map-{name}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            while not self.closed:
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
        self.closed = True

    def state(self) -> ShardMapState:
        with self._lock:
            return self._mapper.snapshot()

    def close(self) -> None:
        """Stop following (within one poll) and unsubscribe; call before Ray shuts down."""
        self.closed = True
        self._thread.join(timeout=self._sub.POLL_S + 5)
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

    def submit(
        self, node: str, ref: DatasetRef, shards: Sequence[int], request: NodeQuery
    ) -> _Call:
        handle = self._handles.get(node)
        if handle is None:
            try:
                handle = ray.get_actor(node_actor_name(node), namespace=self._namespace)
            except ValueError:
                return _Call(self, node, None, f"node {node} is gone")
            self._handles[node] = handle
        return _Call(self, node, handle.query.remote(ref, list(shards), request), None)


def cluster_query_service(client: FiloPyClient, timeout_s: float = 60.0) -> QueryService:
    """PromQL over the cluster `client` is connected to; `close()` it before disconnecting."""
    return QueryService(
        ClusterMaps(client), RayNodeCaller(client.settings.ray.namespace), timeout_s
    )


__all__ = ["ClusterMaps", "RayNodeCaller", "cluster_query_service"]

"""Running PromQL on a FiloPy cluster: plan, route, fan out to the nodes, merge.

The caller (the REST server, the CLI, a Python client) keeps each dataset's shard map current
through a subscription, so a query costs no call to the singleton. `query.pushdown` decides
which parts of the expression are series-local or pushable aggregations; those go to the nodes
that own the shards the parts' selectors route to (`query.routing`), each node evaluating them on
its own memstores and the ColumnStore, and only step results come back. Everything else (binary
operators between vectors, topk, ...) runs here on those results (`query.evaluator`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import ray

from coordinator.node_coordinator import node_actor_name
from filopy.client import DatasetUnknownError, FiloPyClient, Subscription
from filopy.dataset import Dataset
from filopy.hashing import check_spread
from filopy.mapper import ShardMapper
from filopy.shard_status import (
    Active,
    CurrentShardSnapshot,
    Degraded,
    Recovery,
    ShardEvent,
    ShardMapState,
    ShardStatus,
)
from filopy.store.api import LabelMatcher
from query.aggregate import Partial
from query.evaluator import eval_partial, eval_series_local, evaluate
from query.executor import NodeAnswer, NodeQuery, ShardsNotHere
from query.promql import Aggregate, Expr, QueryError, children, format_expr, parse, selectors
from query.pushdown import concat_matrices, is_pushable, is_series_local, merge_partials
from query.routing import SelectorRoute, route
from query.values import MemorySource, StepMatrix, Value

log = logging.getLogger("filopy.query")

DEFAULT_LOOKBACK_MS = 300_000


class ShardsUnavailable(QueryError):
    """Shards the query needs are not Active, and the request did not allow partial results."""

    def __init__(self, dataset: str, shards: dict[int, str]) -> None:
        listed = ", ".join(f"{s} ({st})" for s, st in sorted(shards.items()))
        super().__init__(
            "unavailable",
            f"shards of {dataset!r} needed by the query are not available: {listed}; retry, or "
            "allow partial results",
        )
        self.dataset, self.shards = dataset, shards

    def __reduce__(self) -> Any:
        return (type(self), (self.dataset, self.shards))


@dataclass
class QueryResult:
    value: Value
    warnings: list[str] = field(default_factory=list)
    shards: tuple[int, ...] = ()
    nodes: dict[str, list[int]] = field(default_factory=dict)
    series_scanned: int = 0
    samples_scanned: int = 0


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


class QueryService:
    """PromQL over the datasets of one cluster, for any Ray driver joined to it.

    It follows each queried dataset's shard map on a thread: `close()` it before `ray.shutdown()`
    (a thread still blocked in Ray while Ray shuts down can take the process down with it)."""

    def __init__(self, client: FiloPyClient, timeout_s: float = 60.0) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._datasets: dict[str, Dataset] = {}
        self._maps: dict[str, _MapWatch] = {}
        self._nodes: dict[str, Any] = {}
        self._lock = threading.Lock()

    # ----- cluster state, cached -------------------------------------------------------------

    @staticmethod
    def _check_spread(ds: Dataset, spread: int | None) -> None:
        if spread is None:
            return
        try:
            check_spread(spread, ds.num_shards)
        except ValueError as e:
            raise QueryError("bad_data", f'invalid parameter "spread": {e}') from None

    def dataset(self, name: str) -> Dataset:
        ds = self._datasets.get(name)
        if ds is None:
            self._datasets = {d.name: d for d in self._client.datasets()}
            ds = self._datasets.get(name)
            if ds is None:
                raise DatasetUnknownError(name)
        return ds

    def shard_map(self, name: str) -> ShardMapState:
        """The dataset's current shard map (an immutable snapshot, shared: do not copy it)."""
        with self._lock:
            watch = self._maps.get(name)
            if watch is None or watch.closed:
                if watch is not None:  # the dataset may have been removed and re-created
                    self._datasets.pop(name, None)
                watch = self._maps[name] = _MapWatch(self._client, name)
        return watch.state()

    def _node(self, node: str) -> Any:
        handle = self._nodes.get(node)
        if handle is None:
            handle = self._nodes[node] = ray.get_actor(
                node_actor_name(node), namespace=self._client.settings.ray.namespace
            )
        return handle

    def close(self) -> None:
        for watch in self._maps.values():
            watch.close()
        self._maps.clear()

    # ----- queries ---------------------------------------------------------------------------

    def instant(
        self,
        dataset: str,
        query: str,
        time_ms: int,
        *,
        spread: int | None = None,
        partial: bool = False,
        lookback_ms: int = DEFAULT_LOOKBACK_MS,
    ) -> QueryResult:
        times = np.array([time_ms], np.int64)
        return self._run(dataset, query, times, spread, partial, lookback_ms)

    def range(
        self,
        dataset: str,
        query: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        *,
        spread: int | None = None,
        partial: bool = False,
        lookback_ms: int = DEFAULT_LOOKBACK_MS,
        max_points: int = 11_000,
    ) -> QueryResult:
        if step_ms <= 0:
            raise QueryError("bad_data", "step must be positive")
        if end_ms < start_ms:
            raise QueryError("bad_data", "end timestamp must not be before start time")
        points = (end_ms - start_ms) // step_ms + 1
        if points > max_points:
            raise QueryError(
                "bad_data",
                f"exceeded maximum resolution of {max_points} points per timeseries; "
                "try decreasing the query resolution (?step=XX)",
            )
        times = np.arange(start_ms, end_ms + 1, step_ms, dtype=np.int64)
        return self._run(dataset, query, times, spread, partial, lookback_ms)

    def series(
        self,
        dataset: str,
        selectors_: Sequence[Sequence[LabelMatcher]],
        start_ms: int,
        end_ms: int,
        *,
        partial: bool = False,
    ) -> QueryResult:
        """Label sets of the series matching any of the selectors (`/api/v1/series`)."""
        ds = self.dataset(dataset)
        run = _Run(self, ds, self.shard_map(dataset), None, partial, DEFAULT_LOOKBACK_MS)
        _, shards = route(ds, selectors_, None)
        request = NodeQuery(
            "series", matchers=tuple(tuple(m) for m in selectors_), start_ms=start_ms, end_ms=end_ms
        )
        seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        for answer in run.fan_out(shards, request):
            for labels in answer.result:
                seen.setdefault(tuple(sorted(labels.items())), labels)
        value = [seen[k] for k in sorted(seen)]
        return run.result(value)  # type: ignore[arg-type]

    def explain(self, dataset: str, query: str, *, spread: int | None = None) -> dict[str, Any]:
        """The plan: each selector's shard keys, spread and shards; the nodes hit; which parts
        run on the nodes (series-local or partial aggregation) and which here."""
        ds = self.dataset(dataset)
        self._check_spread(ds, spread)
        expr = parse(query)
        shard_map = self.shard_map(dataset)
        sels = selectors(expr)
        routes, shards = route(ds, [s.matchers for s in sels], spread)
        nodes: dict[str, list[int]] = {}
        for s in shards:
            owner = shard_map.owner(s)
            nodes.setdefault(owner or "(none)", []).append(s)
        return {
            "query": query,
            "dataset": dataset,
            "selectors": [
                _route_json(str_matchers(sel.matchers), r)
                for sel, r in zip(sels, routes, strict=True)
            ],
            "shards": list(shards),
            "shardStatus": {str(s): str(shard_map.status(s)) for s in shards},
            "nodes": nodes,
            "remote": [{"kind": kind, "expr": text} for kind, text in _remote_parts(expr)],
        }

    def _run(
        self,
        dataset: str,
        query: str,
        times: npt.NDArray[np.int64],
        spread: int | None,
        partial: bool,
        lookback_ms: int,
    ) -> QueryResult:
        ds = self.dataset(dataset)
        self._check_spread(ds, spread)
        expr = parse(query)
        run = _Run(self, ds, self.shard_map(dataset), spread, partial, lookback_ms)
        value = evaluate(expr, run, times, lookback_ms)
        return run.result(value)


class _Run:
    """One query's execution: the evaluator's `Backend`, fanning its parts out to the nodes."""

    def __init__(
        self,
        svc: QueryService,
        dataset: Dataset,
        shard_map: ShardMapState,
        spread: int | None,
        partial: bool,
        lookback_ms: int,
    ) -> None:
        self.svc, self.dataset, self.shard_map = svc, dataset, shard_map
        self.spread, self.partial, self.lookback_ms = spread, partial, lookback_ms
        self.warnings: list[str] = []
        self.shards: set[int] = set()
        self.nodes: dict[str, set[int]] = {}
        self.series = 0
        self.samples = 0

    def result(self, value: Value) -> QueryResult:
        return QueryResult(
            value,
            self.warnings,
            tuple(sorted(self.shards)),
            {n: sorted(s) for n, s in sorted(self.nodes.items())},
            self.series,
            self.samples,
        )

    def _shards_of(self, expr: Expr) -> tuple[int, ...]:
        _, shards = route(self.dataset, [s.matchers for s in selectors(expr)], self.spread)
        return shards

    def series_local(
        self, expr: Expr, times: npt.NDArray[np.int64], lookback_ms: int
    ) -> StepMatrix:
        request = NodeQuery("series_local", expr, times, lookback_ms)
        parts = [a.result for a in self.fan_out(self._shards_of(expr), request)]
        if not parts:
            return eval_series_local(expr, MemorySource([]), times, lookback_ms)
        return concat_matrices(parts)

    def partial_aggregate(
        self, agg: Aggregate, times: npt.NDArray[np.int64], lookback_ms: int
    ) -> Partial:
        request = NodeQuery("partial", agg, times, lookback_ms)
        parts = [a.result for a in self.fan_out(self._shards_of(agg), request)]
        if not parts:
            return eval_partial(agg, MemorySource([]), times, lookback_ms)
        return merge_partials(parts)

    def fan_out(self, shards: Sequence[int], request: NodeQuery) -> list[NodeAnswer]:
        """Send the request to the owners of `shards`, in parallel.

        A shard is served when the map has its owner ingesting it: Active, and also Assigned,
        Recovery or Degraded, whose node answers from what it holds (memstore and ColumnStore)
        while it catches up, with a warning naming those shards. Other shards (no owner,
        Stopped, Error, Down) fail the query, or are left out with a warning when partial
        results are allowed."""
        by_node: dict[str, list[int]] = {}
        down: dict[int, str] = {}
        for s in shards:
            owner, status = self.shard_map.owner(s), self.shard_map.status(s)
            if owner is None or not status.ingesting:
                down[s] = str(status)
            else:
                by_node.setdefault(owner, []).append(s)
        calls = {}
        for node, node_shards in by_node.items():
            try:
                handle = self.svc._node(node)
            except ValueError:
                down.update({s: f"node {node} is gone" for s in node_shards})
                continue
            calls[node] = handle.query.remote(self.dataset.ref, node_shards, request)
        answers: list[NodeAnswer] = []
        for node, call in calls.items():
            answer, served = self._answer(node, call, by_node[node], request, down)
            if answer is None:
                continue
            answers.append(answer)
            self.nodes.setdefault(node, set()).update(served)
            self.shards.update(served)
            self.series += answer.series
            self.samples += answer.samples
            self._warn_catching_up(served)
        if down:
            if not self.partial:
                raise ShardsUnavailable(self.dataset.name, down)
            listed = ", ".join(f"{s} ({st})" for s, st in sorted(down.items()))
            self._warn(f"partial result: shards {listed} of {self.dataset.name!r} were not queried")
        return answers

    def _answer(
        self,
        node: str,
        call: Any,
        node_shards: list[int],
        request: NodeQuery,
        down: dict[int, str],
    ) -> tuple[NodeAnswer | None, list[int]]:
        """A node's answer and the shards it covers; failures go to `down`. A node that no
        longer runs some of the shards (our map was stale) is asked again for the others."""
        try:
            return ray.get(call, timeout=self.svc._timeout_s), node_shards
        except ShardsNotHere as e:
            missing = set(getattr(e, "cause", e).shards or node_shards)
            for s in missing & set(node_shards):
                status = self.shard_map.status(s)
                down[s] = (
                    f"moved from {node}"
                    if isinstance(status, Active)
                    else f"{status}, not running on {node} yet"
                )
            rest = [s for s in node_shards if s not in missing]
            if not rest:
                return None, []
            try:
                call = self.svc._node(node).query.remote(self.dataset.ref, rest, request)
            except ValueError:
                down.update({s: f"node {node} is gone" for s in rest})
                return None, []
            return self._answer(node, call, rest, request, down)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            down.update({s: f"node {node} failed: {type(e).__name__}" for s in node_shards})
            self.svc._nodes.pop(node, None)
            return None, []

    def _warn(self, warning: str) -> None:
        if warning not in self.warnings:
            self.warnings.append(warning)

    def _warn_catching_up(self, served: Sequence[int]) -> None:
        """One warning per reason for the served shards that are not Active yet."""
        by_reason: dict[str, list[int]] = {}
        for s in served:
            status = self.shard_map.status(s)
            if not isinstance(status, Active):
                by_reason.setdefault(_catching_up(status), []).append(s)
        for reason, group in by_reason.items():
            listed = ", ".join(str(s) for s in sorted(group))
            self._warn(
                f"{'shard' if len(group) == 1 else 'shards'} {listed} of dataset "
                f"{self.dataset.name!r} {'is' if len(group) == 1 else 'are'} {reason}; "
                "results may miss recent samples"
            )


def _catching_up(status: ShardStatus) -> str:
    """Why a served shard may lack recent samples, for the query's warning."""
    match status:
        case Recovery():
            return "recovering (replaying the Kafka backlog)"
        case Degraded(message=message):
            return f"degraded ({message})" if message else "degraded"
    return f"{str(status).lower()} (starting ingestion)"


def str_matchers(matchers: Sequence[LabelMatcher]) -> str:
    return "{" + ", ".join(str(m) for m in matchers) + "}"


def _route_json(selector: str, r: SelectorRoute) -> dict[str, Any]:
    return {
        "selector": selector,
        "shardKeys": [
            {
                "shardKey": dict(k.shard_key),
                "hash": k.hash,
                "spread": k.spread,
                "shards": list(k.shards),
            }
            for k in r.shard_keys
        ],
        "shards": list(r.shards),
        "allShards": r.all_shards,
        "reason": r.reason,
    }


def _remote_parts(expr: Expr) -> list[tuple[str, str]]:
    """The subexpressions the nodes evaluate, as `query.pushdown` splits them."""
    if isinstance(expr, Aggregate) and is_pushable(expr):
        return [("partial aggregation", format_expr(expr))]
    if is_series_local(expr):
        return [("series-local", format_expr(expr))]
    out: list[tuple[str, str]] = []
    for child in children(expr):
        out.extend(_remote_parts(child))
    return out

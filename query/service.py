"""Running PromQL on a FiloPy cluster: plan, route, fan out to the nodes, merge.

The caller (the REST server, the CLI, a Python client) keeps each dataset's shard map current
through a subscription, so a query costs no call to the singleton. `query.pushdown` decides
which parts of the expression are series-local or pushable aggregations; those go to the nodes
that own the shards the parts' selectors route to (`query.routing`), each node evaluating them on
its own memstores and the ColumnStore, and only step results come back. Everything else (binary
operators between vectors, topk, ...) runs here on those results (`query.evaluator`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from core.dataset import Dataset, DatasetRef
from core.errors import Unavailable
from core.hashing import check_spread
from core.shard_status import (
    Active,
    Degraded,
    Handoff,
    Recovery,
    ShardMapState,
    ShardStatus,
)
from query.aggregate import Partial
from query.evaluator import eval_partial, eval_range_vector, eval_series_local, evaluate
from query.executor import NodeAnswer, NodeQuery, ShardsNotHere
from query.limits import QueryLimits, tenant_of
from query.promql import (
    PARSED_CACHED,
    Aggregate,
    Expr,
    MatrixSelector,
    QueryError,
    Subquery,
    VectorSelector,
    children,
    format_expr,
    parse,
    resolve_at,
    selectors,
    value_type,
)
from query.pushdown import concat_matrices, is_pushable, is_series_local, merge_partials
from query.routing import SelectorRoute, route
from query.values import MemorySource, Scalar, SeriesData, StepMatrix, Value
from store.api import LabelMatcher

log = logging.getLogger("filopy.query")

DEFAULT_LOOKBACK_MS = 300_000
# How long a query waits for its shard map to catch up with a node that no longer runs a shard
# the map still gives it, and how often it looks.
MAP_CATCH_UP_S = 1.0
MAP_POLL_S = 0.005


class NodeUnavailable(Unavailable):
    """A node could not answer (gone, failed, timed out): its shards count as unavailable."""


class MapSource(Protocol):
    """Where queries learn a dataset's definition and its current shard map."""

    def dataset(self, name: str) -> Dataset:
        """The definition; raises the cluster's dataset-unknown error if there is none."""
        ...

    def shard_map(self, name: str) -> ShardMapState:
        """The current map: an immutable snapshot, shared (never copied per query)."""
        ...

    def latest(self, name: str) -> ShardMapState:
        """The map as the coordinator has it now, asked directly: slower than `shard_map`, for
        a query whose followed map stayed older than a node's for `MAP_CATCH_UP_S`."""
        ...

    def close(self) -> None: ...


class PendingAnswer(Protocol):
    def result(self, timeout_s: float) -> NodeAnswer:
        """The node's answer; raises `ShardsNotHere` or `NodeUnavailable`."""
        ...


class NodeCaller(Protocol):
    """Sends one node its part of a query; answers are collected after every call is sent."""

    def submit(
        self, node: str, ref: DatasetRef, shards: Sequence[int], request: NodeQuery
    ) -> PendingAnswer: ...


class ShardsUnavailable(QueryError, Unavailable):
    """Shards the query needs are not Active, and the request did not allow partial results."""

    def __init__(self, dataset: str, shards: dict[int, str]) -> None:
        listed = ", ".join(f"{s} ({st})" for s, st in sorted(shards.items()))
        super().__init__(
            "unavailable",
            f"shards of {dataset!r} needed by the query are not available: {listed}; retry, or "
            "allow partial results",
        )
        self.dataset, self.shards = dataset, shards


@dataclass
class QueryResult:
    value: Value
    warnings: list[str] = field(default_factory=list)
    shards: tuple[int, ...] = ()
    nodes: dict[str, list[int]] = field(default_factory=dict)
    series_scanned: int = 0
    samples_scanned: int = 0
    tenant: str | None = None  # whose limits the query counted against (None: no limits)


class QueryService:
    """PromQL over the datasets of one cluster: maps from a `MapSource`, node parts through a
    `NodeCaller` (the cluster's are in `coordinator.cluster_queries`; tests pass fakes).
    `close()` it before the cluster connection goes (the map source may follow maps on threads).
    `max_samples` / `max_series` (0: none) limit every instant and range query per tenant
    (`query.limits`)."""

    def __init__(
        self,
        maps: MapSource,
        nodes: NodeCaller,
        timeout_s: float = 60.0,
        *,
        max_samples: int = 0,
        max_series: int = 0,
    ) -> None:
        self._maps = maps
        self._nodes = nodes
        self._timeout_s = timeout_s
        self._routes = _Routes()
        self.max_samples, self.max_series = max_samples, max_series

    # ----- cluster state ---------------------------------------------------------------------

    @staticmethod
    def _check_spread(ds: Dataset, spread: int | None) -> None:
        if spread is None:
            return
        try:
            check_spread(spread, ds.num_shards)
        except ValueError as e:
            raise QueryError("bad_data", f'invalid parameter "spread": {e}') from None

    def dataset(self, name: str) -> Dataset:
        return self._maps.dataset(name)

    def shard_map(self, name: str) -> ShardMapState:
        """The dataset's current shard map (an immutable snapshot, shared: do not copy it)."""
        return self._maps.shard_map(name)

    def close(self) -> None:
        self._maps.close()
        close_nodes = getattr(self._nodes, "close", None)  # a caller may hold connections
        if close_nodes is not None:
            close_nodes()

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
        tenant: str | None = None,
    ) -> QueryResult:
        """`tenant`: the token's, if it has one (else the query's `_ws_` counts)."""
        times = np.array([time_ms], np.int64)
        return self._run(dataset, query, times, spread, partial, lookback_ms, tenant=tenant)

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
        tenant: str | None = None,
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
        res = self._run(
            dataset, query, times, spread, partial, lookback_ms, range_query=True, tenant=tenant
        )
        if isinstance(res.value, Scalar):  # a range query's answer is a matrix, as Prometheus'
            values = res.value.values[None, :]  # every step (a NaN scalar is a value)
            value = StepMatrix(res.value.times, [{}], values, np.ones(values.shape, bool))
            res = dataclasses.replace(res, value=value)
        return res

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
        for answer in run.fan_out(shards, lambda _: request):
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
        *,
        range_query: bool = False,
        tenant: str | None = None,
    ) -> QueryResult:
        ds = self.dataset(dataset)
        self._check_spread(ds, spread)
        plan = _plan(query)
        if plan.resolves_at:  # `@ start()` / `@ end()`: this query's own tree
            expr = resolve_at(plan.expr, int(times[0]), int(times[-1]))
            plan = _Plan(expr, value_type(expr), tuple(remote_parts(expr)), True)
        expr, kind = plan.expr, plan.kind
        if range_query and kind not in ("scalar", "vector"):
            shown = "range vector" if kind == "matrix" else kind
            raise QueryError(
                "bad_data",
                f'invalid expression type "{shown}" for range query, must be Scalar or instant '
                "Vector",
            )
        run = _Run(self, ds, self.shard_map(dataset), spread, partial, lookback_ms)
        if self.max_samples or self.max_series:
            run.limits = QueryLimits(tenant_of(expr, tenant), self.max_samples, self.max_series)
        if isinstance(expr, MatrixSelector | Subquery):  # an instant query of a range vector
            return run.result(eval_range_vector(expr, run, int(times[0]), lookback_ms))
        run.prefetch(plan.parts, times)  # every node part, one call per node
        value = evaluate(expr, run, times, lookback_ms)
        return run.result(value)


Part = tuple[int, str, Expr, tuple[int, ...]]  # (index, kind, expression, its shards)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a query text comes to before any data is read: the tree, its type, the parts the
    nodes evaluate. The same for every run of the text unless it says `@ start()`/`@ end()`."""

    expr: Expr
    kind: str
    parts: tuple[Expr, ...]
    resolves_at: bool


@functools.lru_cache(maxsize=PARSED_CACHED)
def _plan(query: str) -> _Plan:
    """The plan of a query text, kept for as many texts as `parse` keeps (a dashboard sends the
    same ones again and again; walking the tree is a good part of a small query's time here)."""
    expr = parse(query, matrix_ok=True)
    if resolve_at(expr, 0, 0) is not expr:
        return _Plan(expr, value_type(expr), (), True)
    return _Plan(expr, value_type(expr), tuple(remote_parts(expr)), False)


class _Routes:
    """The shards each node part's selectors route to, kept per part (a tree of a cached
    plan), dataset definition and spread: routing hashes every shard key of the part."""

    MAX = 4096

    def __init__(self) -> None:
        self._known: dict[tuple[int, int, int | None], tuple[Expr, Dataset, tuple[int, ...]]] = {}

    def shards(self, dataset: Dataset, expr: Expr, spread: int | None) -> tuple[int, ...]:
        key = (id(expr), id(dataset), spread)
        hit = self._known.get(key)
        if hit is not None and hit[0] is expr and hit[1] is dataset:
            return hit[2]
        _, shards = route(dataset, [s.matchers for s in selectors(expr)], spread)
        if len(self._known) >= self.MAX:
            self._known.clear()  # trees and definitions come and go; start again
        self._known[key] = (expr, dataset, shards)  # held: their ids stay theirs
        return shards


class _Run:
    """One query's execution: the evaluator's `Backend`. `prefetch` sends every part the nodes
    evaluate in one call per node; the evaluator then reads the answers from it (a part it asks
    for that was not prefetched is fetched on its own)."""

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
        self.limits: QueryLimits | None = None
        self._done: dict[int, tuple[Expr, npt.NDArray[np.int64], Any]] = {}  # by id(expr)

    def result(self, value: Value) -> QueryResult:
        return QueryResult(
            value,
            self.warnings,
            tuple(sorted(self.shards)),
            {n: sorted(s) for n, s in sorted(self.nodes.items())},
            self.series,
            self.samples,
            None if self.limits is None else self.limits.tenant,
        )

    def _shards_of(self, expr: Expr) -> tuple[int, ...]:
        return self.svc._routes.shards(self.dataset, expr, self.spread)

    # ----- the evaluator's backend -----------------------------------------------------------

    def series_local(
        self, expr: Expr, times: npt.NDArray[np.int64], lookback_ms: int
    ) -> StepMatrix:
        done = self._prefetched(expr, times, lookback_ms)
        if done is None:
            request = NodeQuery("series_local", expr, times, lookback_ms)
            done = [a.result for a in self.fan_out(self._shards_of(expr), lambda _: request)]
        if not done:
            return eval_series_local(expr, MemorySource([]), times, lookback_ms)
        return concat_matrices(done)

    def raw(self, sel: VectorSelector, start_ms: int, end_ms: int) -> list[SeriesData]:
        request = NodeQuery("raw", matchers=(sel.matchers,), start_ms=start_ms, end_ms=end_ms)
        return [s for a in self.fan_out(self._shards_of(sel), lambda _: request) for s in a.result]

    def partial_aggregate(
        self, agg: Aggregate, times: npt.NDArray[np.int64], lookback_ms: int
    ) -> Partial:
        done = self._prefetched(agg, times, lookback_ms)
        if done is None:
            request = NodeQuery("partial", agg, times, lookback_ms)
            done = [a.result for a in self.fan_out(self._shards_of(agg), lambda _: request)]
        if not done:
            return eval_partial(agg, MemorySource([]), times, lookback_ms)
        return merge_partials(done)

    def _prefetched(
        self, expr: Expr, times: npt.NDArray[np.int64], lookback_ms: int
    ) -> list[Any] | None:
        hit = self._done.get(id(expr))
        if hit is None or hit[0] is not expr or lookback_ms != self.lookback_ms:
            return None
        return hit[2] if np.array_equal(hit[1], times) else None

    def prefetch(self, parts: Sequence[Expr], times: npt.NDArray[np.int64]) -> None:
        """Evaluate every node part of the query with one call per node (`NodeQuery` "batch")."""
        if not parts:
            return
        plan: list[Part] = [
            (i, "partial" if is_pushable(p) else "series_local", p, self._shards_of(p))
            for i, p in enumerate(parts)
        ]
        if len(plan) == 1:  # one part: the plain request, nothing to gain from a batch
            return
        union = sorted({s for *_, shards in plan for s in shards})

        def request(node_shards: Sequence[int]) -> NodeQuery:
            mine = set(node_shards)
            batch = tuple(
                (i, kind, expr, tuple(s for s in shards if s in mine))
                for i, kind, expr, shards in plan
                if mine.intersection(shards)
            )
            return NodeQuery("batch", times=times, lookback_ms=self.lookback_ms, parts=batch)

        results: dict[int, list[Any]] = {i: [] for i, *_ in plan}
        for answer in self.fan_out(union, request):
            for i, value in answer.result.items():
                results[i].append(value)
        for i, _, expr, _ in plan:
            self._done[id(expr)] = (expr, times, results[i])

    # ----- fan-out ---------------------------------------------------------------------------

    def fan_out(
        self, shards: Sequence[int], request: Callable[[Sequence[int]], NodeQuery]
    ) -> list[NodeAnswer]:
        """Send each owner of `shards` its request (built for the shards it owns), in parallel.

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
        if self.limits is not None:  # each node is told what earlier calls spent
            request = _limited(request, self.limits.after(self.samples, self.series))

        nodes = self.svc._nodes
        ref = self.dataset.ref
        calls = {n: nodes.submit(n, ref, ns, request(ns)) for n, ns in by_node.items()}
        answers: list[NodeAnswer] = []
        moved: dict[int, str] = {}  # shards a node no longer ran -> that node
        for node, call in calls.items():
            self._collect(node, call, by_node[node], request, down, moved, answers)
        if moved:
            # Our map was older than a move (e.g. a handoff just completed): ask the owners the
            # current map names, once, rather than fail the query.
            fresh = self._caught_up(moved)
            again: dict[str, list[int]] = {}
            for s, old in sorted(moved.items()):
                owner, status = fresh.owner(s), fresh.status(s)
                if owner is not None and owner != old and status.ingesting:
                    again.setdefault(owner, []).append(s)
            for node, ns in again.items():
                call = nodes.submit(node, ref, ns, request(ns))
                for s in ns:
                    down.pop(s, None)
                self._collect(node, call, ns, request, down, {}, answers)
        if down:
            if not self.partial:
                raise ShardsUnavailable(self.dataset.name, down)
            listed = ", ".join(f"{s} ({st})" for s, st in sorted(down.items()))
            self._warn(f"partial result: shards {listed} of {self.dataset.name!r} were not queried")
        return answers

    def _caught_up(self, moved: dict[int, str]) -> ShardMapState:
        """The current map, once it no longer names as live owner a node that said it does not
        run the shard. The node acted on a newer map than ours: ours follows a subscription,
        which trails the node's by milliseconds, and a node that answers in one would otherwise
        be asked again on the same stale map. A map still stale after `MAP_CATCH_UP_S` (a
        subscription delayed on a loaded machine) is replaced by the coordinator's own. A shard
        still starting there (Assigned, Recovery, Degraded) is not waited for."""
        name = self.dataset.name
        deadline = time.monotonic() + min(MAP_CATCH_UP_S, self.svc._timeout_s)
        while True:
            fresh = self.svc._maps.shard_map(name)
            if not _names_as_live(fresh, moved):
                return fresh
            if time.monotonic() >= deadline:
                latest = self.svc._maps.latest(name)
                log.info("query of %s: shard map subscription lags; asked the coordinator", name)
                return latest
            time.sleep(MAP_POLL_S)

    def _collect(
        self,
        node: str,
        call: PendingAnswer,
        node_shards: list[int],
        request: Callable[[Sequence[int]], NodeQuery],
        down: dict[int, str],
        moved: dict[int, str],
        answers: list[NodeAnswer],
    ) -> None:
        """Wait for one node's answer and account for it."""
        answer, served = self._answer(node, call, node_shards, request, down, moved)
        if answer is None:
            return
        answers.append(answer)
        self.nodes.setdefault(node, set()).update(served)
        self.shards.update(served)
        self.series += answer.series
        self.samples += answer.samples
        for warning in answer.warnings:
            self._warn(warning)
        if self.limits is not None:  # the nodes' reads together: stop at once when over
            self.limits.check(self.samples, self.series)
        self._warn_catching_up(served)

    def _answer(
        self,
        node: str,
        call: PendingAnswer,
        node_shards: list[int],
        request: Callable[[Sequence[int]], NodeQuery],
        down: dict[int, str],
        moved: dict[int, str],
    ) -> tuple[NodeAnswer | None, list[int]]:
        """A node's answer and the shards it covers; failures go to `down`. A node that no
        longer runs some of the shards (our map was stale) is asked again for the others, and
        those shards go to `moved` too (the caller may find their new owner)."""
        try:
            return call.result(self.svc._timeout_s), node_shards
        except ShardsNotHere as e:
            missing = set(e.shards or node_shards)
            for s in missing & set(node_shards):
                moved[s] = node
                status = self.shard_map.status(s)
                down[s] = (
                    f"moved from {node}"
                    if isinstance(status, Active)
                    else f"{status}, not running on {node} yet"
                )
            rest = [s for s in node_shards if s not in missing]
            if not rest:
                return None, []
            again = self.svc._nodes.submit(node, self.dataset.ref, rest, request(rest))
            return self._answer(node, again, rest, request, down, moved)
        except NodeUnavailable as e:
            down.update({s: str(e) for s in node_shards})
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


def _limited(
    request: Callable[[Sequence[int]], NodeQuery], limits: QueryLimits
) -> Callable[[Sequence[int]], NodeQuery]:
    """`request` with the query's limits in every node's part."""

    def limited(node_shards: Sequence[int]) -> NodeQuery:
        return dataclasses.replace(request(node_shards), limits=limits)

    return limited


def _names_as_live(state: ShardMapState, moved: dict[int, str]) -> bool:
    """Whether `state` still has a shard running (Active or handing off) on the node that said
    it no longer runs it."""
    return any(
        state.owner(s) == node and isinstance(state.status(s), Active | Handoff)
        for s, node in moved.items()
    )


def _catching_up(status: ShardStatus) -> str:
    """Why a served shard may lack recent samples, for the query's warning."""
    match status:
        case Recovery():
            return "recovering (replaying the Kafka backlog)"
        case Degraded(message=message):
            return f"degraded ({message})" if message else "degraded"
        case Handoff(target=target):
            return f"being handed over to {target}"
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


def remote_parts(expr: Expr) -> list[Expr]:
    """The subexpressions the nodes evaluate, as `query.pushdown` splits them (and as the
    evaluator asks for them: pushable aggregations, then maximal series-local subtrees)."""
    if value_type(expr) == "vector" and (is_pushable(expr) or is_series_local(expr)):
        return [expr]
    if isinstance(expr, Subquery):  # evaluated at its own times, asked for when it runs
        return []
    return [part for child in children(expr) for part in remote_parts(child)]


def _remote_parts(expr: Expr) -> list[tuple[str, str]]:
    return [
        ("partial aggregation" if is_pushable(p) else "series-local", format_expr(p))
        for p in remote_parts(expr)
    ]

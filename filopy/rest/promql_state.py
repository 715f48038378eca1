"""What the Prometheus query API's routers share: the query service and the cluster's client
(kept on `app.state.promql` by `filopy.rest.app.serve_promql`), running a query off the event
loop, its latency, and the request's parameters as Prometheus reads them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from prometheus_client import CollectorRegistry, Counter, Histogram

from filopy.rest.errors import BAD_DATA, ApiError, api_error, unwrapped
from filopy.rest.promql import ERRORS, PARAMETERS, parse_duration
from query.limits import QueryLimitExceeded
from query.service import QueryResult, QueryService

if TYPE_CHECKING:
    from coordinator.client import FiloPyClient

R = TypeVar("R")

# Queries run on threads of their own, so the event loop keeps serving while one waits on the
# nodes: a plain executor (its threads start as queries need them), shared by the process's
# apps, bounded as anyio's worker threads are, and cheaper per call (no capacity limiter, run
# vars or cancel scopes on the way: docs/query.md).
QUERY_THREADS = 40
_QUERY_EXECUTOR = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="query")

QUERY_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Params = dict[str, list[str]]


def query_latency(registry: CollectorRegistry) -> Histogram:
    """The query API's latency, by endpoint and outcome (ok, or the Prometheus errorType)."""
    return Histogram(
        "filopy_query_duration_seconds",
        "Time to answer a PromQL instant or range query, by endpoint and outcome (ok, or the "
        "error type: bad_data, execution, timeout, unavailable, ...).",
        ["endpoint", "outcome"],
        buckets=QUERY_LATENCY_BUCKETS,
        registry=registry,
    )


@dataclass(frozen=True)
class TenantQueryMetrics:
    """Per tenant: the samples its queries read, and its queries refused by a limit. Exported
    only while query limits are on (a tenant is then known for every query)."""

    samples: Counter
    refused: Counter

    @classmethod
    def registered(cls, registry: CollectorRegistry) -> TenantQueryMetrics:
        return cls(
            Counter(
                "filopy_query_tenant_samples",
                "Samples read by a tenant's instant and range queries (query limits on).",
                ["tenant"],
                registry=registry,
            ),
            Counter(
                "filopy_query_tenant_refused",
                "A tenant's queries refused for reading more than a limit allows, by limit "
                "(samples, series).",
                ["tenant", "limit"],
                registry=registry,
            ),
        )


@dataclass(eq=False)
class PromQL:
    """One app's query API: the service that evaluates, the client that lists datasets."""

    client: FiloPyClient
    service: QueryService
    latency: Histogram
    tenants: TenantQueryMetrics | None = None
    started: float = field(default_factory=time.time)

    @asynccontextmanager
    async def timed(self, endpoint: str) -> AsyncIterator[None]:
        """Observe the block's time in `latency`, by outcome."""
        began = time.perf_counter()
        outcome = "ok"
        try:
            yield
        except ApiError as e:
            outcome = e.error_type
            raise
        except Exception:
            outcome = "internal"
            raise
        finally:
            self.latency.labels(endpoint, outcome).observe(time.perf_counter() - began)

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        """`fn` on a query thread; its failures become API errors."""
        try:
            return await asyncio.get_running_loop().run_in_executor(_QUERY_EXECUTOR, fn, *args)
        except ApiError:
            raise
        except Exception as e:
            cause = unwrapped(e)
            if isinstance(cause, QueryLimitExceeded) and self.tenants is not None:
                self.tenants.refused.labels(cause.tenant, cause.limit).inc()
            raise api_error(e, self.client.timeout_s) from None

    def counted(self, res: QueryResult) -> QueryResult:
        """`res`, its samples counted for its tenant (when query limits are on)."""
        if res.tenant is not None and self.tenants is not None:
            self.tenants.samples.labels(res.tenant).inc(res.samples_scanned)
        return res

    async def dataset_of(self, p: Params, path_dataset: str | None) -> str:
        """The dataset a request asks: from the path, the `dataset` parameter, or the only one."""
        if path_dataset is not None:
            return path_dataset
        named = one(p, "dataset")
        if named:
            return named
        names = [d.name for d in await self.run(self.client.datasets)]
        if len(names) == 1:
            return names[0]
        raise ApiError(
            400,
            BAD_DATA,
            f'invalid parameter "dataset": required when the cluster has {len(names)} datasets '
            "(or query /promql/DATASET/api/v1/...)",
        )


def promql_of(request: Request) -> PromQL:
    """The query API of the app serving `request`."""
    state: PromQL = request.app.state.promql
    return state


async def params(request: Request) -> Params:
    """Query string and form body together (Prometheus accepts both, GET and POST; the
    body's value wins). A urlencoded body, what every Prometheus client sends, is split
    here: Starlette's form parser costs more than the rest of a small query's request."""
    out: Params = {}
    for k, v in parse_qsl(request.scope["query_string"].decode("latin-1"), keep_blank_values=True):
        out.setdefault(k, []).append(v)
    if request.method == "POST":
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind == "application/x-www-form-urlencoded":
            pairs = parse_qsl((await request.body()).decode("latin-1"), keep_blank_values=True)
        else:
            pairs = [(k, str(v)) for k, v in (await request.form()).multi_items()]
        for k, v in pairs:
            out.setdefault(k, []).append(v)
    return out


def one(p: Params, name: str, default: str | None = None) -> str | None:
    """A parameter's last value (Prometheus reads the last), or `default`."""
    vals = p.get(name)
    return vals[-1] if vals else default


def required(p: Params, name: str) -> str:
    """A parameter's last value; 400 if absent or blank."""
    v = one(p, name)
    if v is None or v == "":
        raise ApiError(400, BAD_DATA, f'invalid parameter "{name}": required')
    return v


def options(p: Params) -> dict[str, Any]:
    """FiloPy's query options: `partial_response`, `spread` and `lookback_delta`."""
    spread = one(p, "spread")
    out: dict[str, Any] = {
        "partial": (one(p, "partial_response", "false") or "").lower() in ("1", "true"),
    }
    if spread not in (None, ""):
        try:
            out["spread"] = int(spread)
        except ValueError:
            raise ApiError(400, BAD_DATA, f'invalid parameter "spread": {spread!r}') from None
    lookback = one(p, "lookback_delta")
    if lookback:
        out["lookback_ms"] = parse_duration(lookback, "lookback_delta")
        if out["lookback_ms"] <= 0:
            raise ApiError(400, BAD_DATA, 'invalid parameter "lookback_delta": must be positive')
    return out


def envelope(res: QueryResult, data: Any) -> dict[str, Any]:
    """The success body, with the result's warnings if any."""
    body: dict[str, Any] = {"status": "success", "data": data}
    if res.warnings:
        body["warnings"] = res.warnings
    return body


def limited(res: QueryResult, data: list[Any], limit: int) -> dict[str, Any]:
    """The envelope of at most `limit` entries (0: all), with Prometheus' warning if cut."""
    body = envelope(res, data[:limit] if limit else data)
    if limit and len(data) > limit:
        body["warnings"] = [*body.get("warnings", []), "results truncated due to limit"]
    return body


def add_route(
    router: APIRouter, path: str, fn: Callable[..., Any], summary: str, methods: tuple[str, ...]
) -> None:
    """`fn` at `path` for each method, a route each (GET and POST share the handler, which
    reads its parameters itself: PARAMETERS documents them). Included twice, under /api/v1 and
    /promql/{dataset}/api/v1 (`filopy.rest.app.serve_promql` names their operations)."""
    for method in methods:
        router.add_api_route(
            path,
            fn,
            methods=[method],
            summary=summary,
            responses=ERRORS,
            openapi_extra={"parameters": PARAMETERS[path]},
        )

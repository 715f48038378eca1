"""The REST API of a FiloPy cluster: datasets, shard status and control, events, health, metrics.

`create_app(client, settings)` builds the FastAPI app; the CLI serves it with uvicorn. Every call
into the cluster goes through the blocking `FiloPyClient` on a worker thread, so the event loop
stays free for the SSE streams. The reference, with examples, is docs/rest.md.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Body, FastAPI, Path, Query, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sse_starlette import EventSourceResponse, ServerSentEvent

from coordinator.client import FiloPyClient, Subscription
from coordinator.cluster_queries import cluster_query_service
from core.config import Settings
from core.dataset import _NAME_RE, Dataset
from core.mapper import ShardEventError, ShardMapper, shard_ranges
from core.shard_status import Active, CurrentShardSnapshot, Degraded, Error, Recovery
from filopy.ingest_http import Ingestion, serve_ingestion
from filopy.rest.errors import (
    NOT_FOUND,
    UNAVAILABLE,
    ApiError,
    api_error,
    error_response,
    install_handlers,
)
from filopy.rest.metrics import ClusterCollector
from filopy.rest.models import (
    AddressStatusData,
    DatasetHealth,
    DatasetRemovedData,
    ErrorBody,
    HealthData,
    MoveData,
    MovesStartedData,
    NodeData,
    NodesData,
    NodeShardStatus,
    OwnershipChangeData,
    PlanData,
    ShardsStartedData,
    ShardsStoppedData,
    ShardStatusData,
    StartShardsRequest,
    StopShardsRequest,
    Success,
    event_data,
    ownership_data,
    plan_data,
    shard_statuses,
    snapshot_data,
)
from filopy.rest.promql import promql_router, serve_queries

R = TypeVar("R")

DatasetName = Annotated[
    str,
    Path(
        pattern=_NAME_RE.pattern,
        description="Dataset name: a letter, then up to 127 letters, digits, '_' or '-'.",
    ),
]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


CONSOLE_DIR = pathlib.Path(__file__).resolve().parent / "console"


def create_app(client: FiloPyClient, settings: Settings) -> FastAPI:
    """The REST server for the cluster `client` talks to."""
    timeout_s = client.timeout_s
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(client))

    app = FastAPI(
        title="FiloPy",
        summary="Datasets, shard status and control, shard events, health and metrics.",
        version="1",
    )
    app.state.settings = settings
    app.state.client = client
    install_handlers(app, timeout_s)
    queries = cluster_query_service(client, timeout_s)
    serve_queries(app, promql_router(client, queries, registry))  # docs/query.md
    ingestion = Ingestion(client.datasets, settings.gateway)  # docs/ingestion-http.md
    serve_ingestion(app, ingestion)  # write POSTs called directly: docs/ingestion-http.md
    registry.register(ingestion.metrics.registry)
    app.router.add_event_handler("shutdown", queries.close)  # stop following maps before Ray goes
    # The web console (docs/operations.md): static files of the package, reading this API.
    app.mount("/console", StaticFiles(directory=CONSOLE_DIR), name="console")

    @app.get("/", include_in_schema=False)
    async def console_page() -> FileResponse:
        return FileResponse(CONSOLE_DIR / "index.html")

    async def call(fn: Callable[..., R], *args: Any) -> R:
        """Run a blocking client call on a worker thread; its failures become API errors."""
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except Exception as e:
            raise api_error(e, timeout_s) from None

    # ----- datasets --------------------------------------------------------------------------

    @app.post(
        "/api/v1/datasets",
        tags=["datasets"],
        status_code=201,
        response_model=Success[Dataset],
        responses={
            200: {"model": Success[Dataset], "description": "The same definition existed."},
            **_errors(400, 409, 503),
        },
    )
    async def setup_dataset(dataset: Annotated[Dataset, Body()], response: Response) -> Any:
        """SetupDataset: register a dataset and assign its shards.

        201 when created; 200 when the identical definition already exists; 409 when a dataset
        of that name exists with another definition, or its Kafka topic has another partition
        count. With `ingest.source = "kafka"` the topic is created here. A definition without
        `source.bootstrap_servers` gets the cluster's `kafka.bootstrap_servers`.
        """
        dataset = dataset.with_cluster_kafka(settings.kafka.bootstrap_servers)
        # One singleton call: a conflicting definition or topic comes back as its own error.
        created = await call(client.setup_dataset, dataset)
        response.status_code = 201 if created else 200
        response.headers["Location"] = f"/api/v1/datasets/{dataset.name}"
        return Success(data=dataset)

    @app.get(
        "/api/v1/datasets",
        tags=["datasets"],
        response_model=Success[list[Dataset]],
        responses=_errors(503),
    )
    async def list_datasets() -> Any:
        """Every dataset definition, by name."""
        datasets = await call(client.datasets)
        return Success(data=sorted(datasets, key=lambda d: d.name))

    async def find_dataset(ds: str, *, missing_ok: bool = False) -> Dataset | None:
        for d in await call(client.datasets):
            if d.name == ds:
                return d
        if missing_ok:
            return None
        raise ApiError(404, NOT_FOUND, f"unknown dataset {ds!r}")

    @app.get(
        "/api/v1/datasets/{ds}",
        tags=["datasets"],
        response_model=Success[Dataset],
        responses=_errors(400, 404, 503),
    )
    async def get_dataset(ds: DatasetName) -> Any:
        """One dataset's definition."""
        dataset = await find_dataset(ds)
        return Success(data=dataset)

    @app.delete(
        "/api/v1/datasets/{ds}",
        tags=["datasets"],
        response_model=Success[DatasetRemovedData],
        responses=_errors(400, 404, 503),
    )
    async def remove_dataset(ds: DatasetName) -> Any:
        """Stop ingesting the dataset and forget its definition (stored data stays)."""
        await call(client.remove_dataset, ds)
        return Success(data=DatasetRemovedData(name=ds))

    # ----- cluster -----------------------------------------------------------------------------

    @app.get(
        "/api/v1/cluster",
        tags=["cluster"],
        response_model=Success[list[str]],
        responses=_errors(503),
    )
    async def cluster() -> Any:
        """The names of the datasets the cluster ingests."""
        return Success(data=sorted(d.name for d in await call(client.datasets)))

    @app.get(
        "/api/v1/cluster/{ds}/status",
        tags=["cluster"],
        response_model=Success[list[ShardStatusData]],
        responses=_errors(400, 404, 503),
    )
    async def shard_status(ds: DatasetName) -> Any:
        """Every shard's status and owner (address: a node id; empty when unowned)."""
        mapper: ShardMapper = await call(client.shard_map, ds)
        return Success(data=shard_statuses(mapper, await call(client.node_names)))

    @app.get(
        "/api/v1/cluster/{ds}/statusByAddress",
        tags=["cluster"],
        response_model=Success[list[AddressStatusData]],
        responses=_errors(400, 404, 503),
    )
    async def status_by_address(ds: DatasetName) -> Any:
        """Shards grouped by owner: every member (oldest first, maybe with no shards), then
        the unowned shards under address ""."""
        mapper: ShardMapper = await call(client.shard_map, ds)
        members: list[str] = await call(client.members)
        names: dict[str, str] = await call(client.node_names)
        owners = list(members) + sorted(mapper.all_nodes() - set(members))

        def group(address: str, shards: list[int]) -> AddressStatusData:
            statuses = [NodeShardStatus(shard=s, status=str(mapper.status(s))) for s in shards]
            node = names.get(address, address)
            return AddressStatusData(address=address, node=node, shards=statuses)

        out = [group(node, mapper.shards_for_node(node)) for node in owners]
        unowned = mapper.unassigned_shards()
        if unowned:
            out.append(group("", unowned))
        return Success(data=out)

    @app.post(
        "/api/v1/cluster/{ds}/startshards",
        tags=["cluster"],
        response_model=Success[ShardsStartedData],
        responses=_errors(400, 404, 503),
    )
    async def start_shards(ds: DatasetName, request: StartShardsRequest) -> Any:
        """Start unowned shards on a node. Nothing changes unless every shard can start."""
        done = await call(client.start_shards, ds, request.address, request.shardList)
        return Success(data=ShardsStartedData(address=done.node, shardList=list(done.shards)))

    @app.post(
        "/api/v1/cluster/{ds}/stopshards",
        tags=["cluster"],
        response_model=Success[ShardsStoppedData],
        responses=_errors(400, 404, 503),
    )
    async def stop_shards(ds: DatasetName, request: StopShardsRequest) -> Any:
        """Take shards from their nodes (status Down); they stay unowned until started again
        or until membership changes."""
        done = await call(client.stop_shards, ds, request.shardList)
        return Success(data=ShardsStoppedData(shardList=list(done.shards)))

    # ----- rebalancing (docs/operations.md) ---------------------------------------------------

    @app.get(
        "/api/v1/cluster/{ds}/plan",
        tags=["rebalancing"],
        response_model=Success[PlanData],
        responses=_errors(400, 404, 503),
    )
    async def plan(
        ds: DatasetName,
        add_nodes: Annotated[int, Query(ge=0, le=1024, description="Nodes joining.")] = 0,
        remove_node: Annotated[
            list[str], Query(description="A node leaving (id or unique prefix); repeatable.")
        ] = [],  # noqa: B006 - FastAPI copies defaults
        drain_node: Annotated[
            list[str], Query(description="A node to empty (id or unique prefix); repeatable.")
        ] = [],  # noqa: B006
        throttled: Annotated[
            bool, Query(description="Only the moves the next round may start.")
        ] = False,
    ) -> Any:
        """What rebalancing would do now, or after nodes join, leave or are drained: the moves,
        and shards per node before and after. Applies nothing."""
        result = await call(
            lambda: client.plan(
                ds,
                add_nodes=add_nodes,
                remove_nodes=remove_node,
                drain_nodes=drain_node,
                throttled=throttled,
            )
        )
        return Success(data=plan_data(result))

    @app.get(
        "/api/v1/cluster/{ds}/history",
        tags=["rebalancing"],
        response_model=Success[list[OwnershipChangeData]],
        responses=_errors(400, 404, 503),
    )
    async def history(
        ds: DatasetName,
        shard: Annotated[
            int | None, Query(ge=0, le=2**31 - 1, description="Only this shard.")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=100_000, description="At most this many.")] = 100,
    ) -> Any:
        """Who owned which shard when, and why: every ownership change, newest first, with the
        new owner's epoch and the offsets it replayed (kept `store.history_retention_days`)."""
        changes = await call(lambda: client.history(ds, shard, limit))
        return Success(data=[ownership_data(c) for c in changes])

    @app.post(
        "/api/v1/cluster/{ds}/rebalance",
        tags=["rebalancing"],
        response_model=Success[MovesStartedData],
        responses=_errors(404, 503),
    )
    async def rebalance(ds: DatasetName) -> Any:
        """Run one rebalance round now: start the moves the throttle allows (each a handoff:
        the old owner drains, the new one takes over once live)."""
        done = await call(client.rebalance, ds)
        held = "; ".join(why for _, why in done.held_back)
        moves = [MoveData(shard=s, source=a, target=b) for _, s, a, b in done.moves]
        return Success(data=MovesStartedData(moves=moves, held_back=held))

    @app.get(
        "/api/v1/nodes",
        tags=["cluster"],
        response_model=Success[NodesData],
        responses=_errors(503),
    )
    async def nodes() -> Any:
        """The cluster's nodes: id, name and version of each member, and the nodes refused
        (a name a member already has)."""
        members: list[str] = await call(client.members)
        names: dict[str, str] = await call(client.node_names)
        versions: dict[str, str] = await call(client.node_versions)
        refused: dict[str, str] = await call(client.refused_nodes)
        listed = [
            NodeData(address=n, name=names.get(n, n), version=versions.get(n, "")) for n in members
        ]
        return Success(data=NodesData(members=listed, refused=refused))

    @app.post(
        "/api/v1/nodes/{node}/drain",
        tags=["rebalancing"],
        response_model=Success[MovesStartedData],
        responses=_errors(404, 503),
    )
    async def drain_node(node: str) -> Any:
        """Empty a node for maintenance: its shards move off through handoffs, a few at a time
        (the throttle); it gets no new shards until it leaves or the drain is cancelled."""
        done = await call(client.drain_node, node)
        moves = [MoveData(shard=s, source=a, target=b) for _, s, a, b in done.moves]
        return Success(data=MovesStartedData(moves=moves))

    @app.delete(
        "/api/v1/nodes/{node}/drain",
        tags=["rebalancing"],
        response_model=Success[MovesStartedData],
        responses=_errors(404, 503),
    )
    async def cancel_drain(node: str) -> Any:
        """Stop emptying a node (moves in flight finish)."""
        await call(lambda: client.drain_node(node, cancel=True))
        return Success(data=MovesStartedData(moves=[]))

    @app.get(
        "/api/v1/cluster/{ds}/events",
        tags=["cluster"],
        response_class=EventSourceResponse,
        responses={
            200: {
                "description": "An SSE stream: a `snapshot` event, then a `shard_event` per "
                "change, and `dataset_removed` when the dataset goes away.",
                "content": {"text/event-stream": {}},
            },
            **_errors(400, 404, 503),
        },
    )
    async def events(ds: DatasetName) -> EventSourceResponse:
        """SubscribeShardUpdates as Server-Sent Events, for clients in any language."""
        sub: Subscription = await call(client.subscribe, ds)
        return EventSourceResponse(_stream(sub), ping=15)

    async def _names(known: dict[str, str], node: str | None = None) -> dict[str, str]:
        """Node names for the stream: fetched for a snapshot or a node not named yet; the last
        known ones while the cluster does not answer (the stream goes on with ids)."""
        if node is not None and (not node or node in known):
            return known
        try:
            return await anyio.to_thread.run_sync(client.node_names)
        except Exception:
            return known

    async def _stream(sub: Subscription) -> AsyncIterator[ServerSentEvent]:
        mapper: ShardMapper | None = None
        names: dict[str, str] = {}
        try:
            async for update in sub:
                if isinstance(update, CurrentShardSnapshot):
                    mapper = ShardMapper.from_state(update.state)
                    names = await _names(names)
                    data = _json(snapshot_data(update, names))
                    yield ServerSentEvent(data=data, event="snapshot")
                    continue
                if mapper is not None:
                    try:
                        mapper.update_from_event(update)
                    except ShardEventError:
                        mapper = None  # out of step: report events without statuses
                names = await _names(names, update.node or "")
                data = _json(event_data(update, mapper, names))
                yield ServerSentEvent(data=data, event="shard_event")
            yield ServerSentEvent(data=_json({"dataset": sub.ref.name}), event="dataset_removed")
        finally:
            # Also on client disconnect (cancellation): drop the subscription in the cluster.
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await anyio.to_thread.run_sync(sub.unsubscribe)

    # ----- operations ----------------------------------------------------------------------------

    @app.get(
        "/__health",
        tags=["operations"],
        response_model=Success[HealthData],
        responses=_errors(503),
    )
    async def health() -> Any:
        """200 when every shard of every dataset is Active or in Recovery, else 503 naming the
        shards that are not, with the reason for Degraded and Error ones (a Degraded shard
        still ingests, but its store or Kafka is out: the cluster is not healthy); also 503
        while the singleton holds failover back because more members are silent than answer."""
        datasets = await call(client.datasets)
        report: dict[str, DatasetHealth] = {}
        problems: list[str] = []
        for d in sorted(datasets, key=lambda d: d.name):
            try:
                mapper: ShardMapper = await call(client.shard_map, d.name)
            except ApiError as e:
                if e.status == 404:
                    continue  # removed meanwhile
                raise
            active = len(mapper.active_shards())
            live = mapper.active_or_recovering_shards()
            report[d.name] = DatasetHealth(
                shards=mapper.num_shards, active=active, recovering=len(live) - active
            )
            if len(live) < mapper.num_shards:
                problems.append(f"dataset {d.name!r}: {_unhealthy(mapper)}")
        said = ["unhealthy shards: " + "; ".join(problems)] if problems else []
        suspect = await call(client.suspect_self)
        if suspect:
            said.insert(0, f"failover held back: {suspect}")
        if said:
            return error_response(503, UNAVAILABLE, "; ".join(said))
        return Success(data=HealthData(healthy=True, datasets=report))

    @app.get("/__liveness", tags=["operations"], response_model=Success[str])
    async def liveness() -> Any:
        """200 while this server runs; it does not ask the cluster."""
        return Success(data="ok")

    @app.get(
        "/metrics",
        tags=["operations"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text."}},
    )
    async def metrics() -> Response:
        """Prometheus exposition format; see docs/rest.md for the metric families."""
        body = await anyio.to_thread.run_sync(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    def openapi() -> dict[str, Any]:
        """FastAPI documents request validation as 422; this API answers 400 (as the spec
        asks), so the schema says so too."""
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            for item in schema.get("paths", {}).values():
                for op in item.values():
                    responses = op.get("responses", {})
                    if responses.pop("422", None) is not None and "400" not in responses:
                        responses["400"] = {
                            "description": "Bad Request",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/ErrorBody"}
                                }
                            },
                        }
            schemas = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _json(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"))


def _unhealthy(mapper: ShardMapper) -> str:
    """`Down: 3, 5-7; Unassigned: 9; Degraded: 4 (store unavailable ...)`: the shards not Active
    or in Recovery, by status; Degraded and Error shards with their messages."""
    by_status: dict[str, list[int]] = {}
    for s in range(mapper.num_shards):
        st = mapper.status(s)
        if not isinstance(st, Active | Recovery):
            by_status.setdefault(type(st).__name__, []).append(s)
    reasons = {
        s: st.message
        for s in range(mapper.num_shards)
        if isinstance(st := mapper.status(s), Degraded | Error) and st.message
    }

    def why(shards: list[int]) -> str:
        said = [f"shard {s}: {reasons[s]}" for s in shards if s in reasons][:5]
        return f" ({'; '.join(said)})" if said else ""

    return "; ".join(f"{k}: {shard_ranges(v)}{why(v)}" for k, v in sorted(by_status.items()))

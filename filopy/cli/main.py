"""The `filopy` command line. Errors are one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

app = typer.Typer(
    name="filopy",
    help="FiloPy: a FiloDB-style time-series ingestion cluster on Kafka, Ray and Cassandra.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[gateway]" is a settings section, not markup
)
dataset_app = typer.Typer(help="Datasets: create, list, show, delete.", no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")
shards_app = typer.Typer(help="Stop shards, or start them on a chosen node.", no_args_is_help=True)
app.add_typer(shards_app, name="shards")
node_app = typer.Typer(help="This machine as a FiloPy node: join a cluster.", no_args_is_help=True)
app.add_typer(node_app, name="node")
series_app = typer.Typer(help="Series: delete.", no_args_is_help=True)
app.add_typer(series_app, name="series")
token_app = typer.Typer(
    help="API tokens for the HTTP servers: create, list, revoke (in the store the settings name; "
    "docs/security.md).",
    no_args_is_help=True,
)
app.add_typer(token_app, name="token")

console = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

RayAddress = Annotated[
    str, typer.Option("--address", "-a", help="Ray cluster address of a running FiloPy cluster.")
]
RestUrl = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="FILOPY_URL",
        help="The cluster's REST API (e.g. http://head:8080) instead of --address: for a machine "
        "that runs no Ray node.",
    ),
]
ApiToken = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="FILOPY_TOKEN",
        help="The token --url sends; default: the admin token `filopy up` keeps in its state "
        "directory.",
    ),
]
RayTempDir = Annotated[
    str | None,
    typer.Option(
        envvar="FILOPY_RAY_TEMP_DIR",
        help="Ray's directory for sessions, logs and sockets (default /tmp/ray); one per node "
        "where nodes share a machine.",
    ),
]


def _clean_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None
        except Exception as e:  # the CLI's promise: one line, no traceback
            while isinstance(getattr(e, "cause", None), Exception):  # Ray's task error wrapper
                e = e.cause  # type: ignore[attr-defined]
            message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if type(e).__name__ == "ValidationError" and hasattr(e, "errors"):  # pydantic's
                from filopy.rest.errors import validation_message

                message = "; ".join(validation_message(e.errors()).splitlines())
            err.print(f"[bold red]error:[/] {message}")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _client(address: str) -> Any:
    from coordinator.client import connect

    return connect(address)


@app.command()
@_clean_errors
def demo(
    quick: Annotated[bool, typer.Option(help="A smaller, faster run (used by CI).")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Show Ray's own output too (else in its log files).")
    ] = False,
) -> None:
    """Run the main job: a local cluster ingesting, losing a node, recovering, reading back."""
    from filopy.cli.demo import run_demo

    if not run_demo(quick=quick, console=console, verbose=verbose):
        raise typer.Exit(1)


@app.command()
@_clean_errors
def up(
    nodes: Annotated[int, typer.Option(min=1, help="FiloPy nodes to start.")] = 3,
    port: Annotated[
        int, typer.Option(envvar="FILOPY_REST_PORT", help="REST API port on 127.0.0.1.")
    ] = 8080,
) -> None:
    """Start a local cluster in the background: Ray head + FiloPy nodes on 127.0.0.1, the
    singleton, the REST API, and Kafka (and Cassandra if configured) via scripts/services.sh."""
    from filopy.cli.local import state_dir
    from filopy.cli.local import up as start

    with console.status(f"starting a local cluster of {nodes} FiloPy nodes…"):
        cluster = start(nodes, port)
    console.print(
        f"[green]local cluster up[/]: {cluster.nodes} FiloPy nodes, Ray at {cluster.ray_address}, "
        f"REST API {cluster.rest_url} (OpenAPI at {cluster.rest_url}/docs)\n"
        f"log: {cluster.log}\nstate: {state_dir() / 'local-cluster.json'}; "
        "other commands find it from this directory; stop it with `filopy down`"
    )


@app.command()
@_clean_errors
def down() -> None:
    """Stop the local cluster `filopy up` started (and the services it started itself)."""
    from filopy.cli.local import down as stop

    with console.status("stopping the local cluster…"):
        cluster = stop()
    stopped = f" and {', '.join(cluster.started_services)}" if cluster.started_services else ""
    console.print(f"local cluster (pid {cluster.pid}){stopped} stopped")


@app.command()
@_clean_errors
def serve(
    address: RayAddress = "auto",
    host: Annotated[str, typer.Option(help="Interface the REST API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="FILOPY_REST_PORT", help="REST API port.")] = 8080,
) -> None:
    """Run the cluster singleton on a Ray cluster (if not running yet) and serve the REST API."""
    import ray

    from coordinator import ray_env
    from coordinator.client import resolve_address
    from core.config import load_settings

    settings = load_settings()
    ray_env.bind_loopback()  # Ray is imported by now: binding at connect time is what counts
    ray.init(
        address=resolve_address(address), namespace=settings.ray.namespace, logging_level="WARNING"
    )
    _serve_rest(settings, host, port)


def _serve_rest(settings: Any, host: str, port: int) -> None:
    """Start (or find) the singleton on the connected Ray cluster and serve the REST API on
    `host:port` until SIGTERM/SIGINT."""
    import ray
    import uvicorn

    from coordinator.client import FiloPyClient
    from coordinator.cluster_actor import start_cluster_actor
    from core.heap import keep_long_lived_frozen
    from filopy.rest import create_app
    from filopy.serving import scheme, uvicorn_options

    actor = start_cluster_actor(settings)
    ray.get(actor.ready.remote(), timeout=120)
    client = FiloPyClient(actor, settings)
    app_ = create_app(client, settings)
    url = f"{scheme(settings)}://{host}:{port}"
    console.print(f"FiloPy singleton ready; REST API on {url} (OpenAPI at /docs)")
    keep_long_lived_frozen()
    uvicorn.run(app_, host=host, port=port, log_level="warning", **uvicorn_options(settings))


@app.command()
@_clean_errors
def head(
    bind: Annotated[
        str, typer.Option(help="This host's address that nodes and clients dial (not 0.0.0.0).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The Ray head's port (what nodes join).")] = 6379,
    rest_port: Annotated[
        int, typer.Option(envvar="FILOPY_REST_PORT", help="REST API port (on --bind).")
    ] = 8080,
    redis: Annotated[
        str | None,
        typer.Option(
            envvar="FILOPY_RAY_REDIS",
            help="HOST:PORT of a Redis keeping Ray's control state, so a restarted head resumes "
            "its cluster (docs/deployment.md).",
        ),
    ] = None,
    temp_dir: RayTempDir = None,
) -> None:
    """Run the head of a cluster on several machines, in the foreground: the Ray head, the
    cluster singleton and the REST API, all bound to --bind. Nodes join with `filopy node join
    --address HOST:PORT`. Stop it with SIGTERM or Ctrl-C."""
    import os

    from core.config import load_settings
    from filopy.cli import raynode

    settings = load_settings()
    host, _ = raynode.split_address(f"{bind}:{port}")
    if redis is not None:
        raynode.split_address(redis)  # fail on a typo before Ray starts
        os.environ["RAY_REDIS_ADDRESS"] = redis  # Ray's GCS keeps its tables there
        os.environ.setdefault("RAY_external_storage_namespace", settings.ray.namespace)
    from coordinator.names import HEAD_RESOURCE

    # Ray declares a node dead after this many missed health checks (3 s apart): 20 matches the
    # 60 s a node's raylet waits for the head, so a head cut off from its nodes for less than
    # that does not have Ray end them all on heal. FiloPy's own pings still fail a silent node
    # over in `cluster.failure_timeout_s` while the head hears most nodes.
    spec = raynode.NodeSpec(
        bind=host,
        port=port,
        resources={HEAD_RESOURCE: 1},
        temp_dir=temp_dir,
        system_config={"health_check_failure_threshold": 20},
    )
    node = raynode.start(spec)
    import ray

    ray.init(
        address=node.gcs_address,
        _node_ip_address=host,
        namespace=settings.ray.namespace,
        logging_level="WARNING",
    )
    console.print(f"Ray head at {node.gcs_address}; nodes join with `filopy node join "
                  f"--address {node.gcs_address}`")  # fmt: skip
    try:
        _serve_rest(settings, host, rest_port)
    finally:
        ray.shutdown()
        node.kill_all_processes(check_alive=False, allow_graceful=True)


@node_app.command("join")
@_clean_errors
def node_join(
    address: Annotated[
        str,
        typer.Option(
            "--address", "-a", help="The head's HOST:PORT; default: the cluster `filopy up` runs."
        ),
    ] = "auto",
    name: Annotated[
        str | None, typer.Option(help="The node's name in status and the console (unique).")
    ] = None,
    bind: Annotated[
        str | None,
        typer.Option(help="This host's address the cluster dials; default: the one to the head."),
    ] = None,
    cpus: Annotated[int, typer.Option(min=1, help="CPUs Ray may schedule on this node.")] = 1,
    wait: Annotated[
        float, typer.Option(min=0, help="Seconds to wait for the head to answer.")
    ] = 120.0,
    temp_dir: RayTempDir = None,
) -> None:
    """Start a FiloPy node on this machine and join it to a cluster, in the foreground (stop it
    with SIGTERM or Ctrl-C; its shards move to the other nodes). The singleton gives it shards
    as rebalancing allows."""
    from coordinator import ray_env
    from coordinator.node_coordinator import NAME_LABEL
    from core.config import load_settings
    from core.local_state import ray_token_path, running
    from filopy.cli import raynode

    settings = load_settings()
    local = running()
    if address == "auto":
        if local is None:
            raise typer.BadParameter("no `filopy up` cluster here; give the head's --address")
        address = local.ray_address
    if local is not None and address == local.ray_address:
        ray_env.use_ray_token(ray_token_path())  # the `filopy up` cluster's Ray token
    host, port = raynode.split_address(address)
    raynode.wait_reachable(host, port, wait)
    here = bind or raynode.address_towards(host, port)
    if raynode.is_loopback(host) != raynode.is_loopback(here):
        raise typer.BadParameter(
            f"--bind {here} and the head {host} must both be loopback or both not"
        )
    spec = raynode.NodeSpec(
        bind=here,
        head_address=f"{host}:{port}",
        num_cpus=cpus,
        resources={settings.cluster.node_resource: 1},
        labels={NAME_LABEL: name} if name else {},
        temp_dir=temp_dir,
    )
    node = raynode.start(spec)
    shown = name or node.node_id[:12]
    console.print(f"FiloPy node {shown} at {here} joined the cluster at {host}:{port}; "
                  "Ctrl-C or SIGTERM stops it")  # fmt: skip
    raise typer.Exit(raynode.run_until_stopped(node))


@app.command()
@_clean_errors
def gateway(
    host: Annotated[str, typer.Option(help="Interface the gateway listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="FILOPY_GATEWAY_PORT", help="HTTP port.")] = 8081,
    max_body_bytes: Annotated[
        int | None,
        typer.Option(min=1024, help="Larger request bodies are refused (413) (settings)."),
    ] = None,
    ack_timeout_s: Annotated[
        float | None,
        typer.Option(min=0.1, help="Kafka acks not in by then: 503 + Retry-After (settings)."),
    ] = None,
) -> None:
    """Serve HTTP ingestion alone (remote write, Influx line protocol, OTLP under
    /ingest/DATASET/): no Ray; dataset definitions from the store, samples to Kafka; limits from
    the settings' [gateway] section. See docs/ingestion-http.md."""
    import uvicorn

    from core.config import load_settings
    from core.heap import keep_long_lived_frozen
    from filopy.ingest_http import create_gateway_app
    from filopy.serving import scheme, uvicorn_options

    settings = load_settings()
    overrides = {"max_body_bytes": max_body_bytes, "ack_timeout_s": ack_timeout_s}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        settings = settings.model_copy(
            update={"gateway": settings.gateway.model_copy(update=overrides)}
        )
    app_ = create_gateway_app(settings)
    console.print(f"FiloPy ingestion gateway on {scheme(settings)}://{host}:{port}")
    keep_long_lived_frozen()
    uvicorn.run(app_, host=host, port=port, log_level="warning", **uvicorn_options(settings))


@app.command()
@_clean_errors
def status(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    address: RayAddress = "auto",
    url: RestUrl = None,
    token: ApiToken = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """The shard grid of a dataset, with a legend and the shards of each node."""
    if url is not None:
        from filopy.cli.rest_client import RestClient

        with RestClient(url, token) as rest:
            mapper = rest.shard_map(dataset)
            names, refused = rest.nodes()
    else:
        client = _client(address)
        mapper = client.shard_map(dataset)
        found = client.nodes()  # names and refusals at one instant
        names, refused = {m.node: m.name for m in found.members}, dict(found.refused)
    if as_json:
        shards = [
            {
                "shard": s,
                "status": str(mapper.status(s)),
                "address": mapper.owner(s) or "",
                "node": names.get(mapper.owner(s) or "", mapper.owner(s) or ""),
            }
            for s in range(mapper.num_shards)
        ]
        console.print_json(
            json.dumps({"dataset": dataset, "shards": shards, "nodes": names, "refused": refused})
        )
        return
    from filopy.cli.views import shard_grid

    console.print(shard_grid(mapper, f"{dataset}: {mapper.num_shards} shards", names, refused))


@app.command()
@_clean_errors
def watch(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    seconds: Annotated[
        float | None,
        typer.Option("--for", min=0, help="Stop after this many seconds; default: until Ctrl-C."),
    ] = None,
    address: RayAddress = "auto",
) -> None:
    """Print the current snapshot, then every shard event as it happens (Ctrl-C to stop)."""
    import time

    from core.mapper import ShardMapper
    from core.shard_status import CurrentShardSnapshot
    from filopy.cli.views import shard_grid

    deadline = None if seconds is None else time.monotonic() + seconds
    client = _client(address)
    names = client.node_names()
    with client.subscribe(dataset) as updates:
        while deadline is None or time.monotonic() < deadline:
            left = updates.POLL_S if deadline is None else deadline - time.monotonic()
            try:
                update = updates.next(max(0.0, min(left, updates.POLL_S)))
            except TimeoutError:
                continue
            except StopIteration:  # the dataset was removed
                break
            # Names learnt are kept: events about a node that left still name it.
            if isinstance(update, CurrentShardSnapshot):
                names |= client.node_names()
                console.print(shard_grid(ShardMapper.from_state(update.state), dataset, names))
                continue
            node = update.node or ""
            if node and node not in names:  # a node that joined since
                names |= client.node_names()
            console.print(
                f"shard {update.shard:>4}  {type(update).__name__}  {names.get(node, node)}"
            )


@dataset_app.command("create")
@_clean_errors
def dataset_create(
    name: Annotated[str, typer.Argument(help="Dataset name.")],
    shards: Annotated[int, typer.Option(help="Shard count (a power of two).")] = 8,
    min_nodes: Annotated[int, typer.Option(help="Spread the shards over this many nodes.")] = 1,
    spread: Annotated[int, typer.Option(help="Default spread (log2 of shards per shard key).")] = 1,
    topic: Annotated[str | None, typer.Option(help="Kafka topic; default filopy-NAME.")] = None,
    bootstrap: Annotated[
        str | None,
        typer.Option(help="Kafka bootstrap servers; default: the cluster's own."),
    ] = None,
    record_format: Annotated[
        str, typer.Option("--format", help="filopy-binary or influx-line.")
    ] = "filopy-binary",
    from_json: Annotated[
        typer.FileText | None,
        typer.Option(
            help="A full definition as JSON (as `dataset show` prints); overrides the rest."
        ),
    ] = None,
    retention: Annotated[
        str | None,
        typer.Option(
            help='Keep raw data this long ("30d", "12h"; "0": forever); default: '
            "the cluster's store.retention_days."
        ),
    ] = None,
    address: RayAddress = "auto",
) -> None:
    """SetupDataset: register a dataset and assign its shards (its Kafka topic is created)."""
    from core.dataset import Dataset
    from filopy.rest.datasets import parse_retention

    retention_ms = parse_retention(retention)  # a bad value fails before anything is created
    if from_json is not None:
        definition = json.loads(from_json.read())
        definition.pop("storage", None)  # `dataset show` adds it; not part of the definition
        ds = Dataset.model_validate(definition)
    else:
        source: dict[str, Any] = {"topic": topic, "record_format": record_format}
        if bootstrap is not None:  # else the cluster's kafka.bootstrap_servers
            source["bootstrap_servers"] = bootstrap
        ds = Dataset.model_validate(
            {
                "name": name,
                "num_shards": shards,
                "min_num_nodes": min_nodes,
                "spread": {"default": spread},
                "source": source,
            }
        )
    client = _client(address)
    created = client.setup_dataset(ds)
    console.print(f"{'created' if created else 'already exists (same definition)'}: {ds.name}")
    if retention is not None:
        client.set_retention(ds.name, retention_ms)
        console.print(f"retention: {_retention_text(retention_ms)}")


@dataset_app.command("delete")
@_clean_errors
def dataset_delete(
    name: Annotated[str, typer.Argument(help="Dataset name.")], address: RayAddress = "auto"
) -> None:
    """Remove a dataset: its shards stop and its definition is forgotten. Its stored series,
    checkpoints and epochs stay, so creating it again resumes where it stopped."""
    _client(address).remove_dataset(name)
    console.print(f"deleted: {name}")


@dataset_app.command("list")
@_clean_errors
def dataset_list(address: RayAddress = "auto") -> None:
    """Names of the datasets the cluster knows."""
    for ds in _client(address).datasets():
        console.print(ds.name)


@dataset_app.command("show")
@_clean_errors
def dataset_show(
    name: Annotated[str, typer.Argument(help="Dataset name.")], address: RayAddress = "auto"
) -> None:
    """A dataset's full definition as JSON, with its retention and bytes stored (`storage`:
    left out when the definition is read back by `dataset create --from-json`)."""
    client = _client(address)
    for ds in client.datasets():
        if ds.name == name:
            shown = ds.model_dump(mode="json")
            info = client.storage(name)
            shown["storage"] = {
                "retention": _retention_text(info["retention_ms"]),
                "retention_from": "dataset" if info["own_retention_ms"] is not None else "cluster",
                "max_bytes": info["max_bytes"],
                "bytes": info["bytes"],
                "chunks": info["chunks"],
                "buckets": len(info["buckets"]),
                "last_sweep_error": info["sweep"].get("last_error"),
            }
            console.print_json(json.dumps(shown))
            return
    raise typer.BadParameter(f"unknown dataset {name!r}")


@dataset_app.command("retention")
@_clean_errors
def dataset_retention(
    name: Annotated[str, typer.Argument(help="Dataset name.")],
    value: Annotated[
        str | None,
        typer.Argument(
            help='How long raw data is kept: "30d", "12h", "0" (forever) or "default" (the '
            "cluster's store.retention_days). Without it: show the retention and bytes stored."
        ),
    ] = None,
    max_bytes: Annotated[
        str | None,
        typer.Option(
            help='Also bound the bytes stored, oldest buckets dropped first ("50GiB", "800MB"; '
            '"none" removes the bound). SQLite only.'
        ),
    ] = None,
    address: RayAddress = "auto",
) -> None:
    """Show or change a live dataset's retention. Reads stop answering older data at once; the
    space is freed by the next sweep (SQLite) or by TTLs (Cassandra, docs/storage.md)."""
    from filopy.rest.datasets import parse_retention

    client = _client(address)
    retention_ms = None if value in (None, "default") else parse_retention(value)
    limit = None if max_bytes in (None, "none") else _parse_bytes(max_bytes)
    if value is not None:
        client.set_retention(name, retention_ms)
    if max_bytes is not None:
        client.set_size_limit(name, limit)
    info = client.storage(name)
    origin = "its own" if info["own_retention_ms"] is not None else "the cluster default"
    bound = "" if info["max_bytes"] is None else f" (at most {info['max_bytes']})"
    console.print(
        f"{name}: retention {_retention_text(info['retention_ms'])} ({origin}); "
        f"{info['bytes']} bytes stored{bound} in {info['chunks']} chunks, "
        f"{len(info['buckets'])} buckets"
    )


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}  # fmt: skip


def _parse_bytes(text: str) -> int:
    """A size as operators write it: "50GiB", "800MB", "1000"."""
    import re

    from core.errors import Invalid

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m and _BYTE_UNITS.get(m.group(2).lower())
    if m is None or unit is None or float(m.group(1)) * unit < 1:
        raise Invalid(f'a size is a positive number of bytes like "50GiB" or "800MB", not {text!r}')
    return int(float(m.group(1)) * unit)


def _retention_text(ms: int | None) -> str:
    """A retention as an operator writes it: the largest whole unit."""
    if not ms:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@app.command()
@_clean_errors
def ingest(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    series: Annotated[int, typer.Option(min=1, help="How many series.")] = 1000,
    scrapes: Annotated[int, typer.Option(min=1, help="Scrapes of every series, 15 s apart.")] = 100,
    start_ms: Annotated[
        int | None, typer.Option(help="First timestamp (ms); default: now minus the span.")
    ] = None,
    address: RayAddress = "auto",
) -> None:
    """Send a synthetic Prometheus-like workload through the gateway, with a progress bar."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from ingest.gateway import Gateway
    from ingest.workload import SCRAPE_MS
    from ingest.workload import scrapes as workload

    ds = next((d for d in _client(address).datasets() if d.name == dataset), None)
    if ds is None:
        raise typer.BadParameter(f"unknown dataset {dataset!r}")
    total = series * scrapes
    start = start_ms if start_ms is not None else int(time.time() * 1000) - scrapes * SCRAPE_MS
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("acked samples", total=total)

        def show(p: Any) -> None:
            bar.update(task, completed=p.samples_acked)

        with Gateway(ds, progress=show, progress_interval_s=0.2) as gw:
            for batch in workload(series, scrapes, per_batch=10, start_ms=start):
                gw.send_batch(batch)
        final = gw.progress(final=True)
        bar.update(task, completed=final.samples_acked)
    console.print(
        f"sent {final.samples_acked:,} samples in {final.messages_acked:,} messages "
        f"({final.samples_per_s:,.0f} samples/s)"
    )


def _parse_time(text: str | None) -> int | None:
    if text is None:
        return None
    from filopy.rest.promql import parse_time

    return parse_time(text, "time")


@app.command()
@_clean_errors
def query(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    promql: Annotated[str, typer.Argument(help="A PromQL expression.")],
    at: Annotated[
        str | None, typer.Option("--time", help="Evaluation time (unix s or RFC 3339); now.")
    ] = None,
    start: Annotated[str | None, typer.Option(help="Range start (unix s or RFC 3339).")] = None,
    end: Annotated[str | None, typer.Option(help="Range query end; default now.")] = None,
    step: Annotated[str, typer.Option(help="Range query step (e.g. 15s, 1m).")] = "1m",
    spread: Annotated[int | None, typer.Option(help="Override the dataset's spread.")] = None,
    partial: Annotated[
        bool, typer.Option(help="Answer without unavailable shards (with a warning).")
    ] = False,
    explain: Annotated[bool, typer.Option(help="Print the plan instead of running it.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Prometheus API JSON.")] = False,
    address: RayAddress = "auto",
    url: RestUrl = None,
    token: ApiToken = None,
) -> None:
    """Run a PromQL query: instant by default, a range query with --start."""
    import time as _time

    from rich.table import Table

    from filopy.rest.promql import parse_duration, result_json

    end_ms = _parse_time(end) or int(_time.time() * 1000)
    footer = ""
    if url is not None:
        from filopy.cli.rest_client import RestClient

        if explain:
            raise typer.BadParameter("--explain needs --address (the REST API has no plans)")
        # The API takes the same unix seconds or RFC 3339 times, and durations, as typed.
        times = {"time": at} if start is None else {"start": start, "end": end_ms / 1000,
                                                     "step": step}  # fmt: skip
        with RestClient(url, token) as rest:
            body = rest.query(dataset, promql, spread=spread,
                              partial_response=str(partial).lower(), **times)  # fmt: skip
        data, warnings = body["data"], body.get("warnings", [])
    else:
        client = _client(address)
        try:
            if explain:
                plan = client.queries().explain(dataset, promql, spread=spread)
                console.print_json(json.dumps(plan))
                return
            options = {"spread": spread, "partial": partial}
            if start is not None:
                step_ms = parse_duration(step, "step")
                res = client.query_range(
                    dataset, promql, _parse_time(start), end_ms, step_ms, **options
                )
            else:
                res = client.query(dataset, promql, _parse_time(at), **options)
        finally:
            client.queries().close()  # stop following the shard map (unsubscribe)
        data, warnings = result_json(res.value), res.warnings
        footer = (
            f"; {res.samples_scanned:,} samples scanned on {len(res.shards)} shards of "
            f"{len(res.nodes)} nodes"
        )
    for w in warnings:
        err.print(f"[yellow]warning:[/] {w}")
    if as_json:
        console.print_json(json.dumps({"status": "success", "data": data}))
        return
    if data["resultType"] in ("scalar", "string"):
        console.print(data["result"][1])
        return
    table = Table(show_header=True)
    table.add_column("series")
    table.add_column("value" if data["resultType"] == "vector" else "values", justify="right")
    for r in data["result"]:
        labels = r["metric"]
        name = labels.get("__name__", "")
        rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
        series = f"{name}{{{rest}}}" if rest or not name else name
        if "value" in r:
            table.add_row(series, r["value"][1])
        else:
            points = r["values"]
            shown = ", ".join(v for _, v in points[-3:])
            table.add_row(series, f"{len(points)} points, last: {shown}")
    console.print(table)
    console.print(f"[dim]{len(data['result'])} series{footer}[/]")


@series_app.command("delete")
@_clean_errors
def series_delete(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    selectors: Annotated[
        list[str],
        typer.Argument(help="Series selectors, as Prometheus' match[]: 'up{job=\"api\"}'."),
    ],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    address: RayAddress = "auto",
    url: RestUrl = None,
    token: ApiToken = None,
) -> None:
    """Delete every series a selector matches, whole, from every shard's memory and the store
    (docs/lifecycle.md, "Deleting series"). It cannot be undone; samples written later with
    the same labels make a new series."""
    from filopy.rest.promql import parse_matchers

    parsed = [parse_matchers(s) for s in selectors]  # a bad selector fails before anything
    if any(not p for p in parsed):
        raise typer.BadParameter("a selector needs at least one matcher")
    if not yes:
        typer.confirm(
            f"Delete every series of {dataset} matching {' or '.join(selectors)}, from memory "
            "and the store? This cannot be undone",
            abort=True,
        )
    if url is not None:
        from filopy.cli.rest_client import RestClient

        with RestClient(url, token) as rest:
            rest.delete_series(dataset, selectors)
        console.print(f"{dataset}: deleted the series matching {' or '.join(selectors)}")
        return
    info = _client(address).delete_series(dataset, parsed)
    unowned = info["shards"] - info["by_nodes"]
    where = f", {unowned} of them run by no node: from the store" if unowned else ""
    console.print(f"{dataset}: deleted {info['series']:,} series ({info['shards']} shards{where})")


@shards_app.command("stop")
@_clean_errors
def shards_stop(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    shards: Annotated[list[int], typer.Argument(help="Shard numbers.")],
    address: RayAddress = "auto",
) -> None:
    """Stop ingesting shards; they stay unowned until started again or reassigned."""
    reply = _client(address).stop_shards(dataset, shards)
    console.print(f"stopped shards {list(reply.shards)} of {dataset}")


@shards_app.command("start")
@_clean_errors
def shards_start(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    node: Annotated[str, typer.Argument(help="Node name or id (see `filopy status`).")],
    shards: Annotated[list[int], typer.Argument(help="Shard numbers.")],
    address: RayAddress = "auto",
) -> None:
    """Start shards on a chosen node (stop them first if another node owns them)."""
    client = _client(address)
    reply = client.start_shards(dataset, client.node(node), shards)
    shown = _short(reply.node, client.node_names())
    console.print(f"started shards {list(reply.shards)} of {dataset} on {shown}")


def _short(node: str, names: dict[str, str] | None = None) -> str:
    """A node as people read it: its name, else (a node that left) the start of its id."""
    if names and node in names:
        return names[node]
    return node if len(node) <= 14 else node[:12] + ".."


def _print_moves(
    moves: list[tuple[int, str, str]], before: dict, after: dict, names: dict[str, str]
) -> None:
    from rich.table import Table

    if moves:
        table = Table("shard", "from", "to", title=f"{len(moves)} moves (each drains first)")
        for shard, source, target in moves:
            table.add_row(str(shard), _short(source, names), _short(target, names))
        console.print(table)
    else:
        console.print("no moves")
    if before or after:
        table = Table("node", "shards now", "shards after")
        for node in sorted(set(before) | set(after)):
            shown = _short(node, names)
            table.add_row(shown, f"{before.get(node, 0):g}", f"{after.get(node, 0):g}")
        console.print(table)


@app.command()
@_clean_errors
def plan(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    add_nodes: Annotated[int, typer.Option(min=0, help="What if this many nodes joined.")] = 0,
    remove_node: Annotated[
        list[str] | None,
        typer.Option(help="What if this node left (name, id or id prefix); repeatable."),
    ] = None,
    drain_node: Annotated[
        list[str] | None, typer.Option(help="What if this node were drained; repeatable.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    address: RayAddress = "auto",
) -> None:
    """Show what rebalancing would do, now or after nodes join, leave or are drained; applies
    nothing. See docs/operations.md."""
    client = _client(address)
    result = client.plan(
        dataset,
        add_nodes=add_nodes,
        remove_nodes=remove_node or [],
        drain_nodes=drain_node or [],
    )
    moves = [(m.shard, m.source, m.target) for m in result.moves]
    if as_json:
        body = {
            "moves": [{"shard": s, "source": a, "target": b} for s, a, b in moves],
            "shards_before": result.load_before,
            "shards_after": result.load_after,
            "unowned_after": sum(1 for o in result.owners if o is None),
            "held_back": result.held_back,
        }
        console.print_json(json.dumps(body))
        return
    _print_moves(moves, dict(result.load_before), dict(result.load_after), client.node_names())
    unowned = sum(1 for o in result.owners if o is None)
    if unowned:
        console.print(f"{unowned} shards would have no owner (over every node's capacity)")


@app.command()
@_clean_errors
def rebalance(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    apply: Annotated[bool, typer.Option("--apply", help="Start the moves now.")] = False,
    address: RayAddress = "auto",
) -> None:
    """Show the next rebalance round's moves (as the throttle allows), or with --apply start
    them now. Each move drains the old owner first; watch them with `filopy watch`."""
    client = _client(address)
    if not apply:
        result = client.plan(dataset, throttled=True)
        _print_moves(
            [(m.shard, m.source, m.target) for m in result.moves],
            dict(result.load_before),
            dict(result.load_after),
            client.node_names(),
        )
        console.print(f"({result.held_back}; --apply starts these moves)")
        return
    done = client.rebalance(dataset)
    _print_moves([(s, a, b) for _, s, a, b in done.moves], {}, {}, client.node_names())
    for _, why in done.held_back:
        console.print(f"({why})")


@app.command()
@_clean_errors
def history(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    shard: Annotated[int | None, typer.Option(min=0, help="Only this shard.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    address: RayAddress = "auto",
) -> None:
    """Who owned which shard when, and why (joined, failed, rebalance, drain, operator, ...),
    with the new owner's epoch and the offsets it replayed."""
    import datetime as dt

    from rich.table import Table

    client = _client(address)
    changes = client.history(dataset, shard, limit)
    if as_json:
        console.print_json(json.dumps([_row(c) for c in changes]))
        return
    table = Table("time (UTC)", "shard", "from", "to", "reason", "epoch", "replayed")
    names = client.node_names()  # members' names; a node that left shows by its id
    for c in changes:
        at = dt.datetime.fromtimestamp(c.at_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(
            at,
            str(c.shard),
            _short(c.from_node, names) if c.from_node else "-",
            _short(c.to_node, names) if c.to_node else "-",
            c.reason,
            "-" if c.epoch is None else str(c.epoch),
            "-" if c.replayed_offsets is None else str(c.replayed_offsets),
        )
    console.print(table)


def _row(change: Any) -> dict[str, Any]:
    fields = ("shard", "at_ms", "from_node", "to_node", "reason", "epoch", "replayed_offsets")
    return {f: getattr(change, f) for f in fields}


@app.command()
@_clean_errors
def drain(
    node: Annotated[str, typer.Argument(help="Node name, id, or a unique prefix of an id.")],
    cancel: Annotated[bool, typer.Option("--cancel", help="Stop draining the node.")] = False,
    address: RayAddress = "auto",
) -> None:
    """Move every shard off a node for maintenance, a few at a time, each through a handoff
    (no replay, queries answered throughout); it gets no new shards until it leaves."""
    client = _client(address)
    full = client.node(node)
    done = client.drain_node(full, cancel=cancel)
    if cancel:
        console.print(f"stopped draining {full} (moves in flight finish)")
        return
    _print_moves([(s, a, b) for _, s, a, b in done.moves], {}, {}, client.node_names())
    console.print(f"draining {full}: the other shards follow as moves finish")


if __name__ == "__main__":
    app()


# ----- tokens ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _token_book() -> Iterator[Any]:
    """The tokens of the store the settings name (the same store the servers read)."""
    from core.config import load_settings
    from filopy.auth import TokenBook
    from store import open_stores

    settings = load_settings()
    meta, columns = open_stores(settings)
    columns.close()
    try:
        yield TokenBook(meta)
    finally:
        meta.close()


@token_app.command("create")
@_clean_errors
def token_create(
    name: Annotated[str, typer.Argument(help="Who or what uses it (e.g. grafana, vmagent-eu).")],
    scope: Annotated[
        list[str],
        typer.Option("--scope", "-s", help="read, write or admin; repeat for several."),
    ],
    dataset: Annotated[
        list[str] | None,
        typer.Option("--dataset", "-d", help="Only this dataset (repeat); default: all."),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            help="The token's tenant: the _ws_ of all it writes; its queries count against "
            "that tenant's query limits."
        ),
    ] = None,
) -> None:
    """Make a token and print it (on stdout, alone: `TOKEN=$(filopy token create ...)`). It is
    shown this once; the store keeps only its hash."""
    with _token_book() as book:
        token, text = book.create(name, scope, dataset or (), tenant)
    err.print(f"token {token.name!r} (id {token.id}, scopes {sorted(token.scopes)}) created")
    print(text)


@token_app.command("list")
@_clean_errors
def token_list() -> None:
    """Every token: id, name, scopes, limits, when made and revoked (never the secrets)."""
    from rich.table import Table

    with _token_book() as book:
        tokens = book.list()
    table = Table("id", "name", "scopes", "datasets", "tenant", "created", "revoked")
    for t in tokens:
        table.add_row(
            t.id,
            t.name,
            ",".join(sorted(t.scopes)),
            ",".join(t.datasets) or "all",
            t.tenant or "-",
            _ms_text(t.created_ms),
            _ms_text(t.revoked_ms) if t.revoked_ms is not None else "-",
        )
    console.print(table)


@token_app.command("revoke")
@_clean_errors
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (the hex after fpy_).")],
) -> None:
    """Revoke a token: every server refuses it within auth.refresh_s."""
    with _token_book() as book:
        token = book.revoke(token_id.removeprefix("fpy_").split("_")[0])
    console.print(f"token {token.name!r} (id {token.id}) revoked")


def _ms_text(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")

"""The `filopy` command line. Errors are one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

app = typer.Typer(
    name="filopy",
    help="FiloPy: a FiloDB-style time-series ingestion cluster on Kafka, Ray and Cassandra.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
dataset_app = typer.Typer(help="Datasets: list and show.", no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")

console = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

RayAddress = Annotated[
    str, typer.Option("--address", "-a", help="Ray cluster address of a running FiloPy cluster.")
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
            message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            err.print(f"[bold red]error:[/] {message}")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _client(address: str) -> Any:
    from filopy.client import connect

    return connect(address)


@app.command()
@_clean_errors
def demo(
    quick: Annotated[bool, typer.Option(help="A smaller, faster run (used by CI).")] = False,
) -> None:
    """Run the main job: a local cluster ingesting, losing a node, recovering, reading back."""
    from filopy.demo import run_demo

    if not run_demo(quick=quick, console=console):
        raise typer.Exit(1)


@app.command()
@_clean_errors
def status(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    address: RayAddress = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """The shard grid of a dataset, with a legend and the shards of each node."""
    mapper = _client(address).shard_map(dataset)
    if as_json:
        shards = [
            {"shard": s, "status": str(mapper.status(s)), "address": mapper.owner(s) or ""}
            for s in range(mapper.num_shards)
        ]
        console.print_json(json.dumps({"dataset": dataset, "shards": shards}))
        return
    console.print(mapper.render())


@app.command()
@_clean_errors
def watch(
    dataset: Annotated[str, typer.Argument(help="Dataset name.")],
    address: RayAddress = "auto",
) -> None:
    """Print the current snapshot, then every shard event as it happens (Ctrl-C to stop)."""
    from filopy.shard_status import CurrentShardSnapshot

    with _client(address).subscribe(dataset) as updates:
        for update in updates:
            if isinstance(update, CurrentShardSnapshot):
                from filopy.mapper import ShardMapper

                console.print(ShardMapper.from_state(update.state).render())
            else:
                console.print(f"shard {update.shard:>4}  {type(update).__name__}  {update.node}")


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
    """A dataset's full definition, as JSON."""
    for ds in _client(address).datasets():
        if ds.name == name:
            console.print_json(ds.model_dump_json())
            return
    raise typer.BadParameter(f"unknown dataset {name!r}")


if __name__ == "__main__":
    app()

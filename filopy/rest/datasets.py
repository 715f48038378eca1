"""Datasets: SetupDataset, list, get, remove, retention (docs/rest.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response
from pydantic import BaseModel, Field

from core.dataset import Dataset
from core.errors import Invalid
from filopy.rest.deps import ClusterDep, DatasetName, errors
from filopy.rest.errors import BAD_DATA, ApiError
from filopy.rest.models import DatasetRemovedData, Success
from filopy.rest.promql import parse_duration

router = APIRouter(tags=["datasets"])


@router.post(
    "/api/v1/datasets",
    status_code=201,
    response_model=Success[Dataset],
    responses={
        200: {"model": Success[Dataset], "description": "The same definition existed."},
        **errors(400, 409, 503),
    },
)
async def setup_dataset(
    dataset: Annotated[Dataset, Body()],
    response: Response,
    cluster: ClusterDep,
    retention: Annotated[
        str | None,
        Query(
            description='Keep raw data this long ("30d"; "0": forever); default: the '
            "cluster's `store.retention_days`. Changeable later: PUT .../retention."
        ),
    ] = None,
) -> Any:
    """SetupDataset: register a dataset and assign its shards.

    201 when created; 200 when the identical definition already exists; 409 when a dataset
    of that name exists with another definition, or its Kafka topic has another partition
    count. With `ingest.source = "kafka"` the topic is created here. A definition without
    `source.bootstrap_servers` gets the cluster's `kafka.bootstrap_servers`.
    """
    try:
        retention_ms = parse_retention(retention)
    except Invalid as e:
        raise ApiError(400, BAD_DATA, str(e)) from None
    dataset = dataset.with_cluster_kafka(cluster.settings.kafka.bootstrap_servers)
    # One singleton call: a conflicting definition or topic comes back as its own error.
    created = await cluster.call(cluster.client.setup_dataset, dataset)
    if retention is not None:
        await cluster.call(cluster.client.set_retention, dataset.name, retention_ms)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/api/v1/datasets/{dataset.name}"
    return Success(data=dataset)


@router.get("/api/v1/datasets", response_model=Success[list[Dataset]], responses=errors(503))
async def list_datasets(cluster: ClusterDep) -> Any:
    """Every dataset definition, by name."""
    datasets = await cluster.call(cluster.client.datasets)
    return Success(data=sorted(datasets, key=lambda d: d.name))


@router.get(
    "/api/v1/datasets/{ds}", response_model=Success[Dataset], responses=errors(400, 404, 503)
)
async def get_dataset(ds: DatasetName, cluster: ClusterDep) -> Any:
    """One dataset's definition."""
    return Success(data=await cluster.dataset(ds))


@router.delete(
    "/api/v1/datasets/{ds}",
    response_model=Success[DatasetRemovedData],
    responses=errors(400, 404, 503),
)
async def remove_dataset(ds: DatasetName, cluster: ClusterDep) -> Any:
    """Stop ingesting the dataset and forget its definition (stored data stays)."""
    await cluster.call(cluster.client.remove_dataset, ds)
    return Success(data=DatasetRemovedData(name=ds))


class DatasetStorage(BaseModel):
    """A dataset's retention and what its raw chunks take in the store."""

    retention_ms: int = Field(description="The retention in force, in ms; 0 keeps forever.")
    own_retention_ms: int | None = Field(
        description="The dataset's own retention; null: it has the cluster default."
    )
    default_retention_ms: int = Field(description="The cluster's `store.retention_days`, in ms.")
    max_bytes: int | None = Field(
        description="The dataset's size limit (SQLite): the oldest buckets are dropped first "
        "to stay under it; null: none."
    )
    bytes: int = Field(description="Encoded chunk bytes stored, counted at write.")
    chunks: int
    buckets: list[list[int]] = Field(
        description="[bucket start ms, bytes] per time bucket (SQLite) or day (Cassandra)."
    )
    sweep: dict[str, Any] = Field(
        description="The retention sweeps since the singleton started: runs, errors, "
        "buckets_dropped, bytes_freed, part_keys_deleted, last_ms, last_error."
    )
    downsampled: dict[int, dict[str, int]] = Field(
        default_factory=dict,
        description="Per downsampled resolution (ms): its stored `bytes` and `retention_ms`.",
    )


class RetentionBody(BaseModel):
    """What to change: only the fields given (at least one)."""

    retention: str | None = Field(
        default=None,
        description='A duration ("30d", "12h", "90m", or seconds); "0" keeps forever; null '
        "returns the dataset to the cluster default.",
    )
    max_bytes: int | None = Field(
        default=None,
        gt=0,
        description="A size limit in bytes (SQLite; Cassandra answers 501); null removes it.",
    )


def parse_retention(text: str | None) -> int | None:
    """A retention as the store takes it (ms, 0: forever); Prometheus durations plus `d`/`w`/`y`,
    as operators write them. Bad input is a 400, never a 500."""
    if text is None:
        return None
    try:
        ms = parse_duration(text.strip(), "retention")
    except ApiError as e:
        raise Invalid(str(e)) from None
    if ms < 0:
        raise Invalid(f"a retention cannot be negative, got {text!r}")
    return ms


@router.get(
    "/api/v1/datasets/{ds}/retention",
    response_model=Success[DatasetStorage],
    responses=errors(400, 404, 503),
)
async def get_retention(ds: DatasetName, cluster: ClusterDep) -> Any:
    """The dataset's retention, bytes stored and retention sweeps."""
    return Success(data=await cluster.call(cluster.client.storage, ds))


@router.put(
    "/api/v1/datasets/{ds}/retention",
    response_model=Success[DatasetStorage],
    responses=errors(400, 404, 501, 503),
)
async def set_retention(
    ds: DatasetName, body: Annotated[RetentionBody, Body()], cluster: ClusterDep
) -> Any:
    """Change a live dataset's retention or size limit (the fields given): reads stop answering
    older data at once; the space is freed by the sweep that follows (SQLite) or by TTLs
    (Cassandra; docs/storage.md)."""
    given = body.model_fields_set
    if not given:
        raise ApiError(400, BAD_DATA, 'give "retention", "max_bytes" or both')
    if "retention" in given:
        try:
            retention_ms = parse_retention(body.retention)
        except Invalid as e:
            raise ApiError(400, BAD_DATA, str(e)) from None
        await cluster.call(cluster.client.set_retention, ds, retention_ms)
    if "max_bytes" in given:
        await cluster.call(cluster.client.set_size_limit, ds, body.max_bytes)
    return Success(data=await cluster.call(cluster.client.storage, ds))

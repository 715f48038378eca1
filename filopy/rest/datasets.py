"""Datasets: SetupDataset, list, get, remove (docs/rest.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from core.dataset import Dataset
from filopy.rest.deps import ClusterDep, DatasetName, errors
from filopy.rest.models import DatasetRemovedData, Success

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
    dataset: Annotated[Dataset, Body()], response: Response, cluster: ClusterDep
) -> Any:
    """SetupDataset: register a dataset and assign its shards.

    201 when created; 200 when the identical definition already exists; 409 when a dataset
    of that name exists with another definition, or its Kafka topic has another partition
    count. With `ingest.source = "kafka"` the topic is created here. A definition without
    `source.bootstrap_servers` gets the cluster's `kafka.bootstrap_servers`.
    """
    dataset = dataset.with_cluster_kafka(cluster.settings.kafka.bootstrap_servers)
    # One singleton call: a conflicting definition or topic comes back as its own error.
    created = await cluster.call(cluster.client.setup_dataset, dataset)
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

"""What the REST routers share: the cluster they call, reached through FastAPI's dependency
injection from `app.state` (set once by `create_app`), so the routers are plain modules rather
than closures over a client."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
from fastapi import Depends, Path, Request

from core.config import Settings
from core.dataset import _NAME_RE, Dataset
from filopy.rest.errors import NOT_FOUND, ApiError, api_error
from filopy.rest.models import ErrorBody

if TYPE_CHECKING:
    from coordinator.client import FiloPyClient

R = TypeVar("R")

DatasetName = Annotated[
    str,
    Path(
        pattern=_NAME_RE.pattern,
        description="Dataset name: a letter, then up to 127 letters, digits, '_' or '-'.",
    ),
]


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of error answers: each the error envelope."""
    return {code: {"model": ErrorBody} for code in codes}


@dataclass(frozen=True, slots=True)
class Cluster:
    """The cluster a REST server talks to, and its settings."""

    client: FiloPyClient
    settings: Settings

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        """Run a blocking client call on a worker thread (the event loop stays free for the SSE
        streams); its failures become API errors."""
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except Exception as e:
            raise api_error(e, self.client.timeout_s) from None

    async def dataset(self, name: str) -> Dataset:
        """The definition of dataset `name`, or 404."""
        for d in await self.call(self.client.datasets):
            if d.name == name:
                return d
        raise ApiError(404, NOT_FOUND, f"unknown dataset {name!r}")


async def _cluster(request: Request) -> Cluster:
    # async: a plain `def` dependency would be run on a worker thread
    cluster: Cluster = request.app.state.cluster
    return cluster


ClusterDep = Annotated[Cluster, Depends(_cluster)]

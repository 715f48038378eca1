"""The command line's view of a cluster through its REST API (`--url`), for machines without a
Ray node: an operator's laptop, a client host that reaches only the head's HTTP port.

`filopy status` and `filopy query` take `--url http://head:8080` (or `FILOPY_URL`) instead of
joining the Ray cluster as a driver; they then read the same REST endpoints the console and
Prometheus clients use, and print exactly what they print over Ray. An HTTP error becomes the
error of the category the API answered with (404 `NotFound`, 503 `Unavailable`, ...: the inverse
of `filopy.rest.errors.ANSWERS`) carrying the API's own message, never a traceback.
"""

from __future__ import annotations

from typing import Any

import httpx

from core.errors import FiloPyError, Invalid, Unavailable
from core.local_state import admin_token
from core.mapper import ShardMapper
from core.shard_status import ShardMapState, ShardStatus
from filopy.rest.errors import ANSWERS

TIMEOUT_S = 120.0  # above the query deadline: the server says when a query took too long
CATEGORY_OF_STATUS = {status: category for category, (status, _) in ANSWERS.items()
                      if category is not FiloPyError}  # fmt: skip


def _error(status: int, message: str) -> FiloPyError:
    """The error the API's answer stands for: its category by status (another 5xx, e.g. a proxy's
    502, is Unavailable; another 4xx Invalid)."""
    category = CATEGORY_OF_STATUS.get(status) or (Unavailable if status >= 500 else Invalid)
    return category(f"HTTP {status}: {message}")


class RestClient:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`token`: sent as a bearer token; default, the admin token `filopy up` keeps in the
        state directory (if any)."""
        token = token or admin_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=url.rstrip("/"), timeout=TIMEOUT_S, transport=transport, headers=headers
        )

    def __enter__(self) -> RestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def _call(
        self, path: str, params: dict[str, Any] | None = None, method: str = "GET"
    ) -> dict[str, Any]:
        """The JSON body of `method` `path` ({} for a 204); the API's error (its message)
        otherwise."""
        try:
            r = self._http.request(method, path, params=params)
        except httpx.HTTPError as e:
            where = f"{self._http.base_url}{path}"
            raise Unavailable(f"{where}: {e or type(e).__name__}") from None
        if r.status_code == 204:
            return {}
        try:
            body = r.json()
        except ValueError:
            body = None
        if r.is_error or not isinstance(body, dict):
            detail = body.get("error") if isinstance(body, dict) else None
            raise _error(r.status_code, detail or r.text[:200] or r.reason_phrase)
        return body

    def shard_map(self, dataset: str) -> ShardMapper:
        """The dataset's shard map as the singleton has it (version not carried over REST)."""
        shards = sorted(self._call(f"/api/v1/cluster/{dataset}/status")["data"],
                        key=lambda s: s["shard"])  # fmt: skip
        state = ShardMapState(
            num_shards=len(shards),
            owners=tuple(s["address"] or None for s in shards),
            statuses=tuple(ShardStatus.parse(s["status"]) for s in shards),
            version=0,
        )
        return ShardMapper.from_state(state)

    def nodes(self) -> tuple[dict[str, str], dict[str, str]]:
        """(member id -> name, refused id -> why)."""
        data = self._call("/api/v1/nodes")["data"]
        return {m["address"]: m["name"] for m in data["members"]}, dict(data["refused"])

    def query(self, dataset: str, promql: str, **params: Any) -> dict[str, Any]:
        """The Prometheus API body of an instant query (`time`) or, with `start`, a range query
        (`end`, `step`); `partial_response`, `spread` as the API takes them."""
        kind = "query_range" if "start" in params else "query"
        given = {k: v for k, v in params.items() if v is not None}
        return self._call(f"/promql/{dataset}/api/v1/{kind}", {"query": promql, **given})

    def delete_series(self, dataset: str, selectors: list[str]) -> None:
        """Prometheus' delete_series: every series any selector matches, whole."""
        self._call(
            f"/promql/{dataset}/api/v1/admin/tsdb/delete_series",
            {"match[]": selectors},
            method="POST",
        )

"""The command line's REST client (`filopy status|query --url`) against httpx's MockTransport:
the shard map rebuilt from the status endpoint, names and refusals from the nodes endpoint,
queries sent as the Prometheus API takes them, and every failure the error of its category with
the API's message."""

from __future__ import annotations

import httpx
import pytest

from core.errors import NotFound, Unavailable
from core.shard_status import Active, Degraded, Down, Recovery
from filopy.cli.rest_client import RestClient

STATUS = [
    {"shard": 1, "status": "Recovery(40)", "address": "n2", "node": "beta"},
    {"shard": 0, "status": "Active", "address": "n1", "node": "alpha"},
    {"shard": 2, "status": "Degraded(Kafka unreachable for 5 s)", "address": "n1", "node": "alpha"},
    {"shard": 3, "status": "Down", "address": "", "node": ""},
]


def handler(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path == "/api/v1/cluster/ds/status":
        return httpx.Response(200, json={"status": "success", "data": STATUS})
    if path == "/api/v1/nodes":
        members = [{"address": "n1", "name": "alpha", "version": ""},
                   {"address": "n2", "name": "beta", "version": ""}]  # fmt: skip
        data = {"members": members, "refused": {"n3": "name taken"}}
        return httpx.Response(200, json={"status": "success", "data": data})
    if path.startswith("/promql/ds/api/v1/"):
        echo = {"path": path, "params": dict(request.url.params)}
        return httpx.Response(200, json={"status": "success", "data": echo, "warnings": ["w"]})
    return httpx.Response(
        404, json={"status": "error", "errorType": "not_found", "error": "unknown dataset 'x'"}
    )


def client() -> RestClient:
    return RestClient("http://head:8080/", transport=httpx.MockTransport(handler))


def test_the_shard_map_is_rebuilt_from_the_status_endpoint() -> None:
    with client() as rest:
        m = rest.shard_map("ds")
        names, refused = rest.nodes()
    assert m.num_shards == 4
    assert [m.owner(s) for s in range(4)] == ["n1", "n2", "n1", None]
    assert list(m.statuses) == [
        Active(), Recovery(40), Degraded("Kafka unreachable for 5 s"), Down(),
    ]  # fmt: skip
    assert m.shards_for_node("n1") == [0, 2]
    assert names == {"n1": "alpha", "n2": "beta"} and refused == {"n3": "name taken"}


def test_queries_go_to_the_prometheus_api_with_their_parameters() -> None:
    with client() as rest:
        instant = rest.query("ds", "up", time="1700000000", spread=None, partial_response="false")
        ranged = rest.query("ds", "up", start="1", end=2.0, step="1m", spread=2)
    assert instant["data"]["path"] == "/promql/ds/api/v1/query"
    assert instant["data"]["params"] == {"query": "up", "time": "1700000000",
                                         "partial_response": "false"}  # fmt: skip
    assert ranged["data"]["path"] == "/promql/ds/api/v1/query_range"
    assert ranged["data"]["params"] == {"query": "up", "start": "1", "end": "2.0", "step": "1m",
                                        "spread": "2"}  # fmt: skip
    assert instant["warnings"] == ["w"]


def test_an_api_error_is_its_message() -> None:
    with client() as rest, pytest.raises(NotFound, match="HTTP 404: unknown dataset 'x'"):
        rest.shard_map("x")


def test_an_unreachable_server_or_a_non_json_answer_is_one_line() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    refusing = httpx.MockTransport(refuse)
    with (
        RestClient("http://head:8080", transport=refusing) as rest,
        pytest.raises(Unavailable, match="refused"),
    ):
        rest.nodes()
    html = httpx.MockTransport(lambda r: httpx.Response(502, text="<html>bad gateway</html>"))
    with (
        RestClient("http://head:8080", transport=html) as rest,
        pytest.raises(Unavailable, match="HTTP 502: <html>bad gateway"),
    ):
        rest.nodes()

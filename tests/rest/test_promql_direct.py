"""`query` and `query_range` called directly (`filopy.rest.promql_queries.DirectQueries`, as
`filopy serve` answers them) answer exactly as through FastAPI's routing: every status, body and
content type, good requests and bad ones, GET and POST, both URL forms; other endpoints and
methods still reach the routes. The query service is a real one over fake nodes
(tests/query/test_service_fanout.py), so no cluster is needed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from filopy.rest.app import serve_promql
from filopy.rest.errors import install_handlers
from filopy.rest.promql_queries import DirectQueries
from query.service import QueryService
from tests.query.test_service_fanout import DS, NODES, FakeMaps, FakeNodes, T, active_map
from tests.rest.conftest import ServerThread


class FakeClient:
    timeout_s = 5.0

    def datasets(self) -> list[Any]:
        return [DS]


def _app(direct: bool) -> FastAPI:
    app = FastAPI()
    install_handlers(app, 5.0)
    service = QueryService(FakeMaps(active_map().snapshot()), FakeNodes(NODES))
    serve_promql(app, FakeClient(), service)  # type: ignore[arg-type]
    if not direct:  # the reference: FastAPI's routes alone
        app.user_middleware = [m for m in app.user_middleware if m.cls is not DirectQueries]
    return app


END = (T + 500_000) / 1000
RANGE = {"start": str(END - 300), "end": str(END), "step": "15"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
CASES: list[tuple[str, str, dict[str, str], dict[str, str] | None]] = [
    # (method, path, query string, form body or None)
    ("GET", "/api/v1/query", {"query": "sum(a)", "time": str(END)}, None),
    ("GET", "/api/v1/query", {"query": "a", "time": str(END), "dataset": DS.name}, None),
    ("POST", "/api/v1/query", {}, {"query": "sum by (instance) (rate(a[5m]))", "time": str(END)}),
    ("POST", f"/promql/{DS.name}/api/v1/query", {"time": "1"}, {"query": "a", "time": str(END)}),
    ("GET", f"/promql/{DS.name}/api/v1/query", {"query": "1+1", "time": str(END)}, None),
    ("GET", f"/promql/{DS.name}/api/v1/query_range", {"query": "sum(a)", **RANGE}, None),
    ("POST", "/api/v1/query_range", {}, {"query": "rate(b[1m])", **RANGE}),
    ("POST", f"/promql/{DS.name}/api/v1/query_range", {}, {"query": "a", **RANGE}),
    # bad requests: Prometheus' status and errorType, answered by the app's handler's rules
    ("GET", "/api/v1/query", {}, None),
    ("GET", "/api/v1/query", {"query": "sum(", "time": str(END)}, None),
    ("GET", "/api/v1/query", {"query": "a", "time": "yesterday"}, None),
    ("POST", "/api/v1/query_range", {}, {"query": "a", **RANGE, "step": "0"}),
    ("POST", "/api/v1/query_range", {}, {"query": "a", **RANGE, "end": "0"}),
    ("GET", "/api/v1/query", {"query": "a", "spread": "x"}, None),
    ("GET", "/promql/nosuch/api/v1/query", {"query": "a"}, None),
    ("GET", "/api/v1/query", {"query": "a", "lookback_delta": "-1s"}, None),
    # not the direct endpoints: routed as before
    ("GET", f"/promql/{DS.name}/api/v1/labels", {}, None),
    ("PUT", "/api/v1/query", {"query": "a"}, None),
    ("GET", "/api/v1/query/more", {"query": "a"}, None),
]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    """The routed app and the direct one, each served by uvicorn: (routed URL, direct URL)."""
    with ServerThread(_app(direct=False)) as routed, ServerThread(_app(direct=True)) as direct:
        yield routed, direct


@pytest.mark.parametrize(("method", "path", "query", "form"), CASES)
def test_direct_answers_equal_the_routed_ones(
    servers: tuple[str, str],
    method: str,
    path: str,
    query: dict[str, str],
    form: dict[str, str] | None,
) -> None:
    answers = []
    for url in servers:
        with httpx.Client(base_url=url) as http:
            resp = http.request(method, path, params=query, data=form)
            answers.append((resp.status_code, resp.headers["content-type"], resp.json()))
    assert answers[0] == answers[1]


def test_the_query_endpoints_skip_the_router_and_the_others_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    direct: list[str] = []
    call = DirectQueries.__call__

    async def spy(self: DirectQueries, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            direct.append(scope["path"])
        await call(self, scope, receive, send)

    monkeypatch.setattr(DirectQueries, "__call__", spy)
    routed: list[str] = []
    endpoint_of = APIRoute.handle

    async def handle(self: Any, scope: Any, receive: Any, send: Any) -> None:
        routed.append(scope["path"])
        await endpoint_of(self, scope, receive, send)

    monkeypatch.setattr(APIRoute, "handle", handle)
    with ServerThread(_app(direct=True)) as url, httpx.Client(base_url=url) as http:
        assert http.get("/api/v1/query", params={"query": "sum(a)"}).status_code == 200
        assert http.post(f"/promql/{DS.name}/api/v1/query_range", data={"query": "a", **RANGE})
        assert http.get("/api/v1/labels").status_code == 200
    assert direct == ["/api/v1/query", f"/promql/{DS.name}/api/v1/query_range", "/api/v1/labels"]
    assert routed == ["/api/v1/labels"]


def test_a_multipart_form_is_still_read(servers: tuple[str, str]) -> None:
    with httpx.Client(base_url=servers[1]) as http:
        form = {"query": "sum(a)", "time": str(END)}
        multipart = http.post("/api/v1/query", files={k: (None, v) for k, v in form.items()})
        urlencoded = http.post("/api/v1/query", data=form)
    assert multipart.status_code == 200, multipart.text
    assert multipart.json() == urlencoded.json()
    assert multipart.json()["data"]["result"]


@pytest.mark.parametrize(
    "body",
    [
        b"query=count+by+(instance)+(a)&time={t}",  # '+' is a space
        b"query=count%20by%20(instance)%20(a)&time=1&time={t}",  # the last value wins
        b"query=count+by+(instance)+({__name__=~%22a|%C3%A9%22})&time={t}",  # UTF-8 escapes
        b"query=count+by+(instance)+(a)&time={t}&spread=&lookback_delta=",  # blanks: unset
    ],
)
def test_a_urlencoded_body_reads_as_a_query_string_does(
    servers: tuple[str, str], body: bytes
) -> None:
    """The body is split as Starlette's form parser splits it (latin-1 bytes, then %-escapes
    as UTF-8, '+' as a space, blank values kept)."""
    body = body.replace(b"{t}", str(END).encode())
    with httpx.Client(base_url=servers[1]) as http:
        posted = http.post("/api/v1/query", content=body, headers=FORM)
        got = http.get("/api/v1/query", params={"query": "count by (instance) (a)", "time": END})
    assert posted.status_code == 200, posted.text
    assert posted.json() == got.json() and got.json()["data"]["result"]

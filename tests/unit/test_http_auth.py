"""The HTTP servers' access check (filopy/auth.py) on a small app: where each client puts its
credentials, 401 and 403 with their messages, revocation seen after the refresh, a dataset
limit, the principal handed on, auth disabled. Which scope each route of the real servers
needs is tests/rest/test_auth_matrix.py's, against docs/security.md's table."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.auth import Token, new_token
from filopy.auth import EVERYONE, Authenticate, TokenCache, principal_of, required


class AppClient:
    """Synchronous requests into the ASGI app (httpx's ASGITransport, a fresh loop each)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.cookies = httpx.Cookies()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://filopy", cookies=self.cookies
            ) as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(send())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", path, **kwargs)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Store:
    """The tokens a cache reads, counting the reads."""

    def __init__(self) -> None:
        self.tokens: list[Token] = []
        self.reads = 0
        self.gets = 0

    def load(self) -> list[Token]:
        self.reads += 1
        return list(self.tokens)

    def get(self, token_id: str) -> Token | None:
        self.gets += 1
        return next((t for t in self.tokens if t.id == token_id), None)

    def make(self, *scopes: str, **limits: Any) -> tuple[Token, str]:
        token, text = new_token("t", scopes, 1, **limits)
        self.tokens.append(token)
        return token, text


async def who(request: Request) -> JSONResponse:
    p = principal_of(request.scope)
    return JSONResponse({"token": p.token_id, "tenant": p.tenant})


ROUTES = [
    Route(path, who, methods=["GET", "POST", "DELETE"])
    for path in (
        "/__health",
        "/api/v1/datasets",
        "/api/v1/datasets/{ds}",
        "/api/v1/query",
        "/promql/{ds}/api/v1/query",
        "/ingest/{ds}/api/v1/write",
        "/ingest/{ds}/ping",
        "/ingest/{ds}/query",
        "/api/v1/tokens",
        "/metrics",
    )
]


@pytest.fixture
def world() -> tuple[AppClient, Store, Clock]:
    store, clock = Store(), Clock()
    app = Starlette(routes=ROUTES)
    cache = TokenCache(store.load, store.get, 5.0, clock)
    app.add_middleware(Authenticate, tokens=cache)
    return AppClient(app), store, clock


def bearer(text: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {text}"}


def test_scopes_follow_the_table() -> None:
    assert required("GET", "/__health") == (None, None)
    assert required("GET", "/ingest/x/ping") == (None, "x")
    assert required("POST", "/ingest/x/api/v1/write") == ("write", "x")
    assert required("POST", "/api/v1/query") == ("read", None)
    assert required("POST", "/promql/x/api/v1/query_range") == ("read", "x")
    assert required("GET", "/api/v1/cluster/x/status") == ("read", "x")
    assert required("POST", "/api/v1/cluster/x/stopshards") == ("admin", "x")
    assert required("DELETE", "/api/v1/datasets/x") == ("admin", "x")
    assert required("GET", "/api/v1/tokens") == ("admin", None)
    assert required("GET", "/metrics") == ("read", None)
    # Not in the table: closed (admin), so a new route is never open by mistake.
    assert required("POST", "/api/v1/something-new") == ("admin", None)
    assert required("PATCH", "/whatever") == ("admin", None)


def test_no_credentials_is_401_saying_what_to_send(world: Any) -> None:
    client, _, _ = world
    r = client.get("/api/v1/datasets")
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="filopy"'
    body = r.json()
    assert body["status"] == "error" and body["errorType"] == "unauthorized"
    assert "needs a token with scope 'read'" in body["error"]
    assert "Authorization: Bearer" in body["error"]


def test_open_paths_need_nothing(world: Any) -> None:
    client, _, _ = world
    assert client.get("/__health").status_code == 200
    assert client.get("/ingest/x/ping").status_code == 200
    # Even with garbage credentials: they are not looked at.
    assert client.get("/__health", headers=bearer("nonsense")).status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        "Bearer nonsense",
        "Bearer fpy_0123456789ab_short",
        "Basic !!!not-base64",
        "Digest username=x",
        "Bearer",
    ],
)
def test_malformed_credentials_are_401(world: Any, header: str) -> None:
    client, _, _ = world
    r = client.get("/api/v1/datasets", headers={"Authorization": header})
    assert r.status_code == 401, r.text
    assert r.json()["errorType"] == "unauthorized"


def test_each_client_style_of_credentials_is_accepted(world: Any) -> None:
    client, store, _ = world
    token, text = store.make("write")
    path = "/ingest/x/api/v1/write"
    basic_pw = base64.b64encode(f"agent:{text}".encode()).decode()
    basic_user = base64.b64encode(f"{text}:".encode()).decode()
    for headers, params in [
        (bearer(text), {}),  # Prometheus authorization, vmagent, OpenTelemetry
        ({"Authorization": f"Token {text}"}, {}),  # Influx 2.x clients
        ({"Authorization": f"Basic {basic_pw}"}, {}),  # Prometheus basic_auth: the password
        ({"Authorization": f"Basic {basic_user}"}, {}),  # or the user
        ({}, {"u": "agent", "p": text}),  # Influx 1.x
    ]:
        r = client.post(path, headers=headers, params=params)
        assert r.status_code == 200, (headers, params, r.text)
        assert r.json()["token"] == token.id
    # u/p only on the ingestion paths (Influx's), never in a query string elsewhere.
    assert client.get("/metrics", params={"p": text}).status_code == 401


def test_the_console_cookie_counts_for_reads_only(world: Any) -> None:
    client, store, _ = world
    _, text = store.make("admin")
    client.cookies.set("filopy_token", text)
    assert client.get("/api/v1/datasets").status_code == 200
    # A cross-site form cannot change the cluster with the browser's cookie.
    assert client.post("/api/v1/datasets").status_code == 401


def test_a_wrong_secret_is_401_and_never_echoed(world: Any) -> None:
    client, store, _ = world
    token, text = store.make("admin")
    forged = text[:-4] + ("AAAA" if not text.endswith("AAAA") else "BBBB")
    r = client.get("/api/v1/datasets", headers=bearer(forged))
    assert r.status_code == 401
    assert f"fpy_{token.id}" in r.json()["error"]
    assert forged.rsplit("_", 1)[1] not in r.text


def test_scopes_403_naming_what_is_needed(world: Any) -> None:
    client, store, _ = world
    _, read = store.make("read")
    _, write = store.make("write")
    _, admin = store.make("admin")
    r = client.post("/ingest/x/api/v1/write", headers=bearer(read))
    assert r.status_code == 403
    assert r.json()["errorType"] == "forbidden"
    assert "has scopes ['read']" in r.json()["error"] and "needs 'write'" in r.json()["error"]
    assert client.get("/api/v1/datasets", headers=bearer(write)).status_code == 403
    assert client.post("/api/v1/query", headers=bearer(read)).status_code == 200
    assert client.delete("/api/v1/datasets/x", headers=bearer(read)).status_code == 403
    assert client.get("/api/v1/tokens", headers=bearer(read)).status_code == 403
    # admin includes read and write
    for method, path in [("GET", "/api/v1/datasets"), ("POST", "/ingest/x/api/v1/write"),
                         ("DELETE", "/api/v1/datasets/x"), ("GET", "/api/v1/tokens")]:  # fmt: skip
        assert client.request(method, path, headers=bearer(admin)).status_code == 200


def test_a_dataset_limited_token_reaches_only_its_datasets(world: Any) -> None:
    client, store, _ = world
    _, text = store.make("read", "write", datasets=["mine"])
    assert client.post("/ingest/mine/api/v1/write", headers=bearer(text)).status_code == 200
    assert client.get("/promql/mine/api/v1/query", headers=bearer(text)).status_code == 200
    r = client.post("/ingest/other/api/v1/write", headers=bearer(text))
    assert r.status_code == 403 and "limited to datasets ['mine']" in r.json()["error"]
    # A path that names no dataset could reach any: refused, saying where to go instead.
    r = client.get("/api/v1/query", headers=bearer(text))
    assert r.status_code == 403 and "no dataset named" in r.json()["error"]


def test_the_principal_is_handed_on(world: Any) -> None:
    client, store, _ = world
    token, text = store.make("write", tenant="team-a")
    r = client.post("/ingest/x/api/v1/write", headers=bearer(text))
    assert r.json() == {"token": token.id, "tenant": "team-a"}


def test_a_revoked_token_is_refused_after_the_refresh(world: Any) -> None:
    client, store, clock = world
    token, text = store.make("read")
    assert client.get("/metrics", headers=bearer(text)).status_code == 200
    store.tokens = [
        Token(**{**{f: getattr(token, f) for f in token.__slots__}, "revoked_ms": 2})  # type: ignore[attr-defined]
    ]
    assert client.get("/metrics", headers=bearer(text)).status_code == 200  # cached, still fresh
    clock.now += 5.0
    r = client.get("/metrics", headers=bearer(text))
    assert r.status_code == 401 and "was revoked" in r.json()["error"]


def test_unknown_ids_are_looked_up_at_once_but_not_on_every_request(world: Any) -> None:
    client, store, clock = world
    garbage = bearer("fpy_0123456789ab_" + "a" * 43)
    assert client.get("/metrics", headers=garbage).status_code == 401
    reads, gets = store.reads, store.gets
    for _ in range(20):  # the same unknown id: asked for once a second at most
        client.get("/metrics", headers=garbage)
    assert (store.reads, store.gets) == (reads, gets)
    for i in range(50):  # many unknown ids: at most 10 lookups a second, no full read
        client.get("/metrics", headers=bearer(f"fpy_{i:012x}_" + "a" * 43))
    assert store.reads == reads and store.gets - gets <= 10
    # A token made a moment ago on another server is accepted at once, even now.
    clock.now += 1.0
    _, text = store.make("read")
    assert client.get("/metrics", headers=bearer(text)).status_code == 200
    assert store.reads == reads


def test_a_store_that_cannot_be_read_is_503_not_a_pass() -> None:
    def broken() -> list[Token]:
        raise OSError("store down")

    app = Starlette(routes=ROUTES)
    app.add_middleware(Authenticate, tokens=TokenCache(broken, lambda _: None, 5.0))
    r = AppClient(app).get("/metrics", headers=bearer("fpy_0123456789ab_" + "a" * 43))
    assert r.status_code == 503 and "store down" in r.json()["error"]


def test_auth_disabled_serves_everyone_as_admin() -> None:
    app = Starlette(routes=ROUTES)
    app.add_middleware(Authenticate, tokens=None)
    r = AppClient(app).delete("/api/v1/datasets/x")
    assert r.status_code == 200 and r.json()["token"] == EVERYONE.token_id

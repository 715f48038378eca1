"""Every route of both HTTP servers (the REST server and the gateway), with auth on as by
default, called with no token, a malformed header, a revoked token and a token of each scope:
each answer is what docs/security.md's table says (401 without valid credentials, 403 without
the scope, anything else with it; open routes always answered). The routes come from the apps
themselves and the scopes from the document, so a new route missing from the table fails here
rather than being open or closed by accident."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from starlette.routing import Mount

from core.dataset import Dataset
from filopy.auth import TokenBook
from filopy.ingest_http import create_gateway_app
from store import open_stores
from tests.cluster import cluster_settings
from tests.rest.conftest import Rest, ServerThread, start_rest

pytestmark = [pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
SECURITY = ROOT / "docs" / "security.md"
DATASET = "matrix"
# Path parameters: an existing dataset, except where the call would change it.
PARAMS = {"dataset": DATASET, "ds": DATASET, "name": "job", "node": "nosuch-node",
          "token_id": "000000000000", "path": "console.js"}  # fmt: skip
DESTRUCTIVE = {("DELETE", "/api/v1/datasets/{ds}")}  # called on a dataset that does not exist


def documented() -> dict[tuple[str, str], str]:
    """(method, path) -> scope ("open", "read", "write" or "admin"), from the table."""
    text = SECURITY.read_text()
    table = text[text.index("<!-- auth-table") : text.index("<!-- end auth-table")]
    rules: dict[tuple[str, str], str] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("method", "---"):
            continue
        methods, paths, scope = cells
        for method in methods.split(", "):
            for path in paths.split(", "):
                assert (method, path) not in rules, f"{method} {path} twice in the table"
                rules[(method, path)] = scope
    return rules


def routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path template) of every route of the app (HEAD only where GET is not)."""
    found = []
    for rc in iter_route_contexts(app.routes):
        if isinstance(rc.original_route, Mount):
            found.append(("GET", f"{rc.path}/{{path}}"))
            continue
        methods = set(getattr(rc, "methods", None) or ())
        if "GET" in methods:
            methods.discard("HEAD")
        found += [(m, rc.path) for m in sorted(methods)]
    return found


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The REST server and a gateway on one store with auth on, a dataset, and a token of
    each kind."""
    tmp = tmp_path_factory.mktemp("auth")
    base = cluster_settings(tmp)
    settings = base.model_copy(update={"auth": base.auth.model_copy(update={"enabled": True})})
    for rest in start_rest(tmp, nodes=2, settings=settings):
        rest.client.setup_dataset(Dataset(name=DATASET, num_shards=2, min_num_nodes=1))
        meta, columns = open_stores(settings)
        columns.close()
        book = TokenBook(meta)
        tokens = {scope: book.create(f"matrix-{scope}", [scope])[1] for scope in
                  ("read", "write", "admin")}  # fmt: skip
        revoked, tokens["revoked"] = book.create("matrix-revoked", ["admin"])
        book.revoke(revoked.id)
        gateway_app = create_gateway_app(settings)
        with ServerThread(gateway_app) as gateway_url:
            yield {"rest": rest, "gateway": (gateway_app, gateway_url), "tokens": tokens}
        meta.close()


def _call(url: str, method: str, path: str, headers: dict[str, str]) -> int:
    """The status of one call, with no body and no parameters; an event stream is closed as
    soon as its status is in."""
    with (
        httpx.Client(base_url=url, timeout=60) as http,
        http.stream(method, path, headers=headers) as response,
    ):
        return response.status_code


def _expect(scope: str, credential: str) -> str:
    if scope == "open":
        return "answered"
    if credential in ("none", "malformed", "revoked"):
        return "401"
    held = {"read": {"read"}, "write": {"write"}, "admin": {"read", "write", "admin"}}
    return "answered" if scope in held[credential] else "403"


def _matrix(app: FastAPI, url: str, tokens: dict[str, str]) -> list[str]:
    table = documented()
    missing = [f"{m} {p}" for m, p in routes(app) if (m, p) not in table]
    assert not missing, f"routes not in docs/security.md's table: {missing}"
    credentials = {
        "none": {},
        "malformed": {"Authorization": "Bearer not-a-token"},
        **{name: {"Authorization": f"Bearer {text}"} for name, text in tokens.items()},
    }
    wrong = []
    for method, template in routes(app):
        scope = table[(method, template)]
        params = dict(PARAMS)
        if (method, template) in DESTRUCTIVE:
            params["ds"] = "nosuch"
        path = re.sub(r"\{(\w+)\}", lambda m, p=params: p[m[1]], template)
        for name, headers in credentials.items():
            status = _call(url, method, path, headers)
            got = str(status) if status in (401, 403) else "answered"
            if status >= 500:
                got = f"{status} (a server error)"
            want = _expect(scope, name)
            if got != want:
                wrong.append(f"{method} {path} with {name}: {status}, want {want} ({scope})")
    return wrong


def test_every_rest_route_answers_as_the_table_says(servers: dict[str, Any]) -> None:
    rest: Rest = servers["rest"]
    wrong = _matrix(rest.app, rest.url, servers["tokens"])
    assert not wrong, "\n".join(wrong)


def test_every_gateway_route_answers_as_the_table_says(servers: dict[str, Any]) -> None:
    app, url = servers["gateway"]
    wrong = _matrix(app, url, servers["tokens"])
    assert not wrong, "\n".join(wrong)

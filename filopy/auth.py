"""Who may call what on FiloPy's HTTP servers: the scope each request needs, read from a table,
and the ASGI middleware that checks a request's token before anything else sees it.

One middleware, outermost, on the REST server and on the gateway: it runs before the routers
and before the direct write and query dispatchers, so no path can skip it. The table is data
(`RULES`: method, path pattern, scope; the first match wins) and anything it does not name
needs `admin`: a new route is closed until the table opens it.

Credentials, as clients send them: `Authorization: Bearer <token>` (Prometheus, Grafana,
vmagent, OpenTelemetry), `Token <token>` (Influx 2.x clients), `Basic` with the token as the
password or the user (Prometheus' basic_auth, Grafana), Influx 1.x's `p` (or `u`) query
parameter on the ingestion paths, and a `filopy_token` cookie on reads (the console: a
browser's EventSource cannot send a header). 401 without valid credentials, 403 when the
token's scopes or datasets do not allow the request; both with a message, never the token.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio
from fastapi import FastAPI
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from core.auth import Principal, Token, new_token, split
from core.auth import Scope as TokenScope
from core.config import Settings
from core.errors import NotFound
from core.local_state import write_private
from store import MetaStore, open_stores

log = logging.getLogger("filopy.auth")

COOKIE = "filopy_token"
OPEN = None  # a rule's scope for a path anyone may call
# When auth is off every request is served as this principal.
EVERYONE = Principal("-", "auth disabled", frozenset({"admin"}))

_DS = r"(?P<dataset>[^/]+)"
_READ_METHODS = frozenset({"GET", "HEAD"})
_ANY = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Prometheus' API takes these as POST forms too: still reads.
_PROMQL_POSTS = r"(query|query_range|series|labels|explain|query_exemplars|format_query)"


@dataclass(frozen=True, slots=True)
class Rule:
    methods: frozenset[str]
    path: re.Pattern[str]
    scope: TokenScope | None  # None: open


def _rule(methods: frozenset[str], path: str, scope: TokenScope | None) -> Rule:
    return Rule(methods, re.compile(f"^(?:{path})$"), scope)


RULES: tuple[Rule, ...] = (
    # Load balancers and orchestrators probe these without credentials; they say nothing of
    # the data. The console's page and scripts hold no data either: the data it shows comes
    # from the API, with the user's token.
    _rule(_READ_METHODS, r"/__(health|liveness)", OPEN),
    _rule(_READ_METHODS, rf"/ingest/{_DS}/ping", OPEN),  # Influx clients ping before writing
    _rule(_READ_METHODS, r"/|/console/.*|/favicon\.ico", OPEN),
    _rule(_READ_METHODS, r"/openapi\.json|/docs|/docs/oauth2-redirect|/redoc", OPEN),
    # Prometheus' TSDB admin calls (deleting series): admin, and the dataset named.
    _rule(frozenset({"POST", "PUT"}), rf"/promql/{_DS}/api/v1/admin/tsdb/.+", "admin"),
    # Tokens: admin only, reading them too.
    _rule(_ANY, r"/api/v1/tokens(/.*)?", "admin"),
    # Ingestion (Influx 1.x clients send CREATE DATABASE to /query before writing).
    _rule(frozenset({"POST", "PUT"}), rf"/ingest/{_DS}/.+", "write"),
    _rule(_READ_METHODS | {"POST"}, rf"/ingest/{_DS}/query", "write"),
    # Queries as POST forms.
    _rule(frozenset({"POST"}), rf"/api/v1/{_PROMQL_POSTS}", "read"),
    _rule(frozenset({"POST"}), rf"/promql/{_DS}/api/v1/{_PROMQL_POSTS}", "read"),
    # Every other read: queries, status, history, plans, events, nodes, /metrics.
    _rule(_READ_METHODS, rf"/promql/{_DS}/.*", "read"),
    _rule(_READ_METHODS, rf"/api/v1/(datasets|cluster)/{_DS}(/.*)?", "read"),
    _rule(_READ_METHODS, r"/.*", "read"),
    # Anything else changes the cluster: datasets, shards, drains, rebalancing.
    _rule(_ANY, rf"/api/v1/(datasets|cluster)/{_DS}(/.*)?", "admin"),
)


def required(method: str, path: str) -> tuple[TokenScope | None, str | None]:
    """The scope a request needs (None: open) and the dataset its path names, if any."""
    for rule in RULES:
        if method in rule.methods:
            m = rule.path.match(path)
            if m is not None:
                return rule.scope, m.groupdict().get("dataset")
    return "admin", None


class TokenCache:
    """The tokens of the store (`load`), read again every `refresh_s`. A token id it does not
    know (one made a moment ago on another server) is looked up by itself at once (`get_one`);
    an id found missing is not asked for again within a second, and at most `lookups_per_s`
    such lookups run a second, so garbage tokens cannot turn requests into store reads."""

    def __init__(
        self,
        load: Callable[[], Sequence[Token]],
        get_one: Callable[[str], Token | None],
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
        lookups_per_s: float = 10.0,
    ) -> None:
        self._load = load
        self._get_one = get_one
        self._refresh_s = refresh_s
        self._clock = clock
        self._tokens: dict[str, Token] = {}
        self._missing: dict[str, float] = {}  # id -> when it was found missing
        self._read_at = -float("inf")
        self._lookups_per_s = lookups_per_s
        self._budget = lookups_per_s
        self._budget_at = clock()
        self._lock = threading.Lock()

    def fresh(self) -> bool:
        return self._clock() - self._read_at < self._refresh_s

    def lookup(self, token_id: str) -> Token | None:
        """The token of that id as of at most `refresh_s` ago (blocking: reads the store when
        stale, or the one token when unknown)."""
        if not self.fresh():
            self.reload()
        token = self._tokens.get(token_id)
        if token is not None:
            return token
        return self._look_up_one(token_id)

    def known_fresh(self, token_id: str) -> Token | None:
        """The token without reading the store, when that is enough (cached and fresh)."""
        return self._tokens.get(token_id) if self.fresh() else None

    def _recent(self) -> bool:
        return self._clock() - self._read_at < 1.0

    def _look_up_one(self, token_id: str) -> Token | None:
        now = self._clock()
        with self._lock:
            if now - self._missing.get(token_id, -float("inf")) < 1.0:
                return None
            self._budget = min(
                self._lookups_per_s, self._budget + (now - self._budget_at) * self._lookups_per_s
            )
            self._budget_at = now
            if self._budget < 1:
                return None  # a flood of unknown ids: refused without a store read
            self._budget -= 1
        token = self._get_one(token_id)
        if token is None:
            with self._lock:
                if len(self._missing) > 10_000:
                    self._missing.clear()
                self._missing[token_id] = now
            return None
        self.add(token)
        return token

    def reload(self) -> None:
        with self._lock:
            if self._recent() and self.fresh():
                return  # another thread just did
            tokens = self._load()
            self._tokens = {t.id: t for t in tokens}
            self._read_at = self._clock()

    def add(self, token: Token) -> None:
        """A token this server just made, revoked or looked up: known here at once."""
        self._tokens = {**self._tokens, token.id: token}
        self._missing.pop(token.id, None)


def credentials(scope: Scope) -> str | None:
    """The token text a request carries, wherever its client puts it; None if none."""
    headers = dict(scope["headers"])
    auth = headers.get(b"authorization", b"").decode("latin-1").strip()
    if auth:
        kind, _, value = auth.partition(" ")
        kind, value = kind.lower(), value.strip()
        if kind in ("bearer", "token"):
            return value
        if kind == "basic":
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return value  # not Basic after all: refused as a malformed token
            return password if split(password) or not user else user
        return auth  # an unknown scheme: refused as a malformed token
    if scope["path"].startswith("/ingest/"):
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        for key in ("p", "u"):
            for value in query.get(key, ()):
                if split(value):
                    return value
    if scope["method"] in _READ_METHODS and b"cookie" in headers:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(headers[b"cookie"].decode("latin-1"))
        except Exception:  # a cookie header another application wrote badly
            return None
        if COOKIE in jar:
            return jar[COOKIE].value
    return None


def _refusal(status: int, error_type: str, message: str) -> JSONResponse:
    body = {"status": "error", "errorType": error_type, "error": message}
    headers = {"WWW-Authenticate": 'Bearer realm="filopy"'} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


class Authenticate:
    """ASGI middleware: a request goes on only with a token that may make it; the principal is
    left in `scope["state"]["principal"]` for what comes after (a write token's tenant)."""

    def __init__(self, app: ASGIApp, tokens: TokenCache | None) -> None:
        self.app = app
        self.tokens = tokens  # None: auth disabled, everyone is admin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.tokens is None:
            scope.setdefault("state", {})["principal"] = EVERYONE
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET")
        path = scope["path"]
        needed, dataset = required(method, path)
        if needed is None:
            await self.app(scope, receive, send)
            return
        refusal, principal = await self._check(scope, method, path, needed, dataset)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    async def _check(
        self, scope: Scope, method: str, path: str, needed: TokenScope, dataset: str | None
    ) -> tuple[JSONResponse | None, Principal | None]:
        text = credentials(scope)
        if text is None:
            return _refusal(
                401,
                "unauthorized",
                f"{method} {path} needs a token with scope {needed!r}: send "
                "'Authorization: Bearer <token>' (docs/security.md)",
            ), None
        parts = split(text)
        if parts is None:
            not_token = "the credentials sent are not a FiloPy token"
            return _refusal(401, "unauthorized", not_token), None
        token_id, secret = parts
        assert self.tokens is not None
        token = self.tokens.known_fresh(token_id)
        if token is None:
            try:
                token = await anyio.to_thread.run_sync(self.tokens.lookup, token_id)
            except Exception as e:  # the store cannot be read: nobody can be checked
                log.warning("tokens could not be read: %s", e)
                return _refusal(503, "unavailable", f"tokens could not be read: {e}"), None
        if token is None or not token.matches(secret):
            return _refusal(401, "unauthorized", f"token fpy_{token_id} is not valid"), None
        if token.revoked:
            return _refusal(401, "unauthorized", f"token fpy_{token_id} was revoked"), None
        principal = token.principal()
        if not principal.has(needed):
            return _refusal(
                403,
                "forbidden",
                f"token {token.name!r} (fpy_{token_id}) has scopes {sorted(token.scopes)}; "
                f"{method} {path} needs {needed!r}",
            ), None
        if principal.datasets and (dataset is None or not principal.may_use(dataset)):
            where = f"dataset {dataset!r}" if dataset else f"{method} {path} (no dataset named)"
            return _refusal(
                403,
                "forbidden",
                f"token {token.name!r} (fpy_{token_id}) is limited to datasets "
                f"{list(principal.datasets)}, not {where}",
            ), None
        return None, principal


def principal_of(scope: Scope | dict[str, Any]) -> Principal:
    """The principal the middleware let through (everyone, where no middleware runs)."""
    state = scope.get("state") or {}
    return state.get("principal", EVERYONE)  # type: ignore[no-any-return]


class TokenBook:
    """The tokens of one store, for a server: the cache its middleware checks against, and
    making, listing and revoking them (the admin API and `filopy token`)."""

    def __init__(self, meta: MetaStore, refresh_s: float = 5.0) -> None:
        self.meta = meta
        self.cache = TokenCache(meta.list_tokens, meta.get_token, refresh_s)

    def create(
        self,
        name: str,
        scopes: Sequence[str],
        datasets: Sequence[str] = (),
        tenant: str | None = None,
    ) -> tuple[Token, str]:
        """A new token, stored; its text is returned once and kept nowhere."""
        token, text = new_token(name, scopes, _now_ms(), datasets=datasets, tenant=tenant)
        self.meta.put_token(token)
        self.cache.add(token)
        return token, text

    def list(self) -> list[Token]:
        return self.meta.list_tokens()

    def revoke(self, token_id: str) -> Token:
        """Revoke a token (refused by every server within `refresh_s`); NotFound if unknown."""
        self.meta.revoke_token(token_id, _now_ms())
        token = self.meta.get_token(token_id)
        if token is None:
            raise NotFound(f"no token fpy_{token_id}")
        self.cache.add(token)
        return token


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def open_token_book(settings: Settings) -> TokenBook | None:
    """The token book of the configured store, or None with auth disabled (said in the log)."""
    if not settings.auth.enabled:
        log.warning(
            "auth is disabled (auth.enabled = false): every client that reaches this server "
            "may write, read and change the cluster"
        )
        return None
    meta, columns = open_stores(settings)
    columns.close()
    return TokenBook(meta, settings.auth.refresh_s)


_REFUSAL_SCHEMA = {
    "type": "object",
    "required": ["status", "errorType", "error"],
    "properties": {
        "status": {"type": "string", "enum": ["error"]},
        "errorType": {"type": "string", "enum": ["unauthorized", "forbidden"]},
        "error": {"type": "string"},
    },
}
_REFUSALS = {
    "401": "No valid token: none sent, not a FiloPy token, a wrong secret or a revoked token",
    "403": "The token's scopes or datasets do not allow the request",
}


def document_refusals(app: FastAPI) -> None:
    """Every operation that needs a token lists the middleware's 401 and 403 in the app's
    OpenAPI schema: clients (and schemathesis) generated from it expect them."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = build()  # FastAPI's, cached after the first call
        for path, item in schema.get("paths", {}).items():
            for method, operation in item.items():
                if required(method.upper(), path)[0] is None:
                    continue  # open
                responses = operation.setdefault("responses", {})
                for code, text in _REFUSALS.items():
                    responses.setdefault(
                        code,
                        {
                            "description": text,
                            "content": {"application/json": {"schema": _REFUSAL_SCHEMA}},
                        },
                    )
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def secure(app: FastAPI, settings: Settings) -> None:
    """Tokens checked before anything else sees a request (docs/security.md): added last, the
    middleware is outermost, ahead of the direct write and query dispatchers."""
    book = open_token_book(settings)
    if book is not None:
        document_refusals(app)
    app.state.tokens = book
    app.add_middleware(Authenticate, tokens=None if book is None else book.cache)
    if book is not None:
        app.router.add_event_handler("shutdown", book.meta.close)


def keep_admin_token(book: TokenBook, path: Path) -> str:
    """The admin token in `path` if it is still a valid one of this store; else a new one,
    written there readable by this user only (0600). `filopy up` calls it at every start, so
    the CLI and the local tests find a working token in the state directory."""
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    parts = split(text)
    if parts is not None:
        token = book.meta.get_token(parts[0])
        if token is not None and not token.revoked and token.matches(parts[1]):
            return text
    _, text = book.create("admin (filopy up)", ["admin"])
    write_private(path, text + "\n")
    return text

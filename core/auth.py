"""API tokens: what a token is, how it is made, stored and checked. Pure: no I/O, no HTTP.

A token is `fpy_<id>_<secret>`. The id is public (it names the token in lists, logs and
revocations); the secret is 32 random bytes, shown once when the token is made and stored only as
its SHA-256. A slow password hash is not needed: the secret is random, not chosen by a person, so
there is nothing to guess. Checks compare digests in constant time.

Scopes: `read` (queries, status, events, the console, /metrics), `write` (ingestion), `admin`
(datasets, shards, drain, rebalance, tokens; it includes read and write). A token may be limited to
some datasets, and a write token to one tenant (the `_ws_` label of what it writes).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, get_args

from core.errors import Invalid

Scope = Literal["read", "write", "admin"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
PREFIX = "fpy"
_ID_BYTES = 6  # 12 hex digits: unique among the tokens of one cluster, short enough to type
_SECRET_BYTES = 32
_TOKEN = re.compile(r"^fpy_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Token:
    """A token as stored: everything but its secret."""

    id: str
    name: str
    scopes: frozenset[Scope]
    secret_sha256: str = field(repr=False)
    created_ms: int
    datasets: tuple[str, ...] = ()  # empty: every dataset
    tenant: str | None = None  # a write token's `_ws_`; None: any
    revoked_ms: int | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_ms is not None

    def matches(self, secret: str) -> bool:
        """Whether `secret` is this token's, compared in constant time."""
        return hmac.compare_digest(_digest(secret), self.secret_sha256)

    def principal(self) -> Principal:
        return Principal(self.id, self.name, self.scopes, self.datasets, self.tenant)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: the token's id and name and what it may do."""

    token_id: str
    name: str
    scopes: frozenset[Scope]
    datasets: tuple[str, ...] = ()
    tenant: str | None = None

    def has(self, scope: Scope) -> bool:
        return scope in self.scopes or "admin" in self.scopes

    def may_use(self, dataset: str) -> bool:
        return not self.datasets or dataset in self.datasets


def check_scopes(scopes: Iterable[str]) -> frozenset[Scope]:
    """The scopes named, each one of `SCOPES`; Invalid otherwise (or if none)."""
    given = frozenset(scopes)
    unknown = sorted(given - set(SCOPES))
    if unknown or not given:
        raise Invalid(f"scopes must be some of {list(SCOPES)}, got {sorted(given)}")
    return given  # type: ignore[return-value]


def new_token(
    name: str,
    scopes: Iterable[str],
    now_ms: int,
    *,
    datasets: Iterable[str] = (),
    tenant: str | None = None,
) -> tuple[Token, str]:
    """A new token and its text (`fpy_<id>_<secret>`), which is shown once and never stored."""
    if not name.strip():
        raise Invalid("a token needs a name (who or what uses it)")
    token_id = secrets.token_hex(_ID_BYTES)
    secret = secrets.token_urlsafe(_SECRET_BYTES)
    token = Token(
        id=token_id,
        name=name.strip(),
        scopes=check_scopes(scopes),
        secret_sha256=_digest(secret),
        created_ms=now_ms,
        datasets=tuple(sorted(set(datasets))),
        tenant=tenant or None,
    )
    return token, f"{PREFIX}_{token_id}_{secret}"


def split(text: str) -> tuple[str, str] | None:
    """(id, secret) of a token's text, or None if it is not one."""
    m = _TOKEN.match(text.strip())
    return (m[1], m[2]) if m else None


__all__ = ["PREFIX", "SCOPES", "Principal", "Scope", "Token", "check_scopes", "new_token", "split"]

"""API tokens: make, list and revoke them (admin scope; docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, Request

from core.auth import Token
from filopy.auth import TokenBook
from filopy.rest.deps import errors
from filopy.rest.errors import ApiError, api_error
from filopy.rest.models import CreatedTokenData, Success, TokenData, TokenRequest

router = APIRouter(tags=["tokens"])
R = TypeVar("R")


def _data(token: Token) -> dict[str, Any]:
    return {
        "id": token.id,
        "name": token.name,
        "scopes": sorted(token.scopes),
        "datasets": list(token.datasets),
        "tenant": token.tenant,
        "created_ms": token.created_ms,
        "revoked_ms": token.revoked_ms,
    }


async def _call(request: Request, fn: Callable[..., R], *args: Any) -> R:
    book: TokenBook | None = request.app.state.tokens
    if book is None:
        raise ApiError(404, "not_found", "auth is disabled on this server (auth.enabled = false)")
    try:
        return await anyio.to_thread.run_sync(fn, book, *args)
    except Exception as e:
        raise api_error(e, 30.0) from None


@router.post(
    "/api/v1/tokens",
    status_code=201,
    response_model=Success[CreatedTokenData],
    responses=errors(400, 401, 403, 404, 503),
)
async def create_token(body: TokenRequest, request: Request) -> Any:
    """Make a token; the answer holds the token itself, shown this once."""

    def create(book: TokenBook) -> tuple[Token, str]:
        return book.create(body.name, body.scopes, body.datasets, body.tenant)

    token, text = await _call(request, create)
    return Success(data=CreatedTokenData(**_data(token), token=text))


@router.get(
    "/api/v1/tokens",
    response_model=Success[list[TokenData]],
    responses=errors(401, 403, 404, 503),
)
async def list_tokens(request: Request) -> Any:
    """Every token, revoked ones too (never their secrets)."""
    tokens = await _call(request, TokenBook.list)
    return Success(data=[TokenData(**_data(t)) for t in tokens])


@router.delete(
    "/api/v1/tokens/{token_id}",
    response_model=Success[TokenData],
    responses=errors(401, 403, 404, 503),
)
async def revoke_token(token_id: str, request: Request) -> Any:
    """Revoke a token: every server refuses it within `auth.refresh_s`."""
    token = await _call(request, TokenBook.revoke, token_id)
    return Success(data=TokenData(**_data(token)))

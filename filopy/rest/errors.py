"""Every failure as a JSON envelope with the right HTTP status and a message a human can act on.

FiloPy's errors are answered by their category (`core.errors`), from one table (`ANSWERS`); an
error may name a more specific errorType (a refused shard request names its reason). Exceptions
raised inside the cluster reach us wrapped by Ray (`RayTaskError`, whose `str()` is a remote
traceback): they are unwrapped to their cause first, so no stack trace ever reaches a client.
Ray's own failures and pydantic's validation errors are answered here too; anything unexpected
(and any `Internal` error, a bug) is logged here and answered with a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.dataset import _check_name
from core.errors import (
    Conflict,
    ExecutionFailed,
    FiloPyError,
    Forbidden,
    Internal,
    Invalid,
    Limited,
    NotFound,
    Unauthenticated,
    Unavailable,
    Unsupported,
)

log = logging.getLogger("filopy.rest")

# errorType values (stable; documented in docs/rest.md).
BAD_DATA = "bad_data"
NOT_FOUND = "not_found"
CONFLICT = "conflict"
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
INTERNAL = "internal"
EXECUTION = "execution"
UNSUPPORTED = "unsupported"
METHOD_NOT_ALLOWED = "method_not_allowed"
UNAUTHORIZED = "unauthorized"
FORBIDDEN = "forbidden"
TOO_MANY_REQUESTS = "too_many_requests"

# Each category's answer: (HTTP status, errorType). The bare root is raised only for a request
# the cluster refused without a category (a client-side failure): a 400 as any refusal.
ANSWERS: dict[type[FiloPyError], tuple[int, str]] = {
    NotFound: (404, NOT_FOUND),
    Conflict: (409, CONFLICT),
    Invalid: (400, BAD_DATA),
    Unauthenticated: (401, UNAUTHORIZED),
    Forbidden: (403, FORBIDDEN),
    Limited: (429, TOO_MANY_REQUESTS),
    Unsupported: (501, UNSUPPORTED),  # as Prometheus-compatible servers answer it
    Unavailable: (503, UNAVAILABLE),
    ExecutionFailed: (422, EXECUTION),
    Internal: (500, INTERNAL),
    FiloPyError: (400, BAD_DATA),
}


class ApiError(Exception):
    """An error answer: HTTP status, errorType and message."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message


def error_response(status: int, error_type: str, message: str) -> JSONResponse:
    body = {"status": "error", "errorType": error_type, "error": message}
    return JSONResponse(body, status_code=status)


def unwrapped(exc: BaseException) -> BaseException:
    """The exception raised inside the actor, not Ray's wrapper around it."""
    import ray.exceptions  # here, not at the top: the CLI and unit tests import us without Ray

    while isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None:
        exc = exc.cause
    return exc


def _answer(err: FiloPyError) -> ApiError:
    """A FiloPy error's answer: its category's, with its own errorType if it names one."""
    status, error_type = ANSWERS[err.category or FiloPyError]
    message = f"{err.context}: {err}" if err.context else str(err)
    return ApiError(status, err.error_type or error_type, message)


def api_error(exc: BaseException, timeout_s: float) -> ApiError:
    """Map an exception from the client or the cluster to its HTTP answer."""
    import ray.exceptions

    if isinstance(exc, ApiError):
        return exc
    cause = unwrapped(exc)
    if isinstance(cause, FiloPyError) and cause.category is not Internal:
        return _answer(cause)
    if isinstance(cause, ValidationError):
        return ApiError(400, BAD_DATA, validation_message(cause.errors()))
    if isinstance(cause, ray.exceptions.GetTimeoutError):
        return ApiError(
            503, TIMEOUT, f"the FiloPy cluster singleton did not answer within {timeout_s:.0f} s"
        )
    if isinstance(cause, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError):
        return ApiError(
            503,
            UNAVAILABLE,
            "the FiloPy cluster singleton is unavailable (it may be restarting); retry shortly",
        )
    from query.wire import RemoteQueryError  # here: the CLI reads this module without it

    if isinstance(cause, RemoteQueryError):  # a node failed: its message, the node's own
        log.error("a node failed on a query: %s", cause)
        status, error_type = ANSWERS[Internal]
        return ApiError(status, error_type, f"a node failed on the query: {cause}")
    # A bug (an `Internal` error or anything unexpected): the details go to the log only.
    log.error("unexpected error", exc_info=(type(exc), exc, exc.__traceback__))
    status, error_type = ANSWERS[Internal]
    return ApiError(
        status, error_type, f"internal error ({type(cause).__name__}); see the server log"
    )


def _path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _one(err: Any) -> str:
    loc = list(err.get("loc", ()))
    kind = err.get("type", "")
    msg = str(err.get("msg", "invalid"))
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    where = ""
    if loc and loc[0] == "body":
        if kind == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            return f"request body is not valid JSON: {detail}".rstrip(": ")
        where = _path(loc[1:])
        if not where:
            if kind == "missing":
                return "a JSON request body is required"
            if kind in ("dict_type", "model_type", "model_attributes_type"):
                return "the request body must be a JSON object (Content-Type: application/json)"
            return msg
    elif loc[:2] == ["path", "ds"]:
        try:
            _check_name(str(err.get("input", "")))
        except ValueError as e:
            return str(e)
        where = "path parameter ds"
    elif loc and loc[0] in ("path", "query", "header"):
        where = f"{loc[0]} parameter {_path(loc[1:])}"
    else:
        where = _path(loc)
    if kind == "extra_forbidden":
        return f"unknown field {where!r}"
    if kind == "missing":
        return f"{where}: required"
    if where and not msg.startswith(where.split(" ")[-1]):
        return f"{where}: {msg}"
    return msg


def validation_message(errors: Sequence[Any]) -> str:
    """Pydantic's errors as one line per problem, naming the field (`spread.default: ...`)."""
    seen: list[str] = []
    for err in errors:
        m = _one(err)
        if m not in seen:
            seen.append(m)
    return "; ".join(seen) or "invalid request"


def install_handlers(app: FastAPI, timeout_s: float) -> None:
    """Envelope every error: validation (400, not FastAPI's 422), HTTP and unexpected ones."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        e = api_error(exc, timeout_s)
        return error_response(e.status, e.error_type, e.message)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(400, BAD_DATA, validation_message(exc.errors()))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = {404: NOT_FOUND, 405: METHOD_NOT_ALLOWED}.get(exc.status_code, BAD_DATA)
        message = {
            404: "no such endpoint",
            400: f"the request body could not be read as JSON ({exc.detail})",
        }.get(exc.status_code, str(exc.detail))
        response = error_response(exc.status_code, kind, message)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_api_error)

"""FiloPy's errors: one tree, rooted in `FiloPyError`, sorted by what the caller can do about them.

Every error FiloPy raises descends from `FiloPyError` and from exactly one category:

| category          | what it means                                      | REST answer             |
|-------------------|----------------------------------------------------|-------------------------|
| `NotFound`        | the request names something that does not exist    | 404 `not_found`         |
| `Conflict`        | it contradicts what exists (a definition, owner)   | 409 `conflict`          |
| `Invalid`         | the request or data is wrong: fix it (ValueError) | 400 `bad_data`          |
| `Unauthenticated` | no credentials, or no valid, unrevoked token       | 401 `unauthorized`      |
| `Forbidden`       | a valid token whose scopes or datasets forbid it   | 403 `forbidden`         |
| `Limited`         | over a limit of its tenant: retry later            | 429 `too_many_requests` |
| `Unsupported`     | valid, but FiloPy does not do it                   | 501 `unsupported`       |
| `Unavailable`     | Kafka, the store, a node or shards cannot answer   | 503 `unavailable`       |
| `ExecutionFailed` | a valid query failed on the data                   | 422 `execution`         |
| `Internal`        | a broken invariant: a bug in FiloPy                | 500 `internal`          |

The REST layer answers by category in one table (`filopy/rest/errors.py`). Concrete errors live
next to the code that raises them (the store's in `store/api.py`, Kafka's in
`ingest/topics.py`, ...), each subclassing its category; this module holds the root, the
categories and the errors of the vocabulary that have no better home. It is the ground floor:
it imports nothing of FiloPy.

Errors cross process boundaries (Ray pickles them), so every `FiloPyError` pickles as its class,
its args and its fields, whatever its constructor takes.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "CATEGORIES",
    "Conflict",
    "DatasetUnknownError",
    "ExecutionFailed",
    "FiloPyError",
    "Forbidden",
    "Internal",
    "Invalid",
    "Limited",
    "NotFound",
    "Unauthenticated",
    "Unavailable",
    "Unsupported",
    "category_of",
]


def _rebuild(cls: type[FiloPyError], args: tuple[Any, ...], fields: dict[str, Any]) -> Any:
    """Unpickle an error without calling its `__init__` (whose parameters are not its args)."""
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(fields)
    return err


class FiloPyError(Exception):
    """The root of every FiloPy error. Raised as is only for a cluster the client cannot reach
    (answered like a refused request, 400); everything else raises a subclass of a category."""

    #: What failed, put before the message in REST answers when the message alone does not say
    #: it ("the dataset store failed: ..."). Empty: the message says it.
    context: ClassVar[str] = ""
    #: A more specific REST `errorType` than the category's, if set (e.g. a shard request's
    #: refusal reason).
    error_type: str | None = None

    @property
    def category(self) -> type[FiloPyError] | None:
        """This error's category: its class's (an error whose category depends on its fields,
        such as a query error's kind, overrides this)."""
        return category_of(type(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


# ----------------------------------------------------------------------------------- categories


class NotFound(FiloPyError):
    """The request names something that does not exist (a dataset, ...)."""


class Conflict(FiloPyError):
    """The request contradicts what exists: a dataset or topic defined otherwise, a shard that
    another writer owns now. Retrying the same request cannot succeed."""


class Invalid(FiloPyError, ValueError):
    """The request or the data is wrong; the message says what to change. Also a `ValueError`,
    so code that caught one for bad input still does."""


class Unauthenticated(FiloPyError):
    """The request carries no credentials, or not those of a valid, unrevoked token: send one
    (docs/security.md)."""


class Forbidden(FiloPyError):
    """The request's token is valid but may not do this (its scopes or datasets): use a token
    that may."""


class Limited(FiloPyError):
    """The caller is over a limit of its tenant (samples per second, active series): retry
    after the time the answer gives."""


class Unsupported(FiloPyError):
    """A valid request that FiloPy does not carry out (e.g. a PromQL construct it does not
    evaluate)."""


class Unavailable(FiloPyError):
    """Something the request needs (Kafka, the store, a node, shards) cannot answer now. The
    request itself is fine: retry later."""


class ExecutionFailed(FiloPyError):
    """A valid request that failed while running on the data (e.g. PromQL many-to-many
    matching)."""


class Internal(FiloPyError):
    """A broken invariant: a bug in FiloPy, never the caller's fault nor an outage."""


CATEGORIES: tuple[type[FiloPyError], ...] = (
    NotFound,
    Conflict,
    Invalid,
    Unauthenticated,
    Forbidden,
    Limited,
    Unsupported,
    Unavailable,
    ExecutionFailed,
    Internal,
)


def category_of(error: BaseException | type[BaseException]) -> type[FiloPyError] | None:
    """The category of an error class (the one it descends from), or of an error (its
    `category`); None for the bare root, for a class in several, and for other exceptions."""
    if isinstance(error, FiloPyError):
        return error.category
    if not isinstance(error, type):
        return None
    found = [c for c in CATEGORIES if issubclass(error, c)]
    return found[0] if len(found) == 1 else None


# ----------------------------------------------------------------- errors of the vocabulary


class DatasetUnknownError(NotFound):
    """The cluster has no dataset of that name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown dataset {name!r}")
        self.name = name

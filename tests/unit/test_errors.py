"""One error tree: every error class of FiloPy, found by walking its packages (so a new one cannot
be forgotten), descends from `FiloPyError` and exactly one category, survives pickling (as Ray
carries it) with its message and fields, and gets its category's answer from REST's one table."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import logging
import pickle
import pkgutil
from pathlib import Path
from typing import Any

from coordinator.membership import IllegalTransition, NodeState
from coordinator.messages import RejectReason, ShardRequestRejected
from core.dataset import Dataset, DatasetInvalid, DatasetRef
from core.errors import (
    CATEGORIES,
    Conflict,
    DatasetUnknownError,
    ExecutionFailed,
    FiloPyError,
    Internal,
    Invalid,
    NotFound,
    Unavailable,
    Unsupported,
    category_of,
)
from core.mapper import ShardEventError
from core.shard_status import IngestionStarted
from filopy.ingest_http.tenants import OverLimit
from filopy.rest.errors import ANSWERS, ApiError, api_error
from ingest.topics import KafkaUnavailable, TopicMismatch, TopicMissing, TopicSetupError
from query.executor import ShardsNotHere
from query.limits import QueryLimitExceeded
from query.promql import QUERY_ERROR_CATEGORIES, QueryError
from query.service import ShardsUnavailable
from query.wire import RemoteQueryError
from store.api import DatasetConflict, StaleEpochError, StoreError, StoreUnavailable

PACKAGES = ("core", "store", "ingest", "query", "coordinator", "filopy")
ROOT = Path(__file__).resolve().parents[2]

# Exceptions of FiloPy's packages that are not FiloPy errors, and why.
NOT_FILOPY_ERRORS = {
    "filopy.rest.errors.ApiError": "the HTTP answer REST already chose, not an error to answer",
    "filopy.ingest_http.core.Refused": "the HTTP answer an ingestion endpoint already chose",
}

A = Dataset(name="m", num_shards=4)
B = Dataset(name="m", num_shards=8)


@functools.cache
def samples_args() -> dict[type[BaseException], list[tuple[Any, ...]]]:
    """Sample constructor arguments of every error whose constructor is not just a message; a
    new such error fails `test_every_error_survives_pickling` until it has its samples here."""
    from coordinator.client import NodeUnknownError, ShardRequestError  # imports Ray

    return {
        DatasetUnknownError: [("metrics",)],
        DatasetConflict: [(A, B)],
        StaleEpochError: [("m", 3, 1, 2)],
        TopicMissing: [("filopy-m",)],
        TopicMismatch: [("filopy-m", 8, 4)],
        ShardEventError: [(IngestionStarted(A.ref, 9, "n1"), "invalid shard 9")],
        IllegalTransition: [
            ("n1", NodeState.GONE, NodeState.MEMBER),
            ("n2", None, NodeState.MEMBER),
        ],
        QueryError: [(kind, f"{kind}: something") for kind in QUERY_ERROR_CATEGORIES],
        ShardsUnavailable: [("m", {2: "Down", 5: "Stopped"})],
        ShardsNotHere: [("m", "n1", [1, 3])],
        NodeUnknownError: [("ab12", ["ab12cd", "ef34"]), ("a", ["ab", "ac"], True)],
        OverLimit: [("team-a", "active_series", "team-a is over its limit", 5)],
        QueryLimitExceeded: [("team-a", "samples", 1000), ("-", "series", 10)],
        ShardRequestError: [
            (ShardRequestRejected(DatasetRef(name="m"), RejectReason.UNKNOWN_NODE, "no node x"),)
        ],
    }


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        path = [str(ROOT / package)]
        names += [m.name for m in pkgutil.walk_packages(path, prefix=f"{package}.")]
    return names


@functools.cache
def error_classes() -> list[type[BaseException]]:
    """Every error class of every module, imported when a test asks (some modules import Ray,
    which collecting the tests that need no service must not)."""
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if (
                inspect.isclass(cls)
                and issubclass(cls, BaseException)
                and cls.__module__ == name
                and not cls.__name__.startswith("_")  # control flow, caught in its own module
            ):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [cls for key, cls in sorted(found.items()) if key not in NOT_FILOPY_ERRORS]


def _samples(cls: type[BaseException]) -> list[BaseException]:
    if cls in samples_args():
        return [cls(*args) for args in samples_args()[cls]]
    own_init = [c for c in cls.__mro__ if "__init__" in vars(c) and c.__module__ != "builtins"]
    assert not own_init, f"{cls.__qualname__} takes other arguments: add samples to SAMPLES"
    return [cls(f"a {cls.__name__} happened")]


def test_the_walk_finds_the_errors_of_every_layer() -> None:
    names = {cls.__name__ for cls in error_classes()}
    assert {
        "FiloPyError",
        "DatasetInvalid",
        "ShardEventError",
        "ShardRequestError",
        "StoreTimeout",
        "TopicMismatch",
        "GatewayError",
        "InvalidSeries",
        "RecordEncodeError",
        "QueryError",
        "ShardsUnavailable",
        "ShardsNotHere",
        "NodeUnavailable",
        "IllegalTransition",
    } <= names


def test_every_error_descends_from_filopy_error_and_exactly_one_category() -> None:
    for cls in error_classes():
        assert issubclass(cls, FiloPyError), cls.__qualname__
        if cls is FiloPyError:
            continue  # the root
        if cls is QueryError:  # one class for every kind: each instance is in its kind's category
            for err in _samples(cls):
                assert isinstance(err, QueryError)
                assert category_of(err) is QUERY_ERROR_CATEGORIES[err.kind], err.kind
            continue
        categories = [c for c in CATEGORIES if issubclass(cls, c)]
        assert len(categories) == 1, f"{cls.__qualname__} is in {categories}"
        for err in _samples(cls):
            assert category_of(err) is categories[0], cls.__qualname__


def test_every_error_survives_pickling() -> None:
    """Ray carries errors from actors to callers with its cloudpickle; plain pickle too."""
    import ray.cloudpickle

    for cls in error_classes():
        for err in _samples(cls):
            for dumps in (pickle.dumps, ray.cloudpickle.dumps):
                back = pickle.loads(dumps(err))
                assert type(back) is type(err), cls.__qualname__
                assert str(back) == str(err), cls.__qualname__
                assert back.args == err.args, cls.__qualname__
                assert vars(back) == vars(err), cls.__qualname__
                assert category_of(back) is category_of(err), cls.__qualname__


def test_an_error_wrapped_by_ray_keeps_its_category() -> None:
    """What a caller of an actor catches: Ray's RayTaskError made an instance of the cause."""
    import ray.exceptions

    cause = DatasetConflict(A, B)
    wrapped = ray.exceptions.RayTaskError("setup_dataset", "Traceback ...", cause)
    dual = wrapped.as_instanceof_cause()
    assert isinstance(dual, DatasetConflict) and isinstance(dual, Conflict)
    assert isinstance(dual, ray.exceptions.RayTaskError)
    assert api_error(dual, 60.0).status == 409


def test_invalid_errors_are_still_value_errors() -> None:
    """Code that caught ValueError for bad input keeps catching them."""
    invalid = [cls for cls in error_classes() if issubclass(cls, Invalid)]
    assert {c.__name__ for c in invalid} >= {
        "DatasetInvalid",
        "ShardEventError",
        "RecordEncodeError",
        "InvalidSeries",
    }
    assert all(issubclass(cls, ValueError) for cls in invalid)


def test_old_import_paths_still_work() -> None:
    import coordinator.client
    import core.dataset
    import ingest.gateway
    import query.service
    import store

    assert coordinator.client.FiloPyError is FiloPyError
    assert coordinator.client.DatasetUnknownError is DatasetUnknownError
    assert store.DatasetConflict is DatasetConflict
    assert store.StaleEpochError is StaleEpochError
    assert store.StoreError is StoreError
    assert issubclass(store.StoreTimeout, store.StoreUnavailable)
    assert issubclass(KafkaUnavailable, TopicSetupError)
    for cls in (
        coordinator.client.ShardRequestError,
        core.dataset.DatasetInvalid,
        ingest.gateway.GatewayError,
        ingest.gateway.InvalidSeries,
        query.service.NodeUnavailable,
    ):
        assert issubclass(cls, FiloPyError)


def test_the_error_tree_is_the_ground_floor() -> None:
    """core/errors.py imports nothing of FiloPy, so every layer can raise its errors."""
    tree = ast.parse((ROOT / "core" / "errors.py").read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not {m for m in imported if m.split(".")[0] in PACKAGES}, imported


# ----------------------------------------------------------------------------------------- REST


def test_the_rest_table_answers_every_category() -> None:
    assert set(CATEGORIES) <= set(ANSWERS)
    assert ANSWERS[NotFound] == (404, "not_found")
    assert ANSWERS[Conflict] == (409, "conflict")
    assert ANSWERS[Invalid] == (400, "bad_data")
    assert ANSWERS[Unsupported] == (501, "unsupported")
    assert ANSWERS[Unavailable] == (503, "unavailable")
    assert ANSWERS[ExecutionFailed] == (422, "execution")
    assert ANSWERS[Internal] == (500, "internal")


def test_rest_answers_every_error_by_its_category() -> None:
    for cls in error_classes():
        for err in _samples(cls):
            answer = api_error(err, 60.0)
            category = category_of(err)
            status, error_type = ANSWERS[category or FiloPyError]
            assert answer.status == status, err
            if cls is RemoteQueryError:  # a node's failure: its message, the node's own
                assert answer.message == f"a node failed on the query: {err}"
            elif category is Internal:  # a bug: the details stay in the server log
                assert answer.message == f"internal error ({cls.__name__}); see the server log"
            else:
                assert answer.error_type == (getattr(err, "error_type", None) or error_type), err
                assert str(err) in answer.message, err


def _answer(err: BaseException) -> tuple[int, str, str]:
    a = api_error(err, 15.0)
    return a.status, a.error_type, a.message


def test_rest_answers_keep_their_statuses_types_and_messages() -> None:
    """The answers the REST tests and docs/rest.md promise, from the category table."""
    assert _answer(DatasetUnknownError("m")) == (404, "not_found", "unknown dataset 'm'")
    from coordinator.client import ShardRequestError  # imports Ray

    (refused,) = _samples(ShardRequestError)
    assert _answer(refused) == (400, "unknown_node", "no node x")
    assert _answer(DatasetConflict(A, B))[:2] == (409, "conflict")
    assert _answer(TopicMismatch("t", 8, 4)) == (409, "conflict", str(TopicMismatch("t", 8, 4)))
    assert _answer(KafkaUnavailable("Kafka at k:1 did not answer")) == (
        503,
        "unavailable",
        "Kafka at k:1 did not answer",
    )
    assert _answer(TopicSetupError("replication factor 3 > 1 broker")) == (
        503,
        "unavailable",
        "Kafka topic setup failed: replication factor 3 > 1 broker",
    )
    assert _answer(StoreUnavailable("no host")) == (
        503,
        "unavailable",
        "the dataset store failed: no host",
    )
    assert _answer(StoreError("bad schema"))[2] == "the dataset store failed: bad schema"
    assert _answer(QueryError("bad_data", "parse error")) == (400, "bad_data", "parse error")
    assert _answer(QueryError("unsupported", "no @")) == (501, "unsupported", "no @")
    assert _answer(QueryError("execution", "many-to-many")) == (422, "execution", "many-to-many")
    assert _answer(QueryError("unavailable", "shards down")) == (503, "unavailable", "shards down")
    assert _answer(ShardsUnavailable("m", {1: "Down"}))[:2] == (503, "unavailable")
    assert _answer(DatasetInvalid("min_num_nodes")) == (400, "bad_data", "min_num_nodes")
    assert _answer(FiloPyError("refused")) == (400, "bad_data", "refused")
    assert _answer(ApiError(418, "teapot", "short")) == (418, "teapot", "short")


def test_ray_failures_and_surprises_are_answered_as_before(caplog: Any) -> None:
    import ray.exceptions

    assert _answer(ray.exceptions.GetTimeoutError("x")) == (
        503,
        "timeout",
        "the FiloPy cluster singleton did not answer within 15 s",
    )
    assert _answer(ray.exceptions.RayActorError())[:2] == (503, "unavailable")
    with caplog.at_level(logging.ERROR, logger="filopy.rest"):
        assert _answer(RuntimeError("boom")) == (
            500,
            "internal",
            "internal error (RuntimeError); see the server log",
        )
        assert _answer(IllegalTransition("n1", None, NodeState.MEMBER))[:2] == (500, "internal")
    assert len([r for r in caplog.records if r.exc_info]) == 2  # both logged with a traceback

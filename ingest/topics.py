"""A dataset's Kafka topic: one partition per shard, created at SetupDataset if missing.

The partition count is the shard count, so a topic that exists with another count would route
samples to the wrong shards: that is a setup error, never silently accepted. Every call is
bounded by a timeout, so an unreachable Kafka is a clear error rather than a hang.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic, OffsetSpec

from core.config import KafkaSettings
from core.dataset import Dataset
from core.errors import Conflict, Unavailable
from ingest.kafka_config import ConnectionErrors, kafka_client_config

DEFAULT_TIMEOUT_S = 15.0
_log = logging.getLogger("filopy.kafka")


class TopicSetupError(Unavailable):
    """The dataset's topic cannot be used for ingestion (Kafka refused or failed to set it up)."""

    context = "Kafka topic setup failed"


class KafkaUnavailable(TopicSetupError):
    """Kafka did not answer within the timeout."""

    context = ""  # the message names the broker and the timeout


class TopicMissing(TopicSetupError):
    """The topic does not exist (SetupDataset creates it; the gateway does not)."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"Kafka topic {topic!r} does not exist; set the dataset up first (ensure_topic)"
        )
        self.topic = topic


class TopicMismatch(Conflict):
    """The topic exists with a partition count other than the dataset's shard count: it
    contradicts the dataset's definition (not a failure of Kafka, so not a TopicSetupError)."""

    def __init__(self, topic: str, expected: int, actual: int) -> None:
        super().__init__(
            f"Kafka topic {topic!r} has {actual} partitions but the dataset has {expected} "
            f"shards (one partition per shard); use another topic or recreate this one with "
            f"{expected} partitions"
        )
        self.topic = topic
        self.expected = expected
        self.actual = actual


def admin_client(
    bootstrap_servers: str, timeout_s: float, kafka: KafkaSettings | None = None
) -> AdminClient:
    """An admin client of `bootstrap_servers`, connected as `[kafka]` says (this process's
    settings if None), remembering why its connections fail (`explain`)."""
    ms = str(max(int(timeout_s * 1000), 1))
    errors = ConnectionErrors()
    admin = AdminClient(
        {
            **kafka_client_config(kafka, bootstrap_servers, errors),
            "socket.timeout.ms": ms,
            "socket.connection.setup.timeout.ms": ms,
            "log.connection.close": False,
            "logger": _log,  # librdkafka's connection errors go to logging, not raw stderr
        }
    )
    admin.filopy_errors = errors  # type: ignore[attr-defined]
    return admin


def explain(admin: AdminClient, message: str) -> str:
    """The message with the cause the client's failed connections reported, if any (a refused
    password, an untrusted certificate): served by a `poll`, as librdkafka holds it till then."""
    errors: ConnectionErrors | None = getattr(admin, "filopy_errors", None)
    if errors is None:
        return message
    admin.poll(0)
    return errors.explain(message)


def _metadata(admin: AdminClient, bootstrap: str, timeout_s: float) -> ClusterMetadata:
    try:
        return admin.list_topics(timeout=max(timeout_s, 0.001))
    except KafkaException as e:
        raise KafkaUnavailable(
            explain(admin, f"Kafka at {bootstrap} did not answer within {timeout_s:.1f} s: {e}")
        ) from None


def _partitions(md: ClusterMetadata, topic: str) -> int | None:
    t = md.topics.get(topic)
    if t is None or (t.error is not None and t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        return None
    if t.error is not None:
        raise TopicSetupError(f"Kafka topic {topic!r}: {t.error}")
    return len(t.partitions)


def _leaders_elected(md: ClusterMetadata, topic: str) -> bool:
    """Whether every partition of the topic has a leader (right after creation some do not, and
    reading their offsets fails with NOT_LEADER_FOR_PARTITION)."""
    t = md.topics.get(topic)
    return t is not None and all(p.leader >= 0 and p.error is None for p in t.partitions.values())


def topic_partitions(
    topic: str,
    bootstrap_servers: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    kafka: KafkaSettings | None = None,
) -> int | None:
    """The topic's partition count, or None if it does not exist."""
    admin = admin_client(bootstrap_servers, timeout_s, kafka)
    return _partitions(_metadata(admin, bootstrap_servers, timeout_s), topic)


def check_topic(
    dataset: Dataset,
    bootstrap_servers: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    kafka: KafkaSettings | None = None,
) -> None:
    """Raise unless the dataset's topic exists with exactly `num_shards` partitions."""
    bootstrap = bootstrap_servers or dataset.source.bootstrap_servers
    actual = topic_partitions(dataset.topic, bootstrap, timeout_s, kafka)
    if actual is None:
        raise TopicMissing(dataset.topic)
    if actual != dataset.num_shards:
        raise TopicMismatch(dataset.topic, dataset.num_shards, actual)


def ensure_topic(
    dataset: Dataset,
    bootstrap_servers: str | None = None,
    *,
    replication_factor: int = 1,
    topic_config: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    kafka: KafkaSettings | None = None,
) -> bool:
    """Create the dataset's topic with `num_shards` partitions unless it exists; idempotent.

    Returns True if this call created it. Raises `TopicMismatch` if it exists with another
    partition count and `KafkaUnavailable` if Kafka does not answer within `timeout_s`.
    Returns only once the topic's partitions are in the cluster metadata with a leader each, so
    the caller can produce and consume right away.
    """
    bootstrap = bootstrap_servers or dataset.source.bootstrap_servers
    topic, expected = dataset.topic, dataset.num_shards
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return deadline - time.monotonic()

    admin = admin_client(bootstrap, timeout_s, kafka)
    actual = _partitions(_metadata(admin, bootstrap, left()), topic)
    created = False
    if actual is None:
        new = NewTopic(
            topic,
            num_partitions=expected,
            replication_factor=replication_factor,
            config=dict(topic_config or {}),
        )
        wait = max(left(), 0.001)
        future = admin.create_topics([new], operation_timeout=wait, request_timeout=wait)[topic]
        try:
            future.result(timeout=wait)
            created = True
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise _create_error(admin, topic, bootstrap, timeout_s, e) from None
        except TimeoutError:
            raise KafkaUnavailable(
                explain(
                    admin,
                    f"creating Kafka topic {topic!r} at {bootstrap} took more than "
                    f"{timeout_s:.1f} s",
                )
            ) from None
    # Confirm (after creating, or after losing a creation race) what the cluster now says.
    while True:
        md = _metadata(admin, bootstrap, left())
        actual = _partitions(md, topic)
        if actual is not None and actual != expected:
            raise TopicMismatch(topic, expected, actual)
        if actual == expected and _leaders_elected(md, topic):
            return created
        if left() <= 0:
            raise KafkaUnavailable(
                f"Kafka topic {topic!r} did not get a leader for every partition at {bootstrap} "
                f"within {timeout_s:.1f} s"
            )
        time.sleep(0.05)


def end_offsets(
    admin: AdminClient, topic: str, partitions: int, timeout_s: float = 2.0
) -> dict[int, int]:
    """The broker's end offset (high watermark) of each partition of the topic, asked in one
    request: what a consumer must have read to be caught up, as the broker sees it now (a
    consumer learns it only from its own fetches, late on a slow link). Raises KafkaUnavailable
    if Kafka does not answer within the timeout."""
    wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    try:
        futures = admin.list_offsets(wanted, request_timeout=timeout_s)
        return {tp.partition: int(f.result(timeout=timeout_s).offset) for tp, f in futures.items()}
    except (KafkaException, TimeoutError) as e:
        message = explain(admin, f"end offsets of Kafka topic {topic!r}: {e}")
        raise KafkaUnavailable(message) from None


def _create_error(
    admin: AdminClient, topic: str, bootstrap: str, timeout_s: float, e: KafkaException
) -> Exception:
    err = e.args[0] if e.args else None
    if isinstance(err, KafkaError) and err.code() in (
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._TRANSPORT,
        KafkaError.REQUEST_TIMED_OUT,
    ):
        return KafkaUnavailable(
            explain(
                admin,
                f"creating Kafka topic {topic!r} at {bootstrap} failed within {timeout_s:.1f} s: "
                f"{e}",
            )
        )
    return TopicSetupError(
        explain(admin, f"creating Kafka topic {topic!r} at {bootstrap} failed: {e}")
    )

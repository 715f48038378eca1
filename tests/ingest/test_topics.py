"""A dataset's topic on the real broker: num_shards partitions, created once, never mismatched."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from core.dataset import Dataset, SourceSettings
from ingest.topics import (
    KafkaUnavailable,
    TopicMismatch,
    TopicMissing,
    TopicSetupError,
    check_topic,
    ensure_topic,
    topic_partitions,
)

pytestmark = pytest.mark.kafka


@pytest.fixture
def admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture
def topic_name(admin: AdminClient) -> Iterator[str]:
    name = f"test-topics-{uuid.uuid4().hex[:10]}"
    yield name
    futures = admin.delete_topics([name], operation_timeout=30)
    try:
        futures[name].result(timeout=30)
    except Exception as e:  # the test may not have created it
        assert "UNKNOWN_TOPIC" in str(e), e


def _dataset(topic: str, shards: int, bootstrap: str = "127.0.0.1:9092") -> Dataset:
    return Dataset(
        name="topics",
        num_shards=shards,
        source=SourceSettings(topic=topic, bootstrap_servers=bootstrap),
    )


def test_creates_missing_topic_with_one_partition_per_shard(
    kafka_bootstrap: str, admin: AdminClient, topic_name: str
) -> None:
    dataset = _dataset(topic_name, 8, kafka_bootstrap)
    assert topic_partitions(topic_name, kafka_bootstrap) is None
    with pytest.raises(TopicMissing, match=topic_name):
        check_topic(dataset)
    assert ensure_topic(dataset) is True  # bootstrap servers from the dataset's source
    md = admin.list_topics(topic_name, timeout=10).topics[topic_name]
    assert md.error is None and sorted(md.partitions) == list(range(8))
    check_topic(dataset)


def test_existing_topic_with_the_same_count_is_fine(kafka_bootstrap: str, topic_name: str) -> None:
    dataset = _dataset(topic_name, 4)
    assert ensure_topic(dataset, kafka_bootstrap) is True
    assert ensure_topic(dataset, kafka_bootstrap) is False
    assert ensure_topic(dataset, kafka_bootstrap) is False
    assert topic_partitions(topic_name, kafka_bootstrap) == 4


def test_existing_topic_with_another_count_is_a_setup_error(
    kafka_bootstrap: str, admin: AdminClient, topic_name: str
) -> None:
    admin.create_topics([NewTopic(topic_name, num_partitions=3, replication_factor=1)])[
        topic_name
    ].result(timeout=30)
    dataset = _dataset(topic_name, 8)
    with pytest.raises(TopicMismatch) as info:
        ensure_topic(dataset, kafka_bootstrap)
    err = info.value
    assert (err.topic, err.expected, err.actual) == (topic_name, 8, 3)
    assert topic_name in str(err) and "3 partitions" in str(err) and "8 shards" in str(err)
    with pytest.raises(TopicMismatch):
        check_topic(dataset, kafka_bootstrap)
    assert topic_partitions(topic_name, kafka_bootstrap) == 3  # left untouched


def test_default_topic_name_comes_from_the_dataset(
    kafka_bootstrap: str, admin: AdminClient
) -> None:
    dataset = Dataset(name=f"t{uuid.uuid4().hex[:10]}", num_shards=2)
    assert dataset.topic == f"filopy-{dataset.name}"
    try:
        assert ensure_topic(dataset, kafka_bootstrap) is True
        assert topic_partitions(dataset.topic, kafka_bootstrap) == 2
    finally:
        admin.delete_topics([dataset.topic])[dataset.topic].result(timeout=30)


@pytest.mark.parametrize("call", [ensure_topic, check_topic])
def test_unreachable_kafka_is_a_clear_error_within_the_timeout(call) -> None:
    dataset = _dataset("never-created", 4, "127.0.0.1:1")
    start = time.monotonic()
    with pytest.raises(KafkaUnavailable, match=r"127\.0\.0\.1:1.*2\.0 s") as info:
        call(dataset, timeout_s=2.0)
    assert time.monotonic() - start < 4.0
    assert isinstance(info.value, TopicSetupError)


def test_broker_refusal_is_a_setup_error_naming_the_topic(
    kafka_bootstrap: str, topic_name: str
) -> None:
    with pytest.raises(TopicSetupError, match=f"{topic_name}.*(?i:replication)") as info:
        ensure_topic(_dataset(topic_name, 2), kafka_bootstrap, replication_factor=3)
    assert not isinstance(info.value, KafkaUnavailable)
    assert topic_partitions(topic_name, kafka_bootstrap) is None

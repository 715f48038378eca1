"""Kafka is real: 8 partitions written and read back with assign() and explicit offsets."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.kafka

PARTITIONS = 8
PER_PARTITION = 50


@pytest.fixture
def topic(kafka_bootstrap: str):
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    name = f"smoke-{uuid.uuid4().hex[:10]}"
    futures = admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)])
    futures[name].result(timeout=30)
    yield name
    admin.delete_topics([name])[name].result(timeout=30)


def _consumer(bootstrap: str) -> Consumer:
    # No consumer-group rebalancing and no offset commits: FiloPy owns partitions explicitly.
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "filopy-smoke",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


def _read_all(consumer: Consumer, expected_eofs: int) -> list:
    messages, eofs = [], 0
    while eofs < expected_eofs:
        batch = consumer.consume(num_messages=500, timeout=10)
        assert batch, "no message and no end-of-partition within 10 s"
        for m in batch:
            if m.error() is None:
                messages.append(m)
            elif m.error().code() == -191:  # _PARTITION_EOF
                eofs += 1
            else:
                raise KafkaException(m.error())
    return messages


def test_produce_and_consume_eight_partitions_with_explicit_offsets(
    kafka_bootstrap: str, topic: str
) -> None:
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    sent = {p: [f"p{p}-m{i}".encode() for i in range(PER_PARTITION)] for p in range(PARTITIONS)}
    for p, values in sent.items():
        for v in values:
            producer.produce(topic, value=v, partition=p)
    assert producer.flush(30) == 0

    # Every partition from its beginning: each one's messages, in order, offsets 0..n-1.
    consumer = _consumer(kafka_bootstrap)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got = _read_all(consumer, PARTITIONS)
    consumer.close()
    by_partition: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    for m in got:
        by_partition[m.partition()].append(m)
    for p in range(PARTITIONS):
        assert [m.value() for m in by_partition[p]] == sent[p]
        assert [m.offset() for m in by_partition[p]] == list(range(PER_PARTITION))

    # One partition from an explicit offset: exactly the tail from that offset on.
    start = 37
    consumer = _consumer(kafka_bootstrap)
    consumer.assign([TopicPartition(topic, 5, start)])
    tail = _read_all(consumer, 1)
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 5), timeout=10)
    consumer.close()
    assert [m.value() for m in tail] == sent[5][start:]
    assert {m.partition() for m in tail} == {5}
    assert (low, high) == (0, PER_PARTITION)

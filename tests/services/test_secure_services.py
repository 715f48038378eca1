"""FiloPy's own clients against Kafka (SASL_SSL, SCRAM) and Cassandra (password, TLS) secured by
`scripts/services.sh up kafka-secure cassandra-secure` (issue 32): the right credentials work
end to end; a wrong password or a missing CA fails fast with an error naming the cause.

The secured instances are started once for this module and stopped after it; the plain ones
the rest of the suite uses keep running on their own ports.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from core.config import CredentialsUnreadable, Settings, load_settings
from core.dataset import Dataset, SourceSettings
from core.shard_status import IngestionDegraded, IngestionError, IngestionStarted, ShardEvent
from ingest.gateway import Gateway
from ingest.ingester import KafkaShardIngester
from ingest.topics import KafkaUnavailable, ensure_topic, topic_partitions
from store import (
    ChunkRecord,
    PartKeyRecord,
    StoreUnavailable,
    decode_chunk,
    encode_chunk,
    open_stores,
)
from tests.cluster import cluster_settings, start_cluster
from tests.conftest import ROOT, SERVICES
from tests.waiting import wait_for

if TYPE_CHECKING:
    from coordinator.local_cluster import LocalRayCluster

pytestmark = [pytest.mark.kafka, pytest.mark.cassandra]

KAFKA_PORT, CASSANDRA_PORT = 9094, 9142  # scripts/services.sh's defaults for the secured ones
FAIL_TIMEOUT_S = 5.0  # how long a refused client may take to say so


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SERVICES), *args], capture_output=True, text=True, timeout=900, check=False
    )


@pytest.fixture(scope="module")
def secure_dir() -> Iterator[Path]:
    """The secured Kafka and Cassandra, running; their CA and passwords are in this folder."""
    up = _script("up", "kafka-secure", "cassandra-secure")
    if up.returncode != 0:
        _script("down", "kafka-secure", "cassandra-secure")
        pytest.fail(f"could not start the secured services:\n{up.stdout}\n{up.stderr}", False)
    try:
        yield ROOT / ".services" / "secure"
    finally:
        down = _script("down", "kafka-secure", "cassandra-secure")
        assert down.returncode == 0, down.stderr


def _settings(
    secure: Path, tmp: Path, kafka: dict[str, Any], cassandra: dict[str, Any]
) -> Settings:
    """This process's settings, connecting to the secured services as told."""
    return load_settings(
        kafka={
            "bootstrap_servers": f"127.0.0.1:{KAFKA_PORT}",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "filopy",
            "sasl_password_file": str(secure / "kafka.password"),
            "ssl_ca_file": str(secure / "ca.pem"),
            **kafka,
        },
        cassandra={
            "port": CASSANDRA_PORT,
            "keyspace": f"filopy_secure_{uuid.uuid4().hex[:8]}",
            "connect_timeout_s": FAIL_TIMEOUT_S,
            "username": "filopy",
            "password_file": str(secure / "cassandra.password"),
            "ssl": True,
            "ssl_ca_file": str(secure / "ca.pem"),
            **cassandra,
        },
        store={"backend": "sqlite", "sqlite_path": str(tmp / "filopy.db")},
    )


def _dataset(bootstrap: str) -> Dataset:
    return Dataset(
        name=f"sec{uuid.uuid4().hex[:8]}",
        num_shards=2,
        source=SourceSettings(bootstrap_servers=bootstrap),
    )


def _samples(n: int) -> list[tuple[dict[str, str], int, float]]:
    labels = {"_metric_": "up", "_ws_": "w", "_ns_": "n", "instance": "a"}
    return [(labels, 1_700_000_000_000 + 1000 * i, float(i)) for i in range(n)]


# ----- Kafka --------------------------------------------------------------------------------------


def test_topic_gateway_and_ingester_ingest_over_sasl_ssl(secure_dir: Path, tmp_path: Path) -> None:
    settings = _settings(secure_dir, tmp_path, {}, {})
    k = settings.kafka
    ds = _dataset(k.bootstrap_servers)
    assert ensure_topic(ds, kafka=k, timeout_s=30) is True
    assert topic_partitions(ds.topic, k.bootstrap_servers, 10, k) == 2
    # The other SCRAM mechanism the broker offers, the password given inline this time.
    password = (secure_dir / "kafka.password").read_text().strip()
    sha256 = load_settings(
        kafka={
            **k.model_dump(mode="python"),
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_password_file": "",
            "sasl_password": password,
        }
    ).kafka
    assert topic_partitions(ds.topic, k.bootstrap_servers, 10, sha256) == 2

    with Gateway(ds, kafka=k, timeout_s=10) as gw:
        gw.send(_samples(100))
    assert gw.progress(final=True).samples_acked == 100

    meta, columns = open_stores(settings)
    meta.create_dataset(ds)
    events: list[ShardEvent] = []
    ingester = KafkaShardIngester(
        ds, 0, "n1", meta=meta, columns=columns, settings=settings, report=events.append
    )
    ingesters = [ingester]
    try:
        asyncio.run(ingester.start())
        # Which shard the series went to is the gateway's choice: read both.
        other = KafkaShardIngester(
            ds, 1, "n1", meta=meta, columns=columns, settings=settings, report=events.append
        )
        ingesters.append(other)
        asyncio.run(other.start())
        wait_for(
            "100 samples read by the ingesters over SASL_SSL",
            lambda: sum(i.memstore.memory_samples() for i in ingesters) >= 100,
        )
        assert not [e for e in events if isinstance(e, (IngestionError, IngestionDegraded))]
    finally:
        for i in ingesters:
            asyncio.run(i.stop())
        meta.close()
        columns.close()


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        ({"sasl_password_file": "", "sasl_password": "not-the-password"}, "invalid credentials"),
        ({"ssl_ca_file": ""}, "certificate verify failed"),
    ],
    ids=["wrong-password", "no-ca"],
)
def test_refused_kafka_clients_fail_fast_naming_the_cause(
    secure_dir: Path, tmp_path: Path, change: dict[str, Any], cause: str
) -> None:
    k = _settings(secure_dir, tmp_path, change, {}).kafka
    ds = _dataset(k.bootstrap_servers)
    t0 = time.monotonic()
    with pytest.raises(KafkaUnavailable, match=cause):
        ensure_topic(ds, kafka=k, timeout_s=FAIL_TIMEOUT_S)
    with pytest.raises(KafkaUnavailable, match=cause):
        Gateway(ds, kafka=k, timeout_s=FAIL_TIMEOUT_S)  # it checks the topic first
    assert time.monotonic() - t0 < 4 * FAIL_TIMEOUT_S


def test_an_ingester_refused_by_kafka_turns_degraded_naming_the_cause(
    secure_dir: Path, tmp_path: Path
) -> None:
    good = _settings(secure_dir, tmp_path, {}, {})
    ds = _dataset(good.kafka.bootstrap_servers)
    ensure_topic(ds, kafka=good.kafka, timeout_s=30)
    bad = _settings(
        secure_dir, tmp_path, {"sasl_password_file": "", "sasl_password": "pw-X7-never-shown"}, {}
    )
    bad = bad.model_copy(
        update={"ingest": bad.ingest.model_copy(update={"kafka_retry_timeout_s": 1.0})}
    )
    meta, columns = open_stores(bad)
    meta.create_dataset(ds)
    degraded = threading.Event()
    events: list[ShardEvent] = []

    def report(e: ShardEvent) -> None:
        events.append(e)
        if isinstance(e, IngestionDegraded):
            degraded.set()

    ingester = KafkaShardIngester(
        ds, 0, "n1", meta=meta, columns=columns, settings=bad, report=report
    )
    try:
        asyncio.run(ingester.start())
        assert degraded.wait(30), events
        message = next(e for e in events if isinstance(e, IngestionDegraded)).message
        assert "invalid credentials" in message, message
        assert "pw-X7-never-shown" not in message
        assert not any(isinstance(e, IngestionStarted) for e in events)
    finally:
        asyncio.run(ingester.stop())
        meta.close()
        columns.close()


def test_a_missing_password_file_is_a_clear_error(secure_dir: Path, tmp_path: Path) -> None:
    k = _settings(secure_dir, tmp_path, {"sasl_password_file": str(tmp_path / "nope")}, {}).kafka
    with pytest.raises(CredentialsUnreadable, match=r"kafka\.sasl_password_file"):
        ensure_topic(_dataset(k.bootstrap_servers), kafka=k, timeout_s=FAIL_TIMEOUT_S)


# ----- Cassandra ----------------------------------------------------------------------------------


def _cassandra(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"store": settings.store.model_copy(update={"backend": "cassandra"})}
    )


def test_stores_write_and_read_chunks_with_password_and_tls(
    secure_dir: Path, tmp_path: Path
) -> None:
    settings = _cassandra(_settings(secure_dir, tmp_path, {}, {"connect_timeout_s": 20.0}))
    ds = _dataset("127.0.0.1:9")
    ref = ds.ref
    ts = np.arange(1_700_000_000_000, 1_700_000_000_000 + 60_000, 1000, dtype=np.int64)
    vals = np.arange(len(ts), dtype=np.float64)
    meta, columns = open_stores(settings)
    try:
        meta.create_dataset(ds)
        assert [d.name for d in meta.list_datasets()] == [ds.name]
        epoch = meta.claim_epoch(ref, 0, "n1")
        assert epoch >= 1
        key = PartKeyRecord.from_labels(_samples(1)[0][0], int(ts[0]), int(ts[-1]))
        columns.write_part_keys(ref, 0, [key])
        columns.write_chunks(
            ref,
            0,
            [ChunkRecord(key.part_key, int(ts[0]), int(ts[-1]), len(ts), encode_chunk(ts, vals))],
        )
        assert columns.list_part_keys(ref, 0) == [key]
        (chunk,) = columns.read_chunks(ref, 0, [key.part_key], int(ts[0]), int(ts[-1]))[
            key.part_key
        ]
        got_ts, got_vals = decode_chunk(chunk.data)
        assert np.array_equal(got_ts, ts) and np.array_equal(got_vals, vals)
        meta._conn.session.execute(f"DROP KEYSPACE {settings.cassandra.keyspace}", timeout=60)
    finally:
        meta.close()
        columns.close()


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        ({"password_file": "", "password": "not-the-password"}, "Bad credentials"),
        ({"ssl_ca_file": ""}, "CERTIFICATE_VERIFY_FAILED"),
    ],
    ids=["wrong-password", "no-ca"],
)
def test_refused_store_connections_fail_fast_naming_the_cause(
    secure_dir: Path, tmp_path: Path, change: dict[str, Any], cause: str
) -> None:
    settings = _cassandra(_settings(secure_dir, tmp_path, {}, change))
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable, match=cause):
        open_stores(settings)
    assert time.monotonic() - t0 < 3 * FAIL_TIMEOUT_S


def test_settings_never_show_the_secrets(secure_dir: Path, tmp_path: Path) -> None:
    s = _settings(
        secure_dir,
        tmp_path,
        {"sasl_password_file": "", "sasl_password": "kafka-s3cret"},
        {"password_file": "", "password": "cass-s3cret"},
    )
    for text in (repr(s), str(s), s.model_dump_json(), str(s.model_dump())):
        assert "s3cret" not in text
    assert s.kafka.password() == "kafka-s3cret" and s.cassandra.secret() == "cass-s3cret"


# ----- end to end ---------------------------------------------------------------------------------


@pytest.mark.ray
def test_a_cluster_ingests_from_secured_kafka_into_secured_cassandra(
    secure_dir: Path, tmp_path: Path, ray_cluster: LocalRayCluster
) -> None:
    """The singleton creates the topic, two nodes consume over SASL_SSL and flush to Cassandra
    over TLS with a password: the settings reach every process of the cluster."""
    secured = _settings(secure_dir, tmp_path, {}, {"connect_timeout_s": 20.0})
    base = cluster_settings(tmp_path, "kafka", flush_interval_s=0.5, max_chunk_samples=10)
    settings = base.model_copy(
        update={
            "kafka": secured.kafka,
            "cassandra": secured.cassandra,
            "store": base.store.model_copy(update={"backend": "cassandra"}),
        }
    )
    c = start_cluster(ray_cluster, settings)
    for _ in range(2):
        c.add_node()
    c.wait_for("2 members", lambda: len(c.client.members()) == 2)
    ds = Dataset(
        name=f"e2e{uuid.uuid4().hex[:8]}",
        num_shards=2,
        min_num_nodes=2,
        source=SourceSettings(bootstrap_servers=secured.kafka.bootstrap_servers),
    )
    assert c.client.setup_dataset(ds)
    c.wait_for("both shards active", lambda: c.client.shard_map(ds.name).is_healthy(), 90)
    series = [{"_metric_": "up", "_ws_": "w", "_ns_": "n", "instance": f"i{i}"} for i in range(20)]
    rows = [(s, 1_700_000_000_000 + 1000 * k, float(k)) for k in range(30) for s in series]
    with Gateway(ds, kafka=settings.kafka, timeout_s=10) as gw:
        gw.send(rows)
    assert gw.progress(final=True).samples_acked == len(rows)

    meta, columns = open_stores(settings)  # what the nodes flushed, read over TLS

    def stored() -> int:
        keys = [k.part_key for s in range(2) for k in columns.list_part_keys(ds.ref, s)]
        return sum(
            ch.num_samples
            for s in range(2)
            for chunks in columns.read_chunks(ds.ref, s, keys, 0, 2**62).values()
            for ch in chunks
        )

    try:
        # Chunks of 10 samples are sealed and flushed; the last open one may stay in memory.
        c.wait_for("sealed chunks of every series in Cassandra", lambda: stored() >= 20 * 20)
        assert c.client.shard_map(ds.name).is_healthy()
        meta._conn.session.execute(f"DROP KEYSPACE {settings.cassandra.keyspace}", timeout=60)
    finally:
        meta.close()
        columns.close()


def test_status_names_the_secured_instances_beside_the_plain_ones(secure_dir: Path) -> None:
    status = _script("status")
    assert status.returncode == 0, status.stderr
    for name in ("kafka-secure", "cassandra-secure"):
        assert f"{name}: running" in status.stderr, status.stderr
    assert (secure_dir / "ca.pem").is_file()
    assert (secure_dir / "kafka.password").stat().st_mode & 0o077 == 0  # this user's only

"""Issue 11, items 4 and 12: the dataset's label limits and metric name, enforced where records
are decoded, and no input record, however odd, stopping a shard.

Decoder tests run in-process; the end-to-end tests write bad records straight to a real Kafka
topic (as any producer may) among good ones and ingest them with a real ingester into SQLite and
into Cassandra, then make another node take the shard over and replay them.
"""

from __future__ import annotations

import asyncio
import json
import struct
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from hypothesis import given
from hypothesis import strategies as st

from core.config import Settings, load_settings
from core.dataset import Dataset, LabelLimits, RecordFormat, SourceSettings, SpreadSettings
from core.shard_status import IngestionError, IngestionStarted, ShardEvent
from ingest.bad_records import BadRecord, Decoded, series_problem
from ingest.batch import SampleBatch
from ingest.ingester import KafkaShardIngester
from ingest.memstore import ShardMemstore
from ingest.records import decoder_for
from ingest.topics import ensure_topic
from ingest.wire.binary_format import HEADER, MAGIC, decode_binary, encode_binary
from ingest.wire.line_protocol import decode_influx
from store import INT64_MAX, INT64_MIN, ColumnStore, MetaStore, open_stores
from store.api import ChunkRecord, encode_part_key
from store.cassandra import open_cassandra_stores
from tests.waiting import wait_for

T0 = 1_700_000_000_000
NS = 1_000_000
GOOD_A = {"_metric_": "up", "_ws_": "w", "_ns_": "n", "instance": "a"}
GOOD_B = {"_metric_": "up", "_ws_": "w", "_ns_": "n", "instance": "b"}
LONG_VALUE = {"_metric_": "up", "_ws_": "w", "_ns_": "n", "blob": "x" * 70_000}
MANY_LABELS = {"_metric_": "up", "_ws_": "w", "_ns_": "n", **{f"l{i}": "v" for i in range(300)}}
EMPTY_METRIC = {"_metric_": "", "_ws_": "w", "_ns_": "n", "instance": "c"}


def _batch(series: list[dict[str, str]], idx: list[int], ts: list[int]) -> SampleBatch:
    return SampleBatch(
        series,
        np.asarray(idx, np.int32),
        np.asarray(ts, np.int64),
        np.arange(len(idx), dtype=np.float64),
    )


def _kept(got: Decoded) -> list[tuple[tuple[tuple[str, str], ...], int]]:
    b = got.batch
    return [
        (tuple(sorted(b.series[i].items())), t)
        for i, t in zip(b.series_idx.tolist(), b.timestamps.tolist(), strict=True)
    ]


# ------------------------------------------------------------------------------ decoders


@pytest.mark.parametrize(
    ("bad", "reason", "why"),
    [
        (LONG_VALUE, "label_too_long", "70000 bytes, over limits.max_label_value_bytes = 16384"),
        (MANY_LABELS, "too_many_labels", "303 labels, over limits.max_labels_per_series = 64"),
        (EMPTY_METRIC, "no_metric", "no metric name"),
        ({"_metric_": "up", "n" * 257: "v"}, "label_name_too_long", "257 bytes, over"),
        ({"_metric_": "up", "": "v"}, "empty_label_name", "empty label name"),
        ({"__name__": "", "job": "j"}, "no_metric", "no metric name"),
        # 9000 characters, 18000 bytes: limits are in UTF-8 bytes
        ({"_metric_": "up", "city": "é" * 9000}, "label_too_long", "18000 bytes"),
        # three values within the limit, 45 KB together: over the series key limit
        (
            {"_metric_": "up", **{f"k{i}": "v" * 15_000 for i in range(3)}},
            "series_key_too_long",
            "over limits.max_series_key_bytes = 32768",
        ),
        # 10 KB of control characters become 60 KB of JSON escapes in the stored key
        ({"_metric_": "up", "ctl": "\x01" * 10_000}, "series_key_too_long", "60026 bytes"),
    ],
)
def test_a_binary_series_breaking_the_contract_is_counted_per_sample_and_dropped(
    bad: dict[str, str], reason: str, why: str
) -> None:
    got = decode_binary(encode_binary(_batch([GOOD_A, bad, GOOD_B], [0, 1, 2, 1, 1, 0], [T0] * 6)))
    assert got.batch.bad_records == {reason: 3}
    assert got.batch.series == [GOOD_A, GOOD_B]  # the bad series is gone, not only its samples
    assert got.batch.values.tolist() == [0.0, 2.0, 5.0]
    assert got.first_bad is not None and got.first_bad.startswith(reason) and why in got.first_bad
    assert series_problem(bad) is not None and series_problem(bad)[0] == reason  # type: ignore[index]


def test_within_the_limits_is_kept_and_the_key_size_is_exact_not_a_bound() -> None:
    fine = [
        {"_metric_": "up", "blob": "x" * 16_384, "n" * 256: "v"},
        {"_metric_": "up", **{f"l{i}": "v" for i in range(63)}},
        {"_metric_": "up", "ctl": "\x01" * 5_000},  # 30 KB of escapes: under 32768
        {"_metric_": "up", "city": "é" * 8192, "": ""},  # an empty label is absent, allowed
        {"__name__": "up", "job": "j"},
    ]
    assert all(len(encode_part_key(s).encode()) <= 32_768 for s in fine)
    batch = _batch(fine, list(range(len(fine))), [T0] * len(fine))
    got = decode_binary(encode_binary(batch))
    assert got.batch.bad_records == {} and got.batch.series == fine


def test_empty_metric_names_are_no_metric_not_stored() -> None:
    series = [{"_metric_": ""}, {"__name__": ""}, {"_metric_": "", "__name__": "x"}, GOOD_A]
    got = decode_binary(encode_binary(_batch(series, [0, 1, 2, 3], [T0] * 4)))
    assert got.batch.bad_records == {"no_metric": 3} and got.batch.series == [GOOD_A]


def test_the_datasets_own_limits_are_enforced_by_its_decoder() -> None:
    limits = LabelLimits(
        max_label_name_bytes=8,
        max_label_value_bytes=16,
        max_labels_per_series=3,
        max_series_key_bytes=64,
    )
    ds = Dataset(name="tight", num_shards=2, limits=limits)
    series = [
        {"_metric_": "m", "a": "x" * 16},
        {"_metric_": "m", "a": "x" * 17},
        {"_metric_": "m", "abcdefghi": "x"},
        {"_metric_": "m", "a": "1", "b": "2", "c": "3"},
        {"_metric_": "m", "a": "x" * 16, "b": "y" * 16},  # 62 bytes of JSON: fits
        {"_metric_": "m", "a": "x" * 16, "bb": "y" * 16},  # 63
        {"_metric_": "m", "aaa": "x" * 16, "bb": "y" * 16},  # 65: over
    ]
    got = decoder_for(ds)(encode_binary(_batch(series, list(range(7)), [T0] * 7)), T0)
    assert got.batch.bad_records == {
        "label_too_long": 1,
        "label_name_too_long": 1,
        "too_many_labels": 1,
        "series_key_too_long": 1,
    }
    assert got.batch.series == [series[0], series[4], series[5]]
    # the default dataset takes them all
    assert (
        decoder_for(Dataset(name="d", num_shards=2))(
            encode_binary(_batch(series, list(range(7)), [T0] * 7)), T0
        ).batch.bad_records
        == {}
    )


def test_line_protocol_series_breaking_the_contract_are_counted_per_field() -> None:
    ds = Dataset(name="i", num_shards=2, source=SourceSettings(record_format=RecordFormat.INFLUX))
    many = ",".join(f"t{i}=v" for i in range(300))
    lines = [
        f"cpu,host=a user=1,sys=2 {T0 * NS}",
        f"cpu,host=a,blob={'x' * 40_000} user=3,sys=4 {T0 * NS}",
        f"cpu,host=a,blob={'x' * 70_000} user=3,sys=4 {T0 * NS}",  # the parser's key limit
        f"cpu,{many} user=5 {T0 * NS}",
        f"{'m' * 20_000},host=a value=6 {T0 * NS}",  # the measurement is the metric name
        f"cpu,{'k' * 300}=v user=7 {T0 * NS}",
        f'cpu,host=a,q=x\\ y msg="s",user=8 {T0 * NS}',  # parser path: escapes and a string
        f"cpu,host=b,esc=x\\ {'y' * 17_000} user=9 {T0 * NS}",  # parser path, too long
        f"cpu,host=a user=10 {(T0 + 1) * NS}",
    ]
    for decode in (decoder_for(ds), lambda d, t: decode_influx(d, t, fast_path=False)):
        got = decode("\n".join(lines).encode(), T0)
        assert got.batch.bad_records == {
            "label_too_long": 4,
            "too_many_labels": 1,
            "label_name_too_long": 1,
            "non_numeric": 1,
            "undecodable": 1,
        }
        assert sorted(got.batch.values.tolist()) == [1.0, 2.0, 8.0, 10.0]
        assert all(series_problem(s) is None for s in got.batch.series)


# ------------------------------------------------------------------------------ fuzzing

TIGHT = LabelLimits(
    max_label_name_bytes=6,
    max_label_value_bytes=10,
    max_labels_per_series=4,
    max_series_key_bytes=64,
)
_text = st.text(alphabet=st.sampled_from('ab_é\x00\x01"\\🌡'), max_size=14)
_labels = st.dictionaries(_text, _text, max_size=6).flatmap(
    lambda d: st.sampled_from([d, {**d, "_metric_": "m"}, {**d, "__name__": "n"}])
)


@st.composite
def _batches(draw: st.DrawFn) -> SampleBatch:
    series = draw(st.lists(_labels, min_size=1, max_size=6))
    n = draw(st.integers(0, 20))
    idx = draw(st.lists(st.integers(0, len(series) - 1), min_size=n, max_size=n))
    ts = draw(st.lists(st.integers(-(1 << 40), 1 << 50), min_size=n, max_size=n))
    return _batch(series, idx, ts)


def _assert_safe(got: Decoded, limits: LabelLimits, ts_range: tuple[int, int] | None) -> None:
    """What an ingester may pass on to the memstore and the stores."""
    b = got.batch
    assert isinstance(b, SampleBatch)
    assert set(b.bad_records) <= {r.value for r in BadRecord}
    assert all(isinstance(n, int) and n > 0 for n in b.bad_records.values())
    assert (got.first_bad is None) == (not b.bad_records)
    if len(b):
        assert int(b.series_idx.min()) >= 0 and int(b.series_idx.max()) < len(b.series)
    if ts_range is not None and len(b):
        assert ts_range[0] <= int(b.timestamps.min()) and int(b.timestamps.max()) <= ts_range[1]
    for s in b.series:
        assert series_problem(s, limits=limits) is None, s
        assert len(encode_part_key(s).encode("utf-8")) <= limits.max_series_key_bytes
    # ... and the memstore takes it all and seals storable chunks.
    mem = ShardMemstore(Dataset(name="fuzz", num_shards=2, limits=limits), 0, groups_per_shard=2)
    stats = mem.ingest(b, 0)
    assert stats.invalid_series == 0
    for g in range(2):
        for pk in mem.seal_group(g).part_keys:
            assert len(pk.part_key.encode("utf-8")) <= limits.max_series_key_bytes


@given(batch=_batches())
def test_valid_messages_keep_exactly_the_series_within_the_contract(batch: SampleBatch) -> None:
    got = decode_binary(encode_binary(batch, 0), limits=TIGHT, ts_range=(-(1 << 40), 1 << 50))
    _assert_safe(got, TIGHT, None)
    problems = [series_problem(s, limits=TIGHT) for s in batch.series]
    want_bad: dict[str, int] = {}
    for i in batch.series_idx.tolist():
        if problems[i] is not None:
            r = problems[i][0].value  # type: ignore[index]
            want_bad[r] = want_bad.get(r, 0) + 1
    assert got.batch.bad_records == want_bad  # the NumPy checks agree with the per-series rule
    kept = [
        (tuple(sorted(batch.series[i].items())), t)
        for i, t in zip(batch.series_idx.tolist(), batch.timestamps.tolist(), strict=True)
        if problems[i] is None
    ]
    assert _kept(got) == kept


@given(
    batch=_batches(),
    level=st.sampled_from([0, 1]),
    edits=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=6),
    inserts=st.lists(st.tuples(st.integers(0, 1 << 16), st.binary(max_size=8)), max_size=2),
    cut=st.integers(0, 1 << 16),
)
def test_mutated_binary_messages_never_raise_and_pass_on_only_safe_series(
    batch: SampleBatch, level: int, edits, inserts, cut: int
) -> None:
    data = bytearray(encode_binary(batch, level))
    for pos, byte in edits:
        data[pos % len(data)] = byte
    for pos, blob in inserts:
        data[pos % len(data) : pos % len(data)] = blob
    data = data[: max(cut, 8 * len(data) // 10)]
    got = decode_binary(bytes(data), limits=TIGHT)
    _assert_safe(got, TIGHT, (0, 253_402_300_799_999))


@given(
    header=st.tuples(
        st.sampled_from([0, 1]),  # flags (1: zstd, over a raw body it is undecodable)
        st.sampled_from([1, 2, 4, 3]),
        st.sampled_from([4, 8, 2]),
        st.integers(0, 40),
        st.integers(0, 40),
        st.integers(-(1 << 63), (1 << 63) - 1),
    ),
    body=st.binary(max_size=600),
    table=st.lists(_text, max_size=12),
)
def test_random_bodies_behind_a_valid_header_never_raise(header, body: bytes, table) -> None:
    flags, iw, tw, n_series, n, base = header
    body = body + b"\xff".join(s.encode() for s in table)
    data = HEADER.pack(MAGIC, 1, flags, iw, tw, n_series, n, base, len(body)) + body
    _assert_safe(decode_binary(data, limits=TIGHT), TIGHT, (0, 253_402_300_799_999))


@given(data=st.binary(max_size=400))
def test_random_bytes_never_raise_in_either_decoder(data: bytes) -> None:
    for fmt in RecordFormat:
        ds = Dataset(name="f", num_shards=2, limits=TIGHT, source=SourceSettings(record_format=fmt))
        _assert_safe(decoder_for(ds)(data, T0), TIGHT, (0, 253_402_300_799_999))


_tag = st.text(alphabet=st.sampled_from('ab,= \\"é1\t'), min_size=0, max_size=12)


@given(
    lines=st.lists(
        st.tuples(_tag, st.lists(st.tuples(_tag, _tag), max_size=6), _tag, st.integers(0, 3)),
        min_size=1,
        max_size=5,
    )
)
def test_line_protocol_near_misses_never_raise(lines) -> None:
    text = "\n".join(
        f"{m}{''.join(f',{k}={v}' for k, v in tags)} {f}={n}" for m, tags, f, n in lines
    )
    for fast in (True, False):
        got = decode_influx(text.encode(), T0, fast_path=fast, limits=TIGHT)
        _assert_safe(got, TIGHT, None)


# ------------------------------------------------------------------------------ Cassandra guard


@pytest.mark.cassandra
def test_cassandra_refuses_a_key_it_cannot_hold_with_a_clear_error(
    cassandra_address: tuple[str, int],
) -> None:
    host, port = cassandra_address
    meta, columns = open_cassandra_stores([host], port, "filopy_limits")
    try:
        ref = Dataset(name=f"g{uuid.uuid4().hex[:8]}", num_shards=2).ref
        key = encode_part_key(LONG_VALUE)
        chunk = ChunkRecord.from_samples(key, np.array([T0], np.int64), np.array([1.0]))
        with pytest.raises(ValueError, match=r"exceeds the 65\d+ bytes Cassandra can key"):
            columns.write_chunks(ref, 0, [chunk])
        assert columns.read_chunks(ref, 0, [key], INT64_MIN, INT64_MAX) == {}
    finally:
        meta.close()
        columns.close()


# ------------------------------------------------------------------------------ end to end


def _settings(tmp_path: Path, backend: str, flush_interval_s: float) -> Settings:
    base = load_settings()
    return base.model_copy(
        update={
            "store": base.store.model_copy(
                update={"backend": backend, "sqlite_path": tmp_path / "f.db"}
            ),
            "cassandra": base.cassandra.model_copy(
                update={"contact_points": ("127.0.0.1",), "keyspace": "filopy_limits"}
            ),
            "ingest": base.ingest.model_copy(
                update={"groups_per_shard": 2, "flush_interval_s": flush_interval_s}
            ),
        }
    )


@contextmanager
def _running(
    ds: Dataset, node: str, settings: Settings, meta: MetaStore, columns: ColumnStore
) -> Iterator[tuple[KafkaShardIngester, list[ShardEvent]]]:
    events: list[ShardEvent] = []
    ingester = KafkaShardIngester(
        ds, 0, node, meta=meta, columns=columns, settings=settings, report=events.append
    )
    asyncio.run(ingester.start())
    try:
        yield ingester, events
    finally:
        asyncio.run(ingester.stop())


def _messages() -> list[bytes]:
    """Good and bad records as anyone may write them to the topic, bypassing the gateway."""
    return [
        encode_binary(_batch([GOOD_A, GOOD_B], [0, 1], [T0, T0])),
        encode_binary(_batch([GOOD_A, LONG_VALUE], [0, 1, 1], [T0 + 1, T0, T0 + 1])),
        encode_binary(_batch([MANY_LABELS, GOOD_B], [0, 1, 0, 0], [T0, T0 + 1, T0 + 1, T0 + 2])),
        encode_binary(_batch([EMPTY_METRIC], [0, 0, 0, 0], [T0, T0 + 1, T0 + 2, T0 + 3])),
        b"\x00" * 7 + b"not a record",
        struct.pack("<3sB", MAGIC, 1) + b"\xff" * 40,
        encode_binary(_batch([GOOD_A, GOOD_B], [0, 1], [T0 + 2, T0 + 2])),
    ]


BAD = {"label_too_long": 2, "too_many_labels": 3, "no_metric": 4, "undecodable": 2}


def _stored(columns: ColumnStore, ds: Dataset) -> dict[str, list[int]]:
    keys = [pk.part_key for pk in columns.list_part_keys(ds.ref, 0)]
    chunks = columns.read_chunks(ds.ref, 0, keys, INT64_MIN, INT64_MAX)
    return {
        json.loads(k)["instance"]: sorted(
            t for c in chunks.get(k, []) for t in c.samples()[0].tolist()
        )
        for k in keys
    }


def _no_errors(events: list[ShardEvent]) -> bool:
    return not any(isinstance(e, IngestionError) for e in events)


@pytest.mark.kafka
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("cassandra", marks=pytest.mark.cassandra)]
)
def test_bad_records_on_the_topic_are_counted_and_never_stop_a_shard_nor_its_replay(
    backend: str, kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "cassandra":
        request.getfixturevalue("cassandra_address")
    ds = Dataset(
        name=f"lim{uuid.uuid4().hex[:8]}",
        num_shards=1,
        spread=SpreadSettings(default=0),
        source=SourceSettings(
            topic=f"limits-{uuid.uuid4().hex[:10]}", bootstrap_servers=kafka_bootstrap
        ),
    )
    # Node 1 never flushes on its own; node 2 flushes often.
    slow, fast = _settings(tmp_path, backend, 3600.0), _settings(tmp_path, backend, 0.3)
    meta, columns = open_stores(fast)
    ensure_topic(ds)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 2_000_000})
    try:
        meta.create_dataset(ds)
        for m in _messages():
            producer.produce(ds.topic, value=m, partition=0)
        assert producer.flush(30) == 0
        n = len(_messages())
        with _running(ds, "n1", slow, meta, columns) as (first, events1):
            wait_for("node 1 reads every record", lambda: first.next_offset == n)
            wait_for(f"live: {events1}", lambda: isinstance(events1[-1], IngestionStarted))
            assert dict(first.bad_records) == BAD
            assert first.memstore.num_series == 2 and first.memstore.memory_samples() == 6
            # Node 1 is presumed dead: node 2 takes the shard over and replays it all.
            with _running(ds, "n2", fast, meta, columns) as (second, events2):
                wait_for("node 2 replays every record", lambda: second.next_offset == n)
                assert dict(second.bad_records) == BAD
                wait_for(
                    f"node 2 flushes and checkpoints: {events2}",
                    lambda: (
                        second.flusher is not None and second.flusher.totals().checkpoint == n - 1
                    ),
                )
                # The shard goes on: a good record after the replay is ingested and flushed.
                after = encode_binary(_batch([GOOD_A], [0], [T0 + 3]))
                producer.produce(ds.topic, value=after, partition=0)
                assert producer.flush(30) == 0
                wait_for("flushes after", lambda: second.flusher.totals().checkpoint == n)  # type: ignore[union-attr]
                assert isinstance(events2[-1], IngestionStarted) and _no_errors(events2), events2
            assert _no_errors(events1), events1  # fenced at its final flush: a warning only
        assert _stored(columns, ds) == {
            "a": [T0, T0 + 1, T0 + 2, T0 + 3],
            "b": [T0, T0 + 1, T0 + 2],
        }
        assert max(meta.read_checkpoints(ds.ref, 0).values()) == n
    finally:
        meta.close()
        columns.close()
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.delete_topics([ds.topic])[ds.topic].result(timeout=30)

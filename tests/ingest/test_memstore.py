"""The per-shard memstore, in memory only: ingest, ordering, index, sealing, memory bound."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.dataset import Dataset
from core.hashing import partition_key_hash
from ingest.batch import SampleBatch
from ingest.memstore import NONE_TS, ShardMemstore, flush_group_of
from ingest.seal import chunk_cuts
from store import LabelMatcher, PartKeyRecord, decode_chunk, encode_part_key

DS = Dataset(name="mem", num_shards=4)


def _mem(**kw) -> ShardMemstore:
    args = dict(
        groups_per_shard=4,
        max_chunk_samples=4,
        chunk_span_ms=1_000,
        retention_ms=10_000,
        max_samples=1_000_000,
    )
    args.update(kw)
    return ShardMemstore(DS, 0, **args)


def _labels(i: int, **extra: str) -> dict[str, str]:
    return {"_metric_": "cpu", "_ws_": "w", "_ns_": "n", "host": f"h{i}", **extra}


def batch(samples: list[tuple[dict[str, str], int, float]]) -> SampleBatch:
    """A batch from (labels, ts, value) triples, series deduplicated as the decoders do."""
    series: list[dict[str, str]] = []
    index: dict[str, int] = {}
    idx = []
    for labels, _, _ in samples:
        key = encode_part_key(labels)
        if key not in index:
            index[key] = len(series)
            series.append(labels)
        idx.append(index[key])
    return SampleBatch(
        series,
        np.array(idx, np.int32),
        np.array([t for _, t, _ in samples], np.int64),
        np.array([v for _, _, v in samples], np.float64),
    )


def _sid(m: ShardMemstore, labels: dict[str, str]) -> int:
    sid = m.series_id(labels)
    assert sid is not None
    return sid


# ----------------------------------------------------------------------------- ingest, query


def test_ingest_and_query_from_memory() -> None:
    m = _mem()
    a, b = _labels(1), _labels(2)
    st1 = m.ingest(batch([(a, 100, 1.0), (b, 100, 2.0), (a, 200, 3.0)]), 0)
    st2 = m.ingest(batch([(b, 300, 4.0), (a, 250, 5.0)]), 1)
    assert (st1.ingested, st1.new_series, st2.ingested, st2.new_series) == (3, 2, 2, 0)
    ts, vals = m.samples(_sid(m, a))
    assert ts.tolist() == [100, 200, 250] and vals.tolist() == [1.0, 3.0, 5.0]
    ts, vals = m.samples(_sid(m, b), 150, 300)
    assert ts.tolist() == [300] and vals.tolist() == [4.0]
    assert m.memory_samples() == 5 and m.num_series == 2
    assert m.time_range(_sid(m, a)) == (100, 250)
    assert m.labels(_sid(m, a)) == a and m.part_key(_sid(m, a)) == encode_part_key(a)
    assert m.stats.ingested == 5 and m.stats.messages == 2


def test_query_returns_copies_not_views_of_buffers() -> None:
    m = _mem()
    a = _labels(1)
    m.ingest(batch([(a, 1, 1.0)]), 0)
    ts, _ = m.samples(_sid(m, a))
    m.seal_group(m.group_of(_sid(m, a)))
    m.ingest(batch([(a, 2, 2.0)]), 1)  # reuses the open buffer's first slot
    assert ts.tolist() == [1]


def test_empty_label_values_are_absent_labels() -> None:
    m = _mem()
    m.ingest(batch([(_labels(1, dc=""), 1, 1.0)]), 0)
    m.ingest(batch([(_labels(1), 2, 2.0)]), 1)
    assert m.num_series == 1
    assert m.samples(0)[0].tolist() == [1, 2]
    assert m.labels(0) == _labels(1)


def test_invalid_labels_are_dropped_and_counted() -> None:
    m = _mem()
    bad = SampleBatch(
        [{"_metric_": "x", "n": 3}, _labels(1)],  # type: ignore[dict-item]
        np.array([0, 1, 0], np.int32),
        np.array([1, 1, 2], np.int64),
        np.array([1.0, 2.0, 3.0]),
    )
    st = m.ingest(bad, 0)
    assert (st.invalid_series, st.ingested, m.num_series) == (2, 1, 1)


def test_empty_batch_advances_watermarks() -> None:
    m = _mem()
    m.ingest(SampleBatch.empty(), 7)
    assert all(m.watermark(g) == 7 for g in range(4))


# --------------------------------------------------------------------------- out of order


def test_within_a_message_time_order_wins_across_messages_late_samples_are_dropped() -> None:
    m = _mem()
    a, b = _labels(1), _labels(2)
    # In one message: a's samples in any order are taken sorted; its repeated ts 10 keeps the
    # first sample (1.0).
    st = m.ingest(
        batch([(a, 10, 1.0), (a, 10, 9.0), (a, 5, 8.0), (a, 20, 2.0), (b, 7, 3.0), (a, 15, 7.0)]),
        0,
    )
    assert (st.ingested, st.out_of_order) == (5, 1)
    # Later messages: only samples after each series' last one.
    st = m.ingest(batch([(a, 20, 9.0), (a, 21, 4.0), (b, 7, 9.0), (b, 6, 9.0)]), 1)
    assert (st.ingested, st.out_of_order) == (1, 3)
    assert m.samples(_sid(m, a))[0].tolist() == [5, 10, 15, 20, 21]
    assert m.samples(_sid(m, a))[1].tolist() == [8.0, 1.0, 7.0, 2.0, 4.0]
    assert m.samples(_sid(m, b))[1].tolist() == [3.0]
    assert m.stats.out_of_order == 4


def _reference(messages: list[list[tuple[int, int]]]) -> dict[int, list[tuple[int, float]]]:
    """Sequential model of the ordering policy: per message, each series' samples in time
    order (a repeated ts keeps its first sample); a sample is kept iff its ts beats every
    sample of its series from earlier messages."""
    last: dict[int, int] = {}
    out: dict[int, list[tuple[int, float]]] = {}
    value = 0.0
    for msg in messages:
        numbered = []
        for s, t in msg:
            value += 1
            numbered.append((s, t, value))
        seen: set[tuple[int, int]] = set()
        for s, t, v in sorted(numbered, key=lambda x: (x[0], x[1], x[2])):
            if (s, t) in seen:
                continue
            seen.add((s, t))
            if t > last.get(s, -(1 << 62)):
                out.setdefault(s, []).append((t, v))
        for s, t, _ in numbered:
            last[s] = max(last.get(s, -(1 << 62)), t)
    return out


@settings(max_examples=60)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 4), st.integers(0, 30)), max_size=25),
        min_size=1,
        max_size=8,
    )
)
def test_ordering_policy_matches_sequential_model(messages: list[list[tuple[int, int]]]) -> None:
    """The vectorised filter (fast and segmented-max paths) equals the per-sample rule."""
    m = _mem()
    value = 0.0
    for off, msg in enumerate(messages):
        samples = []
        for s, t in msg:
            value += 1
            samples.append((_labels(s), t, value))
        m.ingest(batch(samples) if samples else SampleBatch.empty(), off)
    expected = _reference(messages)
    for s in range(5):
        sid = m.series_id(_labels(s))
        got = [] if sid is None else list(zip(*(a.tolist() for a in m.samples(sid)), strict=True))
        assert got == expected.get(s, [])
    total = sum(len(msg) for msg in messages)
    assert m.stats.ingested + m.stats.out_of_order == total


# ------------------------------------------------------------------------------------ index


def _index_fixture() -> ShardMemstore:
    m = _mem()
    rows = [
        {"_metric_": "cpu", "host": "a", "dc": "eu"},
        {"_metric_": "cpu", "host": "b", "dc": "us"},
        {"_metric_": "cpu", "host": "c"},
        {"_metric_": "mem", "host": "a", "dc": "eu", "env": "prod"},
        {"_metric_": "mem", "host": "bb", "env": ""},
    ]
    m.ingest(batch([(r, 1, 1.0) for r in rows]), 0)
    return m


MATCHER_CASES = [
    [("_metric_", "=", "cpu")],
    [("_metric_", "=", "cpu"), ("dc", "=", "eu")],
    [("dc", "=", "")],
    [("dc", "!=", "")],
    [("dc", "!=", "eu")],
    [("host", "=~", "b.*")],
    [("host", "=~", "b")],
    [("dc", "=~", "eu|")],
    [("dc", "!~", "e.")],
    [("env", "!~", ".+"), ("_metric_", "=", "mem")],
    [("nope", "=", "")],
    [("nope", "=", "x")],
    [("_metric_", "=~", ".*"), ("host", "!=", "a"), ("dc", "!~", "us")],
    [],
]


@pytest.mark.parametrize("spec", MATCHER_CASES, ids=lambda s: " ".join(map("".join, s)) or "none")
def test_find_series_matches_prometheus_semantics(spec: list[tuple[str, str, str]]) -> None:
    m = _index_fixture()
    matchers = [LabelMatcher(label, op, value) for label, op, value in spec]  # type: ignore[arg-type]
    expected = [s for s in range(m.num_series) if all(x.matches(m.labels(s)) for x in matchers)]
    assert m.find_series(matchers) == expected


def test_find_series_concrete_answers() -> None:
    m = _index_fixture()
    hosts = lambda ids: sorted(m.labels(i)["host"] for i in ids)  # noqa: E731
    assert hosts(m.find_series([LabelMatcher("dc", "=", "")])) == ["bb", "c"]
    assert hosts(m.find_series([LabelMatcher("host", "=~", "b")])) == ["b"]  # anchored
    assert hosts(m.find_series([LabelMatcher("dc", "!~", "e.")])) == ["b", "bb", "c"]
    assert m.find_series([LabelMatcher("nope", "=", "x")]) == []


def test_find_series_filters_small_candidate_sets_directly() -> None:
    m = _mem()
    rows = [{"_metric_": "m", "i": str(i), "odd": str(i % 2)} for i in range(200)]
    m.ingest(batch([(r, 1, 1.0) for r in rows]), 0)
    found = m.find_series(
        [
            LabelMatcher("i", "=~", "1.*"),
            LabelMatcher("odd", "=", "1"),
            LabelMatcher("i", "!=", "1"),
        ]
    )
    assert sorted(int(m.labels(s)["i"]) for s in found) == [
        i for i in range(200) if str(i).startswith("1") and i % 2 and i != 1
    ]


# ----------------------------------------------------------------------------------- groups


def test_flush_group_is_partition_hash_mod_groups_and_deterministic() -> None:
    m1, m2 = _mem(groups_per_shard=8), _mem(groups_per_shard=8)
    rows = [_labels(i, job=f"j{i % 3}") for i in range(200)]
    m1.ingest(batch([(r, 1, 1.0) for r in rows]), 0)
    m2.ingest(batch([(r, 1, 1.0) for r in reversed(rows)]), 0)
    groups = []
    for r in rows:
        g = m1.group_of(_sid(m1, r))
        assert g == m2.group_of(_sid(m2, r)) == abs(partition_key_hash(r, DS)) % 8
        assert g == flush_group_of(r, DS, 8)
        assert _sid(m1, r) in m1.group_series(g)
        groups.append(g)
    assert set(groups) == set(range(8))
    # the metric name is not part of the partition hash: same tags, same group
    assert flush_group_of({"_metric_": "a", "x": "1"}, DS, 8) == flush_group_of(
        {"_metric_": "b", "x": "1"}, DS, 8
    )


# ------------------------------------------------------------------------------- sealing


def test_chunk_cuts_follow_time_buckets_then_counts() -> None:
    ts = np.array([0, 10, 20, 30, 40, 50, 999, 1000, 1001, 2500], np.int64)
    assert chunk_cuts(ts, 1000, 4).tolist() == [0, 4, 7, 9, 10]
    assert chunk_cuts(ts, 1000, 100).tolist() == [0, 7, 9, 10]
    assert chunk_cuts(ts[:1], 1000, 1).tolist() == [0, 1]
    neg = np.array([-1500, -1001, -1000, -1, 0], np.int64)  # floor buckets below zero
    assert chunk_cuts(neg, 1000, 10).tolist() == [0, 2, 4, 5]


def test_seal_group_makes_chunks_and_part_keys() -> None:
    m = _mem()
    a = _labels(1)
    ts = [100, 200, 300, 400, 500, 600, 1100, 1200]
    m.ingest(batch([(a, t, float(t)) for t in ts[:3]]), 0)
    m.ingest(batch([(a, t, float(t)) for t in ts[3:]]), 1)
    sid = _sid(m, a)
    g = m.group_of(sid)
    sealed = m.seal_group(g)
    assert sealed.offset == 1 and sealed.samples == 8
    assert [(c.start_time, c.end_time, c.num_samples) for c in sealed.chunks] == [
        (100, 400, 4),
        (500, 600, 2),
        (1100, 1200, 2),
    ]
    assert sealed.part_keys == [PartKeyRecord(encode_part_key(a), 100, 1200)]
    got = np.concatenate([decode_chunk(c.data)[0] for c in sealed.chunks])
    assert got.tolist() == ts
    # sealed chunks still answer queries, and new samples go to a fresh buffer
    m.ingest(batch([(a, 1300, 1.0)]), 2)
    assert m.samples(sid)[0].tolist() == [*ts, 1300]
    assert m.samples(sid, 450, 1150)[0].tolist() == [500, 600, 1100]
    assert m.memory_samples() == 9 and m.unflushed_samples() == 9
    # the next seal starts a new segment; first_ts stays the series' first sample
    again = m.seal_group(g)
    assert [c.start_time for c in again.chunks] == [1300]
    assert again.part_keys == [PartKeyRecord(encode_part_key(a), 100, 1300)]
    other = (g + 1) % 4
    assert m.seal_group(other).chunks == []


# ------------------------------------------------------------------------- memory bound


def _fill(m: ShardMemstore, series: int, per: int, t0: int = 0, offset: int = 0) -> int:
    rows = [
        (_labels(s), t0 + k * 10, float(k)) for k in range(per) for s in range(series)
    ]  # interleaved, one message
    m.ingest(batch(rows), offset)
    return series * per


def test_memory_bound_evicts_only_flushed_chunks_oldest_first() -> None:
    m = _mem(max_samples=100, max_chunk_samples=5, chunk_span_ms=10_000, retention_ms=1 << 40)
    _fill(m, 10, 10, t0=0, offset=0)  # 100 samples: at the bound
    assert m.memory_samples() == 100 and not m.pressure
    # unflushed data is never evicted: going over only raises pressure
    _fill(m, 10, 2, t0=1000, offset=1)
    assert m.memory_samples() == 120 and m.pressure and m.stats.evicted_samples == 0
    for g in range(4):
        m.mark_flushed(m.seal_group(g))
    # everything is flushed now, so eviction brings memory down to 90% of the bound
    assert m.memory_samples() <= 90 and not m.pressure
    assert m.stats.evicted_samples == 120 - m.memory_samples()
    # each series keeps a suffix of its samples: memory_start splits memory from the store
    for s in range(10):
        sid = _sid(m, _labels(s))
        start = m.memory_start(sid)
        ts = m.samples(sid)[0]
        all_ts = [k * 10 for k in range(10)] + [1000, 1010]
        assert ts.tolist() == [t for t in all_ts if start is not None and t >= start]


def test_unflushed_pressure_then_flush_relieves() -> None:
    m = _mem(max_samples=50, max_chunk_samples=100, chunk_span_ms=100_000)
    _fill(m, 5, 12)
    assert m.pressure
    sealed = m.seal_group(m.group_of(0))
    assert m.pressure  # sealed but not yet in the store: still not evictable
    m.mark_flushed(sealed)
    for g in range(4):
        m.mark_flushed(m.seal_group(g))
    assert not m.pressure and m.unflushed_samples() == 0


def test_retention_evicts_flushed_chunks_outside_the_window() -> None:
    m = _mem(retention_ms=1_000, max_chunk_samples=100, chunk_span_ms=500)
    a = _labels(1)
    m.ingest(batch([(a, t, 1.0) for t in range(0, 3_000, 100)]), 0)
    sid = _sid(m, a)
    m.mark_flushed(m.seal_group(m.group_of(sid)))
    # chunks are the 500 ms buckets; newest sample 2900: chunks ending before 1900 go
    assert m.memory_start(sid) == 1500
    assert m.samples(sid)[0].tolist() == list(range(1500, 3000, 100))
    assert m.stats.evicted_samples == 15
    m.ingest(batch([(a, 5000, 1.0)]), 1)
    assert m.evict() == 15  # window before 5000: the rest of the flushed chunks
    assert m.samples(sid)[0].tolist() == [5000] and m.memory_start(sid) == 5000


# ----------------------------------------------------------------------- recovery rules


def test_checkpoints_skip_replayed_messages_per_group() -> None:
    m = _mem(groups_per_shard=2)
    rows = [_labels(i) for i in range(20)]
    g = [flush_group_of(r, DS, 2) for r in rows]
    assert set(g) == {0, 1}
    m.set_checkpoints({0: 5, 1: 3}, replay_until=9)
    assert m.recovering
    st = m.ingest(batch([(r, 1, 1.0) for r in rows]), 4)  # group 0 skipped, group 1 ingested
    assert st.skipped_replay == g.count(0) and st.ingested == g.count(1)
    st = m.ingest(batch([(r, 2, 1.0) for r in rows]), 5)
    assert st.skipped_replay == g.count(0)
    st = m.ingest(batch([(r, 3, 1.0) for r in rows]), 6)
    assert st.ingested == 20 and m.recovering
    m.ingest(SampleBatch.empty(), 9)
    assert not m.recovering
    # a re-delivered message is skipped as a whole
    st = m.ingest(batch([(r, 9, 1.0) for r in rows]), 6)
    assert st.skipped_replay == 20 and st.ingested == 0


def test_checkpoints_of_other_groups_count_disable_skipping() -> None:
    m = _mem(groups_per_shard=2)
    m.set_checkpoints({0: 5, 1: 5, 2: 5}, replay_until=None)  # written with 3 groups
    assert not m.recovering
    assert m.ingest(batch([(_labels(1), 1, 1.0)]), 0).ingested == 1


def test_stored_part_keys_skip_flushed_samples_and_keep_start_time() -> None:
    m = _mem()
    a, b = _labels(1), _labels(2)
    m.load_part_keys([PartKeyRecord(encode_part_key(a), 50, 300)])
    assert m.num_series == 1 and m.find_series([LabelMatcher("host", "=", "h1")]) == [0]
    st = m.ingest(batch([(a, 200, 1.0), (a, 300, 1.0), (a, 301, 2.0), (b, 1, 3.0)]), 0)
    assert (st.skipped_flushed, st.out_of_order, st.ingested) == (2, 0, 2)
    sid = _sid(m, a)
    assert m.samples(sid)[0].tolist() == [301]
    assert m.time_range(sid) == (50, 301)
    sealed = m.seal_group(m.group_of(sid))
    assert PartKeyRecord(encode_part_key(a), 50, 301) in sealed.part_keys


@settings(max_examples=60)
@given(
    series=st.integers(1, 6),
    rounds=st.lists(st.tuples(st.integers(1, 9), st.booleans(), st.booleans()), max_size=6),
    window=st.tuples(st.integers(-50, 900), st.integers(0, 900)),
)
def test_snapshot_many_is_each_series_snapshot_concatenated(
    series: int, rounds: list[tuple[int, bool, bool]], window: tuple[int, int]
) -> None:
    """Whatever was sealed, flushed or evicted: one read of many series is their single reads."""
    m = _mem(retention_ms=200)
    t0 = 0
    for offset, (per, seal, evict) in enumerate(rounds):
        _fill(m, series, per, t0=t0, offset=offset)
        t0 += per * 10 + 5
        if seal:
            for g in range(m.groups_per_shard):
                m.mark_flushed(m.seal_group(g))
        if evict:
            m.evict(now_ms=t0)
    start, width = window
    sids = list(range(m.num_series))[::-1]  # any order
    starts, ts, vals, bounds = m.snapshot_many(sids, start, start + width)
    assert len(bounds) == len(sids) + 1 and bounds[0] == 0 and bounds[-1] == len(ts)
    for i, sid in enumerate(sids):
        mem_start, want_ts, want_vals = m.snapshot(sid, start, start + width)
        assert starts[i] == (NONE_TS if mem_start is None else mem_start)
        assert ts[bounds[i] : bounds[i + 1]].tolist() == want_ts.tolist()
        assert vals[bounds[i] : bounds[i + 1]].tolist() == want_vals.tolist()


def test_keyed_batches_find_their_series_by_key_as_by_labels() -> None:
    """Decoders' keys stand for label sets: series found by key are those found by labels,
    a new key for known labels finds the known series, and bad label sets stay refused."""
    from ingest.batch import KeyedBatch

    m = _mem()
    plain = batch([(_labels(0), 10, 1.0), (_labels(1), 10, 2.0)])
    m.ingest(plain, 0)
    a, b, c = ("k-a", "k-b", "k-c")  # any hashable key

    def keyed(series: list[dict], keys: list, t: int) -> KeyedBatch:
        n = len(series)
        idx = np.arange(n, dtype=np.int32)
        return KeyedBatch(series, idx, np.full(n, t, np.int64), np.ones(n), keys=keys)

    bad = {"_metric_": "cpu", "_ws_": "w", "_ns_": "n", "host": 5}  # not str -> str
    st = m.ingest(keyed([_labels(1), _labels(2), bad], [a, b, c], 20), 1)
    assert st.new_series == 1 and st.invalid_series == 1
    st = m.ingest(keyed([_labels(2), _labels(1)], [b, "another key, same labels"], 30), 2)
    assert st.new_series == 0 and st.ingested == 2
    for i, want in ((0, [10]), (1, [10, 20, 30]), (2, [20, 30])):
        assert m.samples(_sid(m, _labels(i)))[0].tolist() == want
    assert m.num_series == 3


@settings(max_examples=60)
@given(
    steps=st.lists(st.lists(st.integers(1, 700), min_size=1, max_size=60), min_size=1, max_size=6),
    span=st.sampled_from([1_000, 2_000, 3_600_000]),
    most=st.integers(1, 9),
)
def test_sealing_everything_cuts_each_buffer_as_chunk_cuts_says(
    steps: list[list[int]], span: int, most: int
) -> None:
    """The vectorised seal cuts all of a group's buffers at once; each buffer's chunks are
    exactly the ones `chunk_cuts` (the rule, per buffer) gives."""
    m = ShardMemstore(DS, 0, groups_per_shard=1, max_chunk_samples=most, chunk_span_ms=span)
    streams = {}
    for i, deltas in enumerate(steps):
        ts = np.cumsum(np.array(deltas, np.int64)) - 5_000
        streams[encode_part_key(_labels(i))] = ts
        batch = SampleBatch([_labels(i)], np.zeros(len(ts), np.int32), ts, ts * 0.5)
        m.ingest(batch, i)
    sealed = m.seal_group(0)
    by_key: dict[str, list] = {}
    for c in sealed.chunks:
        by_key.setdefault(c.part_key, []).append(c)
    assert sorted(by_key) == sorted(streams)
    for key, ts in streams.items():
        cuts = chunk_cuts(ts, span, most).tolist()
        want = [(int(ts[a]), int(ts[b - 1]), b - a) for a, b in itertools.pairwise(cuts)]
        got = [(c.start_time, c.end_time, c.num_samples) for c in by_key[key]]
        assert got == want
        for c in by_key[key]:
            assert np.array_equal(
                decode_chunk(c.data)[0], ts[(ts >= c.start_time) & (ts <= c.end_time)]
            )

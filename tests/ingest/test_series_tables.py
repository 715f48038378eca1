"""A binary decoder parses a repeated series table once (`SeriesTables`), and the memstore
remembers the series ids of its keys: both must give exactly what a fresh decode gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from core.dataset import Dataset, LabelLimits, SpreadSettings
from ingest.batch import SampleBatch
from ingest.memstore import ShardMemstore
from ingest.wire.binary_format import SeriesTables, decode_binary, encode_binary

_text = st.text(st.characters(exclude_characters="\x00", codec="utf-8"), min_size=1, max_size=6)
_labels = st.dictionaries(_text, _text, max_size=4).map(lambda d: {"_metric_": "m", **d})
_maybe_bad = st.one_of(_labels, st.dictionaries(_text, _text, max_size=3))  # some lack a name


def _batch(series: list[dict[str, str]], t: int, per_series: int = 1) -> SampleBatch:
    n = len(series)
    idx = np.tile(np.arange(n, dtype=np.int32), per_series)
    ts = np.repeat(np.arange(per_series, dtype=np.int64), n) + t
    return SampleBatch(series, idx, ts, np.arange(len(idx), dtype=np.float64) + 0.5)


def _same(a: SampleBatch, b: SampleBatch) -> None:
    assert a.series == b.series
    assert a.series_idx.tolist() == b.series_idx.tolist()
    assert a.timestamps.tolist() == b.timestamps.tolist()
    assert a.values.tolist() == b.values.tolist()
    assert a.bad_records == b.bad_records


@settings(max_examples=60)
@given(
    tables=st.lists(st.lists(_maybe_bad, min_size=1, max_size=5), min_size=1, max_size=4),
    order=st.lists(st.integers(0, 3), min_size=1, max_size=12),
)
def test_a_cached_table_decodes_as_a_fresh_one(tables: list, order: list) -> None:
    cache = SeriesTables(max_tables=2)
    for k, i in enumerate(order):
        message = encode_binary(_batch(tables[i % len(tables)], 1_000 * (k + 1), per_series=2))
        _same(decode_binary(message, tables=cache).batch, decode_binary(message).batch)
    assert cache.hits + cache.misses == len(order)


def test_a_repeated_table_is_parsed_once_and_shares_its_keys() -> None:
    series = [{"_metric_": "m", "i": str(i)} for i in range(20)]
    cache = SeriesTables()
    first = decode_binary(encode_binary(_batch(series, 1_000)), tables=cache).batch
    second = decode_binary(encode_binary(_batch(series, 2_000)), tables=cache).batch
    assert (cache.misses, cache.hits) == (1, 1)
    assert second.keys is first.keys  # type: ignore[attr-defined]
    assert second.timestamps.tolist() == [2_000] * 20
    reordered = decode_binary(encode_binary(_batch(series[::-1], 3_000)), tables=cache).batch
    assert cache.misses == 2 and reordered.series == series[::-1]


def test_a_table_seen_under_other_limits_is_checked_again() -> None:
    series = [{"_metric_": "m", "host": "x" * 40}, {"_metric_": "m", "host": "y"}]
    cache = SeriesTables()
    message = encode_binary(_batch(series, 1_000))
    assert decode_binary(message, tables=cache).batch.series == series
    tight = LabelLimits(max_label_value_bytes=10)
    got = decode_binary(message, limits=tight, tables=cache).batch
    assert got.series == [series[1]] and got.bad_records == {"label_too_long": 1}
    assert cache.hits == 1


def test_the_cache_keeps_at_most_its_bounds() -> None:
    cache = SeriesTables(max_tables=3, max_bytes=10_000)
    for i in range(10):
        series = [{"_metric_": "m", "i": f"{i}-{j}"} for j in range(5)]
        decode_binary(encode_binary(_batch(series, 1_000)), tables=cache)
    assert len(cache._recent) == 3
    huge = [{"_metric_": "m", "i": f"{j:05d}" * 50} for j in range(100)]  # a 25 KB table
    decode_binary(encode_binary(_batch(huge, 1_000)), tables=cache)
    decode_binary(encode_binary(_batch(huge, 2_000)), tables=cache)
    assert cache.hits == 0 and all(len(t.raw) <= 10_000 for t in cache._recent)


def test_the_memstore_remembers_the_ids_of_a_repeated_table() -> None:
    ds = Dataset(name="tables", num_shards=1, spread=SpreadSettings(default=0))
    a = [{"_metric_": "m", "i": str(i)} for i in range(30)]
    b = a[10:] + [{"_metric_": "m", "i": f"new{i}"} for i in range(5)]
    bad = [{"no_name": "x"}, a[0]]
    cache = SeriesTables()
    mem = ShardMemstore(ds, 0)
    for k, series in enumerate([a, b, a, bad, b, bad, a]):
        batch = decode_binary(encode_binary(_batch(series, 1_000 * (k + 1))), tables=cache).batch
        mem.ingest(batch, k)
    assert cache.hits == 4 and mem.num_series == 35
    for labels in a + b:
        sid = mem.series_id(labels)
        assert sid is not None
        ts = mem.samples(sid)[0].tolist()
        want = [1_000 * (k + 1) for k, s in enumerate([a, b, a, bad, b, bad, a]) if labels in s]
        assert ts == want, labels

"""Shard key / partition key hashing and spread, checked against FiloDB's own test vectors."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from core.dataset import SpreadOverride, SpreadSettings
from core.hashing import (
    HASH_SEED,
    combine_hash,
    hash32,
    ingestion_shard,
    query_shards,
    resolve_spread,
    shard_for_series,
    shard_key_hash_from_values,
    shards_for_query,
    strip_metric_suffix,
)
from filopy import Dataset, partition_key_hash, shard_key_hash

from .support import java_string_hash, to_int32, xxh32_reference


def ref_hash(s: str) -> int:
    return to_int32(xxh32_reference(s.encode("utf-8"), 0x9747B28C))


def ref_combine(*hashes: int) -> int:
    """FiloDB's fold: start at 7, then h = 31*h + x on a Java int, computed with numpy int32."""
    with np.errstate(over="ignore"):
        h = np.int32(7)
        for x in hashes:
            h = np.int32(31) * h + np.int32(x)
    return int(h)


# ----- primitives ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["", "a", "abc", "heap_usage", "0123456789abcdef", "x" * 37, "ünïcødé €", "😀 metric"]
)
def test_hash32_is_xxh32_with_filodb_seed_as_signed_int(text: str) -> None:
    assert hash32(text) == ref_hash(text)
    assert hash32(text.encode("utf-8")) == hash32(text)
    assert -(2**31) <= hash32(text) < 2**31


def test_hash32_uses_the_filodb_seed() -> None:
    assert HASH_SEED == 0x9747B28C
    assert hash32("App-0") != to_int32(xxhash.xxh32_intdigest(b"App-0", 0))


@pytest.mark.parametrize(
    ("a", "b"), [(0, 0), (1, 2), (2**31 - 1, 1), (-(2**31), -1), (123456789, -987654321)]
)
def test_combine_hash_wraps_like_a_java_int(a: int, b: int) -> None:
    with np.errstate(over="ignore"):
        expected = int(np.int32(31) * np.int32(a) + np.int32(b))
    assert combine_hash(a, b) == expected


# ----- FiloDB ShardMapperSpec vectors ----------------------------------------------------------

# FiloDB's ShardMapperSpec derives its hashes with Java's String.hashCode.
SPEC_K = java_string_hash("someAppName" + "$" + "someMetricName")
SPEC_P = java_string_hash("a=1;b=2;c=3")


def test_spec_hashes_match_the_values_quoted_in_filodb() -> None:
    assert SPEC_K == 0x111FCDDB
    assert SPEC_P & 0xFFFFFFFF == 0x9D3D772F
    assert SPEC_P < 0  # FiloDB sees a negative Int


@pytest.mark.parametrize(
    ("spread", "shard"),
    [(0, 0x1B), (1, 0x3B), (2, 0x2B), (3, 0x2B), (4, 0x2F), (5, 0x2F), (6, 0x2F)],
)
def test_worked_example_ingestion_shard(spread: int, shard: int) -> None:
    assert ingestion_shard(SPEC_K, SPEC_P, spread, 64) == shard
    # Signed (JVM) and unsigned forms of the same hash route identically.
    assert ingestion_shard(SPEC_K, SPEC_P & 0xFFFFFFFF, spread, 64) == shard


def test_worked_example_spread_too_large_raises() -> None:
    with pytest.raises(ValueError, match="spread 7"):
        ingestion_shard(SPEC_K, SPEC_P, 7, 64)
    with pytest.raises(ValueError, match="spread -1"):
        ingestion_shard(SPEC_K, SPEC_P, -1, 64)
    with pytest.raises(ValueError, match="spread 7"):
        query_shards(SPEC_K, 7, 64)


def test_worked_example_query_shards() -> None:
    assert query_shards(SPEC_K, 0, 64) == [0x1B]
    assert query_shards(SPEC_K, 1, 64) == [0x1B, 0x3B]
    assert query_shards(SPEC_K, 2, 64) == [0x0B, 0x1B, 0x2B, 0x3B]
    assert query_shards(SPEC_K, 3, 64) == [0x03, 0x0B, 0x13, 0x1B, 0x23, 0x2B, 0x33, 0x3B]
    assert query_shards(SPEC_K, 4, 64) == [i * 4 + 3 for i in range(16)]
    assert query_shards(SPEC_K, 5, 64) == [i * 2 + 1 for i in range(32)]
    assert query_shards(SPEC_K, 6, 64) == list(range(64))


@pytest.mark.parametrize("num_shards", [0, 3, 12, 100])
def test_num_shards_must_be_a_power_of_two(num_shards: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        ingestion_shard(1, 2, 0, num_shards)
    with pytest.raises(ValueError, match="power of two"):
        query_shards(1, 0, num_shards)


def test_single_shard_dataset_routes_everything_to_shard_zero() -> None:
    assert ingestion_shard(SPEC_K, SPEC_P, 0, 1) == 0
    assert query_shards(SPEC_K, 0, 1) == [0]


# ----- shard key hash ---------------------------------------------------------------------------

LABELS = {"_ws_": "demo", "_ns_": "App-0", "_metric_": "heap_usage", "host": "H0", "dc": "DC1"}


def test_shard_key_hash_combines_non_metric_values_by_column_name_then_metric() -> None:
    # Column order by name: _ns_ before _ws_.
    expected = ref_combine(ref_hash("App-0"), ref_hash("demo"), ref_hash("heap_usage"))
    assert shard_key_hash(LABELS) == expected
    assert shard_key_hash_from_values(["App-0", "demo"], "heap_usage") == expected


def test_shard_key_hash_ignores_non_shard_key_tags_and_label_order() -> None:
    reordered = dict(reversed(list(LABELS.items())))
    assert shard_key_hash(reordered) == shard_key_hash(LABELS)
    assert shard_key_hash({**LABELS, "host": "other"}) == shard_key_hash(LABELS)
    assert shard_key_hash({**LABELS, "_ns_": "App-1"}) != shard_key_hash(LABELS)


@pytest.mark.parametrize("suffix", ["_bucket", "_count", "_sum"])
def test_histogram_suffixes_share_the_base_metric_shard_key(suffix: str) -> None:
    base = {"_ws_": "demo", "_ns_": "App-0", "_metric_": "http_latency"}
    assert shard_key_hash({**base, "_metric_": "http_latency" + suffix}) == shard_key_hash(base)


def test_only_one_known_suffix_is_stripped() -> None:
    assert strip_metric_suffix("x_sum_count") == "x_sum"
    assert strip_metric_suffix("requests_total") == "requests_total"
    assert strip_metric_suffix("bucket") == "bucket"
    assert strip_metric_suffix("_sum") == ""  # as FiloDB's trimShardColumn


def test_missing_shard_key_tags_are_skipped() -> None:
    labels = {"_ws_": "demo", "_metric_": "m"}
    assert shard_key_hash(labels) == ref_combine(ref_hash("demo"), ref_hash("m"))


def test_prometheus_name_label_is_the_metric_when_metric_column_is_absent() -> None:
    prom = {"_ws_": "demo", "_ns_": "App-0", "__name__": "heap_usage"}
    assert shard_key_hash(prom) == shard_key_hash(LABELS)
    both = {**prom, "_metric_": "other"}
    assert shard_key_hash(both) == shard_key_hash({**LABELS, "_metric_": "other"})


def test_labels_without_a_metric_name_are_rejected() -> None:
    with pytest.raises(ValueError, match="no metric name"):
        shard_key_hash({"_ws_": "demo", "_ns_": "App-0"})


def test_dataset_shard_key_columns_are_used() -> None:
    ds = Dataset(name="jobs", num_shards=16, shard_key_columns=("job", "exporter", "_metric_"))
    labels = {"job": "J", "exporter": "E", "_metric_": "up", "_ws_": "ignored"}
    # exporter < job by name.
    assert shard_key_hash(labels, ds) == ref_combine(ref_hash("E"), ref_hash("J"), ref_hash("up"))


# ----- partition key hash -------------------------------------------------------------------------


def test_partition_key_hash_pairs_sorted_by_key_without_metric_and_le() -> None:
    labels = {**LABELS, "le": "0.5"}
    pairs = sorted((k, v) for k, v in labels.items() if k not in ("_metric_", "le"))
    expected = ref_combine(*(ref_combine_pair(k, v) for k, v in pairs))
    assert partition_key_hash(labels) == expected
    assert partition_key_hash(labels) == partition_key_hash(LABELS)


def ref_combine_pair(k: str, v: str) -> int:
    with np.errstate(over="ignore"):
        return int(np.int32(31) * np.int32(ref_hash(k)) + np.int32(ref_hash(v)))


def test_partition_key_hash_depends_on_every_other_tag() -> None:
    base = partition_key_hash(LABELS)
    for key in ("_ws_", "_ns_", "host", "dc"):
        assert partition_key_hash({**LABELS, key: LABELS[key] + "x"}) != base
    assert partition_key_hash({**LABELS, "_metric_": "other"}) == base
    assert partition_key_hash({**LABELS, "extra": "1"}) != base


def test_partition_key_hash_excludes_prometheus_name_when_it_is_the_metric() -> None:
    prom = {k: v for k, v in LABELS.items() if k != "_metric_"} | {"__name__": "heap_usage"}
    assert partition_key_hash(prom) == partition_key_hash(LABELS)


def test_partition_key_hash_sorts_keys_like_java() -> None:
    # Java compares UTF-16 code units: U+1F600 (D83D DE00) sorts before U+FFFF.
    labels = {"_metric_": "m", "\uffff": "a", "\U0001f600": "b"}
    expected = ref_combine(ref_combine_pair("\U0001f600", "b"), ref_combine_pair("\uffff", "a"))
    assert partition_key_hash(labels) == expected


# ----- spread ----------------------------------------------------------------------------------


def spread_dataset() -> Dataset:
    return Dataset(
        name="spready",
        num_shards=64,
        spread=SpreadSettings(
            default=1,
            overrides=(SpreadOverride(shard_key={"_ws_": "big", "_ns_": "App-9"}, spread=4),),
        ),
    )


def test_spread_default_override_and_per_query_override() -> None:
    ds = spread_dataset()
    assert resolve_spread(ds, {"_ws_": "demo", "_ns_": "App-9"}) == 1
    assert resolve_spread(ds, {"_ws_": "big", "_ns_": "App-9", "_metric_": "m"}) == 4
    assert resolve_spread(ds, {"_ws_": "big", "_ns_": "App-9"}, override=0) == 0
    with pytest.raises(ValueError, match="between 0 and 6"):
        resolve_spread(ds, {}, override=7)


def test_series_shard_is_among_its_query_shards() -> None:
    ds = spread_dataset()
    key = {"_ws_": "big", "_ns_": "App-9", "_metric_": "heap_bucket"}
    shards = shards_for_query(ds, key)
    assert len(shards) == 16
    seen = {shard_for_series(ds, {**key, "host": f"h{i}", "le": "1"}) for i in range(200)}
    assert seen <= set(shards)
    assert len(seen) > 8  # the spread really spreads
    assert shard_for_series(ds, {**key, "host": "h1"}, spread=0) == shards_for_query(ds, key, 0)[0]
